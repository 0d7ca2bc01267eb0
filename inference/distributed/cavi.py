"""Coordinate ascent (EM, variational EM, CAVI) with the rows sharded over devices and processes.

:func:`fit_sharded` runs the zoo's :class:`~latentzoo.inference.cavi.CAVI` driver unchanged on
data split over a row mesh. Its recipe (a :class:`~latentzoo.inference.cavi.CoordinateAscent`,
e.g. ``fa_em().algorithm`` or ``fa_cavi().algorithm``) is wrapped by :func:`shard_algorithm`,
which only pins where each parameter lives: a parameter with a leading row axis (FA's ``z_loc``
(N, K)) is split over rows like the data, every other one (``W_loc``, ``psi_loc``, the shared
``z_scale_tril``) is replicated. The E-step then runs on each device's rows, and the M-steps'
sufficient statistics (FA: ``m~ᵀm~``, ``Xᵀm~``, the residual sums of squares; the objective) are
sums over rows that XLA's SPMD partitioner (GSPMD) computes per device and all-reduces. The
driver's sweep, stopping rule, ELBO-decrease check and result are the one-device ones, so the
result equals ``fit_fa_variational`` on one device up to the order of the additions (tested to
1e-9 on 4 devices, EM and CAVI).

The start: by default the recipe's own ``init`` (FA: its data checks and ``em_init`` /
``cavi_init``), which reads the data on the host and so needs every row in this process. In a
multi-process run pass ``init=``, a function ``(key, *data, **model_kwargs) -> params`` that
JAX can trace (no NumPy on the data): for FA's EM,
``lambda key, X, K, **_: em_init(key, X, read_fa_priors(factor_analysis, X, K=K), K=K)``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import jax
from jax import lax
from jax.sharding import Mesh
from numpyro.infer.svi import SVIRunResult

from latentzoo.inference.cavi import CAVI, CAVIState, CoordinateAscent

from .mesh import replicate, replicated, row_leading, row_sharding, shard_rows

__all__ = ["shard_algorithm", "fit_sharded", "param_shardings"]


def param_shardings(params: dict, mesh: Mesh, n_rows: int) -> dict:
    """name -> ``NamedSharding``: rows split for a parameter whose leading axis is the row axis
    (length ``n_rows``), replicated otherwise."""
    return {k: (row_sharding(mesh) if row_leading(v, n_rows) else replicated(mesh)) for k, v in params.items()}


def _takes(fn, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def shard_algorithm(algorithm: CoordinateAscent, mesh: Mesh, n_rows: int) -> CoordinateAscent:
    """The same recipe, with the parameters that ``update`` returns pinned to
    :func:`param_shardings` (inside the compiled sweep, so each sweep's output already lies where
    the next one reads it). ``init`` and ``elbo`` are the recipe's own."""
    takes_key = _takes(algorithm.update, "rng_key")

    def pin(params):
        shardings = param_shardings(params, mesh, n_rows)
        return {k: lax.with_sharding_constraint(v, shardings[k]) for k, v in params.items()}

    if takes_key:
        def update(params, *args, rng_key=None, **kwargs):
            return pin(algorithm.update(params, *args, rng_key=rng_key, **kwargs))
    else:
        def update(params, *args, **kwargs):
            return pin(algorithm.update(params, *args, **kwargs))

    return CoordinateAscent(algorithm.init, update, algorithm.elbo)


def fit_sharded(
    cavi: CAVI,
    rng_key,
    num_steps: int,
    *data,
    mesh: Mesh,
    init: Callable[..., dict] | None = None,
    rtol: float = 1e-8,
    progress_bar: bool = False,
    **model_kwargs,
) -> SVIRunResult:
    """``cavi.run(rng_key, num_steps, *data, **model_kwargs)`` with the rows of ``data`` sharded.

    Args:
        cavi: the driver, e.g. ``CAVI(factor_analysis, em.guide, em.algorithm)`` for
            ``em = fa_em()``; its model, guide and ``on_decrease`` are kept.
        rng_key: the key, as for ``cavi.run``.
        num_steps: at most this many sweeps; stops early when the relative objective change is
            below ``rtol`` (as ``cavi.run``).
        data: this process's rows (all rows in a single-process run), or arrays from
            :func:`~latentzoo.inference.distributed.mesh.shard_rows`.
        mesh: the row mesh (:func:`~latentzoo.inference.distributed.mesh.row_mesh`).
        init: ``(key, *data, **model_kwargs) -> params``, traced by JAX; None uses the recipe's
            own ``init`` (single process only, see the module docstring).
        model_kwargs: the model's keyword arguments (``K=3``, ``priors=None``).

    Returns the driver's ``SVIRunResult`` (``params`` with ``z_loc`` split over rows, ``state``,
    ``losses`` = -objective after each sweep), the one ``cavi.run`` returns on one device.
    """
    placed = tuple(shard_rows(x, mesh, name=f"data argument {i}") for i, x in enumerate(data))
    if not placed:
        raise ValueError("fit_sharded needs the data (the model's positional arguments).")
    n_rows = placed[0].shape[0]
    driver = CAVI(cavi.model, cavi.guide, shard_algorithm(cavi.algorithm, mesh, n_rows),
                  on_decrease=cavi.on_decrease)
    rng_key, key_init = jax.random.split(rng_key)  # as CAVI.init splits it
    if init is None:
        if not all(x.is_fully_addressable for x in placed):
            raise ValueError(
                "In a multi-process run fit_sharded needs init=(key, *data, **model_kwargs) -> "
                "params, since the recipe's own init reads all the rows on one host."
            )
        params = cavi.algorithm.init(key_init, *placed, **model_kwargs)
    else:
        params = jax.jit(lambda k, d: init(k, *d, **model_kwargs))(replicate(key_init, mesh), placed)
    params = jax.device_put(params, param_shardings(params, mesh, n_rows))
    rng_key = replicate(rng_key, mesh)
    start = CAVIState(params, 0.0, 0, rng_key)
    state = CAVIState(params, -driver.evaluate(start, *placed, **model_kwargs), 0, rng_key)
    return driver.run(rng_key, num_steps, *placed, init_state=state, rtol=rtol,
                      progress_bar=progress_bar, **model_kwargs)
