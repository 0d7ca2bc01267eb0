r"""Annealed importance sampling (Neal, 2001): log p(X | parameters) for any model with a Gibbs
table whose latent updates honour the likelihood's temperature.

With the parameters :math:`\theta` fixed and latents :math:`z`, AIS walks the tempered path of
:mod:`latentzoo.inference.tempering`,

.. math::

    f_\beta(z) = p(z \mid \theta)\, p(X \mid z, \theta)^\beta, \qquad
    0 = \beta_0 < \beta_1 < \dots < \beta_{K-1} = 1,

from the prior (:math:`f_0`, normalised) to the unnormalised posterior (:math:`f_1`, whose
normaliser is :math:`p(X \mid \theta)`). Each chain draws :math:`z_0 \sim p(z \mid \theta)`, then
for k = 1..K-2 draws :math:`z_k \sim T_{\beta_k}(\cdot \mid z_{k-1})`, a kernel leaving
:math:`f_{\beta_k}` invariant (one sweep of the table's latent updates on
``temper(model, beta_k)``), and carries the log weight

.. math::

    \log w = \sum_{k=1}^{K-1} \log\frac{f_{\beta_k}(z_{k-1})}{f_{\beta_{k-1}}(z_{k-1})}
           = \sum_{k=1}^{K-1} (\beta_k - \beta_{k-1}) \log p(X \mid z_{k-1}, \theta).

:math:`E[w] = p(X \mid \theta)` exactly for any K and any valid kernels. The estimate is
:math:`\log \frac1M \sum_m w_m` over M independent chains (computed as a log-mean-exp). By
Jensen's inequality it is biased low on the log scale, by about half the relative variance of
the weights' mean; more temperatures shrink both.

**Standard error.** With :math:`\hat p = \bar w`, the delta method gives
:math:`\mathrm{Var}(\log \hat p) \approx \mathrm{Var}(w) / (M \bar w^2)`, so the reported error is
:math:`\mathrm{sd}(w_m / \bar w) / \sqrt M` (sample sd, ddof = 1), computed from the log weights
without overflow. It is itself an estimate from M weights: when a few chains dominate (small
:attr:`AISResult.ess`), it understates the error.

**No normalising constant in the weights.** The same unnormalised :math:`f_\beta` enters the
weights and the kernels. The tensor-analysers supplement (eqs. 18-20) instead normalises the
tempered likelihood, adding :math:`C(\beta)` (:func:`supplement_log_c`) to :math:`\log f_\beta`;
the kernels do not see a z-free constant, but the weights telescope to an extra
:math:`C(\beta_{K-1}) - C(\beta_0) = -C(0)`, which is infinite (:math:`-\infty` with eq. 19 as
printed, :math:`+\infty` with the constant that really normalises): :func:`supplement_log_weights`
shows it.

**Whole data or per row.** ``X`` is the model's whole data set: the estimate is
:math:`\log p(X \mid \theta) = \sum_n \log p(x_n \mid \theta)` for models whose rows are
independent given :math:`\theta` (divide by N for "per data point"). One AIS run on all rows is
N chains' worth of work in one; its log weights' variance grows with N, so the number of
temperatures needed grows with N too.

:func:`prior_sampling_log_marginal` is the simple importance sampler with the prior as proposal
(the tensor-analysers paper's sec. 3.3): the same computation with the schedule (0, 1).
"""

from __future__ import annotations

import collections
import functools
import math
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.handlers import seed, substitute, trace
from numpyro.infer.gibbs import latent_sample_sites

from .gibbs import SweepState, read_model, sweep
from .gibbs_plan import make_plan
from .tempering import temper
from .updates import GibbsUpdate, Move

__all__ = [
    "AISResult",
    "ais",
    "beta_schedule",
    "prior_sampling_log_marginal",
    "supplement_log_c",
    "supplement_log_weights",
    "log_mean_exp_with_stderr",
]

SCHEDULES = ("sigmoid", "geometric", "linear")
#: Smallest positive temperature of the geometric schedule.
GEOMETRIC_START = 1e-4
#: Half-width of the sigmoid schedule's grid (Grosse, Ghahramani & Adams, 2015 use 4).
SIGMOID_WIDTH = 4.0


class AISResult(NamedTuple):
    """An importance-sampling estimate of log p(X | parameters).

    - **log_marginal**: log of the mean weight, :math:`\\log \\frac1M \\sum_m w_m` (scalar).
    - **stderr**: its delta-method standard error, :math:`\\mathrm{sd}(w / \\bar w)/\\sqrt M`.
    - **log_weights**: (M,) the chains' log weights.
    - **betas**: (K,) the temperatures, from 0 to 1.
    """

    log_marginal: jax.Array
    stderr: jax.Array
    log_weights: jax.Array
    betas: jax.Array

    @property
    def ess(self) -> jax.Array:
        """Effective number of chains, :math:`(\\sum w)^2 / \\sum w^2` (M when all weights agree)."""
        lw = self.log_weights
        return jnp.exp(2.0 * jax.nn.logsumexp(lw) - jax.nn.logsumexp(2.0 * lw))


def log_mean_exp_with_stderr(log_weights) -> tuple[jax.Array, jax.Array]:
    """``(log mean w, sd(w / mean w) / sqrt(M))`` from log weights (M,), without overflow."""
    lw = jnp.asarray(log_weights)
    M = lw.shape[0]
    est = jax.nn.logsumexp(lw) - jnp.log(M)
    rel = jnp.exp(lw - est)  # w / mean(w), mean 1
    return est, jnp.sqrt(jnp.sum((rel - 1.0) ** 2) / (M - 1) / M)


def beta_schedule(num_temps: int, kind: str = "sigmoid") -> np.ndarray:
    """Temperatures :math:`\\beta_0 = 0 < \\dots < \\beta_{K-1} = 1`, K = ``num_temps``.

    - ``"linear"``: evenly spaced.
    - ``"geometric"``: 0, then K - 1 values evenly spaced in log from ``GEOMETRIC_START`` to 1
      (small steps where :math:`\\log f_\\beta` changes fastest relative to its value).
    - ``"sigmoid"``: :math:`\\sigma` of an even grid on [-4, 4], rescaled to [0, 1] (Grosse et
      al., 2015): small steps at both ends, where the tempered distributions change most.
    """
    if not _is_int(num_temps) or num_temps < 2:
        raise ValueError(f"num_temps must be an integer >= 2 (0 and 1 at least), got {num_temps!r}.")
    if kind == "linear":
        return np.linspace(0.0, 1.0, num_temps)
    if kind == "geometric":
        if num_temps == 2:
            return np.array([0.0, 1.0])
        return np.concatenate([[0.0], np.geomspace(GEOMETRIC_START, 1.0, num_temps - 1)])
    if kind == "sigmoid":
        s = 1.0 / (1.0 + np.exp(-np.linspace(-SIGMOID_WIDTH, SIGMOID_WIDTH, num_temps)))
        b = (s - s[0]) / (s[-1] - s[0])
        b[-1] = 1.0
        return b
    raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)} or an array of temperatures, got {kind!r}.")


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _check_betas(schedule, num_temps) -> np.ndarray:
    if isinstance(schedule, str):
        return beta_schedule(num_temps, schedule)
    b = np.asarray(schedule, dtype=float)
    if (
        b.ndim != 1 or b.shape[0] < 2 or not np.all(np.isfinite(b)) or b[0] != 0.0
        or b[-1] != 1.0 or np.any(np.diff(b) < 0)
    ):
        raise ValueError(
            "The temperature schedule must be a 1-D array that starts at 0, ends at 1 and never decreases."
        )
    return b


# ------------------------------------------------------------------------- the compiled core
class _Setup(NamedTuple):
    model: object
    updates: tuple
    static_kwargs: tuple
    latent_sites: tuple
    data_site: str


_COMPILED: collections.OrderedDict = collections.OrderedDict()
_CACHE_SIZE = 16


def _split_kwargs(model_kwargs):
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


def _compiled(setup: _Setup):
    # keyed by identity (the entry keeps the objects alive, so an id is never reused for another)
    key = (id(setup.model), tuple(id(u) for u in setup.updates), setup.static_kwargs,
           setup.latent_sites, setup.data_site)
    if key in _COMPILED:
        _COMPILED.move_to_end(key)
        return _COMPILED[key][1]
    fns = (jax.jit(functools.partial(_log_weights, setup)),
           jax.jit(functools.partial(_prior_log_weights, setup), static_argnames=("batch",)))
    _COMPILED[key] = (setup, fns)
    if len(_COMPILED) > _CACHE_SIZE:
        _COMPILED.popitem(last=False)
    return fns


def _log_likelihood(setup: _Setup, values, X, kwargs):
    """log p(X | values) of the untempered data site (its handler scale, if any, included)."""
    _, _, tr = read_model(setup.model, values, (X,), kwargs)
    site = tr[setup.data_site]
    lp = site["fn"].log_prob(site["value"])
    if site.get("scale") is not None:
        lp = lp * site["scale"]
    return jnp.sum(lp)


def _prior_draw(setup: _Setup, params, key, X, kwargs):
    """The latents from p(z | params): the model traced with the parameters substituted."""
    tr = trace(substitute(seed(setup.model, key), data=params)).get_trace(X, **kwargs)
    return {s: tr[s]["value"] for s in setup.latent_sites}


def _log_weights(setup: _Setup, params, X, keys, betas, dynamic):
    """(M,) AIS log weights, one chain per key; betas (K,) traced (one compilation per K)."""
    kwargs = {**dict(setup.static_kwargs), **dynamic}
    data = (setup.data_site,)

    def chain(key):
        k0, k_run = jax.random.split(key)
        z = _prior_draw(setup, params, k0, X, kwargs)
        lw = (betas[1] - betas[0]) * _log_likelihood(setup, {**params, **z}, X, kwargs)

        def step(carry, beta_dbeta):
            z, lw, key = carry
            beta, dbeta = beta_dbeta
            state = SweepState({**params, **z}, key, jnp.zeros(()), jnp.zeros((), bool))
            state = sweep(temper(setup.model, beta, data), setup.updates, state, (X,), kwargs)
            z = {s: state.z[s] for s in setup.latent_sites}
            lw = lw + dbeta * _log_likelihood(setup, {**params, **z}, X, kwargs)
            return (z, lw, state.rng_key), None

        # the kernel at beta_k (k = 1..K-2), then the weight's factor f_{k+1} / f_k at the result
        (_, lw, _), _ = jax.lax.scan(step, (z, lw, k_run), (betas[1:-1], jnp.diff(betas)[1:]))
        return lw

    return jax.vmap(chain)(keys)


def _prior_log_weights(setup: _Setup, params, X, keys, dynamic, *, batch: int):
    """log p(X | z) for z from the prior, one per key; keys (B, batch): lax.map over the B
    batches, vmap within one, so memory is that of one batch."""
    kwargs = {**dict(setup.static_kwargs), **dynamic}

    def one(key):
        return _log_likelihood(setup, {**params, **_prior_draw(setup, params, key, X, kwargs)},
                               X, kwargs)

    return jax.lax.map(jax.vmap(one), keys).reshape(-1)


def _prepare(model, updates, X, params, model_kwargs, latent_sites, data_site, need_updates):
    """Validate the inputs (one sentence per problem) and choose the updates AIS sweeps."""
    if not callable(model):
        raise ValueError("model must be a NumPyro model (a callable).")
    if isinstance(latent_sites, str):
        latent_sites = (latent_sites,)
    latent_sites = tuple(latent_sites)
    if not latent_sites or not all(isinstance(s, str) for s in latent_sites):
        raise ValueError("latent_sites must name at least one latent site of the model.")
    model_kwargs = dict(model_kwargs or {})
    try:
        X = jnp.asarray(X)
    except (TypeError, ValueError):
        raise ValueError("X must be a numeric array.") from None
    if not jnp.issubdtype(X.dtype, jnp.number) or not bool(jnp.all(jnp.isfinite(X))):
        raise ValueError("X must be a numeric array with finite entries only.")
    if not isinstance(params, dict):
        raise ValueError("params must be a dict of site name -> value.")
    tr = trace(seed(model, jax.random.PRNGKey(0))).get_trace(X, **model_kwargs)
    if data_site not in tr or not tr[data_site].get("is_observed", False):
        raise ValueError(f"The model has no observed site {data_site!r} (data_site).")
    latent = latent_sample_sites(tr)
    unknown = [s for s in latent_sites if s not in latent]
    if unknown:
        raise ValueError(f"latent_sites {unknown} are not latent sample sites of the model.")
    param_sites = [s for s in latent if s not in latent_sites]
    missing = [s for s in param_sites if s not in params]
    extra = [s for s in params if s not in param_sites]
    if missing or extra:
        raise ValueError(
            f"params must give exactly the model's parameter sites {param_sites}"
            + (f"; {missing} are missing" if missing else "")
            + (f"; {extra} are not parameter sites" if extra else "") + "."
        )
    fixed = {}
    for name in param_sites:
        value = jnp.asarray(params[name])
        if value.shape != jnp.shape(tr[name]["value"]):
            raise ValueError(
                f"params[{name!r}] has shape {value.shape}; the model's site has "
                f"{jnp.shape(tr[name]['value'])}."
            )
        fixed[name] = value
    chosen = ()
    if need_updates:
        updates = tuple(updates)
        if not all(isinstance(u, (GibbsUpdate, Move)) for u in updates):
            raise ValueError("updates must be GibbsUpdate or Move records (a Gibbs table).")
        plan = make_plan(model, updates, (X,), model_kwargs)
        chosen = tuple(u for u in plan.updates if set(u.sites) <= set(latent_sites))
        covered = {s for u in chosen if isinstance(u, GibbsUpdate) for s in u.sites}
        uncovered = [s for s in latent_sites if s not in covered]
        if uncovered:
            raise ValueError(
                f"No applicable update in the table samples the latent sites {uncovered} alone; "
                "AIS needs one for every latent site."
            )
    static, dynamic = _split_kwargs(model_kwargs)
    setup = _Setup(model, chosen, static, latent_sites, data_site)
    return setup, X, fixed, dynamic


def ais(
    model,
    updates: Sequence[GibbsUpdate | Move],
    X,
    params: dict,
    model_kwargs: dict | None = None,
    *,
    latent_sites: Sequence[str],
    num_chains: int = 10,
    num_temps: int = 500,
    schedule="sigmoid",
    rng_key,
    data_site: str = "X",
) -> AISResult:
    """log p(X | params) by annealed importance sampling.

    Args:
        model: the NumPyro program, called as ``model(X, **model_kwargs)``.
        updates: its Gibbs table. AIS sweeps, in table order, the applicable updates whose
            ``sites`` all lie in ``latent_sites`` (moves included); each must honour the
            likelihood's temperature (:func:`~latentzoo.inference.tempering.temperature`), which
            ``check_conditional`` on ``temper(model, beta)`` tests.
        X: the data, the model's ``data_site``.
        params: fixed values of every latent site outside ``latent_sites``.
        model_kwargs: the model's keyword arguments (sizes, ``priors``).
        latent_sites: the sites integrated out; they start from their prior given ``params``.
        num_chains: M independent chains (at least 2, for the standard error).
        num_temps: K, the number of distributions on the path, both ends included (K - 2
            sweeps, K - 1 weight factors); ignored when ``schedule`` is an array.
        schedule: ``"sigmoid"``, ``"geometric"``, ``"linear"`` (:func:`beta_schedule`) or an
            array of temperatures from 0 to 1.
        rng_key: a JAX PRNG key.
        data_site: the observed site whose likelihood is tempered.

    Returns an :class:`AISResult`: log p(X | params) summed over all rows of ``X``.
    """
    if not _is_int(num_chains) or num_chains < 2:
        raise ValueError(f"num_chains must be an integer >= 2 (for a standard error), got {num_chains!r}.")
    betas = _check_betas(schedule, num_temps)
    setup, X, fixed, dynamic = _prepare(
        model, updates, X, params, model_kwargs, latent_sites, data_site, need_updates=True
    )
    run, _ = _compiled(setup)
    betas_j = jnp.asarray(betas)
    lw = run(fixed, X, jax.random.split(rng_key, num_chains), betas_j, dynamic)
    est, se = log_mean_exp_with_stderr(lw)
    return AISResult(est, se, lw, betas_j)


def prior_sampling_log_marginal(
    model,
    X,
    params: dict,
    model_kwargs: dict | None = None,
    *,
    latent_sites: Sequence[str],
    num_samples: int,
    rng_key,
    batch: int = 1000,
    data_site: str = "X",
) -> AISResult:
    """log p(X | params) ≈ log (1/S) Σ_s p(X | z_s), z_s ~ p(z | params): importance sampling
    with the prior as proposal (AIS with the schedule (0, 1)). Fine when the posterior is not much
    narrower than the prior (few latents, e.g. one small row); hopeless otherwise, as its
    standard error (often itself underestimated then) shows.

    ``num_samples`` draws are made ``batch`` at a time (``lax.map`` over batches), so 1e5 fit in
    memory; the count is rounded up to whole batches. Returns an :class:`AISResult` with
    ``betas = (0, 1)``.
    """
    for name, v in (("num_samples", num_samples), ("batch", batch)):
        if not _is_int(v) or v < (2 if name == "num_samples" else 1):
            raise ValueError(f"{name} must be a positive integer (num_samples >= 2), got {v!r}.")
    setup, X, fixed, dynamic = _prepare(
        model, (), X, params, model_kwargs, latent_sites, data_site, need_updates=False
    )
    _, run = _compiled(setup)
    batch = min(batch, num_samples)
    n_batches = math.ceil(num_samples / batch)
    keys = jax.random.split(rng_key, n_batches * batch)
    keys = keys.reshape((n_batches, batch) + keys.shape[1:])
    lw = run(fixed, X, keys, dynamic, batch=batch)
    est, se = log_mean_exp_with_stderr(lw)
    return AISResult(est, se, lw, jnp.asarray([0.0, 1.0]))


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


def supplement_log_weights(result: AISResult, noise_variance, num_rows: int, *,
                           as_printed: bool = True):
    """The log weights the supplement's eqs. 18-20 would give on the same chains: each factor
    :math:`f_{\\beta_k}/f_{\\beta_{k-1}}` with :math:`\\log f_\\beta` including
    :func:`supplement_log_c`. The kernels are unchanged (the constant is free of z), so the
    weights differ from ``result.log_weights`` by :math:`\\sum_k C(\\beta_k) - C(\\beta_{k-1})
    = C(1) - C(\\beta_0) = -C(\\beta_0)`: infinite from :math:`\\beta_0 = 0` (:math:`-\\infty`
    as printed, :math:`+\\infty` with the normalising constant), and a bias of
    :math:`-C(\\beta_0)` from any positive start. For showing why the constant stays out.
    """
    c = supplement_log_c(result.betas, noise_variance, num_rows, as_printed=as_printed)
    return result.log_weights + jnp.sum(jnp.diff(c))
