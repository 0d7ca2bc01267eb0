"""FA on a row mesh, one process of a (possibly) multi-process run; the program the
multi-process tests start (tests/inference/test_distributed_processes.py) and the recipe that
docs/distributed.md shows.

    LATENTZOO_COORDINATOR=127.0.0.1:12355 LATENTZOO_NUM_PROCESSES=2 LATENTZOO_PROCESS_ID=0 \\
    XLA_FLAGS=--xla_force_host_platform_device_count=2 \\
    python -m tests.inference.distributed_fa_worker OUT.npz        # and PROCESS_ID=1 beside it

Every process makes the same data (``default_fa_data``), keeps its own block of rows
(``local_rows``), and runs FA's Gibbs sweep (``ConjugateGibbs(factor_analysis, fa_updates())``)
and online FA's default EM on its rows sharded over all devices of all processes. Process 0
writes the Gibbs draws and the online fit to OUT.npz. Without the environment variables it runs
as one process on the devices it has.

It prints ``JOINED p`` once the processes are joined; ``--loop`` prints ``READY p`` after the
results are written and keeps sweeping until it is killed or loses a peer;
``--columns-off-by P`` gives process P one column fewer (bad input).
"""

from __future__ import annotations

import argparse
import functools
import sys

import numpy as np

from latentzoo.inference.distributed import initialize_from_env, run_main


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?")
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--features", type=int, default=5)
    ap.add_argument("--factors", type=int, default=2)
    ap.add_argument("--samples", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--loop", action="store_true")
    ap.add_argument("--columns-off-by", type=int, default=None)
    args = ap.parse_args(argv)

    info = initialize_from_env()  # before any JAX computation
    print(f"JOINED {info.process_id}", flush=True)

    import jax

    from latentzoo.inference.distributed import (
        ShardedGibbs,
        ShardedStream,
        gather,
        local_rows,
        row_mesh,
        shard_rows,
    )
    from latentzoo.inference.fa import online_kernels as kern
    from latentzoo.inference.fa.gibbs import fa_updates
    from latentzoo.inference.gibbs import ConjugateGibbs
    from latentzoo.models.factor_analysis import default_fa_data, factor_analysis

    K = args.factors
    X = default_fa_data(0, N=args.rows, D=args.features, K=K)
    X_local = np.asarray(local_rows(X))
    if args.columns_off_by == info.process_id:
        X_local = X_local[:, :-1]
    mesh = row_mesh()
    Xs = shard_rows(X_local, mesh, name="X")

    gibbs = ShardedGibbs(ConjugateGibbs(factor_analysis, fa_updates()), mesh, K=K)
    state = gibbs.init(jax.random.PRNGKey(args.seed), Xs, num_warmup=args.warmup)
    draws = gibbs.run(state, Xs, num_samples=args.samples, num_warmup=args.warmup)
    samples = gather(draws.samples)

    step = functools.partial(kern.em_batch_step, warmup=8, sa_start=args.batch, kappa=0.5,
                             averaging_start=16, psi_floor=1e-6, expansion=True)
    F0 = kern.init_factors(jax.random.PRNGKey(args.seed), args.features, K)
    stream = ShardedStream(step, kern.em_init(F0), batch_size=args.batch, mesh=mesh)
    stream.partial_fit(X_local)
    F, psi = kern.em_finalize(stream.state, psi_floor=1e-6, expansion=True)
    online = gather({"F": F, "psi": psi, "mean": stream.state.mean})

    if info.process_id == 0 and args.out:
        np.savez(args.out, **{f"gibbs_{k}": v for k, v in samples.items()},
                 **{f"online_{k}": v for k, v in online.items()},
                 devices=jax.device_count(), processes=jax.process_count())
    if args.loop:
        print(f"READY {info.process_id}", flush=True)
        state = draws.last_state
        while True:  # sweeping until killed, or until a lost peer ends this process
            state = gibbs.step(state, Xs)
            jax.block_until_ready(state)
    print(f"DONE {info.process_id} of {info.num_processes} on {jax.device_count()} devices", flush=True)


if __name__ == "__main__":
    run_main(lambda: main(sys.argv[1:]))
