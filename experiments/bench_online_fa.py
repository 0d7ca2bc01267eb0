"""Benchmark: online factor analysis throughput and memory at D = 10^6, accuracy and speed vs
scikit-learn at T = 10^4.

    python experiments/bench_online_fa.py [--quick] [--json OUT]

Throughput: ``OnlineFactorAnalysis`` (default EM, float32, batches of 32 rows, K = 20) in
observations/s, against the thesis' Algorithm 2 one observation at a time in numpy, in the
same run (ratio ``speedup_vs_thesis``), and on the CPU against the same fit compiled with XLA's
default library fusion (``LATENTZOO_XLA_DOT_ONLY_FUSION=0``, see
``latentzoo.inference.cpu_fusion``; ratio ``speedup_vs_xla_default_fusion``).

Peak memory: the rise of the process' peak resident set size (VmHWM, reset before the fit)
over the resident size with the data in memory and JAX's runtime started, measured in a fresh
subprocess after the program has been compiled once (XLA's compiler memory is a fixed cost
that does not grow with D K). ``peak_mem_bytes`` includes the initialisation (QR of a D x K
Gaussian matrix); ``peak_mem_steady_bytes`` is the peak after the first chunk (state plus one
chunk in flight). The data are 64-byte aligned, so chunks are read in place.

Streaming bound: a batch step must at least read and write every D-sized array of the fit's
state once and read the batch twice (the step's two passes over feature blocks), so
``bytes_per_step = 2 * state_bytes + 2 * batch * D * itemsize``. With the machine's memory
bandwidth measured in the same run (a NumPy copy of 512 MB, read + write, best of 5) the bound
is ``bandwidth / bytes_per_step * batch`` observations/s; ``fraction_of_bound`` is the measured
throughput over it. Targets: >= 200 obs/s on the 2-core CPU and >= 25 % of the bound.
On an accelerator the bandwidth is the device's own (a jitted copy of 512 MB on the device, read
+ write, best of 5), and the rows must also cross from host to device: ``h2d_bytes_per_s`` is
measured in the same run (``jax.device_put`` of one batch, best of 5) and the bound is the
smaller of the two (``bound_device_obs_per_s``, ``bound_transfer_obs_per_s``).

Accuracy: relative Frobenius covariance error of the default EM divided by scikit-learn's
``FactorAnalysis(svd_method="randomized")`` on Algorithm 3 data (mean over seeds), and the
wall-time ratio (compiled steady state; the first-call time including compilation is
reported too).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _online_fa_common import (  # noqa: E402
    atomic_write_text,
    fa_covariance,
    generate_fa_model,
    relative_covariance_distance,
    sample_fa,
)

SPECTRA = [(1, 10), (1, 100), (1, 1000), (1, 10000)]


def _rss_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def _low_rank_rows(n, D, K, seed, dtype=np.float32):
    rng = np.random.default_rng(seed)
    F = (rng.standard_normal((D, K)) / np.sqrt(K)).astype(dtype)
    from latentzoo.inference.fa.online import aligned_empty

    # the data 64-byte aligned: XLA then reads each chunk in place (an unaligned chunk costs
    # one chunk-sized copy per partial_fit, 128 MB at D = 10^6, b = 32)
    X = aligned_empty((n, D), dtype)
    for i in range(n):  # row by row keeps generation temporaries at O(D)
        X[i] = F @ rng.standard_normal(K).astype(dtype) + rng.standard_normal(D).astype(dtype)
    return X


def throughput_child(D, K, n_rows, batch):
    """Runs in a fresh interpreter: prints JSON with obs/s and peak memory above the data."""
    X = _low_rank_rows(n_rows, D, K, seed=0)
    import latentzoo  # noqa: F401
    import jax
    import jax.numpy as jnp

    from latentzoo.inference.fa.online import OnlineFactorAnalysis

    jnp.zeros(1).block_until_ready()  # start JAX's CPU runtime: its fixed cost is not the fit's
    make = lambda: OnlineFactorAnalysis(  # noqa: E731
        K, batch_size=batch, warmup=batch, averaging_start=2 * batch, random_state=0
    )
    # Compile first, on a throw-away model: XLA's compiler memory (kept by malloc afterwards)
    # is a fixed cost of the program, not the O(D K) working set the target is about.
    t0 = time.perf_counter()
    warm = make()
    warm.partial_fit(X[:batch])
    jax_first = time.perf_counter() - t0  # compilation + initialisation + one chunk
    del warm
    gc.collect()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM so the peak below is the fit's own
    except OSError:
        pass
    base = _rss_kb("VmRSS")
    m = make()
    m.partial_fit(X[:batch])  # initialisation (QR of a D x K Gaussian) and the first chunk
    peak_init = _rss_kb("VmHWM")
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # from here on: the steady state (state + one chunk in flight)
    except OSError:
        pass
    t0 = time.perf_counter()
    for lo in range(batch, n_rows, batch):
        m.partial_fit(X[lo : lo + batch])
    jax.block_until_ready(m._state)
    dt = time.perf_counter() - t0
    peak_steady = _rss_kb("VmHWM")
    peak = max(peak_init, peak_steady)
    state_bytes = sum(int(a.nbytes) for a in jax.tree.leaves(m._state)
                      if hasattr(a, "shape") and D in a.shape)
    F = m.components_
    ok = bool(np.all(np.isfinite(F)))
    device = jax.devices()[0]
    on_accelerator = device.platform != "cpu"
    print(json.dumps({
        "device": f"{device.platform} {getattr(device, 'device_kind', '')}".strip(),
        "device_bandwidth_bytes_per_s": device_copy_bandwidth() if on_accelerator else None,
        "h2d_bytes_per_s": host_to_device_bandwidth(X[:batch]) if on_accelerator else None,
        "state_bytes": state_bytes,
        "obs_per_s": (n_rows - batch) / dt,
        "first_call_s": jax_first,
        "peak_mem_bytes": (peak - base) * 1024,
        "peak_mem_steady_bytes": (peak_steady - base) * 1024,
        "finite": ok,
    }))


def copy_bandwidth(nbytes: int = 512 * 2**20, repeats: int = 5) -> float:
    """Bytes/s of a NumPy copy (read + write: 2 x nbytes per copy), best of ``repeats``."""
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    best = np.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return 2 * nbytes / best


def device_copy_bandwidth(nbytes: int = 512 * 2**20, repeats: int = 5) -> float:
    """Bytes/s of a jitted copy on JAX's default device (read + write), best of ``repeats``."""
    import jax
    import jax.numpy as jnp

    src = jnp.ones(nbytes // 4, jnp.float32)
    scale = jax.jit(lambda a: a * 1.5)  # a real pass: XLA may elide a plain copy
    scale(src).block_until_ready()
    best = np.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        scale(src).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return 2 * nbytes / best


def host_to_device_bandwidth(rows: np.ndarray, repeats: int = 5) -> float:
    """Bytes/s of ``jax.device_put`` of ``rows`` (host memory to the default device)."""
    import jax

    jax.device_put(rows).block_until_ready()
    best = np.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.device_put(rows).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return rows.nbytes / best


def streaming_bound(res: dict, bandwidth: float) -> dict:
    """Bytes a batch step moves at the least, the throughput bound they set at ``bandwidth``,
    and the fraction of it reached (see the module's "Streaming bound"). On an accelerator
    (``res["h2d_bytes_per_s"]`` set) the device's own bandwidth replaces ``bandwidth`` and the
    bound is also capped by moving each batch from host to device."""
    batch_bytes = res["batch_size"] * res["D"] * 4
    step = 2 * res["state_bytes"] + 2 * batch_bytes
    if res.get("device_bandwidth_bytes_per_s"):
        bandwidth = res["device_bandwidth_bytes_per_s"]
    bound = bandwidth / step * res["batch_size"]
    out = {"bandwidth_bytes_per_s": bandwidth, "bytes_per_step": step}
    if res.get("h2d_bytes_per_s"):
        transfer = res["h2d_bytes_per_s"] / batch_bytes * res["batch_size"]
        out.update(bound_device_obs_per_s=bound, bound_transfer_obs_per_s=transfer)
        bound = min(bound, transfer)
    return {**out, "bound_obs_per_s": bound, "fraction_of_bound": res["obs_per_s"] / bound}


def thesis_numpy_throughput(D, K, n_rows, seed=0, warmup=None):
    """Algorithm 2, one observation at a time, numpy float32: rows per second of full updates.

    The first ``warmup`` rows (default K + 5) only move the running averages, as in the
    thesis' warm-up, and are not timed: with fewer rows than factors the M-step fits the data
    exactly and psi = 0, after which every row is nan arithmetic."""
    warmup = K + 5 if warmup is None else warmup
    X = _low_rank_rows(n_rows + warmup, D, K, seed=seed)
    rng = np.random.default_rng(seed)
    st = {
        "F": np.linalg.qr(rng.standard_normal((D, K)).astype(np.float32))[0],
        "psi": np.ones(D, np.float32),
        "mean": np.zeros(D, np.float32),
        "A": np.zeros((D, K), np.float32),
        "B": np.zeros((K, K), np.float32),
        "d2": np.zeros(D, np.float32),
    }
    for t in range(1, warmup + 1):
        _algorithm2_row(st, X[t - 1], t, K, learn=False)
    t0 = time.perf_counter()
    for t in range(warmup + 1, warmup + n_rows + 1):
        _algorithm2_row(st, X[t - 1], t, K, learn=True)
    return n_rows / (time.perf_counter() - t0)


def _algorithm2_row(st, x, t, K, learn):
    """Lines 5-15 of Algorithm 2 on the dict of numpy arrays ``st`` (in place)."""
    st["mean"] += (x - st["mean"]) / t
    d = x - st["mean"]
    F, psi = st["F"], st["psi"]
    C = (F / psi[:, None]).T
    S = np.linalg.inv(np.eye(K, dtype=np.float32) + C @ F)
    m = S @ (C @ d)
    st["B"] += (np.outer(m, m) - st["B"]) / t
    H = S + st["B"]
    st["A"] += (np.outer(d, m) - st["A"]) / t
    st["d2"] += (d * d - st["d2"]) / t
    if learn:
        F = st["A"] @ np.linalg.inv(H)
        st["F"], st["psi"] = F, st["d2"] + np.sum((F @ H) * F - 2 * F * st["A"], axis=1)


def accuracy(D, T, seeds, K=10):
    import latentzoo  # noqa: F401
    from sklearn.decomposition import FactorAnalysis

    from latentzoo.inference.fa.online import OnlineFactorAnalysis

    out = {}
    for spec in SPECTRA:
        e_ours, e_sk, t_ours, t_sk, t_first = [], [], [], [], []
        for seed in seeds:
            rng = np.random.default_rng(seed)
            c, F, psi = generate_fa_model(D, K, spec, rng)
            X = sample_fa(c, F, psi, T, rng)
            C = fa_covariance(F, psi)
            t0 = time.perf_counter()
            sk = FactorAnalysis(K, svd_method="randomized", random_state=seed).fit(X)
            t_sk.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            m = OnlineFactorAnalysis(K, random_state=seed).fit(X)
            _ = m.components_
            t_first.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            m = OnlineFactorAnalysis(K, random_state=seed).fit(X)  # compiled: steady state
            _ = m.components_
            t_ours.append(time.perf_counter() - t0)
            e_ours.append(relative_covariance_distance(m.get_covariance(), C))
            e_sk.append(relative_covariance_distance(sk.get_covariance(), C))
        key = f"D{D}_spec1-{spec[1]}"
        out[key] = {
            "err_ours": float(np.mean(e_ours)),
            "err_sklearn": float(np.mean(e_sk)),
            "err_ratio_vs_sklearn": float(np.mean(e_ours) / np.mean(e_sk)),
            "time_ours_s": float(np.mean(t_ours)),
            "time_ours_first_call_s": float(np.mean(t_first)),
            "time_sklearn_s": float(np.mean(t_sk)),
            "time_ratio_vs_sklearn": float(np.mean(t_ours) / np.mean(t_sk)),
        }
        print(f"  {key}: err ratio {out[key]['err_ratio_vs_sklearn']:.3f}  time ratio "
              f"{out[key]['time_ratio_vs_sklearn']:.3f}", flush=True)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="D=10^5, fewer rows and seeds (CI)")
    ap.add_argument("--json", default=None, help="write the results to this JSON file")
    ap.add_argument("--seeds", type=int, default=None, help="seeds for the accuracy part (default 5; quick 2)")
    ap.add_argument("--no-accuracy", action="store_true",
                    help="only the throughput part (the accuracy part runs on the CPU as well)")
    ap.add_argument("--child", nargs=4, type=int, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        throughput_child(*a.child)
        return None
    D = 10**5 if a.quick else 10**6
    K, batch = 20, 32
    n_rows = 8 * batch if a.quick else 16 * batch
    t_start = time.perf_counter()
    print(f"throughput: D={D}, K={K}, batches of {batch} rows, float32", flush=True)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", str(D), str(K), str(n_rows), str(batch)]
    child = subprocess.run(cmd, capture_output=True, text=True, check=True)
    res = json.loads(child.stdout.strip().splitlines()[-1])
    if res["device"].startswith("cpu"):
        # the baseline in the same run: XLA's default library fusion for the batch scan
        # (latentzoo.inference.cpu_fusion), everything else equal
        env = {**os.environ, "LATENTZOO_XLA_DOT_ONLY_FUSION": "0"}
        base = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True,
                                         env=env).stdout.strip().splitlines()[-1])
        res["xla_default_fusion_obs_per_s"] = base["obs_per_s"]
        res["speedup_vs_xla_default_fusion"] = res["obs_per_s"] / base["obs_per_s"]
    res["thesis_obs_per_s"] = thesis_numpy_throughput(D, K, 10 if a.quick else 5)
    res["D"], res["K"], res["batch_size"] = D, K, batch
    res["mem_target_bytes"] = 4 * D * K * 4
    res["speedup_vs_thesis"] = res["obs_per_s"] / res["thesis_obs_per_s"]
    res.update(streaming_bound(res, copy_bandwidth()))
    print(json.dumps(res), flush=True)
    seeds = list(range(a.seeds)) if a.seeds else ([0, 1] if a.quick else [0, 1, 2, 3, 4])
    T = 2000 if a.quick else 10**4
    res["settings"] = {}
    if not a.no_accuracy:
        print(f"accuracy at T={T}, seeds={seeds}", flush=True)
        for Dacc in (100, 1000):
            res["settings"].update(accuracy(Dacc, T, seeds))
    res["runtime_s"] = time.perf_counter() - t_start

    print()
    print(f"{'metric':28s} {'value':>14s} {'target':>14s}")
    print(f"{'obs_per_s':28s} {res['obs_per_s']:14.1f} {'>= 200':>14s}")
    if "xla_default_fusion_obs_per_s" in res:
        print(f"{'  XLA default fusion':28s} {res['xla_default_fusion_obs_per_s']:14.1f} "
              f"{'ratio %.2f' % res['speedup_vs_xla_default_fusion']:>14s}")
    print(f"{'bytes_per_step (least)':28s} {res['bytes_per_step']:14.3e} {'':>14s}")
    print(f"{'device':28s} {res['device']:>14s}")
    print(f"{'copy bandwidth (bytes/s)':28s} {res['bandwidth_bytes_per_s']:14.3e} {'':>14s}")
    if res.get("h2d_bytes_per_s"):
        print(f"{'host->device (bytes/s)':28s} {res['h2d_bytes_per_s']:14.3e} {'':>14s}")
        print(f"{'bound: device memory':28s} {res['bound_device_obs_per_s']:14.1f} {'':>14s}")
        print(f"{'bound: host->device':28s} {res['bound_transfer_obs_per_s']:14.1f} {'':>14s}")
    print(f"{'bound_obs_per_s':28s} {res['bound_obs_per_s']:14.1f} {'':>14s}")
    print(f"{'fraction_of_bound':28s} {res['fraction_of_bound']:14.3f} {'>= 0.25':>14s}")
    print(f"{'thesis_obs_per_s (numpy)':28s} {res['thesis_obs_per_s']:14.2f} {'':>14s}")
    print(f"{'peak_mem_bytes':28s} {res['peak_mem_bytes']:14.3e} {res['mem_target_bytes']:14.3e}")
    print(f"{'  of which steady state':28s} {res['peak_mem_steady_bytes']:14.3e} {'':>14s}")
    print(f"{'setting':28s} {'err ratio':>14s} {'time ratio':>14s}")
    for k, v in res["settings"].items():
        print(f"{k:28s} {v['err_ratio_vs_sklearn']:14.3f} {v['time_ratio_vs_sklearn']:14.3f}")
    print(f"(targets: err ratio <= 1.05, time ratio <= 0.2; runtime {res['runtime_s']:.0f} s)")
    if a.json:
        atomic_write_text(a.json, json.dumps(res, indent=2) + "\n")
    return res


if __name__ == "__main__":
    main()
