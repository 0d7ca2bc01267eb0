r"""Gibbs updates of the rank-likelihood factor SVM (:mod:`latentzoo.models.rank_factor_svm`),
derived from the model's joint density (supplement section 2, with its faults corrected).

Notation: pairs p = (lo_p, hi_p) of feature f_p with score :math:`u_p = a_{f_p}^\top(z_{hi_p} -
z_{lo_p})`, augmentation :math:`\lambda_p`, observed margin :math:`o_p` (ε in a fit); the SVM's
:math:`u_n = y_n\beta_{t(n)}^\top z_n` with :math:`\lambda^c_n` and margin :math:`o_n` (1 in a
fit). Each hinge contributes :math:`\mathcal N(o; u - \lambda, \lambda)\,h(\lambda)` with
:math:`h` flat (the paper) or Exp(r) (the proper version the tests run).

- :math:`\lambda \mid \cdot \propto \lambda^{-1/2}\exp\{-c^2/(2\lambda) - (\tfrac12 + r)\lambda\}`
  with :math:`c = o - u`: :math:`\mathrm{GIG}(1 + 2r, c^2, \tfrac12)`, i.e. :math:`1/\lambda \sim
  \mathrm{IG}(\sqrt{1+2r}/|c|, 1 + 2r)`; at r = 0 the supplement's
  :math:`\mathrm{IG}(|w^l + \epsilon - w|^{-1}, 1)`. Its λ^u line has :math:`|w^u + \epsilon -
  w^u|` (it must be :math:`|w + \epsilon - w^u|`).
- :math:`z_n \mid \cdot`: Gaussian with precision :math:`\mathrm{diag}(1/s_n^2) + \sum_{p \ni n}
  a_{f_p}a_{f_p}^\top/\lambda_p + \beta\beta^\top/\lambda^c_n` and linear term
  :math:`m_n/s_n^2 + \sum_{p\ni n} a_{f_p}(\sigma_p(o_p + \lambda_p) + w_{f_p,\bar p})/\lambda_p +
  y_n\beta(o_n + \lambda^c_n)/\lambda^c_n`, where :math:`\sigma_p = +1` when n is the pair's
  ``hi`` and -1 when its ``lo``, :math:`w_{f,\bar p}` the other member's value and
  :math:`(m_n, s_n)` the prior's mean and scale (N(0, 1) for L, :math:`(\mu_{t(n)},
  \psi_{t(n)}^{-1/2})` for NL). The sum runs over *every* pair n is in: the supplement keeps only
  the two in which n is the centre, dropping those in which it is a neighbour. λ enters as a
  precision (the supplement writes :math:`\lambda_{i,n}^{-1}`). Because pairs couple samples,
  the rows are drawn in turn (``lax.scan``; each step touches n's own pairs, so a sweep is linear
  in N·D·K); for G the rows are independent and drawn at once.
- :math:`a_i \mid \cdot` (rows independent): precision :math:`\mathrm{diag}(1/\xi_i) +
  \sum_{p: f_p = i} d_pd_p^\top/\lambda_p`, linear term :math:`\sum_p d_p(o_p + \lambda_p)/\lambda_p`,
  :math:`d_p = z_{hi_p} - z_{lo_p}`; G: :math:`\mathrm{diag}(1/\xi_i) + \tau_i Z^\top Z` and
  :math:`\tau_i Z^\top x_i`. Drawn per row jointly (the supplement updates one entry at a time).
- :math:`\beta_t \mid \cdot`: precision :math:`\mathrm{diag}(1/b_t) + \sum_{t(n)=t} z_nz_n^\top/
  \lambda^c_n`, linear term :math:`\sum_{t(n)=t} y_nz_n(o_n + \lambda^c_n)/\lambda^c_n`.
- :math:`\tau_i \mid \cdot`: :math:`\mathrm{Ga}(a_\tau + N/2, b_\tau + \tfrac12\sum_n(x_{in} -
  a_i^\top z_n)^2)`.

**Tempered copies** (replica exchange): every update reads its likelihood site's inverse
temperature :math:`\beta_T` (:func:`~latentzoo.inference.tempering.temperature`; 1 untempered).
Raising :math:`\mathcal N(o; u - \lambda, \lambda)` or :math:`\mathcal N(x; a^\top z, 1/\tau)`
to the power :math:`\beta_T` multiplies its quadratic form by :math:`\beta_T`, so every
:math:`1/\lambda` and every :math:`\tau` above becomes :math:`\beta_T/\lambda` and
:math:`\beta_T\tau`, and τ's shape gains :math:`\beta_T N/2` and its rate
:math:`\tfrac{\beta_T}2\sum_n(\cdot)^2`; λ's conditional becomes GIG(β_T + 2r, β_T c², 1 - β_T/2)
(:mod:`.hinge`).

The shrinkage blocks are :mod:`.shrinkage`, the DP mixture's :mod:`.dp`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpyro.distributions as dist

from latentzoo.inference import small_linalg
from latentzoo.inference.gaussian import gaussian_draw, mvn_from_precision
from latentzoo.inference.rank_svm.hinge import hinge_lam_draw, hinge_lam_law, lam_rate
from latentzoo.inference.tempering import temperature
from latentzoo.inference.updates import GibbsUpdate, unwrap

__all__ = [
    "lam_update",
    "z_update",
    "A_update",
    "beta_update",
    "tau_update",
    "lam_rate",
    "hinge_lam_draw",
    "z_row_precision",
]

NORMAL, GAMMA = (dist.Normal,), (dist.Gamma,)
LAM_PRIORS = (dist.ImproperUniform, dist.Exponential)


def _score(values, priors, kind):
    """The hinge's score u, read back from the margin's mean u - λ."""
    return unwrap(priors[f"{kind}_margin"]).loc + values[f"lam_{kind}"]


def lam_update(kind: str) -> GibbsUpdate:
    """λ of every hinge of one kind (``"rank"`` or ``"svm"``) | scores, margins."""
    site = f"lam_{kind}"

    def conditional(values, obs, priors):
        c = obs[f"{kind}_margin"] - _score(values, priors, kind)
        return {site: hinge_lam_law(c, lam_rate(priors[site]), temperature(priors[f"{kind}_margin"]))}

    def draw(key, values, obs, priors):
        c = obs[f"{kind}_margin"] - _score(values, priors, kind)
        return {site: hinge_lam_draw(key, c, lam_rate(priors[site]), temperature(priors[f"{kind}_margin"]))}

    return GibbsUpdate(f"{site} | scores", (site,), {site: LAM_PRIORS, f"{kind}_margin": NORMAL},
                       conditional, draw, tempered=True)


# ---------------------------------------------------------------------------------- z
def _z_prior(priors, shape):
    base = unwrap(priors["z"])
    loc = jnp.broadcast_to(base.loc, shape)
    prec = jnp.broadcast_to(1.0 / base.scale**2, shape)
    return prec, loc * prec


def _svm_terms(values, obs, priors, y, t):
    """Per row: the classifier's vector b_n = β_{t(n)}, the weight β_T/λ^c_n (β_T the margin
    site's inverse temperature, 1 untempered) and the linear coefficient."""
    b = values["beta"][t]
    inv = temperature(priors["svm_margin"]) / values["lam_svm"]
    return b, inv, y * (obs["svm_margin"] + values["lam_svm"]) * inv


def z_row_precision(values, obs, priors, *, t, ranked: bool):
    """(P (N, K, K), h_static (N, K)) of every row's conditional, all terms except the rank
    pairs' dependence on the other members' current values (:func:`z_update` adds that).
    The labels and (``ranked``) the pairs are the model's data tables ``obs["y"]``,
    ``obs["pairs"]``."""
    y = obs["y"]
    A, z = values["A"], values["z"]
    prec, h = _z_prior(priors, z.shape)
    P = prec[:, :, None] * jnp.eye(z.shape[1])
    b, inv, lin = _svm_terms(values, obs, priors, y, t)
    P = P + inv[:, None, None] * b[:, :, None] * b[:, None, :]
    h = h + lin[:, None] * b
    if not ranked:  # Gaussian features, noise precisions tempered
        tau = temperature(priors["X"]) * values["tau"]
        P = P + (A.T * tau) @ A
        h = h + (obs["X"] * tau) @ A
        return P, h
    pairs = obs["pairs"]
    lam, o = values["lam_rank"], obs["rank_margin"]
    inc, role = pairs.incidence, pairs.role
    a = A[pairs.feature[inc]]  # (N, L, K)
    w = temperature(priors["rank_margin"]) * jnp.abs(role) / lam[inc]  # (N, L): β_T/λ, 0 on padding
    P = P + jnp.einsum("nl,nlk,nlj->nkj", w, a, a)
    h = h + jnp.einsum("nl,nlk->nk", w * role * (o[inc] + lam[inc]), a)
    return P, h


def z_update(*, t_site: str | None = None, ranked: bool = True) -> GibbsUpdate:
    """All factor scores z (N, K) | everything else; ``ranked`` False for the G variants. The
    labels and pairs come from the model's data tables (``obs["y"]``, ``obs["pairs"]``)."""

    def rows(values, obs, priors):
        t = values[t_site] if t_site else jnp.zeros(obs["y"].shape[0], jnp.int32)
        return z_row_precision(values, obs, priors, t=t, ranked=ranked)

    def conditional(values, obs, priors):
        P, h = rows(values, obs, priors)
        return {"z": mvn_from_precision(P, h).to_event(1)}

    def draw(key, values, obs, priors):
        P, h = rows(values, obs, priors)
        if not ranked:
            return {"z": gaussian_draw(key, P, h)}
        pairs = obs["pairs"]
        A, lam = values["A"], values["lam_rank"]
        inc, role = pairs.incidence, pairs.role
        other = jnp.where(role > 0, pairs.lo[inc], pairs.hi[inc])  # (N, L)
        a = A[pairs.feature[inc]]
        wa = (temperature(priors["rank_margin"]) * jnp.abs(role) / lam[inc])[..., None] * a  # (N, L, K)
        L = small_linalg.cholesky(P)  # plain XLA: batched LAPACK can deadlock (see small_linalg)
        eps = jax.random.normal(key, h.shape, h.dtype)

        def step(z, n):
            w_other = jnp.sum(a[n] * z[other[n]], -1)  # the neighbours' current w (L,)
            hn = h[n] + w_other @ wa[n]
            mean = small_linalg.cho_solve(L[n], hn)
            noise = small_linalg.solve_upper(L[n], eps[n])
            return z.at[n].set(mean + noise), None

        z = jax.lax.scan(step, values["z"], jnp.arange(h.shape[0]))[0]
        return {"z": z}

    requires = {"z": NORMAL, "beta": NORMAL, "svm_margin": NORMAL}
    requires.update({"rank_margin": NORMAL} if ranked else {"X": NORMAL})
    return GibbsUpdate("z | A, beta, lambdas", ("z",), requires,
                       None if ranked else conditional, draw, tempered=True)


# ---------------------------------------------------------------------------------- A
def A_update(*, ranked: bool = True) -> GibbsUpdate:
    """Loadings A (D, K) | z, λ (R) or z, τ (G), ξ: rows independent, each drawn jointly. The R
    variants' pairs are the model's data table ``obs["pairs"]``."""

    def conditional(values, obs, priors):
        z, A = values["z"], values["A"]
        base = unwrap(priors["A"])
        prec = jnp.broadcast_to(1.0 / base.scale**2, A.shape)
        P = prec[:, :, None] * jnp.eye(A.shape[1])
        h = jnp.broadcast_to(base.loc, A.shape) * prec
        if not ranked:
            tau = temperature(priors["X"]) * values["tau"]
            P = P + tau[:, None, None] * (z.T @ z)[None]
            h = h + tau[:, None] * (obs["X"].T @ z)
        else:
            pairs = obs["pairs"]
            lam, o = values["lam_rank"], obs["rank_margin"]
            w = temperature(priors["rank_margin"]) / lam  # β_T/λ per pair
            d = z[pairs.hi] - z[pairs.lo]  # (P, K)
            D = A.shape[0]
            P = P + jax.ops.segment_sum(w[:, None, None] * d[:, :, None] * d[:, None, :],
                                        pairs.feature, num_segments=D)
            h = h + jax.ops.segment_sum(d * ((o + lam) * w)[:, None], pairs.feature, num_segments=D)
        return {"A": mvn_from_precision(P, h).to_event(1)}

    requires = {"A": NORMAL}
    requires.update({"rank_margin": NORMAL} if ranked else {"X": NORMAL})
    return GibbsUpdate("A | z, lambdas, xi", ("A",), requires, conditional, tempered=True)


# ------------------------------------------------------------------------------- beta
def beta_update(*, t_site: str | None = None) -> GibbsUpdate:
    """Classifier coefficients beta (T, K) | z, λ^c, b: one Gaussian per mixture component; the
    labels are the model's data table ``obs["y"]``."""

    def conditional(values, obs, priors):
        z, beta, lam, y = values["z"], values["beta"], values["lam_svm"], obs["y"]
        T = beta.shape[0]
        t = values[t_site] if t_site else jnp.zeros(z.shape[0], jnp.int32)
        base = unwrap(priors["beta"])
        prec = jnp.broadcast_to(1.0 / base.scale**2, beta.shape)
        P = prec[:, :, None] * jnp.eye(beta.shape[1])
        h = jnp.broadcast_to(base.loc, beta.shape) * prec
        w = temperature(priors["svm_margin"]) / lam  # β_T/λ^c
        P = P + jax.ops.segment_sum(w[:, None, None] * z[:, :, None] * z[:, None, :], t, num_segments=T)
        lin = y * (obs["svm_margin"] + lam) * w
        h = h + jax.ops.segment_sum(lin[:, None] * z, t, num_segments=T)
        return {"beta": mvn_from_precision(P, h).to_event(1)}

    return GibbsUpdate("beta | z, lambda_svm, b", ("beta",), {"beta": NORMAL, "svm_margin": NORMAL},
                       conditional, tempered=True)


# -------------------------------------------------------------------------------- tau
def tau_update() -> GibbsUpdate:
    """Noise precisions τ (D,) of the G variants | A, z."""

    def conditional(values, obs, priors):
        base = unwrap(priors["tau"])
        beta_T = temperature(priors["X"])  # N(x; m, 1/τ)^β ∝ τ^{β/2} exp(-βτ(x - m)²/2)
        R = obs["X"] - values["z"] @ values["A"].T
        shape = values["tau"].shape
        return {"tau": dist.Gamma(jnp.broadcast_to(base.concentration + 0.5 * beta_T * R.shape[0], shape),
                                  jnp.broadcast_to(base.rate + 0.5 * beta_T * jnp.sum(R**2, 0), shape))}

    return GibbsUpdate("tau | A, z", ("tau",), {"tau": GAMMA, "X": NORMAL}, conditional, tempered=True)
