"""Benchmark: the hand-derived FA Gibbs kernel against NumPyro's NUTS on the same model and data.

Bayesian FA with N=500, D=20, K=3 on synthetic data (latentzoo.models.factor_analysis.default_fa_data), 4 chains
each. Efficiency is the smallest bulk ESS per second over the identifiable quantities: every
entry of cov = W Wᵀ + diag(1/psi) (upper triangle) and the marginal log-likelihood of the data.
Each sampler runs twice with identical shapes; the second (compiled) run is timed.

Also times one Gibbs sweep against the dominant matrix products of that sweep in the same run.

    python experiments/bench_fa_gibbs_vs_nuts.py [--quick] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.diagnostics import effective_sample_size, split_gelman_rubin
from numpyro.infer import NUTS

import latentzoo  # noqa: F401
from latentzoo.models.factor_analysis import default_fa_data
from latentzoo.models.factor_analysis import marginal_log_likelihood
from latentzoo.inference.fa.gibbs import fa_updates
from latentzoo.inference.gibbs import ConjugateGibbs
from latentzoo.models.factor_analysis import factor_analysis
from latentzoo.results import atomic_write_text

N, D, K = 500, 20, 3


def identifiable(samples, X):
    """(chains, draws, Q): upper-triangle cov entries and the total marginal log-likelihood."""
    W, mu, psi = samples["W"], samples["mu"], samples["psi"]
    cov = W @ jnp.swapaxes(W, -1, -2) + jax.vmap(jax.vmap(jnp.diag))(1.0 / psi)
    iu = np.triu_indices(D)
    ll = jax.vmap(jax.vmap(lambda w, m, p: marginal_log_likelihood(X, w, m, p)))(W, mu, psi)
    return np.concatenate([np.asarray(cov[..., iu[0], iu[1]]), np.asarray(ll)[..., None]], -1)


def run_sampler(kernel, X, warmup, samples, chains, seed):
    """Run ``chains`` chains of any MCMCKernel (init, warmup with adaptation, sampling) inside one
    compiled function, sequentially over chains, and time a second, already compiled call.

    NumPyro 0.22's ``MCMC.run`` recompiles its sampling loop on every call (``fori_collect`` wraps
    a fresh ``jit`` around its cached body each time), which would put ~10 s of compilation into
    any timing of a run; driving both kernels through the same compiled loop keeps the comparison
    about sampling only.
    """

    def one_chain(key):
        k_init, k_run = jax.random.split(key)
        state = kernel.init(k_init, warmup, None, (X,), {})

        def step(state, _):
            state = kernel.sample(state, (X,), {})
            values = kernel.postprocess_fn((X,), {})(state.z)
            return state, {k: values[k] for k in ("W", "mu", "psi")}

        state = jax.lax.scan(step, state, None, length=warmup)[0]
        return jax.lax.scan(step, state, None, length=samples)[1]

    run = jax.jit(lambda key: jax.lax.map(one_chain, jax.random.split(key, chains)))
    jax.block_until_ready(run(jax.random.PRNGKey(seed)))  # compile
    t0 = time.perf_counter()
    post = jax.block_until_ready(run(jax.random.PRNGKey(seed + 1)))
    seconds = time.perf_counter() - t0
    q = identifiable(post, X)
    ess = np.asarray(effective_sample_size(q))
    rhat = np.asarray(split_gelman_rubin(q))
    return dict(seconds=seconds, min_ess=float(ess.min()), max_rhat=float(rhat.max()),
                min_ess_per_s=float(ess.min() / seconds))


def sweep_vs_matmul(X, repeats=2000):
    """Seconds per Gibbs sweep and per pass of its dominant matrix products, both scanned."""
    model = partial(factor_analysis, K=K)
    kernel = ConjugateGibbs(model, fa_updates())
    state = kernel.init(jax.random.PRNGKey(0), 0, None, (X,), {})

    @jax.jit
    def sweeps(state, X):
        return jax.lax.fori_loop(0, repeats, lambda i, s: kernel.sample(s, (X,), {}), state)

    @jax.jit
    def products(z, W, mu, X):
        def body(i, c):
            z, W = c
            Xc = X - mu
            a = Xc @ W  # z | W: (N, D) x (D, K)
            b = z.T @ z  # W | z: Gram
            cz = Xc.T @ z  # W | z: cross products
            r = X - z @ W.T  # mu, psi residuals (twice per sweep)
            r2 = X - z @ W.T - mu
            z = z + 1e-9 * a + 1e-9 * r[:, :K]
            W = W + 1e-9 * cz + 1e-9 * b[0, 0] + 1e-9 * r2[:K].T
            return z, W
        return jax.lax.fori_loop(0, repeats, body, (z, W))

    def timed(f, *a):
        jax.block_until_ready(f(*a))
        t0 = time.perf_counter()
        jax.block_until_ready(f(*a))
        return (time.perf_counter() - t0) / repeats

    @jax.jit
    def draws(key, psi):
        # the random numbers one sweep consumes: N*K + D*K + D normals, D Gamma(a + N/2) draws
        def body(i, c):
            k1, k2, k3 = jax.random.split(jax.random.fold_in(key, i), 3)
            total = jax.random.normal(k1, (N * K + D * K + D + 2 * K * K,)).sum()
            return c + total + jax.random.gamma(k2, psi + N / 2).sum()
        return jax.lax.fori_loop(0, repeats, body, 0.0)

    t_sweep = timed(sweeps, state, X)
    t_mm = timed(products, state.z["z"], state.z["W"], state.z["mu"], X)
    t_rng = timed(draws, jax.random.PRNGKey(1), state.z["psi"])
    return t_sweep, t_mm, t_rng


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="short chains (smoke test)")
    p.add_argument("--json", default="runs/bench_fa_gibbs_vs_nuts.json")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    warmup, samples = (200, 300) if args.quick else (1000, 2000)
    chains = 4
    X = jnp.asarray(default_fa_data(args.seed, N=N, D=D, K=K))
    model = partial(factor_analysis, K=K)

    gibbs = run_sampler(ConjugateGibbs(model, fa_updates()), X, warmup, samples, chains, args.seed)
    nuts = run_sampler(NUTS(model), X, warmup, samples, chains, args.seed)
    t_sweep, t_mm, t_rng = sweep_vs_matmul(X)
    out = {
        "N": N, "D": D, "K": K, "chains": chains, "warmup": warmup, "samples": samples,
        "gibbs_min_ess_per_s": gibbs["min_ess_per_s"],
        "nuts_min_ess_per_s": nuts["min_ess_per_s"],
        "ratio": gibbs["min_ess_per_s"] / nuts["min_ess_per_s"],
        "gibbs_max_rhat": gibbs["max_rhat"],
        "nuts_max_rhat": nuts["max_rhat"],
        "gibbs_seconds": gibbs["seconds"], "nuts_seconds": nuts["seconds"],
        "gibbs_min_ess": gibbs["min_ess"], "nuts_min_ess": nuts["min_ess"],
        "sweep_seconds": t_sweep, "matmul_seconds": t_mm, "sweep_over_matmul": t_sweep / t_mm,
        "rng_seconds": t_rng, "sweep_over_matmul_plus_rng": t_sweep / (t_mm + t_rng),
    }
    rows = [
        ("sampler", "seconds", "min ESS", "min ESS/s", "max R-hat"),
        ("gibbs", f"{gibbs['seconds']:.2f}", f"{gibbs['min_ess']:.0f}",
         f"{gibbs['min_ess_per_s']:.1f}", f"{gibbs['max_rhat']:.3f}"),
        ("nuts", f"{nuts['seconds']:.2f}", f"{nuts['min_ess']:.0f}",
         f"{nuts['min_ess_per_s']:.1f}", f"{nuts['max_rhat']:.3f}"),
    ]
    for r in rows:
        print("  ".join(str(c).ljust(11) for c in r))
    print(f"\nratio (gibbs / nuts min ESS per s): {out['ratio']:.1f}  (target >= 10)")
    print(f"one sweep {t_sweep * 1e6:.0f} us vs its matrix products {t_mm * 1e6:.0f} us: "
          f"{out['sweep_over_matmul']:.1f}x  (target <= 2)")
    print(f"its random numbers alone take {t_rng * 1e6:.0f} us: sweep / (products + draws) = "
          f"{out['sweep_over_matmul_plus_rng']:.1f}x")
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    atomic_write_text(args.json, json.dumps(out, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
