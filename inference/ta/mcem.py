r"""Monte Carlo EM for tensor analyzers and their mixtures: the closed-form M-step from posterior
draws (supplement eqs. 4-10), a Rao-Blackwellised log-likelihood estimate, and a front door.

Notation of :mod:`latentzoo.models.tensor_analyzer`: groups :math:`z_j` (N, d_j),
:math:`y = [z_1; \dots; z_J]` (P), :math:`u = z_1 \otimes \dots \otimes z_J` (Q),
:math:`x = W y + T_{(1)} u + \mu + \varepsilon`, :math:`\varepsilon \sim \mathcal N(0,
\mathrm{diag}\,\Psi)`. With the features :math:`f = [y; u; 1]` (F = P + Q + 1) and
:math:`B = [W, T_{(1)}, \mu]` (D x F) the mean is :math:`B f`, linear in B.

**M-step.** Given draws :math:`z^{(s)}`, s = 1..S, of the latents (all rows at once), the Monte
Carlo estimate of eq. 1, :math:`\hat Q = \frac1S \sum_s \sum_n \log \mathcal N(x_n; B f_n^{(s)},
\Psi)`, replaces every expectation of eq. 4 by a sample average: :math:`E[y]`, :math:`E[u]`,
:math:`E[yy^\top]`, :math:`E[uy^\top]`, :math:`E[uu^\top]` are the blocks of
:math:`E[f]` and :math:`E[ff^\top]`. Eqs. 6 and 8 are the normal equations of W and of
:math:`T_{(1)}`, each with the other held fixed, and they are coupled through
:math:`E[uy^\top]`; solved jointly (with :math:`\mu` as the bias column, which the supplement
does not have), they are one least-squares problem,

.. math::

    B\, G = A, \qquad G = \sum_n E[f_n f_n^\top], \quad A = \sum_n x_n E[f_n]^\top,

solved by a Cholesky factorisation of G (F x F, shared by all D rows of B). Eq. 10 for
:math:`\Psi` at the new B, :math:`\Psi = \tfrac1N\mathrm{diag}\{\sum_n x_n x_n^\top - 2 B A^\top
+ B G B^\top\}`, equals the average squared residual :math:`\frac1{NS}\sum_{s,n}(x_n - B
f_n^{(s)})^2` (coordinate-wise), which is what is computed: a sum of squares cannot go negative
by cancellation when the noise is small next to the signal. (At the solution
:math:`BGB^\top = BA^\top`, so eq. 10 is also :math:`\tfrac1N\mathrm{diag}\{\sum x x^\top -
BA^\top\}`; the supplement's eq. 11, meant as a rearrangement of eq. 10, does not equal it.)

**Mixtures.** :math:`\hat Q = \frac1S\sum_s\sum_n [\log\pi_{c_n^{(s)}} + \log\mathcal N(x_n;
B_{c^{(s)}_n} f^{(s)}_n, \Psi_{c^{(s)}_n})]` separates over components: component k's terms are
those with :math:`c^{(s)}_n = k`, so its G, A and residuals are the sums above restricted to
those (row, draw) pairs, i.e. each row weighted by the fraction of its draws in component k, with
the features drawn jointly with that label; :math:`\pi_k = N_k / N` with
:math:`N_k = \frac1S\sum_{s,n} 1[c^{(s)}_n = k]`.

**Floors.** Maximum likelihood for these models is unbounded: a component whose rows it fits
exactly (fewer rows than features, or one coordinate explained perfectly) sends its
:math:`\Psi_{kd} \to 0` and the likelihood to infinity, and the next E-step's conditionals would
divide by zero. So :math:`\Psi` is floored at ``psi_floor`` times each coordinate's data variance
(1e-6: far below any noise level worth modelling, so it never binds on a well-posed fit; a
constant coordinate, whose variance is 0, at 1e-6 times the mean variance), and
:math:`\pi` at 1e-12 (a component with no draws keeps a finite log prior). A component with no
draws at all keeps its previous W, T, mu, Psi (the Monte Carlo objective does not involve them).
G gets a ridge of 1e-10 of its mean diagonal: round-off insurance when a component has fewer
(row, draw) pairs than features, where it picks the minimum-norm solution.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import cho_solve

from latentzoo.inference.gaussian import LOG_2PI
from latentzoo.inference.mcem import MCEM, MCEMResult, doubling_schedule
from latentzoo.inference.validation import check_matrix
from latentzoo.models.tensor_analyzer import (
    contract,
    group_names,
    kron_rows,
    mixture_of_tensor_analyzers,
    tensor_analyzer,
)

__all__ = [
    "PSI_FLOOR",
    "ta_m_step",
    "mta_m_step",
    "ta_features",
    "expected_complete_loglik",
    "log_likelihood_estimate",
    "TAFit",
    "fit_ta_mcem",
]

#: Floor of Psi relative to each coordinate's data variance (see the module's "Floors").
PSI_FLOOR = 1e-6
_PI_FLOOR = 1e-12
_RIDGE = 1e-10


def _group_draws(samples):
    J = sum(1 for k in samples if k.startswith("z_"))
    return [samples[name] for name in group_names(range(J))]


def ta_features(samples) -> jax.Array:
    """f = [y; u; 1] for every draw and row: z_j (S, N, d_j) each -> (S, N, P + Q + 1)."""
    zs = _group_draws(samples)
    ones = jnp.ones((*zs[0].shape[:-1], 1), zs[0].dtype)
    return jnp.concatenate([*zs, kron_rows(zs), ones], -1)


def _split(B, shape_T):
    """B (..., D, F) -> W (..., D, P), T (..., D, d_1..d_J), mu (..., D)."""
    d = tuple(shape_T[B.ndim - 1 :])
    P, Q = sum(d), math.prod(d)
    lead = B.shape[:-1]
    return B[..., :P], B[..., P : P + Q].reshape(*lead, *d), B[..., -1]


def _join(W, T, mu):
    return jnp.concatenate([W, T.reshape(*W.shape[:-1], -1), mu[..., None]], -1)


def _component_fit(F, w, X, S, floor):
    """B (D, F), Psi (D,), weight N_k for one component: F (S, N, F) features, w (S, N) 0/1
    membership of each (draw, row) pair."""
    n_k = jnp.sum(w) / S
    G = jnp.einsum("sn,snf,sng->fg", w, F, F) / S
    A = jnp.einsum("sn,nd,snf->df", w, X, F) / S
    nf = G.shape[0]
    empty = n_k <= 0.0
    # an empty component's G is 0: factor the identity instead, and keep its old values below
    G = jnp.where(empty, jnp.eye(nf, dtype=G.dtype), G)
    G = G + _RIDGE * jnp.trace(G) / nf * jnp.eye(nf, dtype=G.dtype)
    B = cho_solve((jnp.linalg.cholesky(G), True), A.T).T
    E = X[None] - F @ B.T  # (S, N, D)
    Psi = jnp.einsum("sn,snd->d", w, E * E) / S / jnp.where(empty, 1.0, n_k)
    return B, jnp.maximum(Psi, floor), n_k, empty


def _floor(X, psi_floor):
    """``psi_floor`` times each coordinate's variance; a constant coordinate (variance 0: image
    borders, dead genes) is floored at ``psi_floor`` times the mean variance instead (1 when
    every coordinate is constant), so its Psi stays positive and the likelihood finite."""
    var = jnp.var(X, axis=0)
    typical = jnp.where(jnp.any(var > 0), jnp.mean(var), 1.0)
    return psi_floor * jnp.where(var > 0, var, typical)


def ta_m_step(samples, X, params, *, psi_floor: float = PSI_FLOOR) -> dict:
    """The TA M-step: maximiser of the Monte Carlo expected complete log-likelihood.

    Args:
        samples: ``z_1``, ..., ``z_J`` draws, each (S, N, d_j) (draws of all chains stacked).
        X: data (N, D).
        params: current ``W`` (D, P), ``T`` (D, d_1, ..., d_J), ``mu`` (D,), ``Psi`` (D,); only
            their shapes are read.

    Returns new ``W``, ``T``, ``mu`` (eqs. 6 and 8 jointly, least squares on f = [y; u; 1]) and
    ``Psi`` (eq. 10), floored at ``psi_floor`` times each coordinate's data variance.
    """
    F = ta_features(samples)
    S = F.shape[0]
    B, Psi, _, _ = _component_fit(F, jnp.ones(F.shape[:2], F.dtype), X, S, _floor(X, psi_floor))
    W, T, mu = _split(B, params["T"].shape)
    return {"W": W, "T": T, "mu": mu, "Psi": Psi}


def mta_m_step(samples, X, params, *, psi_floor: float = PSI_FLOOR) -> dict:
    """The MTA M-step: per component k, the TA M-step on the (draw, row) pairs with c = k; pi_k
    the fraction of those pairs (floored at 1e-12 and renormalised).

    Args:
        samples: labels ``c`` (S, N) and groups ``z_j`` (S, N, d_j), drawn jointly.
        X: data (N, D).
        params: current ``pi`` (C,), ``W`` (C, D, P), ``T`` (C, D, d_1..d_J), ``mu`` (C, D),
            ``Psi`` (C, D); a component with no draws keeps its W, T, mu, Psi.
    """
    F = ta_features(samples)
    S, N = F.shape[:2]
    C = params["pi"].shape[0]
    floor = _floor(X, psi_floor)
    # one component at a time (lax.map): vmapping would hold C copies of the (S, N, F) features
    R = jax.nn.one_hot(samples["c"], C, dtype=F.dtype)  # (S, N, C)
    B, Psi, n_k, empty = jax.lax.map(
        lambda w: _component_fit(F, w, X, S, floor), jnp.moveaxis(R, -1, 0)
    )
    B_old = _join(params["W"], params["T"], params["mu"])
    B = jnp.where(empty[:, None, None], B_old, B)
    Psi = jnp.where(empty[:, None], params["Psi"], Psi)
    W, T, mu = _split(B, params["T"].shape)
    pi = jnp.maximum(n_k / N, _PI_FLOOR)
    return {"pi": pi / pi.sum(), "W": W, "T": T, "mu": mu, "Psi": Psi}


def expected_complete_loglik(samples, X, params) -> jax.Array:
    """The Monte Carlo objective the M-steps maximise (eq. 1 with draws for the expectation):
    (1/S) sum_s sum_n [log pi_{c_n} +] log N(x_n; W y_n + T_(1) u_n + mu, diag Psi), for TA
    params (no ``pi``) or MTA params (``pi``; ``samples`` has ``c``)."""
    F = ta_features(samples)
    S = F.shape[0]
    B = _join(params["W"], params["T"], params["mu"])
    if "pi" not in params:
        E = X[None] - F @ B.T
        ll = -0.5 * jnp.sum(E * E / params["Psi"] + jnp.log(params["Psi"]) + LOG_2PI)
        return ll / S
    c = samples["c"]
    mean = jnp.einsum("sndf,snf->snd", B[c], F)
    Psi = params["Psi"][c]
    ll = -0.5 * jnp.sum((X[None] - mean) ** 2 / Psi + jnp.log(Psi) + LOG_2PI)
    return (ll + jnp.sum(jnp.log(params["pi"])[c])) / S


# --------------------------------------------------------------------- log-likelihood
def _row_logliks(X, W, T, mu, Psi, rest, d1):
    """log N(x_n; o, M Mᵀ + diag Psi) for every row, one component and one draw of z_2..z_J
    (``rest``: J - 1 arrays (d_j,)): z_1 integrated out. Woodbury through the d_1 x d_1
    precision P = I + Mᵀ Psi⁻¹ M, never a D x D matrix."""
    if rest:
        zs = [jnp.zeros((1, d1), X.dtype), *(z[None] for z in rest)]
        M = W[:, :d1] + contract(T, zs, skip=0)[0]  # (D, d_1)
    else:  # one group: u = z_1, so T multiplies z_1 as W does
        M = W + T
    o = mu + (W[:, d1:] @ jnp.concatenate(rest) if rest else 0.0)
    MtL = M.T / Psi  # (d_1, D)
    eye = jnp.eye(d1, dtype=X.dtype)
    L = jnp.linalg.cholesky(eye + MtL @ M)
    # L^-1 once (d_1 right-hand sides), then a product: a batched triangular solve with N
    # right-hand sides is two orders of magnitude slower on XLA's CPU backend
    L_inv = jax.scipy.linalg.solve_triangular(L, eye, lower=True)
    r = X - o
    v = r @ (L_inv @ MtL).T  # (N, d_1)
    quad = jnp.sum(r * r / Psi, -1) - jnp.sum(v * v, -1)
    logdet = jnp.sum(jnp.log(Psi)) + 2.0 * jnp.sum(jnp.log(jnp.diagonal(L)))
    return -0.5 * (X.shape[1] * LOG_2PI + logdet + quad)


def log_likelihood_estimate(X, params, *, d, num_draws: int = 4096, rng_key=None,
                            per_row: bool = False):
    r"""log p(X | params) for a TA or MTA (params with ``pi``), Rao-Blackwellised prior sampling.

    z_1 is integrated out exactly (x | z_2..z_J, c = k is Gaussian with covariance
    :math:`M M^\top + \Psi_k`, :math:`M = W_{k,[1]} + T_k \times_3 z_2 \cdots`), and z_2..z_J
    (standard normal, the model's prior) are averaged over ``num_draws`` draws shared by all rows
    (rounded up to whole chunks): :math:`\log p(x_n) \approx \log \frac1S \sum_s \sum_k \pi_k
    \mathcal N(x_n; \cdot)`. Exact for one group (J = 1); otherwise consistent, biased low by
    O(1/S) where the draws cover the posterior of z_2..z_J poorly (small noise, many groups):
    for those, annealed importance sampling is the estimator to use.

    X (N, D) -> scalar, or (N,) with ``per_row=True``.
    """
    X = jnp.asarray(X)
    d = tuple(int(v) for v in d)
    key = jax.random.PRNGKey(0) if rng_key is None else rng_key
    mixture = "pi" in params
    comps = {k: jnp.asarray(params[k]) for k in ("W", "T", "mu", "Psi")}
    if not mixture:
        comps = {k: v[None] for k, v in comps.items()}
    log_pi = jnp.log(jnp.asarray(params["pi"])) if mixture else jnp.zeros(1, X.dtype)
    C, (N, D) = log_pi.shape[0], X.shape
    rest_sizes = d[1:]
    total = sum(rest_sizes)
    # draws per chunk: about 4M floats of residuals at a time, whatever N, D and C
    chunk = max(1, min(num_draws, (1 << 22) // max(1, N * D * C))) if total else 1
    n_chunks = -(-num_draws // chunk) if total else 1
    draws = jax.random.normal(key, (n_chunks, chunk, total), X.dtype)

    def one_draw(flat):
        rest = list(jnp.split(flat, np.cumsum(rest_sizes)[:-1])) if total else []
        ll = jax.vmap(lambda W, T, mu, Psi: _row_logliks(X, W, T, mu, Psi, rest, d[0]))(
            comps["W"], comps["T"], comps["mu"], comps["Psi"])  # (C, N)
        return jax.nn.logsumexp(ll + log_pi[:, None], axis=0)

    def body(acc, block):
        return jnp.logaddexp(acc, jax.nn.logsumexp(jax.vmap(one_draw)(block), axis=0)), None

    acc, _ = jax.lax.scan(body, jnp.full(N, -jnp.inf, X.dtype), draws)
    rows = acc - jnp.log(n_chunks * chunk)
    return rows if per_row else rows.sum()


# ------------------------------------------------------------------------- front door
class TAFit(NamedTuple):
    """A Monte Carlo EM fit of a TA (C = 1) or MTA.

    - **params**: the estimates (NumPy), named and shaped as the model's sites.
    - **loglik_trace**: ((iteration, log p(X | params)), ...) at the checkpoints, from
      :func:`log_likelihood_estimate` (iteration 0 is the data-driven start).
    - **result**: the driver's :class:`~latentzoo.inference.mcem.MCEMResult`.
    - **model**, **model_kwargs**: the NumPyro program and its arguments (``d``, ``C``).
    """

    params: dict
    loglik_trace: tuple[tuple[int, float], ...]
    result: MCEMResult
    model: object
    model_kwargs: dict


def _check_sizes(d, C):
    try:
        d = tuple(d)
    except TypeError:
        raise ValueError(f"d must be a sequence of group sizes, got {d!r}.") from None
    if not d or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1
                        for v in d):
        raise ValueError(f"d must be one or more positive integer group sizes, got {d!r}.")
    if isinstance(C, bool) or not isinstance(C, (int, np.integer)) or C < 1:
        raise ValueError(f"C must be a positive integer number of components, got {C!r}.")
    return tuple(int(v) for v in d), int(C)


def fit_ta_mcem(
    X,
    *,
    d=(2, 2),
    C: int = 1,
    num_iterations: int = 100,
    seed: int = 0,
    num_chains: int = 1,
    sample_schedule=None,
    burn_in: int = 20,
    sweeps_per_sample: int = 1,
    checkpoints=10,
    num_draws: int = 4096,
    init_params: dict | None = None,
    psi_floor: float = PSI_FLOOR,
    progress_bar: bool = False,
) -> TAFit:
    """Maximum-likelihood TA (``C=1``) or MTA (``C>1``) by Monte Carlo EM.

    The start is data-driven (:func:`latentzoo.inference.ta.start.init_from_data`: per
    component the mean, the top principal directions as W, small random T, the residual variance
    as Psi but no less than half of each coordinate's variance; MTA components from k-means++
    seeds); ``init_params`` overrides entries of it. The
    E-step is the TA Gibbs table's latent updates (alternating group draws, MTA's exact (c, z_1)
    block) on persistent chains; the M-step :func:`ta_m_step` / :func:`mta_m_step`. The default
    schedule doubles the draws per chain every 10 iterations up to 32.

    Returns a :class:`TAFit` with the estimates and the log-likelihood trace.
    """
    from latentzoo.inference.ta.table import mta_updates, ta_updates
    from latentzoo.inference.ta.start import init_from_data

    X = jnp.asarray(check_matrix(X))
    d, C = _check_sizes(d, C)
    for name, v, least in (("num_iterations", num_iterations, 1), ("seed", seed, 0)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < least:
            raise ValueError(f"{name} must be an integer >= {least}, got {v!r}.")
    key_start, key_run, key_ll = jax.random.split(jax.random.PRNGKey(seed), 3)
    groups = group_names(d)
    if C == 1:
        model, updates, latent = tensor_analyzer, ta_updates(d), groups
        kwargs, m_step = {"d": d}, ta_m_step
    else:
        model, updates, latent = mixture_of_tensor_analyzers, mta_updates(d), ("c", *groups)
        kwargs, m_step = {"d": d, "C": C}, mta_m_step
    start = init_from_data(key_start, X, d=d, C=None if C == 1 else C)
    params = {k: v for k, v in start.items() if k not in latent}
    # Psi from at least half of each coordinate's variance (in its component): with P >= D the
    # principal directions explain everything and the start's Psi sits at its floor, where the
    # groups' posterior is so sharp that EM barely moves (docs/mcem.md)
    var = jnp.sum(params["W"] ** 2, -1) + params["Psi"]
    params["Psi"] = jnp.maximum(params["Psi"], 0.5 * var)
    if init_params:
        unknown = sorted(set(init_params) - set(params))
        if unknown:
            raise ValueError(f"init_params names {unknown}, which are not parameters of the model.")
        params.update({k: jnp.asarray(v, X.dtype) for k, v in init_params.items()})

    def loglik(p, X):
        return log_likelihood_estimate(X, p, d=d, num_draws=num_draws, rng_key=key_ll)

    mcem = MCEM(
        model, updates, lambda s, X, p: m_step(s, X, p, psi_floor=psi_floor),
        latent_sites=latent, num_chains=num_chains, sweeps_per_sample=sweeps_per_sample,
        burn_in=burn_in, sample_schedule=sample_schedule or doubling_schedule(1, 10, 32),
        loglik_fn=jax.jit(loglik),
    )
    result = mcem.run(key_run, num_iterations, X, params, checkpoints=checkpoints,
                      progress_bar=progress_bar, **kwargs)
    est = {k: np.asarray(v) for k, v in result.params.items()}
    return TAFit(est, result.loglik_trace, result, model, kwargs)
