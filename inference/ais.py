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
tempered likelihood, adding :math:`C(\beta)`
(:func:`~latentzoo.inference.ais_weights.supplement_log_c`) to :math:`\log f_\beta`. The
kernels do not see a z-free constant, but the weights telescope to an extra
:math:`C(\beta_{K-1}) - C(\beta_0) = -C(0)`, which is infinite (:math:`-\infty` with eq. 19 as
printed, :math:`+\infty` with the constant that really normalises), as
:func:`~latentzoo.inference.ais_weights.supplement_log_weights` shows.

**Whole data or per row.** By default ``X`` is one data set: the estimate is
:math:`\log p(X \mid \theta)`, for models whose rows are independent given :math:`\theta` the
sum :math:`\sum_n \log p(x_n \mid \theta)` (divide by N for "per data point"). Its log
weights' variance grows with N, so the number of temperatures a joint run needs grows with N
too. With ``per_row=True`` each row gets its own M chains and its own estimate (vectorised over
the rows, so at the cost of one joint run). While the summed variance of the rows' log weights is
well below 1 the two agree to first order (same bias, same variance); beyond it a joint run's
weights degenerate (one chain carries the weight, and its standard error is no longer to be
trusted) while each row's run stays in the regime where the delta method holds: on TA{2,2,2} at
noise s.d. 0.1 with 10 rows, M = 10 and K = 100, a joint run is 12 nats low, the per-row sum 1.8.
Use it whenever the latents are per row.

:func:`prior_sampling_log_marginal` is the simple importance sampler with the prior as proposal
(the tensor-analysers paper's sec. 3.3): the same computation with the schedule (0, 1).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.handlers import seed, trace
from numpyro.infer.gibbs import latent_sample_sites

from .ais_weights import AISSetup, compiled_weights, split_model_kwargs
from .gibbs_plan import make_plan
from .updates import GibbsUpdate, Move

__all__ = [
    "AISResult",
    "ais",
    "beta_schedule",
    "prior_sampling_log_marginal",
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

    - **latents**: with ``return_latents``, each chain's final latent values (leading axis M):
      with the weights, an importance sample of p(latents | X, parameters); else None.

    With ``per_row=True`` the first three have a leading row axis: (N,), (N,), (N, M), and the
    latents (N, M, 1, ...) (each row a one-row data set).
    """

    log_marginal: jax.Array
    stderr: jax.Array
    log_weights: jax.Array
    betas: jax.Array
    latents: dict | None = None

    @property
    def ess(self) -> jax.Array:
        """Effective number of chains, :math:`(\\sum w)^2 / \\sum w^2` (M when all weights agree)."""
        lw = self.log_weights
        return jnp.exp(2.0 * jax.nn.logsumexp(lw, axis=-1) - jax.nn.logsumexp(2.0 * lw, axis=-1))


def log_mean_exp_with_stderr(log_weights) -> tuple[jax.Array, jax.Array]:
    """``(log mean w, sd(w / mean w) / sqrt(M))`` from log weights (..., M) over the last axis,
    without overflow."""
    lw = jnp.asarray(log_weights)
    M = lw.shape[-1]
    est = jax.nn.logsumexp(lw, axis=-1) - jnp.log(M)
    rel = jnp.exp(lw - est[..., None])  # w / mean(w), mean 1
    return est, jnp.sqrt(jnp.sum((rel - 1.0) ** 2, axis=-1) / (M - 1) / M)


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
        or b[-1] != 1.0 or np.any(np.diff(b) <= 0)
    ):
        raise ValueError(
            "The temperature schedule must be a 1-D array that starts at 0, ends at 1 and strictly increases."
        )
    return b


def _prepare(model, updates, X, params, model_kwargs, latent_sites, data_site, need_updates,
             per_row):
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
    if per_row:
        rows = X.shape[0] if X.ndim else None
        ragged = [s for s in latent_sites if jnp.ndim(tr[s]["value"]) < 1 or jnp.shape(tr[s]["value"])[0] != rows]
        if ragged:
            raise ValueError(
                f"per_row needs every latent site to hold one entry per row of X along its first "
                f"axis, and {ragged} do not."
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
        untempered = [u.name for u in chosen if not u.tempered]
        if untempered:
            raise ValueError(
                f"The updates {untempered} do not read the likelihood's temperature (tempered=False), "
                "so AIS with them would be biased; derive their annealed form or leave them out."
            )
        covered = {s for u in chosen if isinstance(u, GibbsUpdate) for s in u.sites}
        uncovered = [s for s in latent_sites if s not in covered]
        if uncovered:
            raise ValueError(
                f"No applicable update in the table samples the latent sites {uncovered} alone; "
                "AIS needs one for every latent site."
            )
    static, dynamic = split_model_kwargs(model_kwargs)
    setup = AISSetup(model, chosen, static, latent_sites, data_site)
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
    per_row: bool = False,
    row_params: dict | None = None,
    return_latents: bool = False,
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
        per_row: run AIS on each row of ``X`` on its own, M chains per row, for models whose
            rows are independent given ``params`` and whose latent sites have one entry per row
            (first axis). The same work as one run on all rows; it keeps working where a joint
            run's weights degenerate (their variance adds up over the rows).
        row_params: with ``per_row``, parameter values that differ by row (leading axis N),
            replacing those of ``params`` row by row (one compiled program for all rows; e.g. a
            noise variance made huge at a row's missing entries, which leaves them out).
        return_latents: also return each chain's final latents (``AISResult.latents``).

    Returns an :class:`AISResult`: log p(X | params) summed over all rows of ``X``, or with
    ``per_row`` per row: ``log_marginal`` and ``stderr`` (N,), ``log_weights`` (N, M) (the
    total is ``log_marginal.sum()``, its error ``sqrt((stderr**2).sum())``).
    """
    if not _is_int(num_chains) or num_chains < 2:
        raise ValueError(f"num_chains must be an integer >= 2 (for a standard error), got {num_chains!r}.")
    betas = _check_betas(schedule, num_temps)
    setup, X, fixed, dynamic = _prepare(
        model, updates, X, params, model_kwargs, latent_sites, data_site, True, bool(per_row)
    )
    run, _ = compiled_weights(setup)
    betas_j = jnp.asarray(betas)
    keys = jax.random.split(rng_key, num_chains * (X.shape[0] if per_row else 1))
    if per_row:
        keys = keys.reshape((X.shape[0], num_chains) + keys.shape[1:])
    if row_params is not None:
        if not per_row:
            raise ValueError("row_params gives parameters row by row, which needs per_row=True.")
        bad = [k for k, v in row_params.items()
               if k not in fixed or jnp.shape(v) != (X.shape[0], *jnp.shape(fixed[k]))]
        if bad:
            raise ValueError(f"row_params {bad} must be parameter sites with a leading axis of "
                             f"{X.shape[0]} rows and the site's shape after it.")
        row_params = {k: jnp.asarray(v) for k, v in row_params.items()}
    out = run(fixed, X, keys, betas_j, dynamic, per_row=bool(per_row), row_params=row_params,
              return_latents=bool(return_latents))
    lw, latents = out if return_latents else (out, None)
    est, se = log_mean_exp_with_stderr(lw)
    return AISResult(est, se, lw, betas_j, latents)


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
    per_row: bool = False,
) -> AISResult:
    """log p(X | params) ≈ log (1/S) Σ_s p(X | z_s), z_s ~ p(z | params): importance sampling
    with the prior as proposal (AIS with the schedule (0, 1)). Fine when the posterior is not much
    narrower than the prior (few latents, e.g. one small row); hopeless otherwise, as its
    standard error (often itself underestimated then) shows.

    ``num_samples`` draws are made ``batch`` at a time (``lax.map`` over batches), so 1e5 fit in
    memory; the count is rounded up to whole batches. ``per_row`` as for :func:`ais` (each
    row with its own ``num_samples`` draws). Returns an :class:`AISResult` with
    ``betas = (0, 1)``.
    """
    for name, v in (("num_samples", num_samples), ("batch", batch)):
        if not _is_int(v) or v < (2 if name == "num_samples" else 1):
            raise ValueError(f"{name} must be a positive integer (num_samples >= 2), got {v!r}.")
    setup, X, fixed, dynamic = _prepare(
        model, (), X, params, model_kwargs, latent_sites, data_site, False, bool(per_row)
    )
    _, run = compiled_weights(setup)
    batch = min(batch, num_samples)
    n_batches = math.ceil(num_samples / batch)
    keys = jax.random.split(rng_key, n_batches * batch)
    keys = keys.reshape((n_batches, batch) + keys.shape[1:])
    lw = run(fixed, X, keys, dynamic, batch=batch, per_row=bool(per_row))
    est, se = log_mean_exp_with_stderr(lw)
    return AISResult(est, se, lw, jnp.asarray([0.0, 1.0]))
