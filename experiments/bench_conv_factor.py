"""Benchmark: convolutional FA's exact Gibbs sweep, JAX against plain NumPy, in the same run.

1. Seconds per sweep per image of the exact block Gibbs sweep (W by colour classes, b, d, pi,
   gamma, alpha, beta; :func:`latentzoo.inference.conv_factor.cfa_updates` with
   ``joint_b=False``, the paper's sweep, which is what the NumPy sweep implements), jitted and
   scanned, against the same sweep written in NumPy/SciPy (same colouring, same order, the residual
   carried through the updates) at 64x64 greyscale crops of scikit-learn's sample images, K = 32,
   7x7 atoms. Both start from one state after a few JAX burn-in sweeps; before timing, the NumPy
   pieces are checked against the JAX ones (a colour class's conditional mean and precision, b's
   log-odds, an atom's natural parameters).
2. The correlation both the sampler's conditionals need, R ⋆ d_k over all elements: the
   direct ``lax.conv`` path (what the sampler uses; its colour classes are strided ``lax.conv``
   calls) against an FFT correlation of the same operation (``jnp.fft``), same inputs.
3. The alpha update's Gamma draws alone (one per map coefficient, N·K·H'·W' of them, shape
   e + 1/2 and rates f + w²/2 at the timed state): ``jax.random.gamma`` (what the update used
   before) against :func:`latentzoo.inference.gamma_draws.gamma_draw` (what it uses now), and
   a KS p-value of each against the exact Gamma as a sanity check.
4. Online VB (:class:`~latentzoo.inference.conv_factor.online.OnlineConvFactor`): images per
   second of ``partial_fit`` (compilation excluded) and the process's resident and peak memory
   after streaming growing numbers of images (it must not grow with them); run first, so that
   the peak is its own.

Target (issue): JAX >= 10x NumPy. Timings depend on the machine's load.

    python experiments/bench_conv_factor.py [--quick] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from functools import partial

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
from scipy.signal import convolve2d  # noqa: E402
from scipy.special import expit  # noqa: E402

import latentzoo  # noqa: E402,F401
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from latentzoo.inference.conv_factor import alpha_update, atom_natural, b_logits, cfa_updates, class_conditional, residual  # noqa: E402
from latentzoo.inference.gamma_draws import gamma_draw  # noqa: E402
from latentzoo.inference.conv_factor.stack import initial_values  # noqa: E402
from latentzoo.inference.gibbs import SweepState, read_model, sweep  # noqa: E402
from latentzoo.models.conv_factor import conv_factor, correlate  # noqa: E402
from latentzoo.results import atomic_write_text  # noqa: E402

from cfa_dictionaries import sample_crops  # noqa: E402


# ------------------------------------------------------------------ the NumPy sweep
def _hyper(priors):
    """The prior constants the sweep reads (the model's: read from its traced distributions)."""
    from latentzoo.inference.updates import unwrap

    g = lambda name, *attrs: [float(np.ravel(np.asarray(getattr(unwrap(priors[name]), a)))[0])  # noqa: E731
                              for a in attrs]
    (a_pi, b_pi), (c, dd), (e, f), (gg, hh) = (g("pi", "concentration1", "concentration0"),
                                              g("gamma", "concentration", "rate"),
                                              g("alpha", "concentration", "rate"),
                                              g("beta", "concentration", "rate"))
    return dict(a_pi=a_pi, b_pi=b_pi, c=c, d=dd, e=e, f=f, g=gg, h=hh)


def np_recon_one(Wk, dk):
    """Wk (N, H', W') * dk (C, h, w) -> (N, C, H, W), scipy's full 2-D convolution per image."""
    return np.stack([np.stack([convolve2d(Wn, dc, mode="full") for dc in dk]) for Wn in Wk])


def np_residual(X, W, b, d):
    R = X.copy()
    for k in range(d.shape[0]):
        R -= np_recon_one(b[:, k, None, None] * W[:, k], d[k])
    return R


def np_class_terms(Rp, Wk, alpha_k, dk, bk, gamma, ci, cj, M, L, map_hw):
    """One colour class (offset ci, cj) of element k: (mean, precision, valid, w_old) (N, M, L)
    from the padded residual Rp (N, C, Hpad, Wpad)."""
    C, h, w = dk.shape
    Rb = Rp[:, :, ci:ci + M * h, cj:cj + L * w].reshape(Rp.shape[0], C, M, h, L, w)
    corr = np.einsum("ncmulv,cuv->nml", Rb, dk)
    rows, cols = ci + h * np.arange(M), cj + w * np.arange(L)
    valid = (rows[:, None] < map_hw[0]) & (cols[None, :] < map_hw[1])
    r, c = np.minimum(rows, map_hw[0] - 1), np.minimum(cols, map_hw[1] - 1)
    w_old = np.where(valid, Wk[:, r][:, :, c], 0.0)
    a = np.where(valid, alpha_k[:, r][:, :, c], 1.0)
    gb = (gamma * bk)[:, None, None]
    dd = np.sum(dk * dk)
    P = gb * dd + a
    return gb * (corr + dd * w_old) / P, P, valid, w_old


def np_sweep(rng, s, X, hp):
    """One exact sweep in NumPy, the JAX table's order and algebra (W, b, d, pi, gamma, alpha,
    beta). ``s``: dict of NumPy arrays, updated in place and returned."""
    W, b, d, gamma = s["W"], s["b"], s["d"], s["gamma"]
    N, K, Hp, Wp = W.shape
    C, h, w = d.shape[1:]
    M, L = -(-Hp // h), -(-Wp // w)
    Hpad, Wpad = M * h + h - 1, L * w + w - 1
    R = np_residual(X, W, b, d)
    Rp = np.zeros((N, C, Hpad, Wpad))
    Rp[:, :, :X.shape[2], :X.shape[3]] = R
    for k in range(K):  # W: colour classes
        for col in range(h * w):
            ci, cj = col // w, col % w
            mean, P, valid, w_old = np_class_terms(Rp, W[:, k], s["alpha"][:, k], d[k], b[:, k],
                                                   gamma, ci, cj, M, L, (Hp, Wp))
            new = np.where(valid, mean + rng.standard_normal(mean.shape) / np.sqrt(P), 0.0)
            delta = b[:, k, None, None] * (new - w_old)
            Rp[:, :, ci:ci + M * h, cj:cj + L * w] -= np.einsum(
                "nml,cuv->ncmulv", delta, d[k]).reshape(N, C, M * h, L * w)
            rr, cc = ci + h * np.arange(M), cj + w * np.arange(L)
            rr, cc = rr[rr < Hp], cc[cc < Wp]
            W[:, k, rr[:, None], cc[None, :]] = new[:, :len(rr), :len(cc)]
    R = Rp[:, :, :X.shape[2], :X.shape[3]].copy()
    logit_pi = np.log(s["pi"]) - np.log1p(-s["pi"])
    for k in range(K):  # b
        Y = np_recon_one(W[:, k], d[k])
        Rk = R + b[:, k, None, None, None] * Y
        logit = logit_pi[k] + gamma * (np.sum(Rk * Y, (1, 2, 3)) - 0.5 * np.sum(Y * Y, (1, 2, 3)))
        b[:, k] = (rng.random(N) < expit(logit)).astype(float)
        R = Rk - b[:, k, None, None, None] * Y
    for k in range(K):  # d: each atom jointly
        P, lin, Rk = np_atom_natural(R, W, b, d, gamma, s["beta"], k)
        new = np.empty_like(d[k])
        for c in range(C):
            Lc = np.linalg.cholesky(P[c])
            mu = np.linalg.solve(Lc.T, np.linalg.solve(Lc, lin[c]))
            new[c] = (mu + np.linalg.solve(Lc.T, rng.standard_normal(h * w))).reshape(h, w)
        d[k] = new
        R = Rk - np_recon_one(b[:, k, None, None] * W[:, k], new)
    nk = b.sum(0)
    s["pi"] = rng.beta(hp["a_pi"] + nk, hp["b_pi"] + N - nk)
    Pn = X[0].size
    s["gamma"] = rng.gamma(hp["c"] + Pn / 2, 1.0 / (hp["d"] + 0.5 * np.sum(R * R, (1, 2, 3))))
    s["alpha"] = rng.gamma(hp["e"] + 0.5, 1.0 / (hp["f"] + 0.5 * W**2))
    s["beta"] = rng.gamma(hp["g"] + 0.5, 1.0 / (hp["h"] + 0.5 * d**2))
    return s


def np_atom_natural(R, W, b, d, gamma, beta, k):
    """Atom k's per-channel precision (C, hw, hw), linear term (C, hw), residual without k."""
    C, h, w = d.shape[1:]
    bW = b[:, k, None, None] * W[:, k]
    Rk = R + np_recon_one(bW, d[k])
    Hp, Wp = bW.shape[1:]
    A = np.zeros((2 * h - 1, 2 * w - 1))  # A[s, t] = sum_n gamma_n sum_ij bW[i+s, j+t] bW[i, j]
    for s_ in range(-(h - 1), h):
        for t in range(-(w - 1), w):
            a = bW[:, max(s_, 0):Hp + min(s_, 0), max(t, 0):Wp + min(t, 0)]
            bb = bW[:, max(-s_, 0):Hp + min(-s_, 0), max(-t, 0):Wp + min(-t, 0)]
            A[s_ + h - 1, t + w - 1] = np.sum(gamma * np.sum(a * bb, (1, 2)))
    u = np.arange(h)[:, None] - np.arange(h)[None, :] + h - 1
    v = np.arange(w)[:, None] - np.arange(w)[None, :] + w - 1
    G = A[u[:, None, :, None], v[None, :, None, :]].reshape(h * w, h * w)
    lin = np.zeros((C, h * w))
    for n in range(R.shape[0]):
        for c in range(C):  # valid correlation of the residual with the map, lags (u, v)
            win = np.lib.stride_tricks.sliding_window_view(Rk[n, c], (Hp, Wp))
            lin[c] += gamma[n] * np.einsum("uvij,ij->uv", win, bW[n]).ravel()
    P = G[None] + np.stack([np.diag(beta[k, c].ravel()) for c in range(C)])
    return P, lin, Rk


# ---------------------------------------------------------------------------- checks
def agreement(values, X, priors):
    """Largest differences between the NumPy pieces and the JAX ones at one state."""
    v = {k: np.asarray(a) for k, a in values.items()}
    Xn = np.asarray(X)
    R = np_residual(Xn, v["W"], v["b"], v["d"])
    Rj = residual(values, X)
    out = {"residual": float(np.max(np.abs(R - np.asarray(Rj))))}
    N, K, Hp, Wp = v["W"].shape
    C, h, w = v["d"].shape[1:]
    M, L = -(-Hp // h), -(-Wp // w)
    Rp = np.zeros((N, C, M * h + h - 1, L * w + w - 1))
    Rp[:, :, :Xn.shape[2], :Xn.shape[3]] = R
    k, col = K - 1, h * w - 1
    mean, P, valid, _ = np_class_terms(Rp, v["W"][:, k], v["alpha"][:, k], v["d"][k], v["b"][:, k],
                                       v["gamma"], col // w, col % w, M, L, (Hp, Wp))
    mj, sdj, _ = class_conditional(values["W"], Rj, values["b"], values["d"], values["gamma"],
                                   jnp.zeros_like(values["W"]), values["alpha"], k, col)
    out["W_class_mean"] = float(np.max(np.abs(np.where(valid, mean - np.asarray(mj), 0))))
    out["W_class_sd"] = float(np.max(np.abs(np.where(valid, 1 / np.sqrt(P) - np.asarray(sdj), 0))))
    Y = np_recon_one(v["W"][:, k], v["d"][k])
    Rk = R + v["b"][:, k, None, None, None] * Y
    lp = np.log(v["pi"][k]) - np.log1p(-v["pi"][k])
    logit = lp + v["gamma"] * (np.sum(Rk * Y, (1, 2, 3)) - 0.5 * np.sum(Y * Y, (1, 2, 3)))
    out["b_logit"] = float(np.max(np.abs(logit - np.asarray(b_logits(values, X, priors, k)[0]))))
    P, lin, _ = np_atom_natural(R, v["W"], v["b"], v["d"], v["gamma"], v["beta"], k)
    Pj, linj, _ = atom_natural(values, X, priors, k)
    out["d_precision"] = float(np.max(np.abs(P - np.asarray(Pj))))
    out["d_linear"] = float(np.max(np.abs(lin - np.asarray(linj))))
    return out


# --------------------------------------------------------------------------- timings
def fft_correlate(R, d):
    """R ⋆ d_k by FFT: (N, C, H, W), (K, C, h, w) -> (N, K, H-h+1, W-w+1)."""
    H, W = R.shape[-2:]
    h, w = d.shape[-2:]
    FR = jnp.fft.rfft2(R, s=(H, W))
    Fd = jnp.fft.rfft2(d[..., ::-1, ::-1], s=(H, W))
    full = jnp.fft.irfft2(jnp.einsum("nchw,kchw->nkhw", FR, Fd), s=(H, W))
    return full[..., h - 1:, w - 1:]


def _best(fn, repeats):
    """The fastest of ``repeats`` calls (the machine is shared) after one warm call."""
    jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t)
    return min(times)


def profile_updates(model, table, z, X):
    """Seconds per image of each update of the JAX table alone, jitted, at state ``z`` (which
    part of the sweep costs what)."""
    out = {}
    for u in table:
        def one(key, z, u=u):
            pri, obs, _ = read_model(model, z, (X,), {})
            return u.sample(key, z, obs, pri)

        f = jax.jit(one)
        out[u.name] = _best(lambda: f(jax.random.PRNGKey(1), z), 2) / X.shape[0]
    return out


def bench_gamma_draws(model, z, X, repeats=5):
    """Seconds per call of the alpha update's Gamma draws at state ``z``: jax.random.gamma
    against gamma_draw, both jitted, same shapes and rates."""
    from scipy import stats

    priors, obs, _ = read_model(model, z, (X,), {})
    post = alpha_update().conditional(z, obs, priors)["alpha"]
    a, rate = jnp.broadcast_arrays(post.concentration, post.rate)
    old = jax.jit(lambda k: jax.random.gamma(k, a) / rate)
    new = jax.jit(lambda k: gamma_draw(k, a, rate))
    keys = iter(jax.random.split(jax.random.PRNGKey(7), 2 * repeats + 4))
    t_old = _best(lambda: old(next(keys)), repeats)
    t_new = _best(lambda: new(next(keys)), repeats)
    shape = float(jnp.ravel(a)[0])
    ks = {name: float(stats.kstest(np.ravel(np.asarray(f(next(keys)) * rate)),
                                   stats.gamma(shape).cdf).pvalue)
          for name, f in (("jax_random_gamma", old), ("gamma_draw", new))}
    return {"draws": int(a.size), "shape": shape, "jax_random_gamma_s": t_old,
            "gamma_draw_s": t_new, "speedup": t_old / t_new, "ks_pvalue_unit_rate": ks}


def bench_sweep(N, size, K, atom, jax_sweeps, np_sweeps, burn_in, seed=0):
    X = jnp.asarray(sample_crops(N, size, seed))
    model = partial(conv_factor, K=K, atom_shape=(atom, atom))
    table = cfa_updates(joint_b=False)  # the NumPy sweep has no joint (b, W) move: like for like
    key = jax.random.PRNGKey(seed)
    state = SweepState(initial_values(X, K, (atom, atom), key), key, jnp.zeros(()), jnp.zeros((), bool))

    def run(state, n):
        return jax.lax.scan(lambda s, _: (sweep(model, table, s, (X,), {}), None), state, None, length=n)[0]

    burn = jax.jit(partial(run, n=burn_in))
    state = jax.block_until_ready(burn(state))
    print("  Gibbs: burn-in done", flush=True)
    many = jax.jit(partial(run, n=jax_sweeps))
    t_jax = _best(lambda: many(state), 2) / (jax_sweeps * N)
    by_update = profile_updates(model, table, state.z, X)
    priors, _, _ = read_model(model, state.z, (X,), {})
    check = agreement(state.z, X, priors)
    s = {k: np.array(v, dtype=np.float64) for k, v in state.z.items()}
    rng = np.random.default_rng(seed)
    hp = _hyper(priors)
    np_sweep(rng, {k: v.copy() for k, v in s.items()}, np.asarray(X), hp)  # warm caches
    t = time.perf_counter()
    for _ in range(np_sweeps):
        s = np_sweep(rng, s, np.asarray(X), hp)
    t_np = (time.perf_counter() - t) / (np_sweeps * N)
    print("  Gibbs: JAX and NumPy timed", flush=True)
    draws = bench_gamma_draws(model, state.z, X)
    R = residual(state.z, X)
    d = state.z["d"]
    direct = jax.jit(correlate)
    fft = jax.jit(fft_correlate)
    diff = float(jnp.max(jnp.abs(direct(R, d) - fft(R, d))))
    t_direct, t_fft = _best(lambda: direct(R, d), 5), _best(lambda: fft(R, d), 5)
    return {"N": N, "image": [size, size], "K": K, "atom": [atom, atom],
            "joint_b_move": False, "jax_sweeps": jax_sweeps, "numpy_sweeps": np_sweeps, "burn_in": burn_in,
            "jax_s_per_sweep_per_image": t_jax, "numpy_s_per_sweep_per_image": t_np,
            "numpy_over_jax": t_np / t_jax, "numpy_vs_jax_max_abs_diff": check,
            "jax_s_per_image_by_update": by_update, "alpha_gamma_draws": draws,
            "correlation": {"what": "R ⋆ d_k for all K elements and N images",
                            "sampler_uses": "lax.conv (direct; colour classes as strided lax.conv)",
                            "lax_conv_s": t_direct, "fft_s": t_fft, "max_abs_diff": diff}}


def _peak_rss_mib():
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / 1024.0 if sys.platform != "darwin" else r / 2**20


def _rss_mib():
    """The process's resident memory now (Linux; None elsewhere)."""
    try:
        with open("/proc/self/status") as fh:
            return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS")) / 1024.0
    except (OSError, StopIteration):
        return None


def bench_online(size, K, atom, batch, checkpoints, local_iters, seed=0):
    from latentzoo.inference.conv_factor.online import OnlineConvFactor

    total = checkpoints[-1]
    model = OnlineConvFactor(K, n_total=total, atom_shape=(atom, atom), local_iters=local_iters,
                             seed=seed)
    first = sample_crops(batch, size, seed + 1)
    t = time.perf_counter()
    jax.block_until_ready(model.partial_fit(first).state)  # compiles
    compile_s = time.perf_counter() - t
    seen, times, memory = batch, [], []
    i = 1
    while seen < total:
        Xb = sample_crops(batch, size, seed + 1 + i)  # streamed: no image is kept
        t = time.perf_counter()
        jax.block_until_ready(model.partial_fit(Xb).state)
        times.append(time.perf_counter() - t)
        seen, i = seen + batch, i + 1
        if seen in checkpoints:
            state_mib = sum(np.asarray(a).nbytes for a in model.state) / 2**20
            memory.append({"images_seen": seen, "peak_rss_mib": _peak_rss_mib(),
                           "rss_mib": _rss_mib(), "global_state_mib": state_mib})
            print(f"  online VB: {seen} images streamed", flush=True)
    return {"image": [size, size], "K": K, "atom": [atom, atom], "batch": batch,
            "local_iters": local_iters, "first_step_with_compile_s": compile_s,
            "images_per_s": batch * len(times) / sum(times), "memory": memory}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    ap.add_argument("--json", default=os.path.join("runs", "bench_conv_factor.json"))
    args = ap.parse_args(argv)
    # online VB first, so that the process's peak memory is its own
    if args.quick:
        on = bench_online(size=12, K=3, atom=3, batch=2, checkpoints=(4, 8), local_iters=2)
        sw = bench_sweep(N=2, size=16, K=4, atom=3, jax_sweeps=2, np_sweeps=1, burn_in=2)
    else:
        on = bench_online(size=64, K=32, atom=7, batch=4, checkpoints=(8, 16, 32),
                          local_iters=2)
        sw = bench_sweep(N=4, size=64, K=32, atom=7, jax_sweeps=3, np_sweeps=1, burn_in=3)
    out = {"machine": f"{os.cpu_count()} CPU cores, {jax.devices()[0].platform}",
           "gibbs_sweep": sw, "online_vb": on}
    print(f"exact Gibbs sweep, {sw['N']} images {sw['image'][0]}x{sw['image'][1]}, K={sw['K']}, "
          f"{sw['atom'][0]}x{sw['atom'][1]} atoms (s per sweep per image)")
    print(f"  {'JAX (lax.conv)':<22}{sw['jax_s_per_sweep_per_image']:>12.4g}")
    print(f"  {'NumPy/SciPy':<22}{sw['numpy_s_per_sweep_per_image']:>12.4g}"
          f"   NumPy/JAX = {sw['numpy_over_jax']:.1f}x")
    for name, t in sw["jax_s_per_image_by_update"].items():
        print(f"    JAX {name[:44]:<46}{t:>10.4g}")
    g = sw["alpha_gamma_draws"]
    print(f"alpha's {g['draws']} Gamma draws (shape {g['shape']:.6g}), s per call: "
          f"jax.random.gamma {g['jax_random_gamma_s']:.4g}, gamma_draw {g['gamma_draw_s']:.4g} "
          f"({g['speedup']:.1f}x; KS p {g['ks_pvalue_unit_rate']})")
    c = sw["correlation"]
    print(f"correlation R*d_k (s per call): lax.conv {c['lax_conv_s']:.4g}, FFT {c['fft_s']:.4g} "
          f"(max |diff| {c['max_abs_diff']:.1e}; the sampler uses lax.conv)")
    print(f"NumPy vs JAX pieces, max |diff|: {sw['numpy_vs_jax_max_abs_diff']}")
    print(f"online VB: {on['images_per_s']:.3g} images/s (batch {on['batch']}, "
          f"{on['local_iters']} local passes)")
    for m in on["memory"]:
        print(f"  after {m['images_seen']:>5} images: peak RSS {m['peak_rss_mib']:.0f} MiB, "
              f"RSS {m['rss_mib']} MiB, global state {m['global_state_mib']:.3f} MiB")
    atomic_write_text(args.json, json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.json}")
    return out


if __name__ == "__main__":
    main()
