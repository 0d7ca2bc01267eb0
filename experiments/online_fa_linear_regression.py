"""Thesis ch. 6: online factor analysis of SGD iterates vs the exact linear-regression posterior.

A linear regression model is trained by mini-batch SGD; every weight vector after a mini-batch
update (one "iterate") is one observation for online FA models (thesis online EM, thesis online
SGA, our default online EM; K = 1, 2, 3). Every 10 epochs each fitted Gaussian
N(mean_, F F^T + diag psi) is compared with the exact posterior N(m, S) of eq. 2.13.

    python experiments/online_fa_linear_regression.py [--quick] [--data FILE.csv]
        [--out runs/online_fa_linear_regression] [--seeds 10] [--epochs 1000] [--lr LR]

``--quick``: 60 epochs, 2 seeds, K = 1, 2 (a smoke run of ~15-20 s on a 2-core machine).

Data
----
Default: scikit-learn's shipped diabetes set (``load_diabetes``, 442 x 10, no download).
``--data FILE.csv``: numeric CSV, target in the last column, optional header row (e.g. the UCI
Boston / Concrete / Energy / Yacht copies used in the thesis). Inputs *and* target are
standardised (mean 0, population s.d. 1) and a constant-1 input column is appended, so the
model has a bias and D = inputs + 1 weights. Bad input (missing file, non-numeric cell,
NaN/inf, constant column, too few rows or columns) prints one sentence to stderr and exits 2.

Posterior, SGD loss and learning rate (A, S, H, C, eps; thesis sec. 2.2, 6): see ``_linreg_sgd.py``.

What to expect: for linear regression C is close to proportional to H (homoscedastic
residuals), so the stationary covariance of *any* scalar-lr SGD is close to isotropic, whereas
S = A^-1 is dominated by the near-collinear input directions (small eigenvalues of A). No scalar
learning rate makes the iterates' covariance close to S in relative Frobenius norm when the
inputs are correlated (that needs the preconditioner of Mandt et al.'s Theorem 2); measured
after 1000 epochs the iterates' covariance is 0.98-1.00 away from S on all five data sets; along
S's leading eigenvector the iterates have 0.03-0.6% of the posterior variance, along its
trailing one 1.6-6 times as much. The baseline
row ``sgd_iterates_empirical`` (the mean and empirical covariance of all iterates fed to the FA
models) measures this gap; ``emp_rel_cov_dist`` measures, separately, how well each FA model
fits the iterates it was given.

FA models
---------
``OnlineFactorAnalysis(K, method, variant, warmup=100, learning_rate=1e-3, batch_size=32,
random_state=seed + 1)``: thesis_em (em/thesis), thesis_sga (sga/thesis), ours_em (em/default).
They receive nothing during the first 10 epochs; afterwards each epoch's iterates are passed
with one ``partial_fit`` call. The default variant updates once per 32 rows, so its rows are
passed in multiples of 32 and the remainder is carried to the next epoch (its updates then equal
one ``fit`` over the whole stream); the thesis variants take every epoch's rows as they come.
Reference ``batch_fa_sklearn`` (final epoch only): scikit-learn's batch maximum-likelihood
``FactorAnalysis`` of all iterates of the seed: the maximum-likelihood fit the online methods
approximate (an ML fit, not a Frobenius-optimal one, so it can be beaten on the distances).

Outputs (written atomically into --out)
---------------------------------------
``results.csv``: one row per dataset, seed, K, method, evaluation epoch with ``n_seen`` (iterates
the model has seen), ``rel_mean_dist`` = ||c - m|| / ||m||, ``rel_cov_dist`` =
||C_fa - S||_F / ||S||_F, ``wasserstein`` (2-Wasserstein between the Gaussians) and
``emp_rel_cov_dist`` = ||C_fa - C_emp||_F / ||C_emp||_F against the empirical covariance of the
same iterates (0 for the baseline). The ``sgd_iterates_empirical`` rows have K empty.
``summary.csv``: mean and standard error over seeds (long format, one row per metric).
``fig_linear_regression_posterior.png``: distances vs epoch (mean +- s.e.), one column per K.
``results.json``: configuration, data and posterior facts, the learning-rate numbers, the
final-epoch table, timings, and the commit plus sha256 of the online FA sources that ran. The
thesis' results section (6.2) is empty, so there are no published numbers to compare with.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _linreg_sgd import (  # noqa: E402
    ALPHA_SCALE,
    BATCH_SIZE,
    choose_learning_rate,
    epoch_keys,
    exact_posterior,
    init_weights,
    make_sgd,
)
from _online_fa_common import (  # noqa: E402
    _sqrtm_psd,
    atomic_savefig,
    atomic_write_text,
    mean_stderr,
    relative_covariance_distance,
    rows_to_csv,
    wasserstein2,
)

from latentzoo.cli import SentenceArgumentParser, fail  # noqa: E402

PROG = "online_fa_linear_regression"

WARMUP_EPOCHS = 10
EVAL_EVERY = 10
FA_WARMUP = 100
SGA_LR = 1e-3
METHODS = {  # name -> (method, variant)
    "thesis_em": ("em", "thesis"),
    "thesis_sga": ("sga", "thesis"),
    "ours_em": ("em", "default"),
}
BASELINE = "sgd_iterates_empirical"
BATCH = "batch_fa_sklearn"  # reference: batch ML FA of all iterates, final epoch only
METRICS = ("rel_mean_dist", "rel_cov_dist", "wasserstein", "emp_rel_cov_dist")
MIN_ROWS = 2 * BATCH_SIZE


class InputError(Exception):
    """Bad user input: reported as one sentence on stderr, exit status 2."""


# ----------------------------------------------------------------------------- data
def load_csv(path: str) -> tuple[np.ndarray, np.ndarray]:
    """Numeric CSV, target in the last column, optional header row -> (X (N, P), y (N,)).
    Parsing and validation are the package's own (``latentzoo.data.load_matrix``)."""
    from latentzoo.data import load_matrix

    try:
        M = load_matrix(path)
    except ValueError as err:
        raise InputError(str(err)) from None
    if M.shape[1] < 2:
        raise InputError(f"{path} has {M.shape[1]} column(s); at least one input column and the target are needed.")
    return M[:, :-1], M[:, -1]


def prepare(X: np.ndarray, y: np.ndarray, name: str, max_k: int) -> tuple[np.ndarray, np.ndarray]:
    """Check sizes, standardise inputs and target, append the bias column -> (X (N, D), y (N,))."""
    N, P = X.shape
    if P < max_k:
        raise InputError(
            f"{name}: {P} input column(s) plus a target is too few; K up to {max_k} factors needs at "
            f"least {max_k} input columns (D = inputs + bias > K)."
        )
    if N < MIN_ROWS:
        raise InputError(f"{name}: {N} rows is too few; at least {MIN_ROWS} (two mini-batches of {BATCH_SIZE}) needed.")
    sx, sy = X.std(axis=0), y.std()
    if np.any(sx == 0):
        raise InputError(f"{name}: input column {int(np.argmax(sx == 0)) + 1} is constant; drop it.")
    if sy == 0:
        raise InputError(f"{name}: the target (last column) is constant.")
    Xs = (X - X.mean(axis=0)) / sx
    ys = (y - y.mean()) / sy
    return np.hstack([Xs, np.ones((N, 1))]), ys


# ----------------------------------------------------------------------------- streaming statistics
class RunningMoments:
    """Running mean and covariance (ddof 0) of rows, shifted by the first row for accuracy."""

    def __init__(self, D):
        self.n, self.s, self.Q, self.ref = 0, np.zeros(D), np.zeros((D, D)), None

    def add(self, X, sign=1):
        if X.shape[0] == 0:
            return
        if self.ref is None:
            self.ref = X[0].copy()
        Z = X - self.ref
        self.n += sign * X.shape[0]
        self.s += sign * Z.sum(axis=0)
        self.Q += sign * Z.T @ Z

    def mean_cov(self):
        mu = self.s / self.n
        return self.ref + mu, self.Q / self.n - np.outer(mu, mu)

    def copy(self):
        c = RunningMoments(self.s.size)
        c.n, c.s, c.Q, c.ref = self.n, self.s.copy(), self.Q.copy(), self.ref
        return c


class Feeder:
    """One online FA model and the rows it has not been given yet (default variant: multiples of
    the batch size only, so that its updates equal one ``fit`` over the stream)."""

    def __init__(self, model, multiple):
        self.model, self.multiple, self.carry = model, multiple, None

    def feed(self, rows):
        if self.carry is not None and self.carry.shape[0]:
            rows = np.vstack([self.carry, rows])
        n = rows.shape[0] - rows.shape[0] % self.multiple
        self.carry = rows[n:]
        if n:
            self.model.partial_fit(rows[:n])


def batch_fa_covariance(C, K, seed, tol=1e-5):
    """Covariance of scikit-learn's batch maximum-likelihood FA of rows whose covariance is C.

    The FA likelihood depends on the rows only through their mean and covariance, so the fit
    uses 2D pseudo-rows +-sqrt(D) C^(1/2) (mean 0, covariance exactly C) instead of all iterates.
    """
    import warnings

    from sklearn.decomposition import FactorAnalysis
    from sklearn.exceptions import ConvergenceWarning

    D = C.shape[0]
    R = _sqrtm_psd(C)
    Z = np.sqrt(D) * np.vstack([R, -R])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        fa = FactorAnalysis(K, svd_method="lapack", tol=tol, max_iter=20000, random_state=seed).fit(Z)
    return fa.get_covariance()


def distances(mu, C, post, rS, emp_cov):
    ok = bool(np.all(np.isfinite(C)) and np.all(np.isfinite(mu)))
    if not ok:
        return {k: float("nan") for k in METRICS}
    m, S = post["m"], post["S"]
    return {
        "rel_mean_dist": float(np.linalg.norm(mu - m) / np.linalg.norm(m)),
        "rel_cov_dist": relative_covariance_distance(C, S),
        "wasserstein": wasserstein2(m, S, mu, C, sqrt_C1=rS),
        "emp_rel_cov_dist": relative_covariance_distance(C, emp_cov),
    }


# ----------------------------------------------------------------------------- experiment
def run(name, X, y, seeds, n_epochs, ks, lr=None, log=print):
    import latentzoo  # noqa: F401

    from latentzoo.inference.fa.online import OnlineFactorAnalysis

    prov = provenance()
    t_start = time.perf_counter()
    N, D = X.shape
    post = exact_posterior(X, y)
    lr_info = choose_learning_rate(X, y, post)
    if lr is not None:
        lr_info["lr_chosen"] = lr_info["lr"]
        lr_info["lr"] = float(lr)
    eps = lr_info["lr"]
    rS = _sqrtm_psd(post["S"])
    sgd, nb = make_sgd(X, y, post["alpha"], post["beta"], eps)
    seeds = list(seeds)
    theta = init_weights(seeds, D)
    keys = epoch_keys(seeds, n_epochs)

    feeders = {
        (s, K, meth): Feeder(
            OnlineFactorAnalysis(K, method=mv[0], variant=mv[1], warmup=FA_WARMUP, learning_rate=SGA_LR,
                                 batch_size=BATCH_SIZE, random_state=s + 1),
            BATCH_SIZE if mv[1] == "default" else 1,
        )
        for s in seeds for K in ks for meth, mv in METHODS.items()
    }
    moments = {s: RunningMoments(D) for s in seeds}
    eval_epochs = [e for e in range(WARMUP_EPOCHS + EVAL_EVERY, n_epochs + 1, EVAL_EVERY)]
    if n_epochs > WARMUP_EPOCHS and (not eval_epochs or eval_epochs[-1] != n_epochs):
        eval_epochs.append(n_epochs)
    rows = []
    t_sgd = t_fa = t_eval = 0.0
    done = 0
    bounds = [WARMUP_EPOCHS] + eval_epochs if n_epochs > WARMUP_EPOCHS else [n_epochs]
    for e_end in bounds:  # SGD one block of epochs at a time (bounded memory), then feed and evaluate
        t0 = time.perf_counter()
        theta_j, its = sgd(theta, keys[:, done:e_end])
        its = np.asarray(its)  # (S, E_block, nb, D)
        theta = np.asarray(theta_j)
        t_sgd += time.perf_counter() - t0
        if not np.all(np.isfinite(its)):
            raise InputError(f"{name}: SGD diverged with lr={eps:.4g}; use a smaller --lr.")
        done = e_end
        if e_end <= WARMUP_EPOCHS:
            continue
        t0 = time.perf_counter()
        for si, s in enumerate(seeds):
            for ei in range(its.shape[1]):
                chunk = its[si, ei]
                moments[s].add(chunk)
                for K in ks:
                    for meth in METHODS:
                        feeders[(s, K, meth)].feed(chunk)
        t_fa += time.perf_counter() - t0
        t0 = time.perf_counter()
        for s in seeds:
            mom = moments[s]
            mu_e, C_e = mom.mean_cov()
            base = {"dataset": name, "seed": s, "K": "", "method": BASELINE, "epoch": e_end, "n_seen": mom.n}
            rows.append({**base, **distances(mu_e, C_e, post, rS, C_e)})
            for K in ks:
                for meth in METHODS:
                    fd = feeders[(s, K, meth)]
                    if fd.carry is not None and fd.carry.shape[0]:
                        ref = mom.copy()
                        ref.add(fd.carry, sign=-1)
                        C_ref = ref.mean_cov()[1]
                    else:
                        C_ref = C_e
                    fa = fd.model
                    if not hasattr(fa, "n_samples_seen_"):
                        continue
                    with np.errstate(all="ignore"):
                        d = distances(fa.mean_, fa.get_covariance(), post, rS, C_ref)
                    rows.append({"dataset": name, "seed": s, "K": K, "method": meth, "epoch": e_end,
                                 "n_seen": int(fa.n_samples_seen_), **d})
        if e_end == eval_epochs[-1]:
            for s in seeds:
                mu_e, C_e = moments[s].mean_cov()
                for K in ks:
                    C_b = batch_fa_covariance(C_e, K, s + 1)
                    rows.append({"dataset": name, "seed": s, "K": K, "method": BATCH, "epoch": e_end,
                                 "n_seen": moments[s].n, **distances(mu_e, C_b, post, rS, C_e)})
        t_eval += time.perf_counter() - t0
        if e_end % 100 == 0 or e_end == n_epochs:
            last = [r for r in rows if r["epoch"] == e_end and r["method"] == BASELINE]
            log(f"{name}: epoch {e_end}/{n_epochs}, iterates' rel cov dist "
                f"{np.mean([r['rel_cov_dist'] for r in last]):.3f} ({time.perf_counter() - t_start:.1f} s)")
    info = {
        "dataset": name, "n_rows": int(N), "n_weights": int(D), "n_inputs": int(D - 1),
        "updates_per_epoch": int(nb), "alpha": post["alpha"], "beta": post["beta"],
        "lambda": post["alpha"] / post["beta"],
        "posterior_mean_norm": float(np.linalg.norm(post["m"])),
        "posterior_cov_fro_norm": float(np.linalg.norm(post["S"])),
        "posterior_cov_eigenvalues": [float(v) for v in np.linalg.eigvalsh(post["S"])[::-1]],
        **lr_info,
        "seconds": {"total": time.perf_counter() - t_start, "sgd": t_sgd, "fa_partial_fit": t_fa,
                    "evaluation": t_eval},
        "provenance": prov,
    }
    return rows, info


def summarise(rows):
    out = []
    groups = {}
    for r in rows:
        groups.setdefault((r["dataset"], str(r["K"]), r["method"], r["epoch"]), []).append(r)
    order = {m: i for i, m in enumerate([BASELINE, *METHODS, BATCH])}
    for (ds, K, meth, ep) in sorted(groups, key=lambda k: (k[0], k[1], order[k[2]], k[3])):
        sel = groups[(ds, K, meth, ep)]
        for metric in METRICS:
            mean, se, n_finite = mean_stderr([r[metric] for r in sel])
            out.append({"dataset": ds, "K": K, "method": meth, "epoch": ep, "metric": metric,
                        "mean": mean, "stderr": se, "n_finite": n_finite, "n": len(sel)})
    return out


def plot(summary, name, ks, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("rel_mean_dist", "||mean - m|| / ||m||"), ("rel_cov_dist", "||C - S||_F / ||S||_F"),
              ("emp_rel_cov_dist", "||C - C_iterates||_F / ||C_iterates||_F")]
    colors = {BASELINE: "k", "thesis_em": "tab:orange", "thesis_sga": "tab:green", "ours_em": "tab:blue",
              BATCH: "tab:red"}
    fig, axes = plt.subplots(len(panels), len(ks), figsize=(4.6 * len(ks), 3.0 * len(panels)), squeeze=False)
    for j, K in enumerate(ks):
        for i, (metric, label) in enumerate(panels):
            ax = axes[i][j]
            for meth in [BASELINE, *METHODS, BATCH]:
                if metric == "emp_rel_cov_dist" and meth == BASELINE:
                    continue
                kk = "" if meth == BASELINE else str(K)
                sel = [r for r in summary if r["dataset"] == name and r["K"] == kk and r["method"] == meth
                       and r["metric"] == metric and np.isfinite(r["mean"])]
                if not sel:
                    continue
                ep = np.array([r["epoch"] for r in sel])
                mu = np.array([r["mean"] for r in sel])
                se = np.nan_to_num(np.array([r["stderr"] for r in sel]))
                if meth == BATCH:  # final epoch only
                    ax.errorbar(ep, mu, yerr=se, fmt="*", color=colors[meth], ms=8, label=meth)
                    continue
                ls = "--" if meth == BASELINE else "-"
                ax.plot(ep, mu, ls, color=colors[meth], label=meth, lw=1.2)
                ax.fill_between(ep, np.maximum(mu - se, mu * 1e-3), mu + se, color=colors[meth], alpha=0.2)
            ax.set_yscale("log")
            ax.set_xlabel("epoch")
            ax.set_ylabel(label, fontsize=8)
            if i == 0:
                ax.set_title(f"{name}: K={K}")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)


def final_table(summary, name, ks, epoch):
    out = []
    for K in ["", *[str(k) for k in ks]]:
        for meth in [BASELINE, *METHODS, BATCH]:
            if (K == "") != (meth == BASELINE):
                continue
            row = {"dataset": name, "K": K, "method": meth, "epoch": epoch}
            for metric in METRICS:
                sel = [r for r in summary if r["dataset"] == name and r["K"] == K and r["method"] == meth
                       and r["epoch"] == epoch and r["metric"] == metric]
                if sel:
                    row[metric] = {"mean": sel[0]["mean"], "stderr": sel[0]["stderr"],
                                   "n_finite": sel[0]["n_finite"], "n": sel[0]["n"]}
            out.append(row)
    return out


def format_table(table):
    lines = [f"{'K':>2} {'method':>24} " + " ".join(f"{m:>22}" for m in METRICS)]
    for r in table:
        cells = []
        for m in METRICS:
            c = r.get(m)
            if c is None or not np.isfinite(c["mean"]):
                cells.append(f"{'n/a':>22}")
                continue
            txt = f"{c['mean']:.4g}+-{c['stderr']:.2g}"
            if c["n_finite"] < c["n"]:
                txt += f" ({c['n_finite']}/{c['n']})"
            cells.append(f"{txt:>22}")
        lines.append(f"{r['K'] or '-':>2} {r['method']:>24} " + " ".join(cells))
    return "\n".join(lines)


def provenance():
    """Commit of the working tree, and path and sha256 of the online FA sources, read when the
    run starts (right after import; the files may carry uncommitted changes)."""
    import hashlib
    import subprocess

    from latentzoo.inference.fa import online as online_fa
    from latentzoo.inference.fa import online_kernels as online_fa_kernels

    out = {"online_fa_path": os.path.dirname(os.path.abspath(online_fa.__file__))}
    try:
        out["git_commit"] = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=os.path.dirname(os.path.abspath(__file__)),
            capture_output=True, text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        out["git_commit"] = None
    for mod in (online_fa, online_fa_kernels):
        with open(mod.__file__, "rb") as fh:
            out[f"sha256_{os.path.basename(mod.__file__)}"] = hashlib.sha256(fh.read()).hexdigest()
    return out


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    raise TypeError(type(o))


def main(argv=None):
    ap = SentenceArgumentParser(
        prog=PROG, description="Thesis ch. 6: online FA of SGD iterates vs the linear-regression posterior")
    ap.add_argument("--quick", action="store_true", help="60 epochs, 2 seeds, K=1,2 (a smoke run)")
    ap.add_argument("--data", default=None, help="CSV file, target in the last column (default: sklearn diabetes)")
    ap.add_argument("--out", default="runs/online_fa_linear_regression")
    ap.add_argument("--seeds", type=int, default=None, help="number of seeds (default 10; --quick 2)")
    ap.add_argument("--epochs", type=int, default=None, help="SGD epochs (default 1000; --quick 60)")
    ap.add_argument("--lr", type=float, default=None, help="override the derived SGD learning rate")
    a = ap.parse_args(argv)
    seeds = a.seeds if a.seeds is not None else (2 if a.quick else 10)
    n_epochs = a.epochs if a.epochs is not None else (60 if a.quick else 1000)
    ks = [1, 2] if a.quick else [1, 2, 3]
    try:
        if seeds < 2:
            raise InputError(f"--seeds must be at least 2 (standard errors over seeds), got {seeds}.")
        if n_epochs <= WARMUP_EPOCHS:
            raise InputError(f"--epochs must exceed the {WARMUP_EPOCHS} warm-up epochs, got {n_epochs}.")
        if a.lr is not None and not (a.lr > 0 and np.isfinite(a.lr)):
            raise InputError(f"--lr must be a positive number, got {a.lr}.")
        if a.data is None:
            from sklearn.datasets import load_diabetes

            name = "diabetes"
            X_raw, y_raw = load_diabetes(return_X_y=True)
        else:
            name = os.path.splitext(os.path.basename(a.data))[0] or "data"
            X_raw, y_raw = load_csv(a.data)
            if X_raw.ndim != 2 or X_raw.shape[0] == 0:
                raise InputError(f"{a.data!r} has no data rows.")
        X, y = prepare(np.asarray(X_raw, float), np.asarray(y_raw, float), name, max(ks))
    except InputError as exc:
        raise SystemExit(fail(str(exc), PROG)) from None

    t0 = time.perf_counter()
    try:
        rows, info = run(name, X, y, range(seeds), n_epochs, ks, lr=a.lr)
    except InputError as exc:
        raise SystemExit(fail(str(exc), PROG)) from None
    summary = summarise(rows)
    last = max(r["epoch"] for r in rows)
    table = final_table(summary, name, ks, last)
    runtime = time.perf_counter() - t0
    os.makedirs(a.out, exist_ok=True)
    atomic_write_text(os.path.join(a.out, "results.csv"), rows_to_csv(rows))
    atomic_write_text(os.path.join(a.out, "summary.csv"), rows_to_csv(summary))
    plot(summary, name, ks, os.path.join(a.out, "fig_linear_regression_posterior.png"))
    record = {
        "experiment": "online_fa_linear_regression (thesis ch. 6)",
        "config": {"data": a.data or "sklearn.datasets.load_diabetes", "seeds": seeds, "epochs": n_epochs,
                   "ks": ks, "methods": {k: {"method": v[0], "variant": v[1]} for k, v in METHODS.items()},
                   "batch_size": BATCH_SIZE, "warmup_epochs": WARMUP_EPOCHS, "eval_every_epochs": EVAL_EVERY,
                   "fa_warmup": FA_WARMUP, "sga_learning_rate": SGA_LR, "alpha_scale": ALPHA_SCALE,
                   "quick": bool(a.quick), "lr_override": a.lr},
        "data": info,
        "final_epoch": last,
        "final_table": table,
        "runtime_seconds": runtime,
        "provenance": info.pop("provenance"),
    }
    atomic_write_text(os.path.join(a.out, "results.json"), json.dumps(record, indent=1, default=_json_default) + "\n")
    print(f"\n{name}: N={info['n_rows']}, D={info['n_weights']} weights (incl. bias), lr={info['lr']:.4g} "
          f"(Mandt continuous-time {info['lr_mandt_continuous']:.4g}, "
          f"stability limit {info['lr_stability_limit']:.4g}); "
          f"predicted stationary rel cov dist {info['predicted_rel_cov_dist_at_lr']:.3f}")
    print(f"distances at epoch {last} (mean +- s.e. over {seeds} seeds; K '-' = the SGD iterates themselves)")
    print(format_table(table))
    print(f"runtime {runtime:.1f} s; outputs in {a.out}")
    return record


if __name__ == "__main__":
    main()
