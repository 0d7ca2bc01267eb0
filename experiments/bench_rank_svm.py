"""Benchmark: the rank SVM's hand-derived Gibbs sampler against its baselines, each in the same run.

1. G-L model (N = 300, D = 64, K = 10; synthetic data from the model's own form): Gibbs sweep
   time and the smallest bulk ESS per second over identified summaries (noise precisions tau,
   the global scales, the mean squared classifier score), against NumPyro's NUTS on the
   ``marginal=True`` (hinge-factor) form of the same posterior. Both run one chain; each is
   run twice with the same sizes and the second run is timed (compilation excluded).
2. Variational Bayes (CAVI) time to convergence on the same data, against the Gibbs run's time.
3. Scaling of one R-L sweep in N (D = 64, K = 10): the rank neighbours keep it linear in N·D·K.

Target (issue): Gibbs >= 10x NUTS in min ESS/s.

    python experiments/bench_rank_svm.py [--quick] [--json OUT]
"""

from __future__ import annotations

import argparse
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
from numpyro.infer import NUTS  # noqa: E402

from _binary_common import usage_error, write_json  # noqa: E402
from latentzoo.inference.gibbs import SweepState, sweep  # noqa: E402
from latentzoo.inference.rank_svm import initial_values, rank_svm_updates  # noqa: E402
from latentzoo.models.rank_factor_svm import observed_data, rank_factor_svm  # noqa: E402

SCRIPT = "bench_rank_svm.py"


def synthetic(N, D, K, seed=0):
    """Features from a sparse factor model and labels from a linear rule on the factors."""
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(D, K)) * (rng.random((D, K)) < 0.3)
    z = rng.normal(size=(N, K))
    X = z @ A.T + 0.5 * rng.normal(size=(N, D))
    y = np.where(z @ rng.normal(size=K) > 0, 1.0, -1.0)
    X = (X - X.mean(0)) / X.std(0)
    return X, y


def _min_ess(F):
    return float(np.min(effective_sample_size(F[None])))


def _timed(fn, *args):
    """Seconds of the first call (compiles), of a second call, and its result."""
    t = time.perf_counter()
    jax.block_until_ready(fn(*args))
    first = time.perf_counter() - t
    t = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return first, time.perf_counter() - t, out


def _summary_fn(values, D):
    u = jnp.sum(values["beta"][0] * values["z"], -1)
    return jnp.concatenate([values["tau"], values["Phi_tilde_a"][None], values["Phi_beta"][None],
                            jnp.mean(u**2)[None]])


def gibbs_vs_nuts(N, D, K, warmup, samples, nuts_warmup, nuts_samples, seed=0):
    X, y = synthetic(N, D, K, seed)
    data, kw = observed_data(X, y, "G-L")
    kw = {**kw, "K": K}
    model = partial(rank_factor_svm, **kw)
    init = initial_values(data, kw, seed)
    table = rank_svm_updates("G-L")

    @jax.jit
    def gibbs(key):
        state = SweepState(init, key, jnp.zeros(()), jnp.zeros((), bool))

        def step(state, _):
            state = sweep(model, table, state, (data,), {})
            return state, _summary_fn(state.z, D)

        state, _ = jax.lax.scan(step, state, None, length=warmup)
        return jax.lax.scan(step, state, None, length=samples)[1]

    marginal = partial(model, marginal=True)
    kernel = NUTS(marginal)
    nuts_init = {k: v for k, v in init.items() if not k.startswith("lam_")}

    @jax.jit
    def nuts(key):
        state = kernel.init(key, nuts_warmup, nuts_init, (data,), {})
        post = kernel.postprocess_fn((data,), {})

        def step(state, _):
            state = kernel.sample(state, (data,), {})
            return state, _summary_fn(post(state.z), D)

        state, _ = jax.lax.scan(step, state, None, length=nuts_warmup)
        return jax.lax.scan(step, state, None, length=nuts_samples)[1]

    out = {}
    for name, fn, sweeps in (("gibbs", gibbs, warmup + samples), ("nuts", nuts, nuts_warmup + nuts_samples)):
        first, secs, F = _timed(fn, jax.random.PRNGKey(seed + 1))
        ess = _min_ess(np.asarray(F))
        out[name] = dict(seconds=secs, seconds_with_compile=first, sweeps=sweeps,
                         sec_per_sweep=secs / sweeps, min_ess=ess, min_ess_per_s=ess / secs)
    out["ratio_min_ess_per_s"] = out["gibbs"]["min_ess_per_s"] / max(out["nuts"]["min_ess_per_s"], 1e-12)
    out["gibbs_seconds"] = out["gibbs"]["seconds_with_compile"]
    return out, (X, y)


def vb_time(X, y, K, steps):
    from latentzoo.inference.rank_svm.vb import fit_vb

    t = time.perf_counter()  # fit_vb compiles its sweep on every call: timed with it
    fit = fit_vb(X, y, variant="G-L", K=K, num_steps=steps)
    secs = time.perf_counter() - t
    return dict(seconds_with_compile=secs, sweeps=int(len(fit.result.losses)))


def sweep_scaling(Ns, D, K, reps, seed=0):
    rows = []
    for N in Ns:
        rng = np.random.default_rng(seed)
        X = rng.normal(size=(N, D))
        y = np.where(rng.random(N) < 0.5, 1.0, -1.0)
        data, kw = observed_data(X, y, "R-L")
        kw = {**kw, "K": K}
        model = partial(rank_factor_svm, **kw)
        table = rank_svm_updates("R-L")
        f = jax.jit(lambda st: sweep(model, table, st, (data,), {}))
        st = SweepState(initial_values(data, kw, seed), jax.random.PRNGKey(0), jnp.zeros(()),
                        jnp.zeros((), bool))
        st = jax.block_until_ready(f(jax.block_until_ready(f(st))))
        t = time.perf_counter()
        for _ in range(reps):
            st = f(st)
        jax.block_until_ready(st.z)
        secs = (time.perf_counter() - t) / reps
        rows.append(dict(N=N, pairs=kw["pairs"].num_pairs, sec_per_sweep=secs,
                         us_per_N_D_K=1e6 * secs / (N * D * K)))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes for a smoke test")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    if args.quick:
        N, D, K, w, s, nw, ns, Ns, reps, vb_steps = 60, 12, 3, 50, 50, 30, 30, (50, 100), 3, 30
    else:
        N, D, K, w, s, nw, ns, Ns, reps, vb_steps = 300, 64, 10, 500, 2000, 200, 300, (150, 300, 600, 1200), 20, 500
    res, (X, y) = gibbs_vs_nuts(N, D, K, w, s, nw, ns)
    res["vb"] = vb_time(X, y, K, vb_steps)
    res["vb_vs_gibbs_time"] = res["gibbs_seconds"] / res["vb"]["seconds_with_compile"]
    res["scaling"] = sweep_scaling(Ns, D, K, reps)
    res["sizes"] = dict(N=N, D=D, K=K)
    g, n = res["gibbs"], res["nuts"]
    print(f"G-L, N={N}, D={D}, K={K} (one chain each; compilation excluded)")
    print(f"{'sampler':8} {'s/sweep':>10} {'min ESS':>8} {'min ESS/s':>10}")
    for name, r in (("Gibbs", g), ("NUTS", n)):
        print(f"{name:8} {r['sec_per_sweep']:10.4f} {r['min_ess']:8.1f} {r['min_ess_per_s']:10.2f}")
    print(f"Gibbs / NUTS min ESS/s: {res['ratio_min_ess_per_s']:.1f}x (target >= 10x)")
    print(f"Both with compilation: VB to convergence {res['vb']['seconds_with_compile']:.2f} s "
          f"({res['vb']['sweeps']} sweeps); Gibbs run {res['gibbs_seconds']:.2f} s "
          f"(Gibbs / VB time {res['vb_vs_gibbs_time']:.1f}x)")
    print("R-L sweep scaling (D=%d, K=%d):" % (D, K))
    for r in res["scaling"]:
        print(f"  N={r['N']:5d} pairs={r['pairs']:6d} {r['sec_per_sweep'] * 1e3:8.2f} ms/sweep "
              f"{r['us_per_N_D_K']:.4f} us per N*D*K")
    if args.json:
        write_json(args.json, res)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ValueError as e:
        usage_error(SCRIPT, str(e))
