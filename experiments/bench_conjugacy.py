"""Benchmark: a user's prior swap in FA, sigma2's update derived by the conjugacy detector against
the NUTS fallback it had before.

The variant below mirrors ``models/factor_analysis.py``'s ``factor_analysis`` with the noise prior
swapped as a user would edit the model: a *variance* per column, ``sigma2_d ~ InverseGamma(a, b)``,
and ``X ~ Normal(z Wᵀ + mu, sqrt(sigma2))``. FA's z, W and mu updates read the precision
``values["psi"]``, a site the variant no longer has, so the plan drops them ("it reads ['psi'],
which the model does not have"); with the detector their sites and sigma2 are all derived, and
FA's three interweaving moves (which read no psi) stay. Four kernels:

- ``fa_updates(), derive``: what a user gets now: z, W, mu, sigma2 derived, the moves kept;
- ``fa_updates(), no derive``: the fallback without the detector: z, W, mu and sigma2 by NUTS
  inside the Gibbs sweep, the moves kept;
- ``adapted, derive``: FA's z, W, mu updates behind a one-line adaptor (``psi = 1 / sigma2``),
  which a user could write, and sigma2 derived;
- ``adapted, NUTS sigma2``: the same with ``derive=False``: only sigma2 falls back to NUTS.

Same data (``default_fa_data``, N=500, D=20, K=3), 4 chains, same warm-up and draws. Efficiency is
the smallest bulk ESS per second over every entry of cov = W Wᵀ + diag(sigma2) (upper triangle),
timed on a second, compiled run (as experiments/bench_fa_gibbs_vs_nuts.py does).

    python experiments/bench_conjugacy.py [--quick] [--json OUT]
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
import numpyro
import numpyro.distributions as dist
from numpyro.diagnostics import effective_sample_size, split_gelman_rubin

import latentzoo  # noqa: F401
from latentzoo.inference.fa.gibbs import W_update, mu_update, scale_move, shear_move, shift_move, z_update
from latentzoo.inference.gibbs import ConjugateGibbs
from latentzoo.models.factor_analysis import default_fa_data, factor_variances
from latentzoo.models.shapes import data_sizes
from latentzoo.results import atomic_write_text

N, D, K = 500, 20, 3


def fa_variance_noise(X=None, *, K: int, N: int | None = None, D: int | None = None, a=3.0, b=1.0):
    """``factor_analysis`` with the noise prior swapped: sigma2_d ~ InverseGamma(a, b), a variance."""
    N, D = data_sizes(X, N, D, "fa_variance_noise")
    with numpyro.plate("D", D):
        mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
        sigma2 = numpyro.sample("sigma2", dist.InverseGamma(a, b))
        W = numpyro.sample("W", dist.Normal(0.0, 1.0).expand([K]).to_event(1))
    numpyro.deterministic("factor_variance", factor_variances(W))
    with numpyro.plate("N", N):
        z = numpyro.sample("z", dist.Normal(0.0, 1.0).expand([K]).to_event(1))
        numpyro.sample("X", dist.Normal(z @ W.T + mu, jnp.sqrt(sigma2)).to_event(1), obs=X)


def with_precision(update):
    """FA's hand-written update on the variant: its ``psi`` is the variant's 1 / sigma2."""
    def alias(values):
        return {**values, "psi": 1.0 / values["sigma2"]}

    conditional = None if update.conditional is None else (
        lambda values, obs, priors: update.conditional(alias(values), obs, priors))
    draw = None if update.draw is None else (
        lambda key, values, obs, priors: update.draw(key, alias(values), obs, priors))
    return update._replace(name=update.name.replace("psi", "1/sigma2"), conditional=conditional, draw=draw)


def moves():
    """FA's interweaving moves (they read W, z, mu and their priors only: valid on the variant)."""
    return [scale_move(), shear_move(), shift_move()]


def adapted_table():
    return [*(with_precision(u) for u in (z_update(), W_update(), mu_update())), *moves()]


def identifiable(samples):
    """(chains, draws, Q): the upper triangle of cov = W Wᵀ + diag(sigma2)."""
    W, s2 = samples["W"], samples["sigma2"]
    cov = W @ jnp.swapaxes(W, -1, -2) + jax.vmap(jax.vmap(jnp.diag))(s2)
    iu = np.triu_indices(D)
    return np.asarray(cov[..., iu[0], iu[1]])


def run_sampler(kernel, X, warmup, samples, chains, seed):
    """All chains (init, warm-up, draws) in one compiled function; a second call is timed."""

    def one_chain(key):
        k_init, k_run = jax.random.split(key)
        state = kernel.init(k_init, warmup, None, (X,), {})

        def step(state, _):
            state = kernel.sample(state, (X,), {})
            values = kernel.postprocess_fn((X,), {})(state.z)
            return state, {k: values[k] for k in ("W", "sigma2")}

        state = jax.lax.scan(step, state, None, length=warmup)[0]
        return jax.lax.scan(step, state, None, length=samples)[1]

    run = jax.jit(lambda key: jax.lax.map(one_chain, jax.random.split(key, chains)))
    t0 = time.perf_counter()
    jax.block_until_ready(run(jax.random.PRNGKey(seed)))  # compile
    compile_and_run = time.perf_counter() - t0
    t0 = time.perf_counter()
    post = jax.block_until_ready(run(jax.random.PRNGKey(seed + 1)))
    seconds = time.perf_counter() - t0
    q = identifiable(post)
    ess = np.asarray(effective_sample_size(q))
    rhat = np.asarray(split_gelman_rubin(q))
    return dict(seconds=seconds, first_call_seconds=compile_and_run, min_ess=float(ess.min()),
                max_rhat=float(rhat.max()), min_ess_per_s=float(ess.min() / seconds))


def plain_table_error(model, X):
    """What ``ConjugateGibbs(variant, fa_updates())`` does: its plan, and the error of a sweep."""
    from latentzoo.inference.fa.gibbs import fa_updates

    kernel = ConjugateGibbs(model, fa_updates())
    kinds = kernel.plan(X).site_kinds()
    try:
        state = kernel.init(jax.random.PRNGKey(0), 0, None, (X,), {})
        kernel.sample(state, (X,), {})
        error = None
    except Exception as err:  # noqa: BLE001 - recorded, not raised
        error = f"{type(err).__name__}: {err}"
    return {s: k[0] for s, k in kinds.items()}, error


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="short chains (smoke test)")
    p.add_argument("--json", default="runs/bench_conjugacy.json")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    warmup, samples = (100, 200) if args.quick else (500, 1000)
    chains = 4
    X = jnp.asarray(default_fa_data(args.seed, N=N, D=D, K=K))
    model = partial(fa_variance_noise, K=K)

    from latentzoo.inference.fa.gibbs import fa_updates

    plain_kinds, plain_error = plain_table_error(model, X)
    kernels = {
        "fa_updates, derive": ConjugateGibbs(model, fa_updates(), derive=True),
        "fa_updates, no derive": ConjugateGibbs(model, fa_updates(), derive=False),
        "adapted, derive": ConjugateGibbs(model, adapted_table(), derive=True),
        "adapted, NUTS sigma2": ConjugateGibbs(model, adapted_table(), derive=False),
    }
    plans = {name: {s: k[0] for s, k in kernel.plan(X).site_kinds().items()} for name, kernel in kernels.items()}
    results = {name: run_sampler(kernel, X, warmup, samples, chains, args.seed) for name, kernel in kernels.items()}
    out = {
        "N": N, "D": D, "K": K, "chains": chains, "warmup": warmup, "samples": samples,
        "quick": args.quick, "plain_fa_updates_plan": plain_kinds, "plain_fa_updates_error": plain_error,
        "plans": plans, "results": results,
        "ratio": results["fa_updates, derive"]["min_ess_per_s"]
        / results["fa_updates, no derive"]["min_ess_per_s"],
        "ratio_adapted": results["adapted, derive"]["min_ess_per_s"]
        / results["adapted, NUTS sigma2"]["min_ess_per_s"],
    }
    print(f"ConjugateGibbs(variant, fa_updates()): plan {plain_kinds}; first sweep: {plain_error}")
    rows = [("kernel", "sigma2", "seconds", "min ESS", "min ESS/s", "max R-hat")]
    for name, r in results.items():
        rows.append((name, plans[name]["sigma2"], f"{r['seconds']:.2f}", f"{r['min_ess']:.0f}",
                     f"{r['min_ess_per_s']:.1f}", f"{r['max_rhat']:.3f}"))
    for r in rows:
        print("  ".join(str(c).ljust(22 if i == 0 else 12) for i, c in enumerate(r)))
    print(f"\nratio, fa_updates with / without the detector (min ESS per s over cov entries): "
          f"{out['ratio']:.1f}  (target >= 10)")
    print(f"ratio, adapted table with sigma2 derived / by NUTS: {out['ratio_adapted']:.1f}")
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    atomic_write_text(args.json, json.dumps(out, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
