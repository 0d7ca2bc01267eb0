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


# ------------------------------------------------------------------ plain NumPy references
def _np_group_draw(rng, X, W, T, mu, Psi, zs, j, beta=1.0):
    """z_j | rest for every row, written plainly: a Python loop over rows, one d x d solve each."""
    N, D = X.shape
    out = np.empty_like(zs[j])
    lo = sum(z.shape[1] for z in zs[:j])
    dj = zs[j].shape[1]
    for n in range(N):
        other = zs[1 - j][n]
        M = W[:, lo:lo + dj] + (np.einsum("dab,b->da", T, other) if j == 0 else np.einsum("dab,a->db", T, other))
        y = np.concatenate([z[n] for z in zs])
        y[lo:lo + dj] = 0.0
        o = W @ y + mu
        lam = beta / Psi
        P = np.eye(dj) + (M.T * lam) @ M
        b = (M.T * lam) @ (X[n] - o)
        L = np.linalg.cholesky(P)
        mean = np.linalg.solve(P, b)
        out[n] = mean + np.linalg.solve(L.T, rng.normal(size=dj))
    return out


def _np_loglik_rows(X, W, T, mu, Psi, zs):
    y = np.concatenate(zs, -1)
    u = (zs[0][:, :, None] * zs[1][:, None, :]).reshape(len(X), -1)
    r = X - y @ W.T - u @ T.reshape(len(mu), -1).T - mu
    return -0.5 * (np.sum(r * r / Psi, -1) + np.sum(np.log(2 * np.pi * Psi)))


def numpy_ais(X, params, betas, chains, seed):
    """AIS for a TA{D,2,2} in plain NumPy: chains and rows in Python loops over the same path."""
    rng = np.random.default_rng(seed)
    W, T, mu, Psi = (np.asarray(params[k]) for k in ("W", "T", "mu", "Psi"))
    logw = np.zeros((chains, len(X)))
    for c in range(chains):
        zs = [rng.normal(size=(len(X), 2)), rng.normal(size=(len(X), 2))]
        for k in range(1, len(betas)):
            logw[c] += (betas[k] - betas[k - 1]) * _np_loglik_rows(X, W, T, mu, Psi, zs)
            zs[0] = _np_group_draw(rng, X, W, T, mu, Psi, zs, 0, betas[k])
            zs[1] = _np_group_draw(rng, X, W, T, mu, Psi, zs, 1, betas[k])
    m = logw.max(0)
    return m + np.log(np.mean(np.exp(logw - m), 0))


def ais_jax_vs_numpy(N, temps, chains, seed=0):
    from latentzoo.inference.ais import ais

    d = (2, 2)
    rng = np.random.default_rng(seed)
    params = random_ta_parameters(rng, 2, d, noise=0.3)
    X, _ = sample_ta(rng, params, N, d)
    betas = np.linspace(0.0, 1.0, temps + 1)
    model = partial(tensor_analyzer, d=d)
    fixed = {k: jnp.asarray(v) for k, v in params.items()}
    table = [group_update(0), group_update(1)]  # one table object: ais caches its compiled path

    def run_jax(key):
        return ais(model, table, jnp.asarray(X), fixed, {"d": d},
                   latent_sites=("z_1", "z_2"), num_chains=chains, schedule=betas, rng_key=key,
                   per_row=True).log_marginal

    secs_jax, ll_jax = _timed(run_jax, jax.random.PRNGKey(seed))
    t = time.perf_counter()
    ll_np = numpy_ais(X, params, betas, chains, seed)
    secs_np = time.perf_counter() - t
    return {"N": N, "temperatures": temps, "chains": chains,
            "jax_seconds_per_row": secs_jax / N, "numpy_seconds_per_row": secs_np / N,
            "jax_over_numpy_speed": secs_np / secs_jax,
            "mean_loglik_jax": float(np.mean(ll_jax)), "mean_loglik_numpy": float(np.mean(ll_np))}


def mcem_iteration(N, C, samples, seed=0, numpy_rows=None):
    """One MCEM iteration (E-step of ``samples`` sweeps per chain + M-step) of a C-component MTA
    on N 8x8 patches (JAX); and a TA's E-step sweep + M-step in plain NumPy against JAX on the
    same rows."""
    from latentzoo.inference.mcem import MCEM
    from latentzoo.inference.ta import init_from_data, mta_updates, ta_updates
    from latentzoo.inference.ta.mcem import mta_m_step, ta_m_step
    from latentzoo.models.tensor_analyzer import group_names, mixture_of_tensor_analyzers
    from sklearn.datasets import load_sample_images
    from sklearn.feature_extraction.image import extract_patches_2d

    d = (2, 2)
    grey = load_sample_images().images[0].astype(float).mean(-1) / 255.0
    P = extract_patches_2d(grey, (8, 8), max_patches=N, random_state=seed).reshape(N, 64)
    P = P - P.mean(1, keepdims=True)
    X = jnp.asarray(P / P.std())
    out = {"N": N, "D": 64, "C": C, "draws_per_chain": samples}
    start = init_from_data(jax.random.PRNGKey(seed), X, d=d, C=C)
    params = {k: v for k, v in start.items() if k not in ("c", "z_1", "z_2")}
    mcem = MCEM(partial(mixture_of_tensor_analyzers, d=d, C=C), mta_updates(d), mta_m_step,
                latent_sites=("c", *group_names(d)), burn_in=0, sample_schedule=lambda i: samples)
    state = mcem.init(jax.random.PRNGKey(1), X, params)
    state, _ = mcem.update(state, X)  # compiles
    jax.block_until_ready(state.params)
    t = time.perf_counter()
    state, _ = mcem.update(state, X)
    jax.block_until_ready(state.params)
    out["mta_iteration_seconds"] = time.perf_counter() - t

    # the same kind of iteration for a plain TA, JAX against NumPy, on the first rows
    n = numpy_rows or min(N, 500)
    Xn = X[:n]
    start = init_from_data(jax.random.PRNGKey(seed), Xn, d=d)
    tparams = {k: v for k, v in start.items() if k not in ("z_1", "z_2")}
    tmcem = MCEM(partial(tensor_analyzer, d=d), ta_updates(d, collapsed_move=False), ta_m_step,
                 latent_sites=group_names(d), burn_in=0, sample_schedule=lambda i: samples)
    tstate = tmcem.init(jax.random.PRNGKey(1), Xn, tparams)
    tstate, _ = tmcem.update(tstate, Xn)
    jax.block_until_ready(tstate.params)
    t = time.perf_counter()
    tstate, _ = tmcem.update(tstate, Xn)
    jax.block_until_ready(tstate.params)
    secs_jax = time.perf_counter() - t
    rng = np.random.default_rng(seed)
    Xnp = np.asarray(Xn)
    W, T, mu, Psi = (np.asarray(tparams[k]) for k in ("W", "T", "mu", "Psi"))
    zs = [np.zeros((n, 2)), np.zeros((n, 2))]
    t = time.perf_counter()
    F_sum, XF = 0.0, 0.0
    for _ in range(samples):
        zs[0] = _np_group_draw(rng, Xnp, W, T, mu, Psi, zs, 0)
        zs[1] = _np_group_draw(rng, Xnp, W, T, mu, Psi, zs, 1)
        u = (zs[0][:, :, None] * zs[1][:, None, :]).reshape(n, -1)
        F = np.concatenate([zs[0], zs[1], u, np.ones((n, 1))], -1)
        F_sum = F_sum + F.T @ F
        XF = XF + Xnp.T @ F
    B = np.linalg.solve(F_sum, XF.T).T
    _ = np.maximum(np.mean(Xnp * Xnp, 0) - np.sum(B * XF, 1) / (n * samples), 1e-6)
    secs_np = time.perf_counter() - t
    out.update({"ta_rows": n, "ta_iteration_jax_seconds": secs_jax, "ta_iteration_numpy_seconds": secs_np,
                "ta_jax_over_numpy_speed": secs_np / secs_jax})
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    q = args.quick
    result = {"gibbs_vs_nuts": gibbs_vs_nuts(N=30 if q else 200, warmup=100 if q else 500,
                                             samples=100 if q else 1000, chains=4)}
    result["ais"] = ais_jax_vs_numpy(N=20 if q else 100, temps=50 if q else 500, chains=10 if not q else 4)
    result["mcem"] = mcem_iteration(N=1000 if q else 10000, C=3 if q else 20, samples=2 if q else 10,
                                    numpy_rows=100 if q else 500)
    g = result["gibbs_vs_nuts"]
    print(f"1. TA latents, N = {g['N']}, {g['chains']} chains x {g['samples']} draws")
    print(f"   {'sampler':<38} {'seconds':>8} {'min ESS':>8} {'min ESS/s':>10}")
    for r in g["rows"]:
        print(f"   {r['sampler']:<38} {r['seconds']:>8.2f} {r['min_ess']:>8.0f} {r['min_ess_per_s']:>10.1f}")
    print(f"   Gibbs / NUTS in min ESS/s: {g['gibbs_over_nuts']:.1f}x")
    a = result["ais"]
    print(f"2. AIS per data point, TA{{2,2,2}}, {a['temperatures']} temperatures x {a['chains']} chains, N = {a['N']}")
    print(f"   JAX {a['jax_seconds_per_row'] * 1e3:.2f} ms/row, NumPy {a['numpy_seconds_per_row'] * 1e3:.1f} ms/row: "
          f"{a['jax_over_numpy_speed']:.0f}x (mean log p: {a['mean_loglik_jax']:.3f} vs {a['mean_loglik_numpy']:.3f})")
    m = result["mcem"]
    print(f"3. MCEM iteration, {m['draws_per_chain']} draws per chain: {m['C']}-component MTA on {m['N']} 8x8 patches "
          f"{m['mta_iteration_seconds']:.2f} s")
    print(f"   TA on {m['ta_rows']} patches: JAX {m['ta_iteration_jax_seconds']:.3f} s, NumPy "
          f"{m['ta_iteration_numpy_seconds']:.2f} s: {m['ta_jax_over_numpy_speed']:.0f}x")
    if args.json:
        atomic_write_text(args.json, json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
