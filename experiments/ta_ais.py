"""AIS on a tensor analyzer TA{2,2,2} against the quadrature oracle and the prior-sampling
estimator (the tensor-analysers supplement's Fig. 3, right panel).

The supplement runs AIS with M = 10 chains and a growing number of intermediate distributions K
on a small TA{2,2,2} and reports that the spread of the estimated average log-likelihood per data
point falls below 0.1 nats from K = 500 on, with 100,000 prior samples as the reference. Here the
TA's parameters are drawn at random (additive loadings of scale 0.5, multiplicative 1, noise s.d.
``--noise``; the supplement's were trained on its 2-D data, which it does not give), the data are
``--rows`` draws from it, and the reference is the quadrature oracle
(:func:`latentzoo.inference.ta.oracle.ta_oracle_log_marginal`: z_1 integrated out exactly, z_2
by composite Gauss-Legendre, converged to 1e-7 nats). For each K, AIS runs ``--repeats`` times
with M = 10 chains on every row (:func:`latentzoo.inference.ais.ais` with ``per_row=True``, the
TA's full Gibbs table honouring the temperature); each repeat gives one average per data point.
The prior-sampling estimator (:func:`latentzoo.inference.ais.prior_sampling_log_marginal`) uses
``--prior-samples`` draws per row.

Prints a table per noise level; writes ``ta_ais.json``, ``ta_ais.csv`` (one line per noise, K
and repeat) and ``ta_ais.png`` under ``--out``.

    python experiments/ta_ais.py [--quick] [--out DIR] [--noise 0.2 0.1] [--rows 100]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import latentzoo  # noqa: E402,F401  (float64)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from _binary_common import save_figure, usage_error, write_csv, write_json  # noqa: E402
from latentzoo.inference.ais import (  # noqa: E402
    ais,
    log_mean_exp_with_stderr,
    prior_sampling_log_marginal,
)
from latentzoo.inference.ta import ta_updates  # noqa: E402
from latentzoo.inference.ta.oracle import ta_oracle_log_marginal  # noqa: E402
from latentzoo.models.tensor_analyzer import random_ta_parameters, sample_ta, tensor_analyzer  # noqa: E402

d = (2, 2)
D = 2
M = 10  # chains per AIS run, as the supplement
LATENTS = ("z_1", "z_2")


def fail(message: str) -> None:
    usage_error("ta_ais", message)


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="few rows, temperatures and repeats (CI)")
    ap.add_argument("--out", default=None, help="output folder (default experiments/results; "
                    "with --quick runs/ta_ais_quick)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--noise", type=float, nargs="+", default=None,
                    help="noise s.d. of the TA, one run each (default 0.2 0.1; quick 0.2)")
    ap.add_argument("--rows", type=int, default=None, help="data points (default 100; quick 5)")
    ap.add_argument("--repeats", type=int, default=None, help="AIS runs per K (default 10; quick 2)")
    ap.add_argument("--temps", type=int, nargs="+", default=None,
                    help="numbers of intermediate distributions K (default 10 50 100 500 1000)")
    ap.add_argument("--prior-samples", type=int, default=None,
                    help="prior draws per row for the simple estimator (default 100000; quick 10000)")
    args = ap.parse_args(argv)
    q = args.quick
    args.out = args.out or ("runs/ta_ais_quick" if q else "experiments/results")
    args.noise = args.noise or ([0.2] if q else [0.2, 0.1])
    args.rows = args.rows if args.rows is not None else (5 if q else 100)
    args.repeats = args.repeats if args.repeats is not None else (2 if q else 10)
    args.temps = args.temps or ([10, 100] if q else [10, 50, 100, 500, 1000])
    args.prior_samples = args.prior_samples if args.prior_samples is not None else (10_000 if q else 100_000)
    if any(not np.isfinite(s) or s <= 0 for s in args.noise):
        fail("--noise must be positive noise standard deviations.")
    for name, v, least in (("--rows", args.rows, 1), ("--repeats", args.repeats, 2),
                           ("--prior-samples", args.prior_samples, 2)):
        if v < least:
            fail(f"{name} must be at least {least}, got {v}.")
    if any(k < 2 for k in args.temps):
        fail("--temps must be numbers of distributions of at least 2.")
    return args


def problem(seed: int, noise: float, rows: int):
    rng = np.random.default_rng(seed)
    p = random_ta_parameters(rng, D, d, noise=noise, additive=0.5, multiplicative=1.0)
    X, _ = sample_ta(rng, p, rows, d)
    return jnp.asarray(X), {k: jnp.asarray(v) for k, v in p.items()}


def run_noise(args, noise: float, key):
    X, p = problem(args.seed, noise, args.rows)
    N = X.shape[0]
    t = time.perf_counter()
    exact_rows = np.asarray(ta_oracle_log_marginal(X, p["W"], p["T"], p["mu"], p["Psi"], per_row=True))
    t_oracle = time.perf_counter() - t
    exact = float(exact_rows.mean())
    key, k_prior = jax.random.split(key)
    t = time.perf_counter()
    ps = prior_sampling_log_marginal(tensor_analyzer, X, p, dict(d=d), latent_sites=LATENTS,
                                     num_samples=args.prior_samples, batch=min(10_000, args.prior_samples),
                                     per_row=True, rng_key=k_prior)
    prior_avg = float(np.mean(ps.log_marginal))
    prior_se = float(np.sqrt(np.sum(np.asarray(ps.stderr) ** 2)) / N)
    t_prior = time.perf_counter() - t
    table = ta_updates(d)
    per_repeat, summary = [], []
    for K in args.temps:
        key, k_ais = jax.random.split(key)
        t = time.perf_counter()
        r = ais(tensor_analyzer, table, X, p, dict(d=d), latent_sites=LATENTS, per_row=True,
                num_chains=M * args.repeats, num_temps=K, rng_key=k_ais)
        lw = np.asarray(r.log_weights)  # (N, M * repeats): repeats x M independent chains per row
        seconds = time.perf_counter() - t  # includes one compilation per K
        runs = np.asarray(log_mean_exp_with_stderr(lw.reshape(N, args.repeats, M))[0])  # (N, R)
        averages = runs.mean(0)  # (R,) average log-likelihood per data point, one per repeat
        for i, a in enumerate(averages):
            per_repeat.append({"noise": noise, "K": K, "repeat": i, "avg_loglik": float(a),
                               "error_vs_oracle": float(a - exact)})
        summary.append({
            "K": K,
            "mean": float(averages.mean()),
            "spread_sd": float(averages.std(ddof=1)),
            "min": float(averages.min()),
            "max": float(averages.max()),
            "error_of_mean_vs_oracle": float(averages.mean() - exact),
            "max_abs_error_vs_oracle": float(np.max(np.abs(averages - exact))),
            "row_spread_sd_mean": float(runs.std(1, ddof=1).mean()),
            "seconds_per_repeat": seconds / args.repeats,
        })
    return {
        "noise": noise,
        "rows": int(N),
        "oracle_avg_loglik": exact,
        "oracle_seconds": t_oracle,
        "prior_sampling": {"samples_per_row": args.prior_samples, "avg_loglik": prior_avg,
                           "stderr": prior_se, "error_vs_oracle": prior_avg - exact,
                           "seconds": t_prior},
        "ais": summary,
    }, per_repeat


def print_table(res) -> None:
    print(f"\nTA{{2,2,2}}, noise s.d. {res['noise']}, {res['rows']} rows, M = {M}: "
          f"average log-likelihood per data point (oracle {res['oracle_avg_loglik']:.4f})")
    print(f"{'K':>6} {'mean':>9} {'spread sd':>10} {'min':>9} {'max':>9} {'mean - oracle':>14} "
          f"{'row sd':>7} {'s/run':>7}")
    for s in res["ais"]:
        print(f"{s['K']:>6} {s['mean']:>9.4f} {s['spread_sd']:>10.4f} {s['min']:>9.4f} {s['max']:>9.4f} "
              f"{s['error_of_mean_vs_oracle']:>14.4f} {s['row_spread_sd_mean']:>7.3f} {s['seconds_per_repeat']:>7.2f}")
    print("spread sd: of the average over rows, across repeats; row sd: of one row's estimate across "
          "repeats, averaged over rows")
    ps = res["prior_sampling"]
    print(f"prior sampling ({ps['samples_per_row']} draws per row): {ps['avg_loglik']:.4f} "
          f"± {ps['stderr']:.4f} (minus oracle {ps['error_vs_oracle']:+.4f}), {ps['seconds']:.1f} s")


def plot(results, per_repeat, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5.2 * len(results), 3.8), squeeze=False)
    for ax, res in zip(axes[0], results):
        Ks = [s["K"] for s in res["ais"]]
        pts = [r for r in per_repeat if r["noise"] == res["noise"]]
        ax.scatter([r["K"] for r in pts], [r["avg_loglik"] for r in pts], s=10, c="C0", alpha=0.5,
                   label=f"AIS, M = {M} (each repeat)")
        ax.errorbar(Ks, [s["mean"] for s in res["ais"]], yerr=[s["spread_sd"] for s in res["ais"]],
                    fmt="o-", c="C0", capsize=3, label="AIS mean ± spread sd")
        ax.axhline(res["oracle_avg_loglik"], c="k", lw=1, label="oracle (quadrature)")
        ps = res["prior_sampling"]
        ax.axhline(ps["avg_loglik"], c="C3", ls="--", lw=1,
                   label=f"prior sampling ({ps['samples_per_row']:.0e} per row)")
        ax.set_xscale("log")
        # the view follows the points, but an estimate many nats low at tiny K does not squash it
        ys = [r["avg_loglik"] for r in pts] + [res["oracle_avg_loglik"], ps["avg_loglik"]]
        lo = res["oracle_avg_loglik"]
        ax.set_ylim(max(min(ys), lo - 1.5) - 0.05, min(max(ys), lo + 1.0) + 0.05)
        ax.set_xlabel("number of intermediate distributions K")
        ax.set_ylabel("average log-likelihood per data point")
        ax.set_title(f"TA{{2,2,2}}, noise s.d. {res['noise']}, {res['rows']} rows", fontsize=9)
        ax.legend(fontsize=7, loc="lower right")
    save_figure(fig, path)
    plt.close(fig)


def main(argv=None):
    args = parse(argv)
    os.makedirs(args.out, exist_ok=True)
    key = jax.random.PRNGKey(args.seed)
    results, per_repeat = [], []
    for noise in args.noise:
        key, k = jax.random.split(key)
        res, rows = run_noise(args, noise, k)
        results.append(res)
        per_repeat += rows
        print_table(res)
    plot(results, per_repeat, os.path.join(args.out, "ta_ais.png"))
    write_csv(os.path.join(args.out, "ta_ais.csv"), per_repeat)
    report = {
        "model": "TA{2,2,2}", "chains_per_run": M, "repeats": args.repeats, "seed": args.seed,
        "temps": args.temps, "quick": args.quick, "results": results,
    }
    write_json(os.path.join(args.out, "ta_ais.json"), report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
