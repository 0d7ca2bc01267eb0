"""Draws per second of the JAX GIG sampler (Devroye 2014, latentzoo.inference.gig) against scipy's
``geninvgauss.rvs`` (Hörmann & Leydold 2014) in the same run, and the throughput and accuracy of
``log_bessel_kv`` against ``scipy.special.kve``.

Each JAX function is jitted and warmed up once, then timed over repeats (``block_until_ready``);
scipy draws the same batch for the same parameters. The sampler's batch is one array of 10^5
elements with one (a, b, p) each; its accept/reject loop runs until all are accepted, so the
table also gives the number of rounds. Usage:

    python experiments/bench_gig.py [--quick] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import scipy.stats as st
from scipy.special import kve

import latentzoo  # noqa: F401  (float64)
from latentzoo.inference.bessel import log_bessel_kv
from latentzoo.inference.gig import GeneralizedInverseGaussian, standard_gig_log_sample

# (a, b, p): the horseshoe's p = 0 at small, unit and large sqrt(ab), p = +-1/2, and a large p.
PARAMS = [(1e-6, 1e-6, 0.0), (1.0, 1.0, 0.0), (1e6, 1e6, 0.0), (2.0, 3.0, 0.5), (1.0, 4.0, -1.5), (1e-3, 1e-3, 50.0)]


def _best_of(fn, repeats):
    best = math.inf
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        best = min(best, time.perf_counter() - t)
    return best


def bench_sampler(n, repeats):
    rows = []
    for a, b, p in PARAMS:
        d = GeneralizedInverseGaussian(jnp.full(n, a), jnp.full(n, b), jnp.full(n, p))
        draw = jax.jit(lambda k, d=d: d.sample(k))
        key = jax.random.PRNGKey(0)
        draw(key).block_until_ready()  # compile
        t_jax = _best_of(lambda: draw(key), repeats)
        _, rounds = standard_gig_log_sample(key, jnp.full(n, p), jnp.full(n, math.sqrt(a * b)), return_rounds=True)
        ref = st.geninvgauss(p, math.sqrt(a * b), scale=math.sqrt(b / a))
        rng = np.random.default_rng(0)
        t_scipy = _best_of(lambda: ref.rvs(size=n, random_state=rng), repeats)
        rows.append({"a": a, "b": b, "p": p, "n": n, "rounds": int(rounds), "jax_draws_per_s": n / t_jax,
                     "scipy_draws_per_s": n / t_scipy, "speedup": t_scipy / t_jax})
    return rows


def bench_bessel(n, repeats):
    rng = np.random.default_rng(1)
    v = rng.uniform(0.0, 1000.0, n)
    x = 10.0 ** rng.uniform(-6.0, 6.0, n)
    f = jax.jit(log_bessel_kv)
    got = np.asarray(f(v, x))
    t_jax = _best_of(lambda: f(v, x), repeats)
    t = time.perf_counter()
    with np.errstate(over="ignore", divide="ignore"):
        ref = np.log(kve(v, x)) - x
    t_scipy = time.perf_counter() - t
    ok = np.isfinite(ref)
    err = np.abs(got - ref)[ok] / np.maximum(1.0, np.abs(ref[ok]))
    return {"n": n, "jax_evals_per_s": n / t_jax, "scipy_kve_evals_per_s": n / t_scipy,
            "compared": int(ok.sum()), "worst_err_rel_to_max1_abs_logK": float(err.max()),
            "median_err": float(np.median(err))}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="10^4 draws, one repeat")
    ap.add_argument("--json", default=None, help="write the results here (default runs/bench_gig.json)")
    args = ap.parse_args(argv)
    n, repeats = (10_000, 1) if args.quick else (100_000, 3)
    rows = bench_sampler(n, repeats)
    print(f"{'a':>7} {'b':>7} {'p':>5} {'rounds':>6} {'jax draws/s':>12} {'scipy draws/s':>14} {'jax/scipy':>9}")
    for r in rows:
        print(f"{r['a']:>7.0e} {r['b']:>7.0e} {r['p']:>5g} {r['rounds']:>6d} {r['jax_draws_per_s']:>12.3g} "
              f"{r['scipy_draws_per_s']:>14.3g} {r['speedup']:>9.2f}", flush=True)
    bessel = bench_bessel(n, repeats)
    print(f"log_bessel_kv: {bessel['jax_evals_per_s']:.3g} evals/s (scipy kve {bessel['scipy_kve_evals_per_s']:.3g}); "
          f"worst error {bessel['worst_err_rel_to_max1_abs_logK']:.2e} relative to max(1, |log K|) over "
          f"{bessel['compared']} random (v, x) in [0, 1000] x [1e-6, 1e6] where kve is finite")
    out = {"device": jax.devices()[0].device_kind, "n": n, "sampler": rows, "log_bessel_kv": bessel}
    path = args.json or os.path.join("runs", "bench_gig.json")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as fh:
        json.dump(out, fh, indent=2)
        fh.write("\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
