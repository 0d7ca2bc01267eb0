"""FA on a row mesh, one process of a (possibly) multi-process run; the program the
multi-process tests start (tests/inference/test_distributed_processes.py) and the recipe that
docs/distributed.md shows.

    LATENTZOO_COORDINATOR=127.0.0.1:12355 LATENTZOO_NUM_PROCESSES=2 LATENTZOO_PROCESS_ID=0 \\
    XLA_FLAGS=--xla_force_host_platform_device_count=2 \\
    python -m tests.inference.distributed_fa_worker OUT.npz        # and PROCESS_ID=1 beside it

Every process makes the same data (``default_fa_data``), keeps its own block of rows
(``local_rows``), and runs, on its rows sharded over all devices of all processes, what
``--fits`` names (default ``gibbs,online``): FA's Gibbs sweep (``ConjugateGibbs(factor_analysis,
fa_updates())``), online FA's default EM (``ShardedStream``), and with ``em`` FA's MAP-EM and
CVQ's exact EM (``fit_sharded`` with a traced ``init=``). Process 0 writes the results to OUT.npz
(``gibbs_*``, ``online_*``, ``em_*``, ``cvq_*``). Without the environment variables it runs as
one process on the devices it has.

It prints ``JOINED p`` once the processes are joined; ``--loop`` prints ``READY p`` after the
results are written, then starts one compiled Gibbs program of ``--loop-sweeps`` sweeps (all but
endless), prints ``SWEEPING p`` once it runs, and waits inside it until the process is killed or
a lost peer ends it; ``--columns-off-by P`` gives process P one column fewer (bad input).
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
    ap.add_argument("--fits", default="gibbs,online",
                    help="comma-separated: gibbs, online, em (FA's EM and CVQ's exact EM); '' for none")
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--features", type=int, default=5)
    ap.add_argument("--factors", type=int, default=2)
    ap.add_argument("--samples", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--em-steps", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--loop", action="store_true")
    ap.add_argument("--loop-sweeps", type=int, default=10**9)
    ap.add_argument("--columns-off-by", type=int, default=None)
    args = ap.parse_args(argv)
    fits = {f for f in args.fits.split(",") if f}

    info = initialize_from_env()  # before any JAX computation
    print(f"JOINED {info.process_id}", flush=True)

    import jax

    from latentzoo.inference.distributed import (
        ShardedGibbs,
        ShardedStream,
        fit_sharded,
        gather,
        local_rows,
        row_mesh,
        shard_rows,
    )
    from latentzoo.inference.cavi import CAVI
    from latentzoo.inference.cvq.em import cvq_exact_em, cvq_guide
    from latentzoo.inference.fa import fa_em
    from latentzoo.inference.fa import online_kernels as kern
    from latentzoo.inference.fa.em import em_init
    from latentzoo.inference.fa.gibbs import fa_updates
    from latentzoo.inference.fa.vb import read_fa_priors
    from latentzoo.inference.gibbs import ConjugateGibbs
    from latentzoo.models.cvq import cvq
    from latentzoo.models.factor_analysis import default_fa_data, factor_analysis

    K = args.factors
    X = default_fa_data(0, N=args.rows, D=args.features, K=K)
    X_local = np.asarray(local_rows(X))
    if args.columns_off_by == info.process_id:
        X_local = X_local[:, :-1]
    mesh = row_mesh()
    Xs = shard_rows(X_local, mesh, name="X")
    results = {}

    gibbs = ShardedGibbs(ConjugateGibbs(factor_analysis, fa_updates()), mesh, K=K)
    if "gibbs" in fits or args.loop:
        state = gibbs.init(jax.random.PRNGKey(args.seed), Xs, num_warmup=args.warmup)
    if "gibbs" in fits:
        draws = gibbs.run(state, Xs, num_samples=args.samples, num_warmup=args.warmup)
        results.update({f"gibbs_{k}": v for k, v in gather(draws.samples).items()})
        state = draws.last_state

    if "online" in fits:
        step = functools.partial(kern.em_batch_step, warmup=8, sa_start=args.batch, kappa=0.5,
                                 averaging_start=16, psi_floor=1e-6, expansion=True)
        F0 = kern.init_factors(jax.random.PRNGKey(args.seed), args.features, K)
        stream = ShardedStream(step, kern.em_init(F0), batch_size=args.batch, mesh=mesh)
        stream.partial_fit(X_local)
        F, psi = kern.em_finalize(stream.state, psi_floor=1e-6, expansion=True)
        online = gather({"F": F, "psi": psi, "mean": stream.state.mean})
        results.update({f"online_{k}": v for k, v in online.items()})

    if "em" in fits:
        # FA's MAP-EM and CVQ's exact EM, rows split over the processes' devices; the starts are
        # traced (init=), since the recipes' own read every row on one host
        em = fa_em()
        fa_start = lambda key, X, K, **_: em_init(key, X, read_fa_priors(factor_analysis, X, K=K), K=K)  # noqa: E731
        fit = fit_sharded(CAVI(factor_analysis, em.guide, em.algorithm), jax.random.PRNGKey(args.seed),
                          args.em_steps, Xs, mesh=mesh, init=fa_start, K=K, priors=None, rtol=1e-9)
        results.update({f"em_{k}": v for k, v in gather(fit.params).items()})
        results["em_losses"] = np.asarray(fit.losses)
        exact = cvq_exact_em()
        fit = fit_sharded(CAVI(cvq, cvq_guide, exact), jax.random.PRNGKey(args.seed), args.em_steps,
                          Xs, mesh=mesh, init=exact.init, K=K, rtol=1e-9)
        results.update({f"cvq_{k}": v for k, v in gather(fit.params).items()})

    if info.process_id == 0 and args.out:
        np.savez(args.out, **results, devices=jax.device_count(), processes=jax.process_count())
    if args.loop:
        print(f"READY {info.process_id}", flush=True)
        # one compiled program of --loop-sweeps sweeps (all but endless): the call returns once
        # it is compiled and running (JAX dispatches asynchronously), then SWEEPING is printed
        # and this process waits inside it until it is killed or a lost peer ends it
        last = gibbs.run(state, Xs, num_samples=1, num_warmup=args.loop_sweeps).last_state
        print(f"SWEEPING {info.process_id}", flush=True)
        jax.block_until_ready(last)
    print(f"DONE {info.process_id} of {info.num_processes} on {jax.device_count()} devices", flush=True)


if __name__ == "__main__":
    run_main(lambda: main(sys.argv[1:]))
