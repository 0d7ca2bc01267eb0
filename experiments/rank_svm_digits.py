"""Rank-likelihood factor SVM on scikit-learn's 8x8 digits, 3 against 5 (the supplement's
USPS/MNIST 3 vs 5 experiment, Figures 1-2, on the digits scikit-learn ships).

Random stratified splits (``--train-fraction`` of the rows for training, the rest for testing).
The four variants (:class:`~latentzoo.inference.rank_svm.classifier.RankFactorSVC`, Gibbs) see the
raw pixel values: the R variants only their order within each pixel (ties grouped), the G
variants standardised pixels. Baselines on standardised pixels, each with C (and the RBF's gamma)
chosen by 5-fold cross-validation on the training rows over a small grid: LinearSVC, logistic
regression, RBF SVC. Prints a mean ± s.d. accuracy table; writes JSON and the learned loadings A
of the first split as 8x8 images (columns ordered by the classifier's |β|), one row per variant.

    python experiments/rank_svm_digits.py [--quick] [--splits 10] [--K 10] [--out DIR]
        [--json FILE] [--data FILE.npz|.csv]

``--data`` runs the same comparison on a labelled file of yours (features, label last in a CSV,
or X and y in an .npz; two classes); the loading images are drawn when it has 64 columns.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import latentzoo  # noqa: E402,F401

from _binary_common import check_at_least, save_figure, usage_error, write_json  # noqa: E402
from latentzoo.cli import SentenceArgumentParser  # noqa: E402

PROG = "rank_svm_digits"
VARIANTS = ("G-L", "R-L", "G-NL", "R-NL")
BASELINES = ("LinearSVC", "LogisticRegression", "RBF SVC")
C_GRID = (0.01, 0.1, 1.0, 10.0, 100.0)


# ------------------------------------------------------------- shared with the other rank-SVM scripts
def digits_3_vs_5():
    """(X (N, 64) raw pixel values 0..16, labels 3/5)."""
    from sklearn.datasets import load_digits

    d = load_digits()
    keep = np.isin(d.target, (3, 5))
    return d.data[keep], d.target[keep]


def load_labelled(prog: str, path: str):
    """(X, y) from a user's labelled file, two classes; one sentence and exit 2 otherwise."""
    from latentzoo.data import LABELLED_MATRIX

    try:
        X, y = LABELLED_MATRIX.validate(LABELLED_MATRIX.load(path), name=path)
    except ValueError as err:
        usage_error(prog, str(err))
    if len(np.unique(y)) != 2:
        usage_error(prog, f"{path} must have exactly two classes, got {len(np.unique(y))}.")
    return X, y


def parse_variants(prog: str, text: str) -> tuple[str, ...]:
    names = tuple(v.strip() for v in text.split(",") if v.strip())
    bad = [v for v in names if v not in VARIANTS]
    if bad or not names:
        usage_error(prog, f"--variants must be a comma-separated list of {', '.join(VARIANTS)}, "
                          f"got {text!r}.")
    return names


def baseline_models(seed: int) -> dict:
    """The three baselines, each a standardise-then-fit pipeline with C (and gamma) by 5-fold CV."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GridSearchCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from sklearn.svm import SVC, LinearSVC

    def cv(model, grid):
        return GridSearchCV(make_pipeline(StandardScaler(), model), grid, cv=5)

    return {
        "LinearSVC": cv(LinearSVC(max_iter=20000, random_state=seed), {"linearsvc__C": C_GRID}),
        "LogisticRegression": cv(LogisticRegression(max_iter=5000), {"logisticregression__C": C_GRID}),
        "RBF SVC": cv(SVC(kernel="rbf"), {"svc__C": C_GRID, "svc__gamma": ("scale", 0.003, 0.03)}),
    }


def splits(y, num: int, train_fraction: float, seed: int):
    """``num`` stratified random (train, test) index pairs."""
    from sklearn.model_selection import StratifiedShuffleSplit

    sss = StratifiedShuffleSplit(n_splits=num, train_size=train_fraction, random_state=seed)
    return list(sss.split(np.zeros(len(y)), y))


def mean_sd(values) -> tuple[float, float]:
    v = np.asarray(values, float)
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0


def common_arguments(prog: str, description: str, *, splits: int, K: int):
    """The options every rank-SVM experiment takes (sizes default to None: set by --quick)."""
    ap = SentenceArgumentParser(prog=prog, description=description)
    ap.add_argument("--quick", action="store_true", help="small run for CI (well under a minute)")
    ap.add_argument("--out", default=None, help=f"output folder (default experiments/results; "
                    f"with --quick runs/{prog}_quick)")
    ap.add_argument("--json", default=None, help=f"JSON path (default OUT/{prog}.json)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--K", type=int, default=None, help=f"factors (default {K}; quick 3)")
    ap.add_argument("--T", type=int, default=5, help="DP truncation of the NL variants")
    ap.add_argument("--levels", type=int, default=16,
                    help="R variants: each feature's values in at most this many groups (0: all "
                         "distinct values, the paper's model; see RankFactorSVC)")
    ap.add_argument("--warmup", type=int, default=None, help="Gibbs warm-up sweeps (default 300; quick 40)")
    ap.add_argument("--samples", type=int, default=None, help="Gibbs draws kept (default 300; quick 40)")
    ap.add_argument("--max-draws", type=int, default=None,
                    help="posterior draws used for prediction (default 100; quick 20)")
    ap.add_argument("--splits", type=int, default=None, help=f"random splits (default {splits}; quick 1)")
    ap.add_argument("--train-fraction", type=float, default=0.5)
    ap.add_argument("--data", default=None, help="a labelled file of yours (CSV label last, or .npz X, y)")
    return ap


def settle(prog: str, args, *, splits: int, K: int):
    """Fill the quick/full defaults and check every size in one sentence each."""
    q = args.quick
    args.out = args.out or (f"runs/{prog}_quick" if q else "experiments/results")
    args.K = args.K if args.K is not None else (3 if q else K)
    args.warmup = args.warmup if args.warmup is not None else (40 if q else 300)
    args.samples = args.samples if args.samples is not None else (40 if q else 300)
    args.max_draws = args.max_draws if args.max_draws is not None else (20 if q else 100)
    args.splits = args.splits if args.splits is not None else (1 if q else splits)
    check_at_least(prog, K=(args.K, 1), T=(args.T, 1), warmup=(args.warmup, 0),
                   samples=(args.samples, 1), max_draws=(args.max_draws, 1), splits=(args.splits, 1),
                   levels=(args.levels, 0),
                   seed=(args.seed, 0))
    if args.levels == 1:
        usage_error(prog, "--levels must be 0 (all values) or at least 2, got 1.")
    if not 0.0 < args.train_fraction < 1.0:
        usage_error(prog, f"--train-fraction must lie strictly between 0 and 1, got {args.train_fraction}.")
    if args.data is not None and not os.path.isfile(args.data):
        usage_error(prog, f"--data {args.data} does not exist.")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        usage_error(prog, f"--out {args.out} is an existing file, not a folder.")


def classifier(variant: str, args, seed: int):
    from latentzoo.inference.rank_svm.classifier import RankFactorSVC

    return RankFactorSVC(variant=variant, K=args.K, T=args.T, num_warmup=args.warmup,
                         num_samples=args.samples, seed=seed, max_draws=args.max_draws,
                         levels=args.levels or None)


def release_compiled() -> None:
    """Drop JAX's compiled programs (call after each fit). Every fit compiles its own programs
    (the labels and rank pairs are constants in them), and a process that keeps them all runs
    out of memory maps (vm.max_map_count): a full digits run died in LLVM after 23 fits."""
    import gc

    import jax

    jax.clear_caches()
    gc.collect()


def factor_order(est) -> np.ndarray:
    """Factors by decreasing mean |β| over the classifiers (the discriminative ones first)."""
    return np.argsort(-np.abs(est.coef_).mean(0))


# ----------------------------------------------------------------------------------- this one
def plot_loadings(fitted: dict, path: str, columns: int = 12) -> None:
    """One row per variant: the loadings of its first ``columns`` factors (by |β|) as 8x8 images,
    each on its own symmetric colour scale (a factor's sign is arbitrary)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    K = min(columns, min(est.loadings_.shape[1] for est in fitted.values()))
    fig, axes = plt.subplots(len(fitted), K, figsize=(1.1 * K + 0.8, 1.2 * len(fitted) + 0.3),
                             squeeze=False)
    for r, (variant, est) in enumerate(fitted.items()):
        order = factor_order(est)
        for c in range(K):
            ax = axes[r, c]
            img = est.loadings_[:, order[c]].reshape(8, 8)
            lim = float(np.abs(img).max()) or 1.0
            ax.imshow(img, cmap="RdBu_r", vmin=-lim, vmax=lim)
            ax.set_xticks([])
            ax.set_yticks([])
            if c == 0:
                ax.set_ylabel(variant, fontsize=9)
            if r == 0:
                ax.set_title(f"factor {c + 1}", fontsize=7)
    fig.suptitle("Loadings A (digits 3 vs 5), factors ordered by |beta|", fontsize=9)
    save_figure(fig, path)
    plt.close(fig)


def main(argv=None):
    ap = common_arguments(PROG, __doc__.splitlines()[0], splits=10, K=10)
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help="comma-separated variants (default all four; quick R-L,G-NL)")
    ap.add_argument("--no-baselines", action="store_true", help="skip the scikit-learn baselines")
    args = ap.parse_args(argv)
    if args.quick and args.variants == ",".join(VARIANTS):
        args.variants = "R-L,G-NL"
    variants = parse_variants(PROG, args.variants)
    settle(PROG, args, splits=10, K=10)
    X, y = load_labelled(PROG, args.data) if args.data else digits_3_vs_5()
    data_name = os.path.basename(args.data) if args.data else "sklearn digits 3 vs 5"
    os.makedirs(args.out, exist_ok=True)

    methods = list(variants) + ([] if args.no_baselines else list(BASELINES))
    acc = {m: [] for m in methods}
    seconds = {m: [] for m in methods}
    rows, first = [], {}
    for s, (tr, te) in enumerate(splits(y, args.splits, args.train_fraction, args.seed)):
        models = {v: classifier(v, args, seed=args.seed + s) for v in variants}
        if not args.no_baselines:
            models.update(baseline_models(args.seed + s))
        for name, model in models.items():
            t = time.perf_counter()
            model.fit(X[tr], y[tr])
            score = float(model.score(X[te], y[te]))
            seconds[name].append(time.perf_counter() - t)
            acc[name].append(score)
            row = {"split": s, "method": name, "accuracy": score, "seconds": seconds[name][-1]}
            if hasattr(model, "best_params_"):
                row["cv_params"] = {k.split("__")[1]: v for k, v in model.best_params_.items()}
            rows.append(row)
            print(f"split {s}: {name:<19} accuracy {score:.4f}  ({seconds[name][-1]:.1f} s)", flush=True)
            if s == 0 and name in variants:
                first[name] = model
            if name in variants:
                release_compiled()

    summary = {m: dict(zip(("mean", "sd"), mean_sd(acc[m])), seconds_mean=float(np.mean(seconds[m])))
               for m in methods}
    print(f"\n{data_name}: N = {len(y)}, D = {X.shape[1]}, {args.splits} split(s), "
          f"train fraction {args.train_fraction}, K = {args.K}")
    print(f"{'method':<19} {'accuracy (mean ± s.d.)':>24} {'seconds/fit':>12}")
    for m in methods:
        print(f"{m:<19} {summary[m]['mean']:>14.4f} ± {summary[m]['sd']:.4f} {summary[m]['seconds_mean']:>12.1f}")
    figure = None
    if X.shape[1] == 64:
        figure = os.path.join(args.out, f"{PROG}_loadings.png")
        plot_loadings(first, figure)
    result = {
        "data": data_name, "N": int(len(y)), "D": int(X.shape[1]), "splits": args.splits,
        "train_fraction": args.train_fraction, "K": args.K, "T": args.T, "levels": args.levels,
        "warmup": args.warmup,
        "samples": args.samples, "max_draws": args.max_draws, "seed": args.seed,
        "baselines": "standardised features; C (and RBF gamma) by 5-fold CV over "
                     f"C in {list(C_GRID)}, gamma in ['scale', 0.003, 0.03]",
        "summary": summary, "rows": rows, "figure": figure and os.path.basename(figure),
    }
    write_json(args.json or os.path.join(args.out, f"{PROG}.json"), result)
    return result


if __name__ == "__main__":
    main()
