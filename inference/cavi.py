"""Closed-form coordinate-ascent VI and (variational) EM with the interface of ``numpyro.infer.SVI``.

A :class:`CAVI` object couples a model, a NumPyro guide whose ``numpyro.param`` sites are the
variational parameters, and a :class:`CoordinateAscent` recipe: three pure functions of the
parameters and the model's arguments,

- ``init(rng_key, *args, **kwargs) -> params``,
- ``update(params, *args, **kwargs) -> params`` (one full sweep of closed-form updates), and
- ``elbo(params, *args, **kwargs) -> scalar`` (the analytic objective).

An ``update`` that takes a keyword ``rng_key`` (the recipes of
:func:`latentzoo.inference.cavi_blocks.coordinate_ascent`, whose blocks may fall back to SVI steps)
gets a fresh key every sweep, split from the state's key as :class:`numpyro.infer.SVI` does.

``init`` / ``update`` / ``run`` mirror :class:`numpyro.infer.SVI`; ``run`` returns
:class:`numpyro.infer.svi.SVIRunResult` with ``losses = -ELBO``, so the results plug into
``Predictive(model, guide=guide, params=result.params)`` and ``Trace_ELBO`` unchanged.
Point-estimated parameters (EM, variational EM) are ``Delta`` sites of the same guide, so the
objective is still an ELBO and ``Trace_ELBO`` checks it. ``run(..., restarts=R)`` runs R starts,
each from its own key, and keeps the one with the best final objective.

Coordinate ascent never decreases the objective; a decrease beyond round-off means a wrong update
or a numerical failure, and :class:`CAVI` raises :class:`ELBODecreaseError` or warns (``on_decrease``).

Block tables (update records that declare the prior families they are exact for, checked against
the model like Gibbs tables) and the recipe builder over them are in
:mod:`latentzoo.inference.cavi_blocks`.

**Checkpoints.** Inside ``with checkpointing(folder):`` every ``CAVI.run`` saves its state (the
params, the objective, the sweep count, the key) and its objective trace to
``folder/cavi-<call>-<restart>.npz`` every so many sweeps and when a start finishes; with
``resume=True`` it continues from them. The state is everything a sweep reads, so a resumed fit
equals the uninterrupted one exactly. Every ``fit_*`` of the zoo runs through this driver, so
all of them checkpoint without knowing it (the CLI's ``--resume``).
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import os
import socket
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.infer.svi import SVIRunResult
from tqdm.auto import tqdm

from latentzoo.models.tables import split_tables


__all__ = [
    "CAVI",
    "CAVIState",
    "new_rows",
    "CoordinateAscent",
    "ELBODecreaseError",
    "VariationalFit",
    "checkpointing",
]


class ELBODecreaseError(RuntimeError):
    """The analytic ELBO went down between two sweeps by more than round-off."""


class CoordinateAscent(NamedTuple):
    """The three pure functions that define a closed-form coordinate-ascent algorithm."""

    init: Callable[..., dict]
    update: Callable[..., dict]
    elbo: Callable[..., jax.Array]


class VariationalFit(NamedTuple):
    """What every closed-form ``fit_*`` of the zoo returns (CAVI, EM, variational EM).

    Attributes:
        result: the driver's ``SVIRunResult`` (``params``, ``state``, ``losses`` = -objective
            after each sweep).
        guide: the NumPyro guide the params belong to, so
            ``Predictive(model, guide=fit.guide, params=fit.params)`` and ``Trace_ELBO`` work.
        model: the NumPyro model that was fitted.
        row_log_likelihood: ``(params, X) -> (N,)`` each new row's log-likelihood at the fitted
            parameters, latents integrated out, set by the ``fit_*`` that has one; None
            otherwise.
        score_kind: ``"exact"``, or ``"lower bound"`` where the latents cannot be summed out
            (CVQ and NOCA beyond 12 sources: the mean-field bound).
    """

    result: SVIRunResult
    guide: Callable
    model: Callable
    row_log_likelihood: Callable | None = None
    score_kind: str = "exact"

    @property
    def params(self) -> dict:
        return self.result.params

    def score_samples(self, X) -> np.ndarray:
        """log p(x_n | fitted parameters) for each row of ``X`` (N,), in scikit-learn's sense
        (a lower bound when :attr:`score_kind` says so)."""
        if self.row_log_likelihood is None:
            raise ValueError("This fit does not score new rows (its model has no per-row "
                             "likelihood here); use latentzoo.predict on a saved run instead.")
        return np.asarray(self.row_log_likelihood(self.params, X))

    def score(self, X) -> float:
        """The mean of :meth:`score_samples` over the rows of ``X``."""
        return float(np.mean(self.score_samples(X)))

    @property
    def losses(self) -> jax.Array:
        return self.result.losses


def new_rows(X, D: int, *, binary: bool = False) -> jax.Array:
    """New rows for a fit's ``score_samples``: a 2-D numeric array of D columns (binary data
    0/1 where ``binary``); one ValueError sentence otherwise. NaN passes (a family that cannot
    leave entries out refuses it itself)."""
    try:
        A = np.asarray(X, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError("The new rows must be a numeric array.") from None
    if A.ndim != 2 or A.shape[1] != D:
        raise ValueError(f"The new rows must be a 2-D array with {D} columns, as the fit had; got shape {A.shape}.")
    if binary and not np.all(np.isin(A, (0.0, 1.0))):
        raise ValueError("The new rows must hold 0/1 values only, as the fit's data did.")
    return jnp.asarray(A)


class CAVIState(NamedTuple):
    """Variational parameters, their ELBO, the sweep count and a key (kept for SVI parity)."""

    params: dict[str, jax.Array]
    elbo: jax.Array
    step: int
    rng_key: jax.Array


class _Checkpoints:
    """Where and how often the runs inside one :func:`checkpointing` block save their state."""

    def __init__(self, folder, every, seconds, resume):
        self.folder, self.every, self.seconds, self.resume = folder, every, seconds, resume
        self.calls = 0

    def path(self, call: int, restart: int) -> str:
        return os.path.join(self.folder, f"cavi-{call}-{restart}.npz")


_CHECKPOINTS: contextvars.ContextVar[_Checkpoints | None] = contextvars.ContextVar(
    "latentzoo_cavi_checkpoints", default=None
)


@contextlib.contextmanager
def checkpointing(folder: str, *, every: int | None = None, seconds: float = 60.0,
                  resume: bool = False):
    """Save the state of every :meth:`CAVI.run` inside the block to ``folder`` (created if
    needed): every ``every`` sweeps, or (``every=None``) at most every ``seconds``, and when a
    start finishes. ``resume=True`` continues each run from its saved state (a finished start is
    not run again). Runs are told apart by their order in the block and their restart number, so
    a resumed block must make the same calls in the same order (as a re-run of one fit does).
    """
    if every is not None and every < 1:
        raise ValueError(f"every must be a positive number of sweeps, got {every}.")
    token = _CHECKPOINTS.set(_Checkpoints(folder, every, seconds, resume))
    try:
        yield
    finally:
        _CHECKPOINTS.reset(token)


def _save_state(path: str, state: CAVIState, losses, finished: bool) -> None:
    """The state, the objective trace and whether the start finished, written atomically."""
    arrays = {f"param:{k}": np.asarray(v) for k, v in state.params.items()}
    arrays.update(elbo=np.asarray(state.elbo), step=np.asarray(state.step),
                  rng_key=np.asarray(state.rng_key), losses=np.asarray(losses, dtype=float),
                  finished=np.asarray(finished))
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    host = "".join(c if c.isalnum() or c in "._" else "_" for c in socket.gethostname() or "localhost")
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".tmp-{os.getpid()}@{host}-", suffix=".npz")
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **arrays)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def _load_state(path: str, fresh: CAVIState) -> tuple[CAVIState, list, bool]:
    """A saved state, checked against a fresh one of the same run (names, shapes, dtypes)."""
    with np.load(path, allow_pickle=False) as z:
        params = {k[len("param:"):]: z[k] for k in z.files if k.startswith("param:")}
        elbo, step, key = z["elbo"], int(z["step"]), z["rng_key"]
        losses, finished = [float(v) for v in z["losses"]], bool(z["finished"])
    want = {k: (np.shape(v), np.asarray(v).dtype) for k, v in fresh.params.items()}
    have = {k: (v.shape, v.dtype) for k, v in params.items()}
    if want != have:
        raise ValueError(
            f"The checkpoint {path} holds the parameters of another fit (names or shapes "
            "differ); run afresh without resuming."
        )
    state = CAVIState({k: jnp.asarray(v) for k, v in params.items()}, jnp.asarray(elbo), step,
                      jnp.asarray(key, dtype=jnp.result_type(fresh.rng_key)))
    return state, losses, finished


def _roundoff(elbo_value: float) -> float:
    # float64 sums of O(N*D) terms: allow a few thousand ulps of the objective's magnitude.
    return 1e-10 * max(1.0, abs(elbo_value)) + 1e-9


def _accepts(fn, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a callable without a signature
        return False


class CAVI:
    """SVI-shaped driver for closed-form updates.

    Args:
        model: the NumPyro model.
        guide: the NumPyro guide; its ``numpyro.param`` names are the keys of the params dict.
        algorithm: a :class:`CoordinateAscent`.
        on_decrease: "raise" (default), "warn" or "ignore" when the ELBO decreases beyond
            round-off between sweeps.

    Example::

        cavi = CAVI(factor_analysis, fa_vb.guide, fa_vb.algorithm)
        result = cavi.run(jax.random.PRNGKey(0), 500, X, K=3)
        Predictive(factor_analysis, guide=fa_vb.guide, params=result.params, num_samples=100)
    """

    def __init__(self, model, guide, algorithm: CoordinateAscent, *, on_decrease: str = "raise"):
        if on_decrease not in ("raise", "warn", "ignore"):
            raise ValueError("on_decrease must be 'raise', 'warn' or 'ignore'.")
        self.model = model
        self.guide = guide
        self.algorithm = algorithm
        self.on_decrease = on_decrease
        self._takes_key = _accepts(algorithm.update, "rng_key")
        self._jitted: dict[Any, tuple[Callable, Callable]] = {}

    def _fns(self, kwargs):
        """The jitted (update, elbo) for these keyword arguments, and the arguments they take.

        Keyword arguments whose every leaf is an array (labels, rank pairs, masks: tables of the
        data) are traced arguments of the compiled sweep, like the positional data; the others
        (sizes, variant names, prior dicts) are bound. A table bound into the program would be
        compiled in as a constant, and compile time would grow with the data."""
        static, tables = split_tables(kwargs)
        key = (tuple(sorted((k, repr(v)) for k, v in static.items())), tuple(sorted(tables)))
        if key not in self._jitted:
            algo = self.algorithm
            if self._takes_key:
                update = jax.jit(lambda p, k, t, *a: algo.update(p, *a, rng_key=k, **static, **t))
            else:
                update = jax.jit(lambda p, k, t, *a: algo.update(p, *a, **static, **t))
            elbo = jax.jit(lambda p, t, *a: algo.elbo(p, *a, **static, **t))
            self._jitted[key] = (update, elbo)
        update, elbo = self._jitted[key]
        return (lambda p, k, *a: update(p, k, tables, *a)), (lambda p, *a: elbo(p, tables, *a))

    def init(self, rng_key, *args, init_params=None, **kwargs) -> CAVIState:
        """Initial parameters (``init_params`` entries override the recipe's) and their ELBO."""
        rng_key, key_init = jax.random.split(rng_key)
        params = self.algorithm.init(key_init, *args, **kwargs)
        if init_params:
            unknown = set(init_params) - set(params)
            if unknown:
                raise ValueError(f"init_params names unknown parameters {sorted(unknown)}.")
            params = {**params, **{k: jnp.asarray(v) for k, v in init_params.items()}}
        _, elbo = self._fns(kwargs)
        return CAVIState(params, elbo(params, *args), 0, rng_key)

    def get_params(self, state: CAVIState) -> dict:
        return state.params

    def evaluate(self, state: CAVIState, *args, **kwargs) -> jax.Array:
        """-ELBO at the state's parameters."""
        _, elbo = self._fns(kwargs)
        return -elbo(state.params, *args)

    def update(self, state: CAVIState, *args, **kwargs) -> tuple[CAVIState, jax.Array]:
        """One sweep of coordinate updates; returns the new state and its loss (-ELBO)."""
        update, elbo = self._fns(kwargs)
        rng_key, key_step = jax.random.split(state.rng_key)
        params = update(state.params, key_step, *args)
        value = elbo(params, *args)
        self._check(float(state.elbo), float(value), state.step + 1)
        return CAVIState(params, value, state.step + 1, rng_key), -value

    def _check(self, old: float, new: float, step: int) -> None:
        if not np.isfinite(new):
            raise FloatingPointError(f"The ELBO became {new} at sweep {step}.")
        drop = old - new
        if drop > _roundoff(old) and self.on_decrease != "ignore":
            msg = (
                f"The ELBO decreased by {drop:.3e} at sweep {step} ({old:.10g} -> {new:.10g}); "
                "a coordinate update is not maximising its block."
            )
            if self.on_decrease == "raise":
                raise ELBODecreaseError(msg)
            warnings.warn(msg, RuntimeWarning, stacklevel=3)

    def run(
        self,
        rng_key,
        num_steps: int,
        *args,
        progress_bar: bool = True,
        init_params=None,
        init_state: CAVIState | None = None,
        rtol: float = 1e-8,
        restarts: int = 1,
        **kwargs,
    ) -> SVIRunResult:
        """Run up to ``num_steps`` sweeps; stop early when the relative ELBO change < ``rtol``.

        With ``restarts=R > 1`` the run is repeated from R starts, each with its own key (the R
        keys of ``jax.random.split(rng_key, R)``; ``init_params`` / ``init_state`` apply to the
        first), and the run with the highest final ELBO is returned.

        Returns ``SVIRunResult(params, state, losses)`` with ``losses[i] = -ELBO`` after sweep i.
        """
        if isinstance(restarts, bool) or not isinstance(restarts, (int, np.integer)) or restarts < 1:
            raise ValueError(f"restarts must be a positive integer, got {restarts!r}.")
        if progress_bar:  # the bar stands at 0 while XLA compiles the sweep: say so
            print("compiling the coordinate-ascent sweep for these sizes; its progress bar follows",
                  file=sys.stderr, flush=True)
        ck = _CHECKPOINTS.get()
        call = None
        if ck is not None:
            call, ck.calls = ck.calls, ck.calls + 1
        if restarts == 1:
            return self._run_one(
                rng_key, num_steps, args, kwargs, progress_bar, init_params, init_state, rtol, "",
                None if ck is None else ck.path(call, 0),
            )
        best = None
        for r, key in enumerate(jax.random.split(rng_key, restarts)):
            res = self._run_one(
                key, num_steps, args, kwargs, progress_bar,
                init_params if r == 0 else None, init_state if r == 0 else None, rtol,
                f" restart {r + 1}/{restarts}", None if ck is None else ck.path(call, r),
            )
            if best is None or float(res.state.elbo) > float(best.state.elbo):
                best = res
        return best

    def _run_one(self, rng_key, num_steps, args, kwargs, progress_bar, init_params, init_state,
                 rtol, label, checkpoint=None) -> SVIRunResult:
        state = init_state or self.init(rng_key, *args, init_params=init_params, **kwargs)
        losses = []
        ck = _CHECKPOINTS.get() if checkpoint else None
        if ck is not None and ck.resume and os.path.exists(checkpoint):
            state, losses, finished = _load_state(checkpoint, state)
            if finished:
                return SVIRunResult(state.params, state, jnp.asarray(losses))
        saved_step, saved_time = len(losses), time.monotonic()
        bar = tqdm(range(len(losses), num_steps), disable=not progress_bar, desc="CAVI" + label)
        for _ in bar:
            old = float(state.elbo)
            state, loss = self.update(state, *args, **kwargs)
            losses.append(float(loss))
            if progress_bar:
                bar.set_postfix(elbo=f"{-losses[-1]:.6g}")
            if abs(-losses[-1] - old) <= rtol * max(1.0, abs(old)):
                break
            if ck is not None and (
                len(losses) - saved_step >= ck.every if ck.every
                else time.monotonic() - saved_time >= ck.seconds
            ):
                _save_state(checkpoint, state, losses, finished=False)
                saved_step, saved_time = len(losses), time.monotonic()
        bar.close()
        if ck is not None:  # a finished start is never run again on resume
            _save_state(checkpoint, state, losses, finished=True)
        return SVIRunResult(state.params, state, jnp.asarray(losses))
