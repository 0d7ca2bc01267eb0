"""Monotone invariance of the rank likelihood: the R variants' fits and predictions do not move
under strictly increasing transforms of the features; the G variants' do.

Each transform is applied column by column to all rows (training and test together): identity,
exp (of the column divided by its largest absolute value, so nothing overflows), cube, and a
random rank warp (each column's distinct values mapped, in order, to cumulative sums of random
Gamma(1/2) steps: ties kept, spacing scrambled). Every variant is refitted on every transformed
copy with the same seed; for the R variants the rank pairs, hence the Gibbs chains and the
predicted probabilities, must be bit-for-bit those of the identity (checked, and the run fails
if not). Logistic regression (standardised, C by 5-fold CV) is shown as a reference that is not
invariant either. Data: scikit-learn's digits, 3 against 5 (or ``--data``).

    python experiments/rank_svm_monotone_invariance.py [--quick] [--splits 2] [--out DIR]
        [--json FILE] [--data FILE]
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import latentzoo  # noqa: E402,F401

from _binary_common import write_json  # noqa: E402
from rank_svm_digits import (  # noqa: E402
    VARIANTS,
    baseline_models,
    classifier,
    common_arguments,
    digits_3_vs_5,
    load_labelled,
    mean_sd,
    parse_variants,
    release_compiled,
    settle,
    splits,
)

PROG = "rank_svm_monotone_invariance"
TRANSFORMS = ("identity", "exp", "cube", "rank warp")


def transform(name: str, X: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One strictly increasing map per column (see the module docstring)."""
    if name == "identity":
        return X.copy()
    if name == "exp":
        top = np.abs(X).max(0)
        return np.exp(X / np.where(top > 0, top, 1.0))
    if name == "cube":
        return X**3
    out = np.empty_like(X)
    for j in range(X.shape[1]):
        values, inverse = np.unique(X[:, j], return_inverse=True)
        out[:, j] = np.cumsum(rng.gamma(0.5, size=len(values)))[inverse]
    return out


def main(argv=None):
    ap = common_arguments(PROG, __doc__.splitlines()[0], splits=2, K=10)
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help="comma-separated variants (default all four; quick R-L,G-L)")
    args = ap.parse_args(argv)
    if args.quick and args.variants == ",".join(VARIANTS):
        args.variants = "R-L,G-L"
    variants = parse_variants(PROG, args.variants)
    settle(PROG, args, splits=2, K=10)
    X, y = load_labelled(PROG, args.data) if args.data else digits_3_vs_5()
    data_name = os.path.basename(args.data) if args.data else "sklearn digits 3 vs 5"
    os.makedirs(args.out, exist_ok=True)

    rng = np.random.default_rng(args.seed)
    copies = {name: transform(name, X, rng) for name in TRANSFORMS}
    methods = list(variants) + ["LogisticRegression"]
    acc = {m: {t: [] for t in TRANSFORMS} for m in methods}
    change = {m: {t: 0.0 for t in TRANSFORMS} for m in methods}  # max |Δp| against identity
    identical = {v: True for v in variants if v.startswith("R")}
    seconds = []
    for s, (tr, te) in enumerate(splits(y, args.splits, args.train_fraction, args.seed)):
        for m in methods:
            base = None
            for t in TRANSFORMS:
                Xt = copies[t]
                model = baseline_models(args.seed + s)[m] if m == "LogisticRegression" \
                    else classifier(m, args, seed=args.seed + s)
                t0 = time.perf_counter()
                model.fit(Xt[tr], y[tr])
                p = model.predict_proba(Xt[te])[:, 1]
                seconds.append(time.perf_counter() - t0)
                acc[m][t].append(float(np.mean(model.classes_[(p > 0.5).astype(int)] == y[te])))
                if base is None:
                    base = p
                change[m][t] = max(change[m][t], float(np.abs(p - base).max()))
                if m in identical and not np.array_equal(p, base):
                    identical[m] = False
                if m != "LogisticRegression":
                    release_compiled()
                print(f"split {s}: {m:<18} {t:<9} accuracy {acc[m][t][-1]:.4f}  "
                      f"max |dp| vs identity {np.abs(p - base).max():.3g}", flush=True)

    summary = {m: {t: dict(zip(("mean", "sd"), mean_sd(acc[m][t])), max_abs_prob_change=change[m][t])
                   for t in TRANSFORMS} for m in methods}
    print(f"\n{data_name}: N = {len(y)}, D = {X.shape[1]}, {args.splits} split(s), K = {args.K}")
    print(f"{'method':<18} " + " ".join(f"{t:>17}" for t in TRANSFORMS) + "   max |dp| vs identity")
    for m in methods:
        cells = " ".join(f"{summary[m][t]['mean']:>8.4f} ± {summary[m][t]['sd']:.4f}" for t in TRANSFORMS)
        print(f"{m:<18} {cells}   {max(change[m].values()):.3g}")
    for v, same in identical.items():
        print(f"{v}: predicted probabilities under every transform "
              f"{'identical to the identity, bit for bit' if same else 'DIFFER from the identity'}")
    result = {
        "data": data_name, "N": int(len(y)), "D": int(X.shape[1]), "splits": args.splits,
        "train_fraction": args.train_fraction, "K": args.K, "T": args.T, "levels": args.levels,
        "warmup": args.warmup,
        "samples": args.samples, "max_draws": args.max_draws, "seed": args.seed,
        "transforms": list(TRANSFORMS), "summary": summary,
        "rank_variants_identical": identical, "seconds_per_fit_mean": float(np.mean(seconds)),
    }
    write_json(args.json or os.path.join(args.out, f"{PROG}.json"), result)
    if not all(identical.values()):
        raise SystemExit(f"{PROG}: a rank variant's predictions moved under a monotone transform.")
    return result


if __name__ == "__main__":
    main()
