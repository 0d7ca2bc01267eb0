"""Convolutional FA features for classification: pooled layer-1 and layer-2 posterior-mean maps
of a two-layer stack, fed to logistic regression on scikit-learn's 8x8 digits, against the raw
pixels, over stratified train/test splits.

The stack (:func:`latentzoo.inference.conv_factor.stack.fit_stack`, exact block Gibbs) is fitted
once to all ``--images`` digits without their labels (unsupervised and transductive: test images'
codes are inferred with the training images', as a dictionary learned on unlabelled data would
be used); only the classifier sees labels, and only the training split's. Features:

- ``layer1 maps``: layer 1's posterior-mean maps E[b_nk W_nk] of the elements in use, unpooled;
- ``layer1``: the same maps max-pooled over 2x2 cells (layer 2's input);
- ``layer2``: layer 2's posterior-mean maps, max-pooled over the whole map (one value per element);
- ``layer1+2``: the pooled layer-1 and the layer-2 features; ``pixels``: the 64 raw pixels.

Each feature set is standardised on the training split and classified by logistic regression
with its inverse regularisation C chosen by 3-fold cross-validation on the training split
(``GridSearchCV``, C in 0.01, 0.1, 1, 10), the same for every feature set.

    python experiments/cfa_features_classify.py [--quick] [--out DIR] [--images N] [--splits S]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import latentzoo  # noqa: E402,F401

from latentzoo.inference.conv_factor.stack import fit_stack  # noqa: E402
from latentzoo.results import atomic_write_text  # noqa: E402


def features(stack, pixels) -> dict[str, np.ndarray]:
    """Feature matrices (N, .) from a fitted stack and the raw images."""
    N = len(pixels)
    l1 = np.asarray(stack.pooled).reshape(N, -1)
    maps2 = np.asarray(stack.layer2.maps)
    l2 = np.abs(maps2).max(axis=(2, 3)) if maps2.shape[1] else np.zeros((N, 0))
    return {"pixels": pixels.reshape(N, -1),
            "layer1 maps": np.asarray(stack.layer1.maps).reshape(N, -1), "layer1": l1,
            "layer2": l2, "layer1+2": np.hstack([l1, l2])}


def classify(feats: dict, y, splits: int, test_size: float, seed: int) -> dict:
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GridSearchCV, StratifiedShuffleSplit
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    cv = StratifiedShuffleSplit(n_splits=splits, test_size=test_size, random_state=seed)
    acc = {name: [] for name in feats}
    for train, test in cv.split(np.zeros(len(y)), y):
        for name, F in feats.items():
            if F.shape[1] == 0:
                acc[name].append(float("nan"))
                continue
            pipe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=3000))
            clf = GridSearchCV(pipe, {"logisticregression__C": [0.01, 0.1, 1.0, 10.0]}, cv=3)
            acc[name].append(float(clf.fit(F[train], y[train]).score(F[test], y[test])))
    return acc


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes for a smoke run")
    ap.add_argument("--out", default=os.path.join("runs", "cfa_features_classify"))
    ap.add_argument("--images", type=int, default=None)
    ap.add_argument("--splits", type=int, default=5)
    ap.add_argument("--test-size", type=float, default=0.3)
    ap.add_argument("--K1", type=int, default=None)
    ap.add_argument("--K2", type=int, default=None)
    ap.add_argument("--atom1", type=int, default=5, help="layer-1 atoms' side (maps 9 - side)")
    ap.add_argument("--burn-in", type=int, default=None)
    ap.add_argument("--draws", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    N = args.images or (60 if args.quick else 600)
    K1 = args.K1 or (4 if args.quick else 8)
    K2 = args.K2 or (4 if args.quick else 8)
    burn_in = args.burn_in if args.burn_in is not None else (5 if args.quick else 100)
    draws = args.draws if args.draws is not None else (3 if args.quick else 40)
    if N < 20 or K1 < 1 or K2 < 1 or burn_in < 0 or draws < 1 or args.splits < 1 \
            or not 0 < args.test_size < 1 or not 1 <= args.atom1 <= 6:
        raise SystemExit("need --images >= 20, --K1, --K2 >= 1, --burn-in >= 0, --draws >= 1, "
                         "--splits >= 1, 0 < --test-size < 1 and 1 <= --atom1 <= 6.")
    from sklearn.datasets import load_digits

    data = load_digits()
    idx = np.random.default_rng(args.seed).choice(len(data.images), N, replace=False)
    X, y = data.images[idx][:, None] / 16.0, data.target[idx]
    t = time.perf_counter()
    atom1 = (args.atom1, args.atom1)
    stack = fit_stack(X, K1=K1, atom1=atom1, K2=K2, atom2=(2, 2), pool_size=2,
                      burn_in=burn_in, draws=draws, seed=args.seed)
    seconds = time.perf_counter() - t
    feats = features(stack, X)
    acc = classify(feats, y, args.splits, args.test_size, args.seed)
    res = {
        "images": N, "splits": args.splits, "test_size": args.test_size, "K1": K1, "K2": K2,
        "atom1": list(atom1), "atom2": [2, 2], "pool_size": 2, "burn_in": burn_in, "draws": draws,
        "elements_in_use": {"layer1": stack.layer1.num_in_use, "layer2": stack.layer2.num_in_use},
        "feature_dims": {k: int(v.shape[1]) for k, v in feats.items()},
        "accuracy": {k: {"mean": float(np.nanmean(v)) if np.isfinite(v).any() else None,
                         "sd": float(np.nanstd(v)) if np.isfinite(v).any() else None,
                         "per_split": v} for k, v in acc.items()},
        "stack_seconds": seconds,
    }
    print(f"digits, {N} images, {args.splits} splits (test {args.test_size:.0%}); layer 1 keeps "
          f"{stack.layer1.num_in_use}/{K1}, layer 2 {stack.layer2.num_in_use}/{K2} elements; "
          f"stack fitted in {seconds:.0f} s")
    print(f"{'features':<12} {'dims':>5} {'accuracy':>16}")
    for name, a in res["accuracy"].items():
        val = "n/a" if a["mean"] is None else f"{a['mean']:.3f} ± {a['sd']:.3f}"
        print(f"{name:<12} {res['feature_dims'][name]:>5} {val:>16}")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "cfa_features_classify.json")
    atomic_write_text(path, json.dumps(res, indent=2) + "\n")
    print(f"wrote {path}")
    return res


if __name__ == "__main__":
    main()
