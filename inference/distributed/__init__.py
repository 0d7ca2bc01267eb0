"""Data parallelism over devices and processes with JAX's own runtime (no engine of ours).

Rows are split over a 1-D device mesh named ``"rows"`` (``jax.sharding.Mesh``,
``NamedSharding(mesh, P("rows"))``); parameters are replicated (``P()``). The zoo's own kernels
and drivers run unchanged under ``jax.jit`` on such arrays, and XLA's SPMD partitioner (GSPMD)
inserts the all-reduces for the sums over rows. Across processes the same code runs under
``jax.distributed`` with Gloo CPU collectives (:func:`initialize_from_env`); each process holds
only its own rows.

- :func:`row_mesh`, :func:`shard_rows`, :func:`replicate`, :func:`gather`, :func:`local_rows`:
  the mesh and the placement of arrays (:mod:`~latentzoo.inference.distributed.mesh`);
- :class:`ShardedGibbs`, :func:`sharded_gibbs`: a Gibbs kernel's sweeps, the per-row latents
  (FA's z (N, K)) split with the data, the same draws as one device
  (:mod:`~latentzoo.inference.distributed.gibbs`);
- :func:`fit_sharded`: EM / variational EM / CAVI through the :class:`~latentzoo.inference.cavi.CAVI`
  driver, per-row variational parameters split (:mod:`~latentzoo.inference.distributed.cavi`);
- :class:`ShardedStream`: streaming mini-batch kernels (online FA) with each batch's rows split
  (:mod:`~latentzoo.inference.distributed.stream`);
- :func:`initialize_from_env`, :func:`run_main`: several processes, with time limits so that a
  lost process ends the run in one sentence (:mod:`~latentzoo.inference.distributed.processes`).

Shapes: data (N, D) with N divisible by the number of devices (each process: its n = N /
processes rows, divisible by its devices); per-row latents (N, K); parameters as on one device.

Example (FA, 4 devices of one process; the same lines run in every process of a
multi-process run after ``initialize_from_env()``, each with its own rows)::

    from latentzoo.inference.distributed import row_mesh, sharded_gibbs, gather
    mesh = row_mesh()
    draws = sharded_gibbs(ConjugateGibbs(factor_analysis, fa_updates()), jax.random.PRNGKey(0),
                          X, mesh=mesh, num_samples=500, num_warmup=500, K=3)
    cov = gather(draws.samples["cov"])
"""

from .cavi import fit_sharded, param_shardings, shard_algorithm
from .gibbs import ShardedDraws, ShardedGibbs, sharded_gibbs
from .mesh import (
    ROWS,
    CollectiveValueError,
    exchange,
    gather,
    local_rows,
    mesh_processes,
    replicate,
    replicated,
    row_mesh,
    row_sharding,
    shard_rows,
)
from .processes import (
    ENV_COORDINATOR,
    ENV_HEARTBEAT_TIMEOUT,
    ENV_INIT_TIMEOUT,
    ENV_NUM_PROCESSES,
    ENV_PROCESS_ID,
    DistributedSetupError,
    ProcessInfo,
    failure_sentence,
    initialize_from_env,
    leave_together,
    read_process_env,
    run_main,
)
from .stream import ShardedStream, stream_order

__all__ = [
    "ROWS", "row_mesh", "row_sharding", "replicated", "shard_rows", "replicate", "gather",
    "local_rows", "exchange", "mesh_processes", "CollectiveValueError",
    "ShardedGibbs", "ShardedDraws", "sharded_gibbs",
    "fit_sharded", "shard_algorithm", "param_shardings",
    "ShardedStream", "stream_order",
    "initialize_from_env", "read_process_env", "run_main", "failure_sentence", "leave_together", "ProcessInfo",
    "DistributedSetupError", "ENV_COORDINATOR", "ENV_NUM_PROCESSES", "ENV_PROCESS_ID",
    "ENV_INIT_TIMEOUT", "ENV_HEARTBEAT_TIMEOUT",
]
