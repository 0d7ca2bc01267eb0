"""Benchmark: tensor analyzers' inference against its baselines, each in the same run (ratios).

1. Gibbs on the TA latents (alternating group updates + the partially collapsed move) against
   NumPyro's NUTS on the same posterior p(z_1, z_2 | x, theta) (parameters fixed at the truth),
   TA{2,2,2}, 4 chains each: smallest bulk ESS per second over every latent coordinate. Both
   samplers run inside one compiled loop, timed on a second call (compilation excluded).
2. One Monte Carlo EM iteration (E-step sweeps + M-step) of a C-component MTA on 8x8 patches,
   the JAX path against the same computation written plainly in NumPy (loops over rows).
3. AIS, per data point: the JAX estimator against a plain NumPy one, same schedule and chains.

Targets (issue): Gibbs >= 10x NUTS in ESS/s; JAX >= 10x NumPy; an MCEM iteration of a
20-component MTA on 10^4 patches in seconds.

    python experiments/bench_tensor_analyzer.py [--quick] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from functools import partial

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import latentzoo  # noqa: E402,F401
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from numpyro.diagnostics import effective_sample_size  # noqa: E402
from numpyro.handlers import condition  # noqa: E402
from numpyro.infer import NUTS  # noqa: E402

from latentzoo.inference.gibbs import SweepState, sweep  # noqa: E402
from latentzoo.inference.ta import collapsed_group_move, group_update  # noqa: E402
from latentzoo.models.tensor_analyzer import random_ta_parameters, sample_ta, tensor_analyzer  # noqa: E402
from latentzoo.results import atomic_write_text  # noqa: E402


def _timed(fn, *args):
    """Seconds of a second call (the first compiles) and its result."""
    jax.block_until_ready(fn(*args))
    t = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return time.perf_counter() - t, out


def gibbs_vs_nuts(N, warmup, samples, chains, seed=0):
    d = (2, 2)
    rng = np.random.default_rng(seed)
    params = random_ta_parameters(rng, 2, d, noise=0.3)
    X, _ = sample_ta(rng, params, N, d)
    X = jnp.asarray(X)
    fixed = {k: jnp.asarray(v) for k, v in params.items()}
    model = partial(tensor_analyzer, d=d)
    table = [group_update(0), group_update(1), collapsed_group_move(1, 0)]

    @jax.jit
    def gibbs(key):
        def one(key):
            k0, k1, key = jax.random.split(key, 3)
            zs = {"z_1": jax.random.normal(k0, (N, 2)), "z_2": jax.random.normal(k1, (N, 2))}
            state = SweepState({**fixed, **zs}, key, jnp.zeros(()), jnp.zeros((), bool))

            def step(state, _):
                state = sweep(model, table, state, (X,), {})
                return state, jnp.concatenate([state.z["z_1"], state.z["z_2"]], -1)

            state, _ = jax.lax.scan(step, state, None, length=warmup)
            return jax.lax.scan(step, state, None, length=samples)[1]

        return jax.lax.map(one, jax.random.split(key, chains))

    conditioned = condition(model, data=fixed)
    kernel = NUTS(conditioned)

    @jax.jit
    def nuts(key):
        def one(key):
            state = kernel.init(key, warmup, None, (X,), {})

            def step(state, _):
                state = kernel.sample(state, (X,), {})
                z = kernel.postprocess_fn((X,), {})(state.z)
                return state, jnp.concatenate([z["z_1"], z["z_2"]], -1)

            state, _ = jax.lax.scan(step, state, None, length=warmup)
            return jax.lax.scan(step, state, None, length=samples)[1]

        return jax.lax.map(one, jax.random.split(key, chains))

    rows = []
    for name, fn in (("gibbs (alternating + collapsed move)", gibbs), ("nuts", nuts)):
        secs, draws = _timed(fn, jax.random.PRNGKey(seed + 1))
        ess = np.asarray(effective_sample_size(np.asarray(draws).reshape(chains, samples, -1)))
        rows.append({"sampler": name, "seconds": secs, "min_ess": float(ess.min()),
                     "min_ess_per_s": float(ess.min() / secs)})
    ratio = rows[0]["min_ess_per_s"] / rows[1]["min_ess_per_s"]
    return {"N": N, "warmup": warmup, "samples": samples, "chains": chains, "rows": rows,
            "gibbs_over_nuts": ratio}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    q = args.quick
    result = {"gibbs_vs_nuts": gibbs_vs_nuts(N=30 if q else 200, warmup=100 if q else 500,
                                             samples=100 if q else 1000, chains=4)}
    g = result["gibbs_vs_nuts"]
    print(f"1. TA latents, N = {g['N']}, {g['chains']} chains x {g['samples']} draws")
    print(f"   {'sampler':<38} {'seconds':>8} {'min ESS':>8} {'min ESS/s':>10}")
    for r in g["rows"]:
        print(f"   {r['sampler']:<38} {r['seconds']:>8.2f} {r['min_ess']:>8.0f} {r['min_ess_per_s']:>10.1f}")
    print(f"   Gibbs / NUTS in min ESS/s: {g['gibbs_over_nuts']:.1f}x")
    if args.json:
        atomic_write_text(args.json, json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
