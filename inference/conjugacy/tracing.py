"""Reading a model for the conjugacy detector: traces at chosen values of one site, the wrappers
around a site's distribution, and the log density of a chosen set of sites.

Everything here is a pure function of its arguments and runs under ``jit`` (the derived
conditionals re-trace the model at traced values), except what only the detector calls, eagerly:
:func:`concrete_arguments` (stand-ins for tracer arguments, when a kernel is initialised inside a
compiled Geweke or SBC program) and :func:`base_trace` (random feasible values, from NumPy).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from numpyro.distributions import constraints
from numpyro.distributions.transforms import biject_to
from numpyro.handlers import seed, substitute, trace

from latentzoo.inference.tempering import Tempered, temperature

__all__ = [
    "WRAPPERS",
    "trace_at",
    "base_trace",
    "concrete_arguments",
    "Peeled",
    "peel",
    "on_index_space",
    "strip_tempered",
    "sites_log_density",
]

#: The distribution wrappers the detector looks through to a site's family.
WRAPPERS = (dist.Independent, dist.ExpandedDistribution, dist.MaskedDistribution, Tempered)


def trace_at(model, model_args, model_kwargs, data) -> dict:
    """The model's trace with the sites in ``data`` (latent values, and observed values to
    replace the data in the arguments) substituted; latent sites not in ``data`` are drawn from
    a fixed seed."""
    return trace(substitute(seed(model, jax.random.PRNGKey(0)), data=data)).get_trace(
        *model_args, **model_kwargs)


def _feasible(fn, rng: np.random.Generator):
    """A random value in the support of ``fn`` (numpy draws mapped into the support; no JAX
    sampler, which would compile eagerly): what the detector traces the other latent sites at
    when it is given no values. Random rather than fixed, so that no structural zero (all
    sources off, a zero loading) hides a dependence."""
    shape = tuple(fn.batch_shape) + tuple(fn.event_shape)
    support = fn.support
    while isinstance(support, constraints.independent):
        support = support.base_constraint
    if support is constraints.boolean:
        return jnp.asarray(rng.integers(0, 2, shape))
    if isinstance(support, constraints.integer_interval):
        lo = int(np.min(np.asarray(support.lower_bound)))
        hi = int(np.max(np.asarray(support.upper_bound)))
        return jnp.asarray(rng.integers(lo, hi + 1, shape))
    if isinstance(support, constraints.integer_greater_than):
        return jnp.asarray(rng.integers(0, 4, shape) + int(np.max(np.asarray(support.lower_bound))) + 1)
    if support is constraints.nonnegative_integer:
        return jnp.asarray(rng.integers(0, 4, shape))
    if fn.is_discrete:
        return None  # an unusual discrete support: drawn from the model's own sampler
    transform = biject_to(fn.support)
    u = rng.standard_normal(transform.inverse_shape(shape))
    return transform(jnp.asarray(u))


def base_trace(model, model_args, model_kwargs, values=None, seed_value: int = 0):
    """``(trace, latent values, observed values)`` at ``values``; every latent site not given is
    set to a random feasible value (:func:`_feasible`, from ``seed_value``)."""
    given = dict(values or {})
    rng = np.random.default_rng(seed_value)

    def fill(msg):
        if msg["type"] != "sample" or msg.get("is_observed"):
            return None
        if msg["name"] in given:
            return given[msg["name"]]
        return _feasible(msg["fn"], rng)

    tr = trace(substitute(seed(model, jax.random.PRNGKey(seed_value)), substitute_fn=fill)).get_trace(
        *model_args, **model_kwargs)
    latent = {n: s["value"] for n, s in tr.items() if s["type"] == "sample" and not s["is_observed"]}
    observed = {n: s["value"] for n, s in tr.items() if s["type"] == "sample" and s["is_observed"]}
    return tr, latent, observed


def _stand_in(x):
    if not isinstance(x, jax.core.Tracer):
        return x
    dtype = np.dtype(x.dtype)
    if np.issubdtype(dtype, np.bool_):
        return np.ones(x.shape, dtype)
    if np.issubdtype(dtype, np.integer):
        return np.ones(x.shape, dtype)
    return np.full(x.shape, 0.75, dtype)


def concrete_arguments(model_args, model_kwargs):
    """``(args, kwargs, replaced)``: the model's arguments with every tracer leaf replaced by a
    concrete stand-in of its shape and dtype (0.75, or 1 for integers and booleans), and whether
    any was replaced.

    The detector decides a site's conjugacy from the *form* of its children's parameters, which
    the data's values do not change; inside a compiled program (a Geweke chain initialising its
    kernel) it reads that form off the stand-ins, eagerly.
    """
    leaves = jax.tree_util.tree_leaves((model_args, model_kwargs))
    replaced = any(isinstance(x, jax.core.Tracer) for x in leaves)
    if not replaced:
        return model_args, model_kwargs, False
    args, kwargs = jax.tree_util.tree_map(_stand_in, (tuple(model_args), dict(model_kwargs)))
    return args, kwargs, True


class Peeled(NamedTuple):
    """A site's distribution with its wrappers removed.

    - **base**: the innermost distribution (its family).
    - **index_shape**: ``E``, the value's shape without the base family's event dims: every
      batch element of the base after plate broadcasting and ``to_event`` (``(N, D)`` for
      ``Normal(loc, scale).expand([D]).to_event(1)`` in a plate of size N).
    - **mask**: boolean array of shape ``E`` (True: the element adds to the log density), or
      None when nothing is masked out.
    """

    base: dist.Distribution
    index_shape: tuple[int, ...]
    mask: jax.Array | None


def peel(fn: dist.Distribution) -> Peeled:
    """Strip ``Independent`` / ``ExpandedDistribution`` / ``MaskedDistribution`` / ``Tempered``
    from ``fn`` and combine the masks of every level into one mask over the base's elements."""
    value_shape = tuple(fn.batch_shape) + tuple(fn.event_shape)
    chain = []
    d = fn
    while isinstance(d, WRAPPERS):
        chain.append(d)
        d = d.base_dist
    base = d
    E = value_shape[: len(value_shape) - len(base.event_shape)]
    mask = None
    for w in chain:
        if not isinstance(w, dist.MaskedDistribution):
            continue
        m = w._mask  # NumPyro's attribute: True, False or a boolean array over w's batch shape
        if m is True:
            continue
        B = tuple(w.batch_shape)
        inner = len(w.event_shape) - len(base.event_shape)  # dims reinterpreted below this level
        m = jnp.broadcast_to(jnp.asarray(m, bool), B).reshape(B + (1,) * inner)
        m = jnp.broadcast_to(m, E)
        mask = m if mask is None else mask & m
    return Peeled(base, E, mask)


def on_index_space(param, index_shape, trailing: int = 0):
    """A parameter of a base distribution broadcast to ``index_shape`` plus its own ``trailing``
    dims (0 for a scalar parameter such as a Normal's loc, 1 for a probability vector)."""
    param = jnp.asarray(param)
    tail = param.shape[param.ndim - trailing:] if trailing else ()
    return jnp.broadcast_to(param, tuple(index_shape) + tuple(tail))


def _has_tempered(d) -> bool:
    while d is not None:
        if isinstance(d, Tempered):
            return True
        d = getattr(d, "base_dist", None) if isinstance(d, WRAPPERS) else None
    return False


def strip_tempered(fn: dist.Distribution) -> dist.Distribution:
    """``fn`` with every :class:`~latentzoo.inference.tempering.Tempered` wrapper replaced by the
    distribution it wraps (the other wrappers and their masks are kept)."""
    while _has_tempered(fn):
        fn = jax.tree_util.tree_map(
            lambda d: d.base_dist if isinstance(d, Tempered) else d, fn,
            is_leaf=lambda d: isinstance(d, Tempered))
    return fn


def sites_log_density(tr, names, priors=None) -> jax.Array:
    """Sum of the log densities of the sample sites ``names`` of a trace: masks and handler
    scales applied as NumPyro's ``log_density`` applies them, and each site's temperature read
    from ``priors`` (the caller's view of the model, as hand-written updates read it with
    :func:`~latentzoo.inference.tempering.temperature`) rather than from this trace. Scalar."""
    total = jnp.zeros(())
    for name in names:
        site = tr[name]
        fn = site["fn"]
        beta = temperature(priors[name]) if priors is not None and name in priors else temperature(fn)
        lp = strip_tempered(fn).log_prob(site["value"])
        if site.get("scale") is not None:
            lp = site["scale"] * lp
        total = total + beta * jnp.sum(lp)
    return total
