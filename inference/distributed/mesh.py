"""Row meshes and row-sharded arrays: JAX's ``Mesh`` / ``NamedSharding`` / ``PartitionSpec``.

Every array with a leading row axis (the data X (N, D), per-row latents z (N, K), their
variational means) is split over a 1-D device mesh whose one axis is named ``"rows"``:
``NamedSharding(mesh, P("rows"))``; everything else (parameters, keys, scalars) is replicated,
``NamedSharding(mesh, P())``. A function jitted over such arrays is partitioned by XLA (GSPMD): a
sum over rows becomes per-device partial sums plus one all-reduce, and the result is the same
array as on one device (up to the order of the additions).

In a multi-process run (:func:`~latentzoo.inference.distributed.processes.initialize_from_env`)
each process holds only its own rows; :func:`shard_rows` builds the global array from them with
``jax.make_array_from_process_local_data``, process p's rows being global rows
``[p n, (p + 1) n)`` (the mesh keeps each process's devices together, in process order). Before it
does, the processes compare what they hold (:func:`exchange`), so a process with another shape
ends the run with the same sentence on every process rather than a hang inside a collective.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

__all__ = [
    "ROWS",
    "CollectiveValueError",
    "row_mesh",
    "row_sharding",
    "replicated",
    "shard_rows",
    "replicate",
    "gather",
    "local_rows",
    "exchange",
    "mesh_processes",
    "row_leading",
]

#: The name of the mesh axis that rows are split over.
ROWS = "rows"

# bytes per process for exchange(): shapes, dtypes and one error sentence fit easily
_EXCHANGE_BYTES = 2048


class CollectiveValueError(ValueError):
    """Bad input found by comparing all processes: raised with the same sentence on every
    process, so only process 0 needs to print it
    (:func:`~latentzoo.inference.distributed.processes.run_main` does so)."""


def row_mesh(devices: Sequence | None = None) -> Mesh:
    """A 1-D :class:`jax.sharding.Mesh` with axis ``"rows"`` over ``devices`` (default: every
    device of every process, ``jax.devices()``), ordered by (process, device id) so that each
    process's devices hold one contiguous block of rows."""
    devices = list(jax.devices() if devices is None else devices)
    if not devices:
        raise ValueError("row_mesh needs at least one device.")
    devices.sort(key=lambda d: (d.process_index, d.id))
    return Mesh(np.asarray(devices, dtype=object), (ROWS,))


def row_sharding(mesh: Mesh) -> NamedSharding:
    """``NamedSharding(mesh, P("rows"))``: the leading axis split over the mesh."""
    return NamedSharding(mesh, PartitionSpec(ROWS))


def replicated(mesh: Mesh) -> NamedSharding:
    """``NamedSharding(mesh, P())``: a full copy on every device of the mesh."""
    return NamedSharding(mesh, PartitionSpec())


def mesh_processes(mesh: Mesh) -> list[int]:
    """The process indices that own devices of ``mesh``, in mesh order."""
    return sorted({d.process_index for d in mesh.devices.flat})


def _local_device_count(mesh: Mesh) -> int:
    me = jax.process_index()
    return sum(d.process_index == me for d in mesh.devices.flat)


def exchange(value) -> list:
    """Every process's ``value`` (anything JSON can write, up to ~2 KB), in process order; every
    process gets the same list. One small all-gather over all processes; no collective at all
    in a single-process run."""
    if jax.process_count() == 1:
        return [value]
    raw = json.dumps(value).encode()
    if len(raw) > _EXCHANGE_BYTES - 4:
        raise ValueError(f"exchange() takes at most {_EXCHANGE_BYTES - 4} bytes of JSON per process.")
    buf = np.zeros(_EXCHANGE_BYTES, np.uint8)
    buf[:4] = np.frombuffer(np.uint32(len(raw)).tobytes(), np.uint8)
    buf[4 : 4 + len(raw)] = np.frombuffer(raw, np.uint8)
    everyone = np.asarray(multihost_utils.process_allgather(buf))
    out = []
    for row in everyone.reshape(-1, _EXCHANGE_BYTES):
        n = int(np.frombuffer(row[:4].tobytes(), np.uint32)[0])
        out.append(json.loads(row[4 : 4 + n].tobytes().decode()))
    return out


def _is_on_mesh(x, mesh: Mesh) -> bool:
    sh = getattr(x, "sharding", None)
    return isinstance(x, jax.Array) and isinstance(sh, NamedSharding) and sh.mesh == mesh


def shard_rows(x, mesh: Mesh, *, name: str = "the data") -> jax.Array:
    """This process's rows ``x`` (n, ...) as one global array (n * processes, ...) split over the
    mesh's ``"rows"`` axis.

    In a single-process run ``x`` is all the rows. An array already placed on this mesh is
    returned as it is. Raises one :class:`ValueError` sentence when the rows cannot be split
    evenly over the devices, and (multi-process) a :class:`CollectiveValueError` on every process
    when the processes hold different shapes or dtypes.
    """
    if _is_on_mesh(x, mesh) and tuple(x.sharding.spec)[:1] == (ROWS,):
        return x
    local = np.asarray(x)
    label = name[:1].upper() + name[1:]
    if local.ndim == 0:
        raise ValueError(f"{label} must have a leading row axis; got a scalar.")
    procs = mesh_processes(mesh)
    n_dev = _local_device_count(mesh)
    if len(procs) == 1 and n_dev == mesh.size:
        if local.shape[0] % n_dev:
            raise ValueError(
                f"{label} has {local.shape[0]} rows, which {n_dev} devices cannot share equally; "
                f"use a row count divisible by {n_dev}."
            )
        return jax.device_put(local, row_sharding(mesh))
    problem = None
    if n_dev == 0:
        problem = "it has no device in the mesh"
    elif local.shape[0] % n_dev:
        problem = (f"its {local.shape[0]} rows cannot be shared equally by its {n_dev} devices; "
                   f"give each process a multiple of {n_dev} rows")
    everyone = exchange({"shape": list(local.shape), "dtype": local.dtype.str, "problem": problem,
                         "devices": n_dev})
    for p, info in enumerate(everyone):
        if info["problem"]:
            raise CollectiveValueError(f"Process {p} cannot shard {name}: {info['problem']}.")
    first = everyone[0]
    for p, info in enumerate(everyone):
        if (info["shape"], info["dtype"], info["devices"]) != (first["shape"], first["dtype"], first["devices"]):
            raise CollectiveValueError(
                f"The processes hold different {name}: process 0 has shape {tuple(first['shape'])} "
                f"({np.dtype(first['dtype'])}, {first['devices']} devices) and process {p} has "
                f"{tuple(info['shape'])} ({np.dtype(info['dtype'])}, {info['devices']} devices); "
                "every process must hold as many rows, of the same columns and type."
            )
    global_shape = (local.shape[0] * len(procs), *local.shape[1:])
    return jax.make_array_from_process_local_data(row_sharding(mesh), local, global_shape)


def replicate(tree, mesh: Mesh):
    """Every array leaf of ``tree`` copied to every device of the mesh (``P()``). In a
    multi-process run each process must pass the same values (a PRNG key, a parameter start)."""

    def put(leaf):
        if _is_on_mesh(leaf, mesh):
            return leaf
        arr = np.asarray(leaf)
        if len(mesh_processes(mesh)) == 1:
            return jax.device_put(arr, replicated(mesh))
        return jax.make_array_from_process_local_data(replicated(mesh), arr, arr.shape)

    return jax.tree.map(put, tree)


def gather(tree):
    """Every leaf of ``tree`` as a NumPy array holding all rows, on every process (an
    all-gather of the row-sharded leaves in a multi-process run; a copy to the host otherwise)."""

    def get(leaf):
        if not isinstance(leaf, jax.Array):
            return np.asarray(leaf)
        if leaf.is_fully_addressable or leaf.is_fully_replicated:
            return np.asarray(leaf)
        return np.asarray(multihost_utils.process_allgather(leaf, tiled=True))

    return jax.tree.map(get, tree)


def local_rows(x, process_index: int | None = None, num_processes: int | None = None):
    """Process ``process_index``'s contiguous block of the rows of ``x`` (default: this process
    of ``jax.process_count()``): rows ``[p n / P, (p + 1) n / P)``, the rows that
    :func:`shard_rows` expects from it. When the processes cannot share the rows equally, a
    :class:`CollectiveValueError` sentence (every process finds the same)."""
    p = jax.process_index() if process_index is None else int(process_index)
    P = jax.process_count() if num_processes is None else int(num_processes)
    n = int(np.shape(x)[0])
    if n % P:
        raise CollectiveValueError(
            f"The data has {n} rows, which {P} processes cannot share equally; use a row count "
            f"divisible by {P}."
        )
    m = n // P
    return x[p * m : (p + 1) * m]


def row_leading(leaf, n_rows: int) -> bool:
    """Whether an array leaf has the leading row axis (its first dimension is ``n_rows``)."""
    shape = jnp.shape(leaf)
    return len(shape) >= 1 and shape[0] == n_rows
