"""Benchmark: FA Gibbs at gene-expression shape (72 x 7129, K = 3) through the command line's runner.

Each case runs ``latentzoo run fa`` (:func:`latentzoo.cli.main`: load, validate, the family's
Gibbs runner, the finite check, ``write_run``) in a fresh interpreter, so that its peak resident
memory (``resource.getrusage``) is its own. Reported per case: the fit (``runs.run_mcmc``:
compilation, warm-up and sampling, checkpoints included), the time after the fit (pointwise
log-likelihood of the stored draws, InferenceData, summary, posterior.nc, trace plot) and its
ratio to the fit, peak RSS, the size of posterior.nc and the number of stored draws. The time
before the fit (imports, reading the data) is recorded in the JSON as ``setup_s``.

Cases: ``high-dim`` (synthetic FA data, N = 72, D = 7129, K = 3, seed 0) and ``default`` (the
command's default data, N = 500, D = 20). A third measurement is the baseline of the
log-likelihood: one draw's pointwise marginal log-likelihood at 72 x 7129 by the Woodbury
identity (what the runner uses) against a dense Gaussian (Cholesky of the D x D covariance).

    python experiments/bench_fa_high_dim.py [--quick] [--samples S] [--warmup W] [--chains C]
                                            [--cases high-dim,default] [--json OUT] [--merge]

Default sizes are the command's (4 chains x 4000 draws + 1000 warm-up); ``--quick`` uses its
``--quick`` sizes (4 x 1000 + 300) for the default case and 4 x 200 + 100 for high-dim.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
N_HD, D_HD, K_HD = 72, 7129, 3
DEFAULT_JSON = os.path.join(HERE, "results", "bench_fa_high_dim.json")


# ------------------------------------------------------------------------------ one case
def run_case(case: str, sizes: dict, workdir: str) -> dict:
    """Run ``latentzoo run fa`` for ``case`` in this interpreter; return its measurements."""
    import contextlib
    import io

    import numpy as np

    import latentzoo  # noqa: F401
    from latentzoo import runs
    from latentzoo.cli import main
    from latentzoo.models.factor_analysis import default_fa_data

    argv = ["run", "fa", "--no-progress", "--out", os.path.join(workdir, case)]
    for name in ("chains", "samples", "warmup"):
        argv += [f"--{name}", str(sizes[name])]
    if case == "high-dim":
        path = os.path.join(workdir, "hd.npy")
        np.save(path, default_fa_data(0, N=N_HD, D=D_HD, K=K_HD))
        argv += ["--data", path, "--K", str(K_HD)]

    fit = {}
    plain = runs.run_mcmc

    def timed_run_mcmc(*args, **kwargs):  # the runner calls runs.run_mcmc: time just the fit
        fit["start"] = time.perf_counter()
        out = plain(*args, **kwargs)
        fit["s"] = time.perf_counter() - fit["start"]
        fit["rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        return out

    runs.run_mcmc = timed_run_mcmc
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    total = time.perf_counter() - t0
    setup = fit["start"] - t0  # imports of the families, reading and checking the data
    if code != 0:
        raise RuntimeError(f"latentzoo run failed with status {code}")
    from latentzoo import arviz_adapter as azx

    nc = os.path.join(workdir, case, "posterior.nc")
    idata = azx.load(nc)
    post = idata.posterior
    return {
        "case": case,
        "shape": [N_HD, D_HD] if case == "high-dim" else [500, 20],
        **sizes,
        "setup_s": setup,
        "fit_s": fit["s"],
        "post_fit_s": total - setup - fit["s"],
        "post_over_fit": (total - setup - fit["s"]) / fit["s"],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "peak_rss_by_end_of_fit_mb": fit["rss"],
        "posterior_nc_mb": os.path.getsize(nc) / 2**20,
        "stored_draws": int(post.sizes["chain"] * post.sizes["draw"]),
        "posterior_sites": sorted(str(v) for v in post.data_vars),
    }


def loglik_baseline() -> dict:
    """Seconds for one draw's pointwise log-likelihood at 72 x 7129: Woodbury (best of 5) vs
    dense (one call after the compiling one: it takes seconds)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import latentzoo  # noqa: F401
    from latentzoo.models.factor_analysis import default_fa_data, marginal_log_likelihood

    rng = np.random.default_rng(1)
    X = jnp.asarray(default_fa_data(0, N=N_HD, D=D_HD, K=K_HD))
    W = jnp.asarray(rng.normal(size=(D_HD, K_HD)))
    mu = jnp.asarray(rng.normal(size=D_HD))
    psi = jnp.asarray(rng.uniform(0.5, 2.0, size=D_HD))

    def dense(X, W, mu, psi):
        cov = W @ W.T + jnp.diag(1.0 / psi)
        L = jnp.linalg.cholesky(cov)
        U = jax.scipy.linalg.solve_triangular(L, (X - mu).T, lower=True)
        logdet = 2.0 * jnp.sum(jnp.log(jnp.diag(L)))
        return -0.5 * (jnp.sum(U * U, 0) + logdet + D_HD * jnp.log(2.0 * jnp.pi))

    woodbury = jax.jit(lambda *a: marginal_log_likelihood(*a, per_row=True))
    dense = jax.jit(dense)
    out = {}
    for name, fn, repeats in (("woodbury", woodbury, 5), ("dense", dense, 1)):
        ll = jax.block_until_ready(fn(X, W, mu, psi))  # compile
        best = np.inf
        for _ in range(repeats):
            t0 = time.perf_counter()
            ll = jax.block_until_ready(fn(X, W, mu, psi))
            best = min(best, time.perf_counter() - t0)
        out[name] = (best, np.asarray(ll))
    return {
        "woodbury_s": out["woodbury"][0],
        "dense_s": out["dense"][0],
        "dense_over_woodbury": out["dense"][0] / out["woodbury"][0],
        "max_abs_difference": float(np.max(np.abs(out["woodbury"][1] - out["dense"][1]))),
    }


# ------------------------------------------------------------------------------ driver
def _worker(args) -> int:
    sizes = dict(chains=args.chains, samples=args.samples, warmup=args.warmup)
    with tempfile.TemporaryDirectory() as workdir:
        result = loglik_baseline() if args.worker == "loglik" else run_case(args.worker, sizes, workdir)
    print(json.dumps(result))
    return 0


def _in_subprocess(case: str, sizes: dict) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", case]
    for name, value in sizes.items():
        cmd += [f"--{name}", str(value)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"bench_fa_high_dim: case {case} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _sizes(args, case):
    quick = {"default": dict(chains=4, samples=1000, warmup=300),
             "high-dim": dict(chains=4, samples=200, warmup=100)}[case]  # fmt: skip
    base = quick if args.quick else dict(chains=4, samples=4000, warmup=1000)
    given = {k: getattr(args, k) for k in base if getattr(args, k) is not None}
    return {**base, **given}


def table(results, baseline) -> str:
    head = ("case", "N x D", "chains x draws (+warm-up)", "fit s", "post-fit s", "post/fit",
            "peak RSS MB", "posterior.nc MB", "stored draws")
    rows = [head]
    for r in results:
        rows.append((r["case"], f"{r['shape'][0]} x {r['shape'][1]}",
                     f"{r['chains']} x {r['samples']} (+{r['warmup']})", f"{r['fit_s']:.1f}",
                     f"{r['post_fit_s']:.1f}", f"{r['post_over_fit']:.3f}", f"{r['peak_rss_mb']:.0f}",
                     f"{r['posterior_nc_mb']:.1f}", str(r["stored_draws"])))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if baseline:
        lines.append("")
        lines.append(
            f"log-likelihood of one draw at {N_HD} x {D_HD}: Woodbury {baseline['woodbury_s'] * 1e3:.2f} ms, "
            f"dense {baseline['dense_s'] * 1e3:.0f} ms (ratio {baseline['dense_over_woodbury']:.0f}), "
            f"largest difference {baseline['max_abs_difference']:.1e}"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    from latentzoo.cli import SentenceArgumentParser

    p = SentenceArgumentParser(prog="bench_fa_high_dim", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="short chains (about 2 minutes in all)")
    p.add_argument("--chains", type=int)
    p.add_argument("--samples", type=int)
    p.add_argument("--warmup", type=int)
    p.add_argument("--cases", default="high-dim,default,loglik",
                   help="comma-separated: high-dim, default, loglik (the log-likelihood baseline)")
    p.add_argument("--json", default=None, help=f"output JSON (default {DEFAULT_JSON}; not with --quick)")
    p.add_argument("--merge", action="store_true",
                   help="keep the other cases already in the JSON (run the cases in separate calls)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return _worker(args)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in ("high-dim", "default", "loglik")]
    if unknown:
        p.error(f"unknown case {unknown[0]!r}; choose high-dim, default or loglik")
    results = [_in_subprocess(case, _sizes(args, case)) for case in cases if case != "loglik"]
    baseline = _in_subprocess("loglik", {}) if "loglik" in cases else None
    print(table(results, baseline))
    path = args.json or (None if args.quick else DEFAULT_JSON)
    if path:
        from latentzoo.results import atomic_write_text

        for r in results:
            r["load_average_1min_after"] = os.getloadavg()[0]  # the machine is shared: say how busy
        if args.merge and os.path.exists(path):
            with open(path) as fh:
                old = json.load(fh)
            results = [r for r in old["cases"] if r["case"] not in cases] + results
            baseline = baseline or old.get("loglik_baseline")
        record = {"cases": results, "loglik_baseline": baseline, "cpu_count": os.cpu_count()}
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        atomic_write_text(path, json.dumps(record, indent=2) + "\n")
        print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
