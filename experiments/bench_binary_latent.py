"""Seconds per iteration of variational EM vs exact EM for CVQ and NOCA at K = 8, 12, 16, and the
gap between the variational bound and the exact log-likelihood per sample at the fitted parameters.

Same data and same run for both methods at each K; each update is jitted, warmed up once, then
timed over several iterations (``block_until_ready``). Usage:

    python experiments/bench_binary_latent.py [--quick] [--json OUT] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import latentzoo  # noqa: E402,F401
from _binary_common import random_binary_sources, write_json  # noqa: E402
from latentzoo.inference.cvq import em as cvq_em  # noqa: E402
from latentzoo.inference import noca as noca_em  # noqa: E402
from latentzoo.inference.noca.bound import noca_bound, noca_exact_loglik  # noqa: E402
from latentzoo.models.cvq import simulate_cvq  # noqa: E402
from latentzoo.models.noca import simulate_noca  # noqa: E402


def _time(fn, params, n):
    params = fn(params)  # compile + one step
    jax.block_until_ready(params)
    t = time.perf_counter()
    for _ in range(n):
        params = fn(params)
    jax.block_until_ready(params)
    return (time.perf_counter() - t) / n, params


def bench_cvq(K, N, vem_iters, exact_iters, fit_iters, seed=0):
    rng = np.random.default_rng(seed)
    D = 64
    W = random_binary_sources(K, D, 8, rng).T
    X, _ = simulate_cvq(W, 0.3, 0.5, N, rng)
    X = jnp.asarray(X)
    kw = {"K": K}
    vem, ex = cvq_em.cvq_vem(), cvq_em.cvq_exact_em()
    p0 = vem.init(jax.random.PRNGKey(seed), X, **kw)
    # X is an argument, not a closed-over constant: XLA would otherwise constant-fold jnp.nonzero
    jv = jax.jit(lambda p, X: vem.update(p, X, **kw))
    je = jax.jit(lambda p, X: ex.update(p, X, **kw))
    up_v, up_e = (lambda p: jv(p, X)), (lambda p: je(p, X))
    t_v, p = _time(up_v, p0, vem_iters)
    for _ in range(fit_iters):
        p = up_v(p)
    t_e, _ = _time(up_e, p0, exact_iters)
    exact = float(cvq_em.cvq_exact_loglik(X, p["W_loc"], p["pi_loc"], p["sigma_loc"]))
    bound = float(cvq_em.cvq_bound(p, X))
    return t_v, t_e, (exact - bound) / N


def bench_noca(K, N, vem_iters, exact_iters, fit_iters, seed=0):
    rng = np.random.default_rng(seed)
    D = 64
    theta = -np.log1p(-0.9) * random_binary_sources(K, D, 6, rng)
    X, _ = simulate_noca(theta, np.full(D, 1e-3), np.full(K, 0.25), N, rng)
    X = jnp.asarray(X)
    P = int(X.sum())
    kw = {"K": K, "num_pos": P}
    vem, ex = noca_em.noca_vem(), noca_em.noca_exact_em(m_sweeps=1)
    p0 = vem.init(jax.random.PRNGKey(seed), X, **kw)
    # X is an argument, not a closed-over constant: XLA would otherwise constant-fold jnp.nonzero
    jv = jax.jit(lambda p, X: vem.update(p, X, **kw))
    je = jax.jit(lambda p, X: ex.update(p, X, **kw))
    up_v, up_e = (lambda p: jv(p, X)), (lambda p: je(p, X))
    t_v, p = _time(up_v, p0, vem_iters)
    for _ in range(fit_iters):
        p = up_v(p)
    t_e, _ = _time(up_e, ex.init(jax.random.PRNGKey(seed), X, **kw), exact_iters)  # its own state (a cache)
    exact = float(noca_exact_loglik(X, p["theta_loc"], p["theta0_loc"], p["pi_loc"]))
    bound = float(noca_bound(p, X, num_pos=P))
    return t_v, t_e, (exact - bound) / N


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--out", default="runs/bench_binary_latent")
    a = ap.parse_args(argv)
    Ks = (8, 12) if a.quick else (8, 12, 16)
    N = 100 if a.quick else 500
    results = []
    print(f"{'model':5} {'K':>3} {'vem s/it':>10} {'exact s/it':>11} {'gap nats/sample':>16}")
    for model, fn in (("cvq", bench_cvq), ("noca", bench_noca)):
        for K in Ks:
            vem_iters = 3 if a.quick else 10
            exact_iters = 1 if (a.quick or K >= 16) else 3
            fit_iters = 10 if a.quick else 100
            t_v, t_e, gap = fn(K, N, vem_iters, exact_iters, fit_iters)
            row = {"model": model, "K": K, "vem_s_per_iter": t_v, "exact_s_per_iter": t_e,
                   "bound_gap_nats_per_sample": gap, "N": N, "D": 64}
            results.append(row)
            print(f"{model:5} {K:>3} {t_v:>10.4f} {t_e:>11.4f} {gap:>16.4f}", flush=True)
    out = {"results": results, "device": jax.devices()[0].device_kind, "quick": a.quick}
    path = a.json or os.path.join(a.out, "bench_binary_latent.json")
    write_json(path, out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
