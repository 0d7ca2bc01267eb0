r"""The log weights of annealed importance sampling, compiled: the chains on the tempered path,
the prior-sampling weights, and the tensor-analysers supplement's weights with :math:`C(\beta)`.

The estimators and their documentation are in :mod:`latentzoo.inference.ais`; this module holds
the pure functions they jit (one compilation per model, update table, static model arguments and
array shapes: :func:`compiled_weights` caches them).
"""

from __future__ import annotations

import collections
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from numpyro.handlers import seed, substitute, trace

from .gibbs import SweepState, observed_log_likelihood, sweep
from .tempering import temper
from .updates import GibbsUpdate, Move

__all__ = [
    "AISSetup",
    "split_model_kwargs",
    "compiled_weights",
    "data_log_likelihood",
    "prior_draw",
    "ais_log_weights",
    "prior_log_weights",
    "supplement_log_c",
    "supplement_log_weights",
]


class AISSetup(NamedTuple):
    """What one compiled AIS program is specialised to: the model, the updates AIS sweeps, the
    hashable model arguments, the latent sites and the data site."""

    model: object
    updates: tuple
    static_kwargs: tuple
    latent_sites: tuple
    data_site: str


_COMPILED: collections.OrderedDict = collections.OrderedDict()
_CACHE_SIZE = 16


def split_model_kwargs(model_kwargs):
    """Hashable keyword arguments (sizes, tuples) are static; the rest (prior dicts, arrays) are
    traced pytrees, so new hyperparameters do not recompile."""
    static, dynamic = {}, {}
    for k, v in model_kwargs.items():
        try:
            hash(v)
            static[k] = v
        except TypeError:
            dynamic[k] = v
    return tuple(sorted(static.items())), dynamic


def _fingerprint(obj, depth: int = 0):
    """A hashable key that is equal for two callables only when they compute the same thing: a
    function by its code, defaults and closure values (recursively), a ``functools.partial`` by
    its function and arguments, a hashable value by itself, anything else by identity. An update
    table is rebuilt on every ``fa_updates()`` call; this lets the rebuilt table reuse the
    compiled program. Identity keys stay valid because the cache keeps the objects alive. As
    with ``jax.jit``'s own cache, module globals the code reads are not part of the key."""
    if depth > 8:
        return ("id", id(obj))
    if isinstance(obj, functools.partial):
        return ("partial", _fingerprint(obj.func, depth + 1),
                tuple(_fingerprint(a, depth + 1) for a in obj.args),
                tuple((k, _fingerprint(v, depth + 1)) for k, v in sorted(obj.keywords.items())))
    code = getattr(obj, "__code__", None)
    if code is not None:
        cells = tuple(_fingerprint(c.cell_contents, depth + 1) for c in (obj.__closure__ or ()))
        defaults = tuple(_fingerprint(v, depth + 1) for v in (obj.__defaults__ or ()))
        return ("fn", code, cells, defaults)
    if isinstance(obj, (GibbsUpdate, Move)):
        return (type(obj).__name__, obj.name, tuple(obj.sites),
                tuple(_fingerprint(getattr(obj, f), depth + 1)
                      for f in obj._fields if f not in ("name", "sites", "requires")))
    if isinstance(obj, (tuple, list)):
        return (type(obj).__name__, tuple(_fingerprint(v, depth + 1) for v in obj))
    try:
        hash(obj)
    except TypeError:
        return ("id", id(obj))
    if isinstance(obj, (int, float, str, bytes, bool, type(None), type)):
        return ("value", obj)
    return ("id", id(obj))


def compiled_weights(setup: AISSetup):
    """The jitted ``(ais_log_weights, prior_log_weights)`` for ``setup``, from a small cache
    keyed by the model's identity and the updates' :func:`_fingerprint`, so repeated estimates
    (new data of the same shape, new parameters, a rebuilt update table) compile once."""
    key = (id(setup.model), _fingerprint(setup.updates), setup.static_kwargs,
           setup.latent_sites, setup.data_site)
    if key in _COMPILED:
        _COMPILED.move_to_end(key)
        return _COMPILED[key][1]
    fns = (jax.jit(functools.partial(ais_log_weights, setup), static_argnames=("per_row", "return_latents")),
           jax.jit(functools.partial(prior_log_weights, setup), static_argnames=("batch", "per_row")))
    _COMPILED[key] = (setup, fns)
    if len(_COMPILED) > _CACHE_SIZE:
        _COMPILED.popitem(last=False)
    return fns


def data_log_likelihood(setup: AISSetup, values, X, kwargs):
    """log p(X | values) of the untempered data site (its handler scale, if any, included)."""
    return observed_log_likelihood(setup.model, values, (X,), kwargs, sites=(setup.data_site,))


def prior_draw(setup: AISSetup, params, key, X, kwargs):
    """The latents from p(z | params): the model traced with the parameters substituted."""
    tr = trace(substitute(seed(setup.model, key), data=params)).get_trace(X, **kwargs)
    return {s: tr[s]["value"] for s in setup.latent_sites}


def ais_log_weights(setup: AISSetup, params, X, keys, betas, dynamic, *, per_row: bool = False,
                    row_params=None, return_latents: bool = False):
    """(M,) AIS log weights, one chain per key; betas (K,) traced (one compilation per K).
    ``per_row``: keys (N, M), each row of X on its own (as a one-row data set) -> (N, M);
    ``row_params``: parameter values that differ by row (each with a leading axis N), replacing
    those of ``params`` for that row. ``return_latents``: also each chain's final latents (the
    weighted sample of the posterior that the weights make unbiased): ``(lw, latents)``, every
    latent with leading axes (M,) (per row (N, M))."""
    if per_row:
        one = functools.partial(ais_log_weights, setup, betas=betas, dynamic=dynamic,
                                return_latents=return_latents)
        if row_params is None:
            return jax.vmap(lambda x, k: one(params, x[None], k))(X, keys)
        return jax.vmap(lambda x, k, rp: one({**params, **rp}, x[None], k))(X, keys, row_params)
    kwargs = {**dict(setup.static_kwargs), **dynamic}
    data = (setup.data_site,)

    def chain(key):
        k0, k_run = jax.random.split(key)
        z = prior_draw(setup, params, k0, X, kwargs)
        lw = (betas[1] - betas[0]) * data_log_likelihood(setup, {**params, **z}, X, kwargs)

        def step(carry, beta_dbeta):
            z, lw, key = carry
            beta, dbeta = beta_dbeta
            state = SweepState({**params, **z}, key, jnp.zeros(()), jnp.zeros((), bool))
            state = sweep(temper(setup.model, beta, data), setup.updates, state, (X,), kwargs)
            z = {s: state.z[s] for s in setup.latent_sites}
            lw = lw + dbeta * data_log_likelihood(setup, {**params, **z}, X, kwargs)
            return (z, lw, state.rng_key), None

        # the kernel at beta_k (k = 1..K-2), then the weight's factor f_{k+1} / f_k at the result
        (z, lw, _), _ = jax.lax.scan(step, (z, lw, k_run), (betas[1:-1], jnp.diff(betas)[1:]))
        return (lw, z) if return_latents else lw

    return jax.vmap(chain)(keys)


def prior_log_weights(setup: AISSetup, params, X, keys, dynamic, *, batch: int, per_row: bool):
    """log p(X | z) for z from the prior, one per key; keys (B, batch): lax.map over the B
    batches, vmap within one, so memory is that of one batch. ``per_row``: each row of X on its
    own with its own draws (the key folded with the row index) -> (N, B * batch)."""
    kwargs = {**dict(setup.static_kwargs), **dynamic}

    def one(key, x):
        z = prior_draw(setup, params, key, x, kwargs)
        return data_log_likelihood(setup, {**params, **z}, x, kwargs)

    if not per_row:
        return jax.lax.map(jax.vmap(lambda k: one(k, X)), keys).reshape(-1)
    rows = jnp.arange(X.shape[0])

    def all_rows(key):
        return jax.vmap(lambda x, n: one(jax.random.fold_in(key, n), x[None]))(X, rows)

    return jax.lax.map(jax.vmap(all_rows), keys).reshape(-1, X.shape[0]).T


# ------------------------------------------------------------- the supplement's weights
def supplement_log_c(beta, noise_variance, num_rows: int = 1, *, as_printed: bool = True):
    r"""The tensor-analysers supplement's :math:`C(\beta)`, summed over ``num_rows`` rows, for
    diagonal noise *variances* :math:`\Psi` (D,). As printed (eq. 19),

    .. math::

        C(\beta) = \tfrac\beta2 \log|\Psi| + \tfrac{\beta D}2 \log 2\pi
                 - \tfrac12 \log|\beta\Psi| - \tfrac D2 \log 2\pi ,

    meant to make :math:`\mathcal N(x; e, \Psi)^\beta e^{C(\beta)}` the normalised
    :math:`\mathcal N(x; e, \Psi/\beta)` (eq. 20). It does not: that needs
    :math:`\log|\Psi/\beta|` in place of :math:`\log|\beta\Psi|`, i.e. :math:`C + D\log\beta`
    (``as_printed=False``). Both vanish at :math:`\beta = 1`; as :math:`\beta \to 0` the printed
    one goes to :math:`+\infty`, the normalising one to :math:`-\infty`. ``beta`` may be an
    array; returns its shape.
    """
    beta = jnp.asarray(beta)[..., None]
    log_psi = jnp.log(jnp.asarray(noise_variance))
    D = log_psi.shape[-1]
    log_2pi = math.log(2.0 * math.pi)
    sign = 1.0 if as_printed else -1.0
    c = (0.5 * beta * log_psi.sum(-1, keepdims=True) + 0.5 * beta * D * log_2pi
         - 0.5 * jnp.sum(sign * jnp.log(beta) + log_psi, -1, keepdims=True) - 0.5 * D * log_2pi)
    return num_rows * c[..., 0]


def supplement_log_weights(result, noise_variance, num_rows: int, *, as_printed: bool = True):
    """The log weights the supplement's eqs. 18-20 would give on the same chains: each factor
    :math:`f_{\\beta_k}/f_{\\beta_{k-1}}` with :math:`\\log f_\\beta` including
    :func:`supplement_log_c`. The kernels are unchanged (the constant is free of z), so the
    weights differ from ``result.log_weights`` by :math:`\\sum_k C(\\beta_k) - C(\\beta_{k-1})
    = C(1) - C(\\beta_0) = -C(\\beta_0)`: infinite from :math:`\\beta_0 = 0` (:math:`-\\infty`
    as printed, :math:`+\\infty` with the normalising constant), and a bias of
    :math:`-C(\\beta_0)` from any positive start. For showing why the constant stays out.
    ``result``: an :class:`~latentzoo.inference.ais.AISResult` (its ``log_weights`` and ``betas``).
    """
    c = supplement_log_c(result.betas, noise_variance, num_rows, as_printed=as_printed)
    return result.log_weights + jnp.sum(jnp.diff(c))
