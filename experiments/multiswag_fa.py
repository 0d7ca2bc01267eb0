"""The thesis' purpose: MultiSWAG with an online factor-analysis posterior (MultiSWAG-FA).

Brownlie (2021), "Extending the Bayesian Deep Learning Method MultiSWAG", builds online FA
(ch. 4, ``OnlineFactorAnalysis``) so that SWAG's Gaussian over SGD iterates (Maddox et al.
2019) can have a low-rank-plus-diagonal covariance learned in one streaming pass, and so that
MultiSWAG (Wilson & Izmailov 2020: a mixture of such Gaussians from independent runs) can be
built from them. This script runs that end to end on small regression problems:

* an MLP (inputs -> 50 ReLU -> 1) in pure JAX, its parameters flattened into one vector
  theta (``jax.flatten_util.ravel_pytree``); Gaussian likelihood with homoscedastic noise;
  inputs and target standardised on each training split;
* R runs from different seeds, vmapped: SGD with momentum 0.9, batch 32 and weight decay;
  pre-training (learning rate 0.05 for the first half, then linear decay to 0.01, as in
  SWAG), then a constant-rate (0.01) SWAG phase; an epoch is one jitted ``lax.scan`` over
  its mini-batches;
* in the SWAG phase theta after *every mini-batch step* is streamed, one epoch's iterates per
  ``partial_fit`` call, into ``OnlineFactorAnalysis`` (SWAG-FA) and into running first and
  second moments (SWA, diagonal SWAG). Per batch, as in the thesis, rather than SWAG's once
  per epoch: the same training gives the FA n_batches times more observations (1200-4200
  per run instead of 150), and the online EM needs hundreds (warm-up 100, averaged
  statistics from 300); correlated consecutive iterates leave the mean and covariance
  estimates consistent and only lower the effective sample size. ``--collect epoch`` gives
  SWAG's choice (the FA warm-up is then capped at a quarter of the iterates);
* weight decay: ``auto`` (default) picks one value per data set from ``WD_GRID`` by the
  validation RMSE of the SWA solution on a 10 % validation part of the first split's
  training rows (test rows never used); the UCI sets need 1e-4 .. 3e-3, diabetes 3e-2;
* methods, all on the same random 90/10 train/test splits: ``sgd`` (final iterate), ``swa``
  (mean of the SWAG-phase iterates), ``swag_diag`` (N(theta_SWA, diag var), S samples),
  ``swag_fa`` (one run's N(c, F F^T + diag psi), ``model.sample(S)``), ``ensemble`` (the R
  SGD solutions), ``multiswa`` (the R SWA solutions), ``multiswag_diag`` and ``multiswag_fa``
  (equal-weight mixture over the R runs' Gaussians, S samples per run). Single-run methods
  are scored for every run and averaged over the runs of a split;
* metrics in the original target units: RMSE of the predictive mean and the negative log
  density per test point of the predictive mixture (1/M) sum_m N(y | f_m(x), sigma_m^2),
  computed with log-sum-exp; mean +- standard error over splits, and the paired difference
  to plain SGD.

Noise variance: every parameter vector theta_m that enters a prediction gets the profile
maximum-likelihood noise variance sigma_m^2 = mean squared training residual of f_theta_m.
The weights are trained on the (scale-free) mean squared error plus weight decay, so the SGD
step does not scale with 1/sigma^2 (which makes a learned sigma^2 unstable on the low-noise
sets, e.g. yacht) and sigma^2 never enters theta or the FA. Training residuals are smaller
than test residuals, so every method's predictive is somewhat overconfident.

Diagnostics in ``results.json``: per run the trace of the FA covariance against the trace of
the iterates' sample covariance, the share of the iterates' variance that is a drift
(0 stationary, 0.75 a straight line), and for run 0 of split 0 the relative covariance
distance between the online FA and scikit-learn's batch FA on the same iterates.

    python experiments/multiswag_fa.py [--quick] [--data FILE.csv] [--out runs/multiswag_fa]
        [--runs 5] [--splits 5] [--rank 5] [--epochs 300] [--samples 30]
        [--fa-method em|sga] [--fa-variant default|thesis] [--collect batch|epoch]
        [--weight-decay auto|W]

Default data: scikit-learn's diabetes set (442 x 10, shipped with scikit-learn). ``--data``
reads a CSV whose last column is the target (a header line is allowed). Bad input ends in one
sentence on stderr and exit code 2. Writes ``results.csv`` (split, method, rmse, nll),
``summary.csv`` (mean and standard error per method), ``results.json`` (configuration,
per-split rows, summary, diagnostics, the OnlineFactorAnalysis version, runtime) and
``multiswag_fa.png``, and prints the summary table. ``--quick``: 1 split, 5 runs, 120
epochs, no batch-FA check (about 10 s on the 2-core machine).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _mlp_sgd import HIDDEN, train_runs  # noqa: E402
from _online_fa_common import atomic_savefig, atomic_write_text, mean_stderr, rows_to_csv  # noqa: E402

from latentzoo.cli import SentenceArgumentParser, fail  # noqa: E402

METHODS = ["sgd", "swa", "swag_diag", "swag_fa", "ensemble", "multiswa", "multiswag_diag", "multiswag_fa"]
SINGLE_RUN = {"sgd", "swa", "swag_diag", "swag_fa"}
MIN_ROWS = 20  # a 10 % test split must hold at least two points
PROG = "multiswag_fa"


class _InputError(ValueError):
    """Bad user input: reported as one sentence on stderr, exit code 2."""


def _fail(message: str) -> int:
    return fail(message, PROG)


# ---------------------------------------------------------------------------------- data
def load_data(path):
    """(X, y, name): the diabetes set by default, else a CSV with the target as last column."""
    if path is None:
        from sklearn.datasets import load_diabetes

        X, y = load_diabetes(return_X_y=True)
        return np.asarray(X, float), np.asarray(y, float), "diabetes"
    from latentzoo.data import load_matrix

    try:
        M = load_matrix(path)
    except ValueError as err:
        raise _InputError(str(err)) from None
    if M.shape[1] < 2:
        raise _InputError(
            f"{path} has {M.shape[1]} column(s); at least one input column and the target are needed.")
    if M.shape[0] < MIN_ROWS:
        raise _InputError(f"{path} has {M.shape[0]} data rows; at least {MIN_ROWS} are needed for 90/10 splits.")
    if np.ptp(M[:, -1]) == 0:
        raise _InputError(f"The target (last column) of {path} is constant.")
    name = os.path.splitext(os.path.basename(path))[0]
    return M[:, :-1], M[:, -1], name


def make_splits(n, n_splits, seed, test_frac=0.1):
    """Random train/test index pairs; split i uses seed + i, so splits are reproducible."""
    n_test = max(2, int(round(test_frac * n)))
    out = []
    for i in range(n_splits):
        perm = np.random.default_rng(seed + i).permutation(n)
        out.append((np.sort(perm[n_test:]), np.sort(perm[:n_test])))
    return out


def standardise(Xtr, ytr, Xte):
    mx, sx = Xtr.mean(0), Xtr.std(0)
    sx = np.where(sx > 0, sx, 1.0)  # a constant training column stays constant (zero)
    my, sy = float(ytr.mean()), float(ytr.std())
    if sy == 0:
        raise _InputError("The target is constant on a training split.")
    return (Xtr - mx) / sx, (ytr - my) / sy, (Xte - mx) / sx, my, sy


# ---------------------------------------------------------------------------------- scoring
def predictive_scores(mlp, thetas, Xtr, ytr, Xte, yte_orig, my, sy):
    """Equal mixture of N(f_m(x), sigma_m^2) over the rows theta_m of ``thetas`` (M, D).

    sigma_m^2 is the mean squared training residual of f_theta_m (profile ML). Returns
    (rmse, nll per test point) in original target units; non-finite thetas give nan.
    """
    from scipy.special import logsumexp

    thetas = np.atleast_2d(np.asarray(thetas, float))
    if not np.all(np.isfinite(thetas)):
        return float("nan"), float("nan")
    ptr, pte = mlp.predict(thetas, Xtr), mlp.predict(thetas, Xte)
    s2 = np.mean((ptr - ytr[None, :]) ** 2, axis=1)  # (M,) standardised units
    mu = pte * sy + my  # (M, n_test) original units
    var = (s2 * sy * sy)[:, None]
    logp = -0.5 * (np.log(2 * np.pi * var) + (yte_orig[None, :] - mu) ** 2 / var)
    nll = -(logsumexp(logp, axis=0) - np.log(thetas.shape[0]))
    rmse = float(np.sqrt(np.mean((mu.mean(0) - yte_orig) ** 2)))
    return rmse, float(np.mean(nll))


def fa_samples(fa, n, seed, notes, tag):
    """``fa.sample``; if psi has left the positive orthant (thesis variant, no floor) the
    draw is repeated with psi clipped at zero and a note is recorded."""
    with np.errstate(invalid="ignore"):
        S = fa.sample(n, random_state=seed)
    if np.all(np.isfinite(S)):
        return S
    psi = fa.noise_variance_
    notes.append(f"{tag}: {int(np.sum(~(psi >= 0)))} of {psi.size} noise variances negative or NaN; "
                 "sampled with psi clipped at 0")
    rng = np.random.default_rng(seed)
    c, Ft = fa.mean_, fa.components_
    h = rng.standard_normal((n, Ft.shape[0]))
    e = rng.standard_normal((n, c.size))
    return c + h @ Ft + e * np.sqrt(np.clip(np.nan_to_num(psi, nan=0.0), 0.0, None))


# ---------------------------------------------------------------------------------- experiment
WD_GRID = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1)


def select_weight_decay(Xtr, ytr, cfg, compiled, log):
    """Weight decay from ``WD_GRID`` by the validation RMSE of the SWA solution, on a random 10 %
    validation part of the first split's training rows (the test rows are never used); one
    vmapped run per grid value, same schedule as the experiment."""
    rng = np.random.default_rng(cfg["seed"] + 7919)
    perm = rng.permutation(len(ytr))
    n_val = max(2, int(round(0.1 * len(ytr))))
    va, tr = perm[:n_val], perm[n_val:]
    Xs, ys, Xv, my, sy = standardise(Xtr[tr], ytr[tr], Xtr[va])
    # pad to the experiment's training size so the compiled epoch is shared (rows >= len(tr)
    # are never indexed)
    Xs = np.concatenate([Xs, np.zeros((n_val, Xs.shape[1]))])
    ys = np.concatenate([ys, np.zeros(n_val)])
    acc = {"s": 0.0, "n": 0}

    def on_epoch(its):
        acc["s"] = acc["s"] + its.sum(1)
        acc["n"] += its.shape[1]

    _, mlp = train_runs(cfg["seed"] + 99, WD_GRID, Xs, ys, cfg, compiled, on_epoch, n_rows=len(tr))
    pv = mlp.predict(acc["s"] / acc["n"], Xv)  # SWA solutions
    rmse = np.sqrt(np.mean((pv * sy + my - ytr[va][None, :]) ** 2, axis=1))
    rmse = np.where(np.isfinite(rmse), rmse, np.inf)
    best = float(WD_GRID[int(np.argmin(rmse))])
    log("weight decay by validation RMSE of SWA: " + ", ".join(f"{w:g}: {r:.4g}" for w, r in zip(WD_GRID, rmse))
        + f" -> {best:g}")
    return best, {f"{w:g}": float(r) for w, r in zip(WD_GRID, rmse)}


def run_split(split, Xtr, ytr, Xte, yte, cfg, compiled, log):
    from latentzoo.inference.fa.online import OnlineFactorAnalysis

    Xs, ys, Xts, my, sy = standardise(Xtr, ytr, Xte)
    R, S = cfg["runs"], cfg["samples"]
    nb = Xs.shape[0] // cfg["batch_size"]
    D = (Xs.shape[1] + 2) * HIDDEN + 1
    per_epoch = nb if cfg["collect"] == "batch" else 1
    n_obs = per_epoch * cfg["swag_epochs"]
    warmup = int(min(cfg["fa_warmup"], n_obs // 4))
    fas = [
        OnlineFactorAnalysis(cfg["rank"], method=cfg["fa_method"], variant=cfg["fa_variant"], warmup=warmup,
                             learning_rate=cfg["fa_lr"], random_state=1000 * split + r + 1)
        for r in range(R)
    ]
    mom = {"s1": np.zeros((R, D)), "s2": np.zeros((R, D)), "first": np.zeros((R, D)), "t_fa": 0.0, "n": 0}
    keep = [] if (cfg["batch_fa_check"] and split == 0) else None  # run 0's iterates, for the check

    def on_epoch(its):
        if cfg["collect"] == "epoch":
            its = its[:, -1:, :]  # theta at the end of the epoch
        if mom["n"] < n_obs // 2:
            mom["first"] += its[:, : n_obs // 2 - mom["n"]].sum(1)
        mom["n"] += its.shape[1]
        mom["s1"] += its.sum(1)
        mom["s2"] += (its * its).sum(1)
        if keep is not None:
            keep.append(its[0].copy())
        tf = time.perf_counter()
        for r in range(R):
            fas[r].partial_fit(its[r])  # one epoch's iterates, in order
        mom["t_fa"] += time.perf_counter() - tf

    t0 = time.perf_counter()
    theta_sgd, mlp = train_runs(
        1000 * split + cfg["seed"], [cfg["weight_decay"]] * R, Xs, ys, cfg, compiled, on_epoch)
    t_train = time.perf_counter() - t0

    theta_swa = mom["s1"] / n_obs
    var_diag = np.clip(mom["s2"] / n_obs - theta_swa**2, 1e-30, None)  # SWAG's clamp
    notes = []
    rng = np.random.default_rng(10_000 + split)
    diag_draws = [theta_swa[r] + np.sqrt(var_diag[r]) * rng.standard_normal((S, D)) for r in range(R)]
    fa_draws = [fa_samples(fas[r], S, 20_000 + 1000 * split + r, notes, f"split {split} run {r}")
                for r in range(R)]

    score = lambda th: predictive_scores(mlp, th, Xs, ys, Xts, yte, my, sy)  # noqa: E731
    per_run = {m: [] for m in SINGLE_RUN}
    for r in range(R):
        per_run["sgd"].append(score(theta_sgd[r : r + 1]))
        per_run["swa"].append(score(theta_swa[r : r + 1]))
        per_run["swag_diag"].append(score(diag_draws[r]))
        per_run["swag_fa"].append(score(fa_draws[r]))
    res = {m: tuple(float(np.mean([v[i] for v in per_run[m]])) for i in (0, 1)) for m in SINGLE_RUN}
    res["ensemble"] = score(theta_sgd)
    res["multiswa"] = score(theta_swa)
    res["multiswag_diag"] = score(np.concatenate(diag_draws))
    res["multiswag_fa"] = score(np.concatenate(fa_draws))

    runs = []
    ptr_swa = mlp.predict(theta_swa, Xs)
    h = n_obs // 2
    mean_first = mom["first"] / h
    mean_second = (mom["s1"] - mom["first"]) / (n_obs - h)
    for r in range(R):
        c, Ft, psi = fas[r].mean_, fas[r].components_, fas[r].noise_variance_
        tr_f = float(np.sum(Ft * Ft))
        runs.append({
            "run": r,
            "iterate_variance_trace": float(var_diag[r].sum()),  # = trace of the iterates' covariance
            "fa_variance_trace": tr_f + float(np.sum(psi)),  # trace(F F^T + diag psi)
            "fa_factor_share": tr_f / (tr_f + float(np.sum(psi))),
            "fa_mean_minus_swa_max": float(np.max(np.abs(c - theta_swa[r]))),
            "fa_min_psi": float(np.min(psi)),
            # |mean(2nd half) - mean(1st half)|^2 / (4 trace Var): 0 for stationary iterates,
            # 0.75 for a straight-line drift
            "drift_share": float(np.sum((mean_second[r] - mean_first[r]) ** 2) / (4 * var_diag[r].sum())),
            "train_rmse_swa": float(np.sqrt(np.mean((np.asarray(ptr_swa[r]) - ys) ** 2)) * sy),
        })
    batch_check = None
    if keep is not None:
        batch_check = batch_fa_check(np.concatenate(keep), fas[0], cfg["rank"])
        runs[0].update(batch_check)
    ratio = np.median([d["fa_variance_trace"] / d["iterate_variance_trace"] for d in runs])
    drift = np.median([d["drift_share"] for d in runs])
    log(f"split {split}: D={D}, {n_obs} iterates/run (FA warm-up {warmup}), {t_train:.1f} s "
        f"(FA {mom['t_fa']:.1f} s), FA/iterate variance trace {ratio:.3g}, drift share {drift:.2f}"
        + (f", online vs batch FA covariance error {batch_check['fa_rel_error_vs_batch_fa']:.3g}"
           if batch_check else "")
        + "; "
        + ", ".join(f"{m} {res[m][0]:.4g}/{res[m][1]:.4g}" for m in METHODS))
    rows = [{"split": split, "method": m, "rmse": res[m][0], "nll": res[m][1]} for m in METHODS]
    return rows, {"split": split, "D": D, "n_iterates_per_run": n_obs, "fa_warmup": warmup,
                  "runs": runs, "notes": notes, "seconds": t_train, "seconds_fa": mom["t_fa"]}


def batch_fa_check(T, fa, K):
    """Relative Frobenius distance between the online FA covariance and scikit-learn's batch
    FA (randomized SVD) on the same iterates T (n, D) -- the accuracy of the streaming fit."""
    from sklearn.decomposition import FactorAnalysis

    t0 = time.perf_counter()
    sk = FactorAnalysis(K, svd_method="randomized", random_state=0).fit(T)
    C_batch = sk.get_covariance()
    C_online = fa.get_covariance()
    return {"fa_rel_error_vs_batch_fa": float(np.linalg.norm(C_online - C_batch) / np.linalg.norm(C_batch)),
            "batch_fa_variance_trace": float(np.trace(C_batch)),
            "batch_fa_seconds": time.perf_counter() - t0}


def fa_provenance():
    """Which OnlineFactorAnalysis produced the numbers: SHA-256 (first 12 hex digits) of the
    two module files and the git commit with a dirty flag for them (the FA internals change
    independently of this script)."""
    import hashlib
    import subprocess

    from latentzoo.inference.fa import online as online_fa
    from latentzoo.inference.fa import online_kernels as online_fa_kernels

    out = {}
    files = [online_fa.__file__, online_fa_kernels.__file__]
    for f in files:
        with open(f, "rb") as fh:
            out[os.path.basename(f) + "_sha256"] = hashlib.sha256(fh.read()).hexdigest()[:12]
    try:
        root = os.path.dirname(os.path.dirname(os.path.abspath(online_fa.__file__)))
        def git(*args):
            return subprocess.run(["git", "-C", root, *args], capture_output=True, text=True, timeout=10)

        out["git_commit"] = git("rev-parse", "--short", "HEAD").stdout.strip() or None
        out["fa_files_modified"] = bool(git("status", "--porcelain", "--", *files).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def summarise(rows):
    out = []
    for m in METHODS:
        sel = [r for r in rows if r["method"] == m]
        row = {"method": m}
        for metric in ("rmse", "nll"):
            row[f"{metric}_mean"], row[f"{metric}_se"], _ = mean_stderr([r[metric] for r in sel])
        # paired over splits: this method minus plain SGD (negative = better than SGD)
        for metric in ("rmse", "nll"):
            base = {r["split"]: r[metric] for r in rows if r["method"] == "sgd"}
            diffs = [r[metric] - base[r["split"]] for r in sel]
            row[f"{metric}_minus_sgd_mean"], row[f"{metric}_minus_sgd_se"], _ = mean_stderr(diffs)
        row["n_splits"] = len(sel)
        out.append(row)
    return out


def plot(summary, title, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    x = np.arange(len(summary))
    colours = ["tab:blue" if r["method"] in SINGLE_RUN else "tab:red" for r in summary]
    for ax, metric, label in ((axes[0], "rmse", "test RMSE"), (axes[1], "nll", "test NLL per point")):
        for i, r in enumerate(summary):
            ax.errorbar(i, r[f"{metric}_mean"], yerr=np.nan_to_num(r[f"{metric}_se"]), fmt="o",
                        color=colours[i], capsize=3)
        ax.set_xticks(x)
        ax.set_xticklabels([r["method"] for r in summary], rotation=35, ha="right")
        ax.set_ylabel(label + " (lower is better)")
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_title(f"{title}: single run (blue), R runs (red)", fontsize=9)
    axes[1].set_title("mean +- s.e. over splits", fontsize=9)
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)


def format_table(summary):
    lines = [f"{'method':<16} {'RMSE':>22} {'NLL':>22}"]
    for r in summary:
        lines.append(f"{r['method']:<16} {r['rmse_mean']:>12.4f} +- {r['rmse_se']:<7.4f} "
                     f"{r['nll_mean']:>12.4f} +- {r['nll_se']:<7.4f}")
    return "\n".join(lines)


def _positive(s):
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {s!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {s!r}")
    return v


def _weight_decay(s):
    if s == "auto":
        return s
    try:
        v = float(s)
    except ValueError:
        v = float("nan")
    if not (v >= 0 and np.isfinite(v)):
        raise argparse.ArgumentTypeError(f"must be 'auto' or a non-negative number, got {s!r}")
    return v


def _json_safe(obj):
    """NaN and infinity become null (strict JSON)."""
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    if isinstance(obj, float) and not np.isfinite(obj):
        return None
    return obj


def main(argv=None):
    ap = SentenceArgumentParser(prog=PROG, description="MultiSWAG with online factor analysis (thesis purpose)")
    ap.add_argument("--quick", action="store_true", help="1 split, 5 runs, 120 epochs (about 10 s)")
    ap.add_argument("--data", default=None, help="CSV, target in the last column (default: diabetes)")
    ap.add_argument("--out", default="runs/multiswag_fa")
    ap.add_argument("--runs", type=_positive, default=None, help="R, SGD runs per split (5)")
    ap.add_argument("--splits", type=_positive, default=None, help="random 90/10 splits (5)")
    ap.add_argument("--rank", type=_positive, default=5, help="K, FA factors (5)")
    ap.add_argument("--epochs", type=_positive, default=None, help="total SGD epochs (300)")
    ap.add_argument("--swag-epochs", type=_positive, default=None,
                    help="epochs of the SWAG phase, at the end (half of --epochs)")
    ap.add_argument("--samples", type=_positive, default=30, help="S, posterior draws per run (30)")
    ap.add_argument("--batch-size", type=_positive, default=32)
    ap.add_argument("--lr", type=float, default=0.05, help="pre-training learning rate (0.05)")
    ap.add_argument("--swag-lr", type=float, default=0.01, help="constant SWAG-phase learning rate (0.01)")
    ap.add_argument("--weight-decay", type=_weight_decay, default="auto",
                    help="a number, or 'auto': chosen per data set from %s by validation RMSE "
                         "on the first split's training rows (default)" % (WD_GRID,))
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--collect", choices=["batch", "epoch"], default="batch",
                    help="stream theta after every mini-batch step (default) or once per epoch")
    ap.add_argument("--fa-method", choices=["em", "sga"], default="em")
    ap.add_argument("--fa-variant", choices=["default", "thesis"], default="default")
    ap.add_argument("--fa-lr", type=float, default=1e-3, help="online SGA step size (1e-3)")
    ap.add_argument("--fa-warmup", type=int, default=100, help="FA warm-up (capped at a quarter of the iterates)")
    ap.add_argument("--no-batch-fa-check", action="store_true",
                    help="skip comparing run 0's online FA on split 0 with scikit-learn's batch FA "
                         "(always skipped with --quick)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)

    quick = dict(runs=5, splits=1, epochs=120)
    full = dict(runs=5, splits=5, epochs=300)
    base = quick if a.quick else full
    cfg = {k: getattr(a, k) if getattr(a, k) is not None else v for k, v in base.items()}
    cfg["swag_epochs"] = a.swag_epochs if a.swag_epochs is not None else cfg["epochs"] // 2
    cfg.update(rank=a.rank, samples=a.samples, batch_size=a.batch_size, lr=a.lr, swag_lr=a.swag_lr,
               weight_decay=a.weight_decay, momentum=a.momentum, collect=a.collect, fa_method=a.fa_method,
               fa_variant=a.fa_variant, fa_lr=a.fa_lr, fa_warmup=a.fa_warmup, seed=a.seed,
               hidden=HIDDEN, test_fraction=0.1, quick=bool(a.quick),
               batch_fa_check=not (a.quick or a.no_batch_fa_check))
    try:
        if cfg["swag_epochs"] >= cfg["epochs"] or cfg["swag_epochs"] < 2:
            raise _InputError(f"--swag-epochs must lie in [2, --epochs), got {cfg['swag_epochs']} "
                              f"with --epochs {cfg['epochs']}")
        for k in ("lr", "swag_lr", "fa_lr"):
            if not (getattr(a, k) > 0 and np.isfinite(getattr(a, k))):
                raise _InputError(f"--{k.replace('_', '-')} must be a positive number, got {getattr(a, k)}")
        if not (0 <= a.momentum < 1 and a.fa_warmup >= 0):
            raise _InputError("--fa-warmup must be non-negative and --momentum in [0, 1)")
        X, y, name = load_data(a.data)
        n_train = X.shape[0] - max(2, int(round(0.1 * X.shape[0])))
        if n_train < cfg["batch_size"]:
            raise _InputError(f"{n_train} training rows are fewer than --batch-size {cfg['batch_size']}")
        D = (X.shape[1] + 2) * HIDDEN + 1
        if cfg["rank"] >= D:
            raise _InputError(f"--rank {cfg['rank']} must be smaller than the {D} network parameters")
    except _InputError as err:  # messages may start with a file name: keep its case
        raise SystemExit(_fail(str(err).rstrip(".") + ".")) from None

    import latentzoo  # noqa: F401  (float64 on)

    t0 = time.perf_counter()
    print(f"{name}: {X.shape[0]} rows, {X.shape[1]} inputs; R={cfg['runs']} runs, {cfg['splits']} splits, "
          f"{cfg['epochs']} epochs ({cfg['swag_epochs']} SWAG), K={cfg['rank']}, "
          f"FA {cfg['fa_method']}/{cfg['fa_variant']}", flush=True)
    rows, diagnostics, compiled = [], [], {}
    log = lambda s: print(s, flush=True)  # noqa: E731
    splits = make_splits(X.shape[0], cfg["splits"], cfg["seed"])
    wd_validation = None
    if cfg["weight_decay"] == "auto":
        tr0 = splits[0][0]
        cfg["weight_decay"], wd_validation = select_weight_decay(X[tr0], y[tr0], cfg, compiled, log)
    for i, (tr, te) in enumerate(splits):
        r, d = run_split(i, X[tr], y[tr], X[te], y[te], cfg, compiled, log)
        rows += r
        diagnostics.append(d)
    summary = summarise(rows)
    runtime = time.perf_counter() - t0

    os.makedirs(a.out, exist_ok=True)
    atomic_write_text(os.path.join(a.out, "results.csv"), rows_to_csv(rows))
    atomic_write_text(os.path.join(a.out, "summary.csv"), rows_to_csv(summary))
    report = {"dataset": name, "n_rows": int(X.shape[0]), "n_inputs": int(X.shape[1]), "config": cfg,
              "methods": METHODS, "weight_decay_validation_rmse": wd_validation, "results": rows,
              "summary": summary, "diagnostics": diagnostics, "online_fa_version": fa_provenance(),
              "runtime_s": runtime}
    text = json.dumps(_json_safe(report), indent=1, allow_nan=False)
    atomic_write_text(os.path.join(a.out, "results.json"), text + "\n")
    plot(summary, name, os.path.join(a.out, "multiswag_fa.png"))
    print(f"\n{name}: test RMSE and NLL per point (original units), mean +- s.e. over {cfg['splits']} split(s)")
    print(format_table(summary))
    notes = [n for d in diagnostics for n in d["notes"]]
    for n in notes[:5]:
        print("note:", n)
    print(f"runtime {runtime:.1f} s; outputs in {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
