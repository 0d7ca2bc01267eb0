"""Streaming (online) estimators with each mini-batch's rows sharded over devices and processes.

:class:`ShardedStream` drives a pure batched kernel ``step(state, X_batch, mask) -> state`` (for
online FA, :func:`~latentzoo.inference.fa.online_kernels.em_batch_step` or ``sga_batch_step``
with their settings bound) over a stream of chunks, as ``OnlineFactorAnalysis.partial_fit``
does on one device: each chunk is cut into mini-batches of ``batch_size`` rows (the last one
padded with rows of mask 0), and ``lax.scan`` runs the kernel over them. Here every mini-batch is
split over the mesh's ``"rows"`` axis: a device holds ``batch_size / devices`` of its rows, the
state (online FA: the running mean, the statistics A, B, d2, psi) is replicated, and the
kernel's sums over the batch's rows (FA's ``Mᵀ M``, ``Mᵀ D_b``, the squared deviations, the
row count) are all-reduced by GSPMD. Nothing of size N is ever gathered.

**Which rows form a mini-batch.** Process p passes its own chunk (``n`` rows, the same ``n`` on
every process); mini-batch j takes rows ``[j b/P, (j + 1) b/P)`` of every process's chunk, in
process order (b = ``batch_size``, P processes), and within a process the devices split those
rows in order. With one process that is plain order, so ``partial_fit(X)`` on a host array is
exactly ``OnlineFactorAnalysis.partial_fit(X)``. With several, it is the single-device stream
of the rows ``stream_order(n, b, P)`` of the processes' chunks stacked in process order
(:func:`stream_order`); the tests compare against that.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .mesh import ROWS, CollectiveValueError, exchange, mesh_processes, replicate, replicated

__all__ = ["ShardedStream", "stream_order"]


def stream_order(n_local: int, batch_size: int, num_processes: int) -> np.ndarray:
    """The order in which :class:`ShardedStream` feeds its kernel the rows of one
    ``partial_fit`` call, as indices into the processes' chunks (``n_local`` rows each) stacked
    in process order; ``(n_local * num_processes,)``. Identity for one process."""
    P, n = int(num_processes), int(n_local)
    if batch_size % P:
        raise ValueError(f"batch_size={batch_size} cannot be split over {P} processes.")
    b = batch_size // P
    order = [p * n + i for lo in range(0, n, b) for p in range(P) for i in range(lo, min(lo + b, n))]
    return np.asarray(order, dtype=np.int64)


def _bucket(n: int) -> int:
    """Next power of two: a stream of odd-sized chunks compiles O(log T) programs, not T."""
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


class ShardedStream:
    """Mini-batched streaming updates with the batch rows split over a row mesh.

    Args:
        step: ``(state, X (b, ...), mask (b,)) -> state``, pure; rows with mask 0 must leave the
            state unchanged (the online FA kernels do).
        state: the initial state (a pytree of arrays, the same on every process); replicated.
        batch_size: rows per mini-batch, a multiple of the mesh's device count.
        mesh: the row mesh (:func:`~latentzoo.inference.distributed.mesh.row_mesh`).

    Example (online FA's default EM; the settings are ``OnlineFactorAnalysis``'s defaults for
    ``batch_size=32``)::

        from latentzoo.inference.fa import online_kernels as kern
        step = functools.partial(kern.em_batch_step, warmup=100, sa_start=32, kappa=0.5,
                                 averaging_start=300, psi_floor=1e-6, expansion=True)
        F0 = kern.init_factors(jax.random.PRNGKey(seed), D, K)
        stream = ShardedStream(step, kern.em_init(F0), batch_size=32, mesh=row_mesh())
        for chunk in chunks:                  # this process's rows of each chunk
            stream.partial_fit(chunk)
        F, psi = kern.em_finalize(stream.state, psi_floor=1e-6, expansion=True)
    """

    def __init__(self, step: Callable[..., Any], state, *, batch_size: int, mesh: Mesh):
        n_dev = mesh.size
        if not isinstance(batch_size, (int, np.integer)) or batch_size < 1 or batch_size % n_dev:
            raise ValueError(
                f"batch_size={batch_size!r} cannot be split over the mesh's {n_dev} devices; use a "
                f"positive multiple of {n_dev}."
            )
        self.step = step
        self.mesh = mesh
        self.batch_size = int(batch_size)
        self.num_processes = len(mesh_processes(mesh))
        self.n_seen = 0
        self.n_features = None
        self.state = replicate(state, mesh)
        rep = replicated(mesh)

        def scan(state, Xb, maskb):
            def body(s, xm):
                s = step(s, *xm)
                return jax.tree.map(lambda a: lax.with_sharding_constraint(a, rep), s), None

            return lax.scan(body, state, (Xb, maskb))[0]

        self._scan = jax.jit(scan)

    def _check(self, X: np.ndarray) -> None:
        problem = None
        if X.ndim < 2:
            problem = f"a chunk must be 2-D (rows, features), got {X.ndim}-D"
        elif X.shape[0] == 0:
            problem = "a chunk must have at least one row"
        elif not np.issubdtype(X.dtype, np.floating):
            problem = f"a chunk must hold floating-point numbers, got {X.dtype}"
        elif not np.all(np.isfinite(X)):
            problem = "the chunk contains NaN or infinity"
        elif self.n_features is not None and X.shape[1:] != self.n_features:
            problem = f"the chunk has {X.shape[1:]} features per row, the stream {self.n_features}"
        everyone = exchange({"shape": list(X.shape), "dtype": X.dtype.str, "problem": problem})
        for p, info in enumerate(everyone):
            if info["problem"]:
                who = f"process {p}: " if len(everyone) > 1 else ""
                raise CollectiveValueError(f"Bad chunk for the stream ({who}{info['problem']}).")
        for p, info in enumerate(everyone):
            if info["shape"] != everyone[0]["shape"] or info["dtype"] != everyone[0]["dtype"]:
                raise CollectiveValueError(
                    f"The processes passed different chunks: process 0 has shape "
                    f"{tuple(everyone[0]['shape'])} and process {p} has {tuple(info['shape'])} "
                    f"({np.dtype(info['dtype'])}); every process must pass as many rows, of the "
                    "same columns and type."
                )

    def partial_fit(self, X):
        """Update the state with this process's rows ``X`` (n, ...) of the next chunk; every
        process calls it with its own rows (the same n). Returns ``self``."""
        X = np.ascontiguousarray(np.asarray(X))
        self._check(X)
        self.n_features = X.shape[1:]
        P = self.num_processes
        b_local = self.batch_size // P
        n = X.shape[0]
        L = _bucket(-(-n // b_local))
        Xb = np.zeros((L * b_local, *X.shape[1:]), X.dtype)
        Xb[:n] = X
        mask = np.zeros(L * b_local, X.dtype)
        mask[:n] = 1
        Xb = Xb.reshape(L, b_local, *X.shape[1:])
        mask = mask.reshape(L, b_local)
        x_sh = NamedSharding(self.mesh, PartitionSpec(None, ROWS))
        if P == 1:
            Xg, mg = jax.device_put(Xb, x_sh), jax.device_put(mask, x_sh)
        else:
            Xg = jax.make_array_from_process_local_data(x_sh, Xb, (L, self.batch_size, *X.shape[1:]))
            mg = jax.make_array_from_process_local_data(x_sh, mask, (L, self.batch_size))
        self.state = self._scan(self.state, Xg, mg)
        self.n_seen += n * P
        return self

    def block_until_ready(self):
        """Wait for the queued updates (for timing); returns ``self``."""
        jax.block_until_ready(self.state)
        return self
