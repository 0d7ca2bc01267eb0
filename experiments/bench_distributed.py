"""Benchmark: weak scaling of row sharding (latentzoo.inference.distributed) over forced host
devices: FA's Gibbs sweep and one EM iteration at 1, 2, 4 devices with the rows per device fixed.

    python experiments/bench_distributed.py [--quick] [--json OUT] [--devices 1,2,4]
                                            [--rows-per-device R]

Each device count runs in a fresh interpreter (``--xla_force_host_platform_device_count=n`` must
be set before JAX starts) on N = n R rows of FA data (D features, K factors). It reports, per
device count:

- ``gibbs_s``: seconds per sweep of ``ConjugateGibbs(factor_analysis, fa_updates())`` (z, W, mu,
  psi and the three interweaving moves) through :class:`~latentzoo.inference.distributed.ShardedGibbs`
  (best of ``repeats`` runs of ``steps`` sweeps, compiled beforehand); ``gibbs_rows_per_s`` = N /
  ``gibbs_s``;
- ``em_s``, ``em_rows_per_s``: the same for one MAP-EM iteration (``fa_em()``'s E-step, (W, mu)
  and psi M-steps) through :func:`~latentzoo.inference.distributed.shard_algorithm`;
- ``*_vs_1``: seconds per step over the 1-device seconds in the same run (weak scaling: 1.0 is
  perfect; above it is overhead);
- ``*_allreduces``: the all-reduces XLA's SPMD partitioner put into the compiled step (read off its
  HLO; XLA combines several sums into one), ``*_allreduce_s``: the time of those all-reduces alone
  (the same shapes, one after the other, in a ``shard_map`` of ``psum``\\ s, best of ``repeats``),
  and ``*_comm_share`` = that time over the step's.

Forced host devices are threads of one process sharing this machine's cores, and their
"all-reduce" is a memory copy between threads: on a machine with fewer cores than devices the
table shows the overhead of partitioning and of the collectives, not a speed-up. ``cores`` is
recorded. The JSON holds the configuration, the machine and one cell per device count.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SCRIPT = "bench_distributed.py"
_COLLECTIVE = re.compile(r"=\s*(\(.*?\)|\S+)\s+all-reduce(?:-start)?\(")
_SHAPE = re.compile(r"(f64|f32|s32|u32|pred)\[([0-9,]*)\]")


def allreduce_shapes(hlo_text: str) -> list[list[tuple[str, tuple[int, ...]]]]:
    """The operand shapes of every all-reduce in a compiled module's HLO text, in order."""
    out = []
    for match in _COLLECTIVE.finditer(hlo_text):
        shapes = [(t, tuple(int(d) for d in dims.split(",") if d)) for t, dims in _SHAPE.findall(match.group(1))]
        out.append(shapes)
    return out


def _best(fn, steps, repeats):
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(steps)
        best = min(best, (time.perf_counter() - t0) / steps)
    return best


def child(n_devices, rows_per_device, D, K, steps, repeats):
    """Runs in a fresh interpreter with n_devices forced host devices; prints one JSON line."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import PartitionSpec as P

    import latentzoo  # noqa: F401  (float64)
    from latentzoo.inference.distributed import (
        ShardedGibbs,
        param_shardings,
        row_mesh,
        shard_algorithm,
        shard_rows,
    )
    from latentzoo.inference.fa import fa_em, fa_updates
    from latentzoo.inference.gibbs import ConjugateGibbs
    from latentzoo.models.factor_analysis import default_fa_data, factor_analysis

    assert jax.device_count() == n_devices, jax.devices()
    N = n_devices * rows_per_device
    mesh = row_mesh()
    X = shard_rows(default_fa_data(0, N=N, D=D, K=K), mesh)

    # Gibbs
    gibbs = ShardedGibbs(ConjugateGibbs(factor_analysis, fa_updates()), mesh, K=K)
    state = gibbs.init(jax.random.PRNGKey(0), X)
    t0 = time.perf_counter()
    state = jax.block_until_ready(gibbs.step(state, X))
    gibbs_compile = time.perf_counter() - t0
    holder = [state]

    def sweeps(n):
        s = holder[0]
        for _ in range(n):
            s = gibbs.step(s, X)
        holder[0] = jax.block_until_ready(s)

    gibbs_s = _best(sweeps, steps, repeats)
    gibbs_hlo = gibbs.lower(holder[0], X).compile().as_text()

    # EM
    em = fa_em()
    algo = shard_algorithm(em.algorithm, mesh, N)
    params = em.algorithm.init(jax.random.PRNGKey(0), X, K=K)
    params = jax.device_put(params, param_shardings(params, mesh, N))
    update = jax.jit(lambda p, x: algo.update(p, x, K=K))
    t0 = time.perf_counter()
    params = jax.block_until_ready(update(params, X))
    em_compile = time.perf_counter() - t0
    pholder = [params]

    def iterations(n):
        p = pholder[0]
        for _ in range(n):
            p = update(p, X)
        pholder[0] = jax.block_until_ready(p)

    em_s = _best(iterations, steps, repeats)
    em_hlo = update.lower(pholder[0], X).compile().as_text()

    def replay_time(shapes):
        """Seconds of the step's all-reduces alone: same shapes, chained, in a shard_map."""
        if not shapes or n_devices == 1:
            return 0.0
        dtypes = {"f64": jnp.float64, "f32": jnp.float32, "s32": jnp.int32, "u32": jnp.uint32,
                  "pred": jnp.bool_}

        def body(x):
            acc = x[0]
            for group in shapes:
                arrays = tuple(jnp.full(s, acc).astype(dtypes[t]) for t, s in group)
                reduced = jax.lax.psum(arrays, "rows")
                acc = acc + 0.0 * sum(jnp.sum(r.astype(jnp.float64)) for r in reduced)
            return acc[None]

        f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("rows"), out_specs=P("rows")))
        x = shard_rows(np.zeros(n_devices), mesh)
        jax.block_until_ready(f(x))

        def run(n):
            y = x
            for _ in range(n):
                y = f(y)
            jax.block_until_ready(y)

        return _best(run, steps, repeats)

    g_shapes, e_shapes = allreduce_shapes(gibbs_hlo), allreduce_shapes(em_hlo)
    g_ar, e_ar = replay_time(g_shapes), replay_time(e_shapes)
    print(json.dumps({
        "devices": n_devices, "rows": N, "rows_per_device": rows_per_device,
        "gibbs_s": gibbs_s, "gibbs_rows_per_s": N / gibbs_s, "gibbs_compile_s": gibbs_compile,
        "gibbs_allreduces": len(g_shapes), "gibbs_allreduce_s": g_ar, "gibbs_comm_share": g_ar / gibbs_s,
        "em_s": em_s, "em_rows_per_s": N / em_s, "em_compile_s": em_compile,
        "em_allreduces": len(e_shapes), "em_allreduce_s": e_ar, "em_comm_share": e_ar / em_s,
        "allreduce_bytes_per_sweep": sum(8 * max(1, int(np.prod(s))) for g in g_shapes for _, s in g),
    }))


def run_child(n, args) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={n}").strip())
    for name in ("LATENTZOO_COORDINATOR", "LATENTZOO_NUM_PROCESSES", "LATENTZOO_PROCESS_ID"):
        env.pop(name, None)
    argv = [sys.executable, os.path.abspath(__file__), "--child", str(n), "--rows-per-device",
            str(args.rows_per_device), "--features", str(args.features), "--factors", str(args.factors),
            "--steps", str(args.steps), "--repeats", str(args.repeats)]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=args.timeout)
    if proc.returncode != 0:
        lines = [s for s in proc.stderr.splitlines() if s.strip()]
        return {"devices": n, "error": lines[-1] if lines else f"exit status {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def table(cells) -> str:
    base = next((c for c in cells if c.get("devices") == 1 and "error" not in c), None)
    head = (f"{'devices':>7} {'rows':>7} | {'gibbs s/sweep':>13} {'rows/s':>9} {'vs 1':>5} {'ARs':>4} "
            f"{'AR s':>9} {'comm':>5} | {'EM s/iter':>10} {'rows/s':>9} {'vs 1':>5} {'ARs':>4} "
            f"{'AR s':>9} {'comm':>5}")
    lines = [head, "-" * len(head)]
    for c in cells:
        if "error" in c:
            lines.append(f"{c['devices']:>7} failed: {c['error']}")
            continue
        gv = c["gibbs_s"] / base["gibbs_s"] if base else float("nan")
        ev = c["em_s"] / base["em_s"] if base else float("nan")
        lines.append(
            f"{c['devices']:>7} {c['rows']:>7} | {c['gibbs_s']:>13.4g} {c['gibbs_rows_per_s']:>9.3g} "
            f"{gv:>5.2f} {c['gibbs_allreduces']:>4} {c['gibbs_allreduce_s']:>9.2g} "
            f"{c['gibbs_comm_share']:>5.0%} | {c['em_s']:>10.4g} {c['em_rows_per_s']:>9.3g} {ev:>5.2f} "
            f"{c['em_allreduces']:>4} {c['em_allreduce_s']:>9.2g} {c['em_comm_share']:>5.0%}")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="500 rows per device, D = 20, K = 3")
    ap.add_argument("--json", default=None, help="write the results here (default runs/bench_distributed.json)")
    ap.add_argument("--devices", default="1,2,4", help="device counts, comma-separated (default 1,2,4)")
    ap.add_argument("--rows-per-device", type=int, default=None)
    ap.add_argument("--features", type=int, default=None)
    ap.add_argument("--factors", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None, help="sweeps per timed run")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs; the best counts")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per device count")
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    quick = args.quick
    for name, small, full in (("rows_per_device", 500, 5000), ("features", 20, 50), ("factors", 3, 5),
                              ("steps", 5, 10)):
        if getattr(args, name) is None:
            setattr(args, name, small if quick else full)
    from _binary_common import check_at_least, usage_error, write_json

    check_at_least(SCRIPT, rows_per_device=(args.rows_per_device, 1), steps=(args.steps, 1),
                   repeats=(args.repeats, 1), factors=(args.factors, 1))
    if args.factors >= args.features:
        usage_error(SCRIPT, f"--factors ({args.factors}) must be smaller than --features ({args.features}).")
    if args.child is not None:
        return child(args.child, args.rows_per_device, args.features, args.factors, args.steps, args.repeats)
    try:
        counts = [int(s) for s in args.devices.split(",") if s.strip()]
    except ValueError:
        usage_error(SCRIPT, f"--devices must be comma-separated integers, got {args.devices!r}.")
    if not counts or min(counts) < 1:
        usage_error(SCRIPT, f"--devices must name positive device counts, got {args.devices!r}.")
    cells = []
    print(f"FA, D = {args.features}, K = {args.factors}, {args.rows_per_device} rows per device, "
          f"forced host devices on {os.cpu_count()} cores", flush=True)
    for n in counts:
        cells.append(run_child(n, args))
        print(f"  {n} device(s) done", file=sys.stderr, flush=True)
    print(table(cells))
    out = {"config": {"rows_per_device": args.rows_per_device, "D": args.features, "K": args.factors,
                      "steps": args.steps, "repeats": args.repeats, "quick": quick},
           "machine": {"cores": os.cpu_count(), "devices": "forced host (CPU threads)"},
           "cells": cells}
    path = args.json or os.path.join("runs", "bench_distributed.json")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_json(path, out)
    print(f"wrote {path}")
    return out


if __name__ == "__main__":
    main()
