"""Held-out evaluation: fit on part of a data set through the command line, score the rest with
``latentzoo predict`` (no refit), and score scikit-learn's natural baselines on the same split, in
the same run.

    python experiments/heldout.py --model MODEL [--data FILE | --data sklearn:NAME]
                                  [--labels FILE] [--test-fraction 0.2] [--quick] [--seed 0]
                                  [--out DIR]

- Density models (fa, mfa, ta, mta): the mean held-out log predictive density per row, in the
  data's own units (a ``--standardize`` fit's Jacobian included), against scikit-learn's
  ``FactorAnalysis`` (K factors, run to convergence), ``PCA`` (K components, probabilistic PCA's density) and
  ``GaussianMixture`` (J full-covariance components, or diagonal ones when D > N / 4).
- Binary-source models (cvq, noca): the mean held-out log-likelihood per row (exact, the 2^K
  states summed out), against independent Bernoulli columns (frequencies with add-one
  smoothing). scikit-learn's ``BernoulliRBM`` has no normalised likelihood (its
  ``score_samples`` is a pseudo-likelihood), so it is not a baseline of a density.
- The classifier (rank-svm): held-out accuracy and log loss against ``LinearSVC`` (accuracy),
  ``LogisticRegression`` and an RBF ``SVC`` with calibrated probabilities (all on standardised
  columns).
- Convolutional FA's held-out task is restoration: ``experiments/cfa_denoise.py``.

``--data sklearn:NAME``: ``breast_cancer`` (569 x 30, with its labels for rank-svm), ``digits``
(1797 x 64), ``digits_binary`` (pixels > 7), ``digits_3_5`` (3 against 5, with labels),
``sample_patches`` (520 x 64). Real-valued data are fitted with ``--standardize`` (the
prediction undoes it). Writes ``heldout.json`` and ``heldout.csv`` into ``--out`` (default
``runs/heldout/<model>-<data>``), together; bad input is one sentence and exit status 2.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

from latentzoo.cli import SentenceArgumentParser, fail  # noqa: E402

PROG = "heldout"
DENSITY = ("fa", "mfa", "ta", "mta")
BINARY = ("cvq", "noca")
CLASSIFIER = ("rank-svm",)
QUICK = ["--chains", "2", "--samples", "100", "--warmup", "100"]
QUICK_SWEEPS = ["--sweeps", "30"]  # a point fit's quick length (samplers take no --sweeps)
FULL = ["--chains", "4", "--samples", "500", "--warmup", "500"]


def load(name: str | None, family, labels: str | None):
    """(X, y or None, name) for ``--data`` (see the module docstring)."""
    from sklearn import datasets

    from posterior_checks import sklearn_data

    if name is None:
        data = family.default_data(0)
        return (*data, "default") if isinstance(data, tuple) else (np.asarray(data), None, "default")
    if name.startswith("sklearn:"):
        key = name.split(":", 1)[1]
        if key == "breast_cancer":
            d = datasets.load_breast_cancer()
            return d.data.astype(float), d.target.astype(float), key
        if key == "digits_3_5":
            d = datasets.load_digits()
            keep = np.isin(d.target, (3, 5))
            return d.data[keep].astype(float), d.target[keep].astype(float), key
        return sklearn_data(key), None, key
    from latentzoo.data import load_array, load_labels

    X = np.asarray(load_array(name), dtype=float)
    y = load_labels(labels) if labels else None
    if y is None and family.name in CLASSIFIER:
        X, y = X[:, :-1], X[:, -1]  # a labelled table: the label last
    return X, y, os.path.splitext(os.path.basename(name))[0]


def split(N: int, fraction: float, seed: int):
    rows = np.random.default_rng(seed).permutation(N)
    n_test = max(1, int(round(fraction * N)))
    if N - n_test < 2:
        raise ValueError(f"--test-fraction {fraction} leaves {N - n_test} training row(s) of {N}.")
    return rows[n_test:], rows[:n_test]


def fit_and_predict(model, X_tr, y_tr, X_te, y_te, args, folder):
    """The zoo's numbers: fit through ``latentzoo run``, then :func:`latentzoo.predict.predict`."""
    from latentzoo.cli import main as cli
    from latentzoo.predict import classify, predict

    train = os.path.join(folder, "train.npy")
    np.save(train, X_tr)
    if y_tr is not None:  # labelled: the labels from a file of their own
        np.save(os.path.join(folder, "labels.npy"), y_tr)
    from latentzoo.registry import get_family

    point = get_family(model).method(None).kind == "point"
    argv = ["run", model, "--data", train, "--out", os.path.join(folder, "run"), "--no-progress",
            "--seed", str(args.seed), *(QUICK if args.quick else FULL),
            *(QUICK_SWEEPS if args.quick and point else [])]
    if y_tr is not None:
        argv += ["--labels", os.path.join(folder, "labels.npy")]
    if args.K:
        argv += ["--K", str(args.K)]
    if model in DENSITY and (X_tr.std(0) > 0).all():  # unit scale; predict undoes it
        argv += ["--standardize"]
    t0 = time.perf_counter()
    if cli(argv) != 0:
        raise ValueError(f"latentzoo run {model} failed on the training rows (its sentence is above).")
    seconds = time.perf_counter() - t0
    result = predict(os.path.join(folder, "run"), X_te)
    if result.positive_probability is not None:
        scores = classify(result, y_te)
        return {"accuracy": scores["accuracy"], "log_loss": scores["log_loss"], "seconds": seconds}
    return {"mean_log_density": float(np.mean(result.log_predictive_density)), "seconds": seconds}


def baselines(model, X_tr, y_tr, X_te, y_te, K: int, J: int):
    """{name: scores} of scikit-learn's baselines on the same split."""
    from sklearn.decomposition import PCA, FactorAnalysis
    from sklearn.calibration import CalibratedClassifierCV
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import log_loss
    from sklearn.mixture import GaussianMixture
    from sklearn.preprocessing import StandardScaler
    from sklearn.svm import SVC, LinearSVC

    out = {}
    if model in DENSITY:
        keep = X_tr.std(0) > 0  # constant columns have no density in scikit-learn's models
        if not keep.all():
            return {"note": f"{int((~keep).sum())} constant column(s): scikit-learn's Gaussian "
                            "models put infinite density there; drop them to compare."}
        k = min(K, X_tr.shape[1] - 1)
        # converged (scikit-learn's default tol = 1e-2 stops early: breast cancer, K = 3, 14.1
        # against 19.9 nats per held-out row at tol = 1e-8)
        fa = FactorAnalysis(k, tol=1e-8, max_iter=100_000, random_state=0).fit(X_tr)
        out["FactorAnalysis"] = fa.score_samples(X_te).mean()
        out["PCA"] = PCA(k, random_state=0).fit(X_tr).score_samples(X_te).mean()
        cov = "full" if X_tr.shape[1] <= X_tr.shape[0] // 4 else "diag"
        gm = GaussianMixture(J, covariance_type=cov, random_state=0, reg_covar=1e-4).fit(X_tr)
        out[f"GaussianMixture ({J}, {cov})"] = gm.score_samples(X_te).mean()
        return {k: {"mean_log_density": float(v)} for k, v in out.items()}
    if model in BINARY:
        p = (X_tr.sum(0) + 1.0) / (X_tr.shape[0] + 2.0)
        ll = X_te @ np.log(p) + (1 - X_te) @ np.log1p(-p)
        return {"independent Bernoulli": {"mean_log_density": float(ll.mean())}}
    scaler = StandardScaler().fit(X_tr)
    A, B = scaler.transform(X_tr), scaler.transform(X_te)
    out["LinearSVC"] = {"accuracy": float(np.mean(LinearSVC(dual="auto").fit(A, y_tr).predict(B) == y_te))}
    for name, clf in (("LogisticRegression", LogisticRegression(max_iter=2000)),
                      ("SVC (RBF)", CalibratedClassifierCV(SVC(), ensemble=False))):
        clf.fit(A, y_tr)
        out[name] = {"accuracy": float(np.mean(clf.predict(B) == y_te)),
                     "log_loss": float(log_loss(y_te, clf.predict_proba(B), labels=clf.classes_))}
    return out


def parse(argv):
    ap = SentenceArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="fa, mfa, ta, mta, cvq, noca or rank-svm")
    ap.add_argument("--data", help="data file (.csv/.npy/.npz) or sklearn:NAME; default: the model's")
    ap.add_argument("--labels", help="the classifier's labels, one per row (default: the last column)")
    ap.add_argument("--test-fraction", type=float, default=0.2)
    ap.add_argument("--K", type=int, help="latent dimension (default: the model's)")
    ap.add_argument("--quick", action="store_true", help="short fits (2 chains of 100 + 100)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="output folder (default runs/heldout/<model>-<data>)")
    return ap.parse_args(argv)


def run(args) -> int:
    import pandas as pd

    from latentzoo.registry import get_family
    from latentzoo.results import atomic_write_text, staged_run_dir

    family = get_family(args.model)
    if family.name not in DENSITY + BINARY + CLASSIFIER:
        raise ValueError(f"The {family.name} model's held-out task is restoration; use "
                         "experiments/cfa_denoise.py.")
    if not 0.0 < args.test_fraction < 1.0:
        raise ValueError(f"--test-fraction must lie between 0 and 1, got {args.test_fraction}.")
    X, y, data_name = load(args.data, family, args.labels)
    if family.name in CLASSIFIER and y is None:
        raise ValueError("The classifier needs labels: --labels FILE, a last column, or "
                         "sklearn:breast_cancer / sklearn:digits_3_5.")
    tr, te = split(X.shape[0], args.test_fraction, args.seed)
    y_tr, y_te = (None, None) if family.name not in CLASSIFIER else (y[tr], y[te])
    K = args.K or family.default_K
    print(f"{family.name} on {data_name}: {len(tr)} training rows, {len(te)} held out, "
          f"{X.shape[1]} columns, K = {K}", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        ours = fit_and_predict(family.name, X[tr], y_tr, X[te], y_te, args, folder)
    rows = [{"method": f"latentzoo {family.name} ({family.method(None).name})", **ours}]
    for name, scores in baselines(family.name, X[tr], y_tr, X[te], y_te, K, 2).items():
        rows.append({"method": name, **scores} if isinstance(scores, dict) else
                    {"method": name, "note": scores})
    table = pd.DataFrame(rows)
    print(table.to_string(index=False))
    out = args.out or os.path.join("runs", "heldout", f"{family.name}-{data_name}")
    with staged_run_dir(out) as stage:
        atomic_write_text(os.path.join(stage, "heldout.csv"), table.to_csv(index=False))
        atomic_write_text(os.path.join(stage, "heldout.json"), table.to_json(orient="records", indent=2))
    print(f"wrote {out}/heldout.csv, {out}/heldout.json")
    return 0


def main(argv=None) -> int:
    args = parse(argv)
    try:
        return run(args)
    except ValueError as err:
        return fail(PROG, str(err))


if __name__ == "__main__":
    sys.exit(main())
