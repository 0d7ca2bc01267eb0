r"""NOCA's MAP-EM as CAVI block tables: the guide, the priors read from the model, the
data-driven start, the variational EM table and the exact EM table.

``noca_vem()`` (method ``"vb"``) runs the table :func:`noca_vb_blocks` (E-step, pi, theta, theta0)
on the objective :math:`\mathcal L = \mathcal F + \log p(\pi) + \log p(\theta) + \log p(\theta_0)`
(the Jaakkola-Jordan bound plus the log priors, a lower bound on :math:`\log p(X, \pi, \theta,
\theta_0)`); ``noca_exact_em()`` (``"em"``) the one-block table :func:`noca_exact_em_blocks` on
:math:`\log p(X\mid\pi,\theta,\theta_0) + \log p(\pi,\theta,\theta_0)`, exact by enumeration. Both are
run by :func:`~latentzoo.inference.cavi_blocks.coordinate_ascent`, which re-reads the model's
priors on every call (:func:`read_noca_priors`): editing a Beta hyperparameter in
``models/noca.py`` changes the fit. Each block declares the prior families it is exact for
(``pi``: Beta, ``theta``/``theta0``: :class:`~latentzoo.models.noca.NoisyOrBeta`); in the
variational table a block whose site has another prior family falls back to SVI steps (with a
warning), the exact table refuses in one sentence.

The start (:func:`noca_data_init`) is built from the data, because the obvious one (every
:math:`\theta_{ij}` of order 1) switches every source off on sparse data in one sweep: an active
source would then turn on a third of all items, so every row prefers it off and
:math:`\pi\to 0`, an absorbing state of EM.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.distributions import constraints

from latentzoo.models.noca import NoisyOrBeta, noca

from latentzoo.inference.cavi import CoordinateAscent
from latentzoo.inference.cavi_blocks import CAVIBlock, coordinate_ascent
from latentzoo.inference.enumerate import all_states, enumerate_posterior
from latentzoo.inference.gibbs import read_model
from latentzoo.inference.noca.bound import noca_bound, noca_state_log_joint, positive_index
from latentzoo.inference.noca.em import (
    THETA_MAX,
    THETA_MIN,
    exact_m_step,
    lam_update,
    pi_update,
    q_update,
    theta0_update,
    theta_update,
)
from latentzoo.inference.updates import elementwise_log_prob, prior_params, unwrap

__all__ = [
    "noca_guide",
    "NOCAPriors",
    "read_noca_priors",
    "noca_log_prior",
    "noca_data_init",
    "Positives",
    "noca_vb_blocks",
    "noca_exact_em_blocks",
    "noca_vem",
    "noca_exact_em",
]

BERNOULLI = (dist.BernoulliProbs, dist.BernoulliLogits)  # dist.Bernoulli is a factory, not a class
_LIK = {"s": BERNOULLI, "X": BERNOULLI}


def noca_guide(X=None, *, K, N=None, D=None, priors=None, num_pos=None):
    """Guide: point estimates pi, theta, theta0 (``Delta``) and Q(s) = prod Bernoulli(lam).
    ``q`` (P, K), the Jensen weights of the positive findings, is a parameter of the bound only."""
    N = X.shape[0] if X is not None else N
    D = X.shape[1] if X is not None else D
    pi = numpyro.param("pi_loc", jnp.full(K, 0.5), constraint=constraints.unit_interval)
    theta = numpyro.param("theta_loc", jnp.ones((K, D)), constraint=constraints.positive)
    theta0 = numpyro.param("theta0_loc", jnp.full(D, 0.01), constraint=constraints.positive)
    lam = numpyro.param("lam", jnp.full((N, K), 0.5), constraint=constraints.unit_interval)
    numpyro.param("q", jnp.full((1, K), 1.0 / K), constraint=constraints.simplex)
    with numpyro.plate("K", K, dim=-1):
        numpyro.sample("pi", dist.Delta(pi))
    with numpyro.plate("D", D, dim=-1):
        numpyro.sample("theta0", dist.Delta(theta0))
    with numpyro.plate("Ksrc", K, dim=-2), numpyro.plate("D", D, dim=-1):
        numpyro.sample("theta", dist.Delta(theta))
    with numpyro.plate("N", N, dim=-2), numpyro.plate("K", K, dim=-1):
        numpyro.sample("s", dist.Bernoulli(probs=lam))


# ----------------------------------------------------------------------------- priors
class NOCAPriors(NamedTuple):
    """The model's priors as the M-steps read them: Beta(pi_a, pi_b) on pi (K,), NoisyOrBeta(a, b)
    on theta (K, D), NoisyOrBeta(a0, b0) on theta0 (D,), and the prior distributions themselves
    (``fns``, for the objective's log prior). A site whose prior is of another family reads as
    (1, 0) (no pseudo-counts): its block then falls back to SVI and does not read them."""

    pi_a: Any
    pi_b: Any
    a: Any
    b: Any
    a0: Any
    b0: Any
    fns: Any


def _concrete_min(x):
    try:
        return float(np.min(np.asarray(x)))
    except (TypeError, jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError):
        return None  # a traced hyperparameter: checked where it was concrete


def _hyper(d, shape, family, names, site, floor):
    if not isinstance(unwrap(d), family):
        return jnp.ones(shape), jnp.zeros(shape)
    a, b = prior_params(d, shape, *names)
    for limit, name in zip(floor, names):
        # the distribution's own parameter, not its broadcast: under jit every jnp operation is
        # staged, so only the value the user passed in is concrete
        low = _concrete_min(getattr(unwrap(d), name))
        if low is not None and low < limit:
            raise ValueError(
                f"The point fits need {name} >= {limit:g} in the {type(unwrap(d)).__name__} prior "
                f"of {site!r} (a log-concave prior with a MAP), got {low:g}."
            )
    return a, b


def read_noca_priors(model, X, *, K, N=None, D=None, priors=None, num_pos=None, **_) -> NOCAPriors:
    """Trace ``model`` on X and read its priors' hyperparameters (the context of the blocks).
    Traced under ``jit`` (one compilation instead of one per operation when called eagerly, as
    at the start of a fit); the distributions are pytrees, so they come out as they are."""

    def read(X):
        N, D = X.shape
        values = {"pi": jnp.full(K, 0.5), "theta": jnp.ones((K, D)), "theta0": jnp.ones(D),
                  "s": jnp.zeros((N, K))}
        fns, _, _ = read_model(model, values, (X,), dict(K=K, priors=priors))
        beta = ("concentration1", "concentration0")
        pi_a, pi_b = _hyper(fns["pi"], (K,), dist.Beta, beta, "pi", (1.0, 1.0))
        a, b = _hyper(fns["theta"], (K, D), NoisyOrBeta, beta, "theta", (1.0, 0.0))
        a0, b0 = _hyper(fns["theta0"], (D,), NoisyOrBeta, beta, "theta0", (1.0, 0.0))
        return NOCAPriors(pi_a, pi_b, a, b, a0, b0, {k: fns[k] for k in ("pi", "theta", "theta0")})

    # the hyperparameters do not depend on the data's values: two rows give the shapes
    return jax.jit(read)(X[:2])


def noca_log_prior(params, ctx: NOCAPriors) -> dict:
    """``{site: log p(site value)}`` for pi, theta, theta0 at the point estimates (any family)."""
    out = {}
    for site in ("pi", "theta", "theta0"):
        out[site] = elementwise_log_prob(ctx.fns[site], params[f"{site}_loc"]).sum()
    return out


# ----------------------------------------------------------------------------- start
def noca_data_init(rng_key, X, K: int, *, seed_rows=None, leak_share: float = 0.5, p_max: float = 0.9):
    r"""A start built from the data: ``{pi_loc, theta_loc, theta0_loc}``.

    Seeds: K distinct rows with at least one finding on, chosen k-means++-style (each next seed
    with probability proportional to its Jaccard distance from the nearest seed so far). Source
    i's template is the mean of the rows weighted by how much of the seed they contain,
    :math:`w_{ni} = (|x_n\wedge x_{s_i}|/|x_{s_i}|)^2`; its gate :math:`p_{ij}` is the excess of
    that mean over the item's overall frequency :math:`\bar x_j`, as a noisy-OR would add it,
    :math:`(m_{ij} - \bar x_j)/(1 - \bar x_j)` clipped to [0, ``p_max``], with the smoothed
    frequency :math:`\bar x_j = (\sum_n x_{nj} + \tfrac12)/(N + 1)`; :math:`\pi_i` is the mean
    weight clipped to [0.01, 0.5] and the leak :math:`p_{0j}` is ``leak_share`` of the item's
    frequency. On sparse data
    an active source then turns on its seed's items and almost nothing else. ``seed_rows`` (K,)
    gives the seeds instead (the re-seeding of switched-off sources).
    """
    Xn = np.asarray(X, dtype=np.float64)
    N, D = Xn.shape
    rng = np.random.default_rng(np.asarray(jax.random.key_data(rng_key)).ravel().tolist())
    size = Xn.sum(1)
    candidates = np.flatnonzero(size > 0)
    if candidates.size == 0:
        candidates = np.arange(N)
    freq = (Xn.sum(0) + 0.5) / (N + 1.0)
    seeds = [int(rng.choice(candidates))] if seed_rows is None else [int(i) for i in seed_rows]
    nearest = np.ones(N)
    for _ in range(len(seeds), K):
        s = Xn[seeds[-1]]
        inter = Xn @ s
        union = size + s.sum() - inter
        dist_ = 1.0 - np.where(union > 0, inter / np.maximum(union, 1.0), 1.0)
        nearest = np.minimum(nearest, dist_)
        w = np.where(size > 0, nearest, 0.0) if np.any(size > 0) else nearest
        w[seeds] = 0.0
        seeds.append(int(rng.choice(N, p=w / w.sum())) if w.sum() > 0 else int(rng.integers(N)))
    S = Xn[seeds]  # (K, D)
    contain = (Xn @ S.T) / np.maximum(S.sum(1), 1.0)[None, :]  # (N, K)
    w = contain**2
    m = (w.T @ Xn) / np.maximum(w.sum(0), 1e-12)[:, None]
    p = np.clip((m - freq) / (1.0 - freq), 0.0, p_max)
    theta = np.clip(-np.log1p(-p), THETA_MIN, THETA_MAX)
    theta0 = -np.log1p(-leak_share * freq)
    pi = np.clip(w.mean(0), 0.01, 0.5)
    dt = X.dtype if hasattr(X, "dtype") else jnp.float64
    return {"pi_loc": jnp.asarray(pi, dt), "theta_loc": jnp.asarray(theta, dt),
            "theta0_loc": jnp.asarray(theta0, dt)}


def _init(rng_key, X, ctx=None, *, K, N=None, D=None, priors=None, num_pos=None):
    """The data-driven start (:func:`noca_data_init`), lam = pi, q = 1/K (uniform over parents)."""
    N, D = X.shape
    P = int(X.sum()) if num_pos is None else num_pos
    start = noca_data_init(rng_key, X, K)
    return {
        **start,
        "lam": jnp.broadcast_to(start["pi_loc"], (N, K)).astype(X.dtype),
        "q": jnp.full((P, K), 1.0 / K, X.dtype),
    }


# ----------------------------------------------------------------------------- tables
class Positives(NamedTuple):
    """What the variational blocks read besides the params: the (row, column) index of the
    ``num_pos`` ones of X (static under jit) and the model's priors."""

    rows: jax.Array
    cols: jax.Array
    num_pos: int
    priors: NOCAPriors


def _positives(model, X, *, num_pos, **kwargs) -> Positives:
    rows, cols = positive_index(X, num_pos)
    return Positives(rows, cols, num_pos, read_noca_priors(model, X, num_pos=num_pos, **kwargs))


def noca_vb_blocks(e_iters: int = 1, q_steps: int = 2, solver_iters: int = 12) -> tuple[CAVIBlock, ...]:
    """The variational MAP-EM table on L = F + log prior: E-step (``e_iters`` x (q steps, lam)),
    then pi, theta, theta0, each M-step with its prior's pseudo-counts."""

    def e_step(params, X, pos: Positives):
        lam, q = params["lam"], params["q"]
        theta, theta0 = params["theta_loc"], params["theta0_loc"]
        for _ in range(e_iters):
            q = q_update(q, lam, theta, theta0, pos.rows, pos.cols, q_steps)
            lam = lam_update(q, X, theta, theta0, params["pi_loc"], pos.rows, pos.cols)
        return {**params, "lam": lam, "q": q}

    def pi_step(params, X, pos: Positives):
        return {**params, "pi_loc": pi_update(params["lam"], pos.priors.pi_a, pos.priors.pi_b)}

    def theta_step(params, X, pos: Positives):
        theta = theta_update(
            params["theta_loc"], params["theta0_loc"], params["lam"], params["q"], X,
            pos.rows, pos.cols, solver_iters, pos.priors.a, pos.priors.b,
        )
        return {**params, "theta_loc": theta}

    def theta0_step(params, X, pos: Positives):
        theta0 = theta0_update(
            params["theta_loc"], params["theta0_loc"], params["lam"], params["q"], X,
            pos.rows, pos.cols, solver_iters, pos.priors.a0, pos.priors.b0,
        )
        return {**params, "theta0_loc": theta0}

    return (
        CAVIBlock("E-step (q, Q(s))", ("s",), _LIK, e_step, ("q", "lam")),
        CAVIBlock("M-step pi", ("pi",), {"pi": (dist.Beta,), **_LIK}, pi_step, ("pi_loc",)),
        CAVIBlock("M-step theta", ("theta",), {"theta": (NoisyOrBeta,), **_LIK}, theta_step, ("theta_loc",)),
        CAVIBlock("M-step theta0", ("theta0",), {"theta0": (NoisyOrBeta,), **_LIK}, theta0_step, ("theta0_loc",)),
    )


def noca_vem(e_iters: int = 1, q_steps: int = 2, solver_iters: int = 12, *, model=noca) -> CoordinateAscent:
    """Variational MAP-EM on L = F + log prior (method ``"vb"``): the table :func:`noca_vb_blocks`,
    checked against ``model``. Needs the keyword ``num_pos`` = number of ones in X (static under
    jit). The objective is split by site, so a block whose prior family was changed falls back to
    SVI steps on :func:`noca_guide`."""

    def objective(params, X, pos: Positives):
        return {"X": noca_bound(params, X, num_pos=pos.num_pos), **noca_log_prior(params, pos.priors)}

    blocks = noca_vb_blocks(e_iters, q_steps, solver_iters)
    return coordinate_ascent(model, blocks, _init, objective, _positives, guide=noca_guide)


def exact_statistics(params, X):
    """The enumeration E-step at params: ``EnumStats`` (log p(x_n), E[s_n], state weights and
    c1 = sum_n p(s | x_n) x_n)."""
    K = params["theta_loc"].shape[0]
    return enumerate_posterior(
        noca_state_log_joint(params["theta_loc"], params["theta0_loc"], params["pi_loc"]), X,
        all_states(K, X.dtype),
    )


# The exact E-step at the parameters a sweep returns is both the objective of that sweep and the
# E-step of the next one, so a sweep stores its sums (``cache_*``) with a copy of the parameters
# they belong to; the objective and the next sweep use them only when the parameters still match
# exactly (``lax.cond``), else they enumerate afresh. One enumeration per sweep instead of two.
_CACHE = ("cache_at", "cache_loglik", "cache_c1", "cache_weights", "cache_Es")


def _pack(params):
    return jnp.concatenate([params["pi_loc"], params["theta_loc"].ravel(), params["theta0_loc"]])


def _with_cache(params, X):
    st = exact_statistics(params, X)
    return {**params, "cache_at": _pack(params), "cache_loglik": st.loglik.sum(), "cache_c1": st.RtX,
            "cache_weights": st.weights, "cache_Es": st.Es}


def _cached(params, X):
    """(loglik, c1, weights, Es) at params: from the cache when it belongs to them."""
    fresh = jnp.all(params["cache_at"] == _pack(params))

    def recompute(_):
        st = exact_statistics(params, X)
        return st.loglik.sum(), st.RtX, st.weights, st.Es

    def reuse(_):
        return tuple(params[k] for k in _CACHE[1:])

    return jax.lax.cond(fresh, reuse, recompute, None)


def _exact_init(rng_key, X, ctx=None, **kwargs):
    return _with_cache(_init(rng_key, X, ctx, **kwargs), X)


def noca_exact_em_blocks(m_sweeps: int = 2) -> tuple[CAVIBlock, ...]:
    """Exact MAP-EM as a one-block table: the enumeration E-step's sums, then the generalised
    M-step with the priors' pseudo-counts, then the E-step at the new parameters (kept for the
    objective and the next sweep). The M-step needs the state weights of the enumeration, not
    only lam, so E- and M-step are one block."""

    def sweep(params, X, ctx: NOCAPriors):
        _, c1, weights, Es = _cached(params, X)
        c0 = weights[:, None] - c1
        theta, theta0 = exact_m_step(
            params["theta_loc"], params["theta0_loc"], c1, c0, m_sweeps, prior=(ctx.a0, ctx.b0, ctx.a, ctx.b)
        )
        pi = pi_update(Es, ctx.pi_a, ctx.pi_b)
        new = _with_cache({**params, "pi_loc": pi, "theta_loc": theta, "theta0_loc": theta0}, X)
        return {**new, "lam": new["cache_Es"]}

    requires = {"pi": (dist.Beta,), "theta": (NoisyOrBeta,), "theta0": (NoisyOrBeta,), **_LIK}
    return (
        CAVIBlock(
            "exact EM sweep (s by enumeration; pi, theta, theta0)", ("s", "pi", "theta", "theta0"),
            requires, sweep, ("lam", "pi_loc", "theta_loc", "theta0_loc"),
        ),
    )


def noca_exact_em(m_sweeps: int = 2, *, model=noca) -> CoordinateAscent:
    """Exact MAP-EM by enumeration (K <= 16; method ``"em"``), checked against ``model``.
    Objective: the exact log-likelihood plus the log prior. ``lam`` holds the exact posterior
    marginals used by the last M-step; ``q`` is carried unchanged. A prior of another family
    than the table's is refused in one sentence (no SVI fallback for the one-block table)."""

    def objective(params, X, ctx: NOCAPriors):
        return {"X": _cached(params, X)[0], **noca_log_prior(params, ctx)}

    def read(model, X, **kwargs):
        return read_noca_priors(model, X, **kwargs)

    return coordinate_ascent(model, noca_exact_em_blocks(m_sweeps), _exact_init, objective, read)
