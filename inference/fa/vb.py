r"""Closed-form mean-field variational inference (CAVI) for Bayesian factor analysis.

Model (:func:`latentzoo.models.factor_analysis.factor_analysis`, thesis eqs. 2.1-2.3), with every
hyperparameter read from the model's trace (:func:`read_fa_priors`):

.. math::

    z_{nk} \sim \mathcal N(m^z_k, 1/\lambda^z_k),\quad W_{dk} \sim \mathcal N(m^W_{dk}, 1/\lambda^W_{dk}),\quad
    \mu_d \sim \mathcal N(m^\mu_d, 1/\lambda^\mu_d),\quad \psi_d \sim \mathrm{Gamma}(a_d, b_d),

    x_{nd} \mid z_n, w_d, \mu_d, \psi_d \sim \mathcal N(w_d^\top z_n + \mu_d,\ 1/\psi_d).

**Mean field** :math:`q = \prod_n \mathcal N(z_n; m_n, S)\ \prod_d \mathcal N(w_d; M_d, S_d)\,
\mathcal N(\mu_d; \nu_d, v_d)\,\mathrm{Gamma}(\psi_d; \alpha_d, \beta_d)` (``S`` is one K x K
matrix when the z prior is shared by rows, as in the model; otherwise one per row). Write
:math:`\bar\psi_d = \alpha_d/\beta_d`, :math:`\widetilde{\log\psi_d} = \operatorname{digamma}(\alpha_d) - \log\beta_d`,
:math:`\Sigma_z = \sum_n S_n`, :math:`\Sigma_{zz} = \sum_n \mathbb E[z_n z_n^\top] = m^\top m + \Sigma_z`.

**(E1) the expected squared residual.** With :math:`r_{nd} = x_{nd} - w_d^\top z_n - \mu_d` and the
factors independent under q,

.. math::

    \textstyle R_d := \sum_n \mathbb E_q[r_{nd}^2] = \sum_n (x_{nd} - M_d^\top m_n - \nu_d)^2
    + N v_d + M_d^\top \Sigma_z M_d + \mathrm{tr}(S_d\,\Sigma_{zz}),

from :math:`\mathbb E[(w^\top z)^2] = \mathrm{tr}(\mathbb E[ww^\top]\mathbb E[zz^\top])` with
:math:`\mathbb E[ww^\top] = MM^\top + S_d`, :math:`\mathbb E[zz^\top] = mm^\top + S_n`.

**Updates** (each is :math:`\log q^*(\cdot) = \mathbb E_{-\cdot}[\log p(X, z, W, \mu, \psi)] +` const;
collect the terms in the block and read off the natural parameters):

- (U1) :math:`q(z_n)`: precision :math:`P = \mathrm{diag}(\lambda^z) + M^\top\mathrm{diag}(\bar\psi)M
  + \sum_d \bar\psi_d S_d`, mean :math:`P^{-1}[\lambda^z m^z + M^\top\mathrm{diag}(\bar\psi)(x_n - \nu)]`.
  The Gibbs conditional (:mod:`~latentzoo.inference.fa.gibbs`) at :math:`W = M, \psi = \bar\psi,
  \mu = \nu`, plus the term :math:`\sum_d \bar\psi_d S_d` from :math:`\mathbb E[w_d w_d^\top]`.
- (U2) :math:`q(w_d)`: precision :math:`P_d = \mathrm{diag}(\lambda^W_d) + \bar\psi_d \Sigma_{zz}`,
  mean :math:`P_d^{-1}[\lambda^W_d m^W_d + \bar\psi_d \sum_n m_n (x_{nd} - \nu_d)]`.
- (U3) :math:`q(\mu_d)`: precision :math:`\lambda^\mu_d + N\bar\psi_d`, mean
  :math:`[\lambda^\mu_d m^\mu_d + \bar\psi_d \sum_n (x_{nd} - M_d^\top m_n)]/(\lambda^\mu_d + N\bar\psi_d)`
  (the Gibbs conditional at the means: :math:`\mathbb E[w_d^\top z_n] = M_d^\top m_n` under q).
- (U4) :math:`q(\psi_d) = \mathrm{Gamma}(a_d + N/2,\ b_d + R_d/2)`; the Gibbs rate plus the variance
  terms of (E1).

**ELBO** (E2) = expected log joint + entropies, all in closed form:

.. math::

    \mathcal L = \sum_d \Big[\tfrac N2(\widetilde{\log\psi_d} - \log 2\pi) - \tfrac12\bar\psi_d R_d\Big]
      + \sum_{\text{Normal sites}} \Big[\tfrac12\log\tfrac{\lambda}{2\pi}
        - \tfrac\lambda2\big((\mathbb E\theta - m)^2 + \mathrm{Var}\,\theta\big)\Big]
      + \sum_d \Big[a_d\log b_d - \log\Gamma(a_d) + (a_d - 1)\widetilde{\log\psi_d} - b_d\bar\psi_d\Big]

      + \sum_{n} \Big[\tfrac K2(1 + \log 2\pi) + \tfrac12\log|S_n|\Big]
      + \sum_d \Big[\tfrac K2(1 + \log 2\pi) + \tfrac12\log|S_d|\Big]
      + \sum_d \tfrac12\big(1 + \log 2\pi v_d\big)
      + \sum_d \big[\alpha_d - \log\beta_d + \log\Gamma(\alpha_d) + (1 - \alpha_d)\operatorname{digamma}(\alpha_d)\big].

Covariances are stored as Cholesky factors of the covariance (``*_scale_tril``), obtained from the
precision by triangular solves (:func:`numpyro.distributions.util.cholesky_of_inverse`), and the
means from that factor (:func:`gaussian_block`). Full derivation and the
EM variant: ``docs/models/fa_variational.md`` and :mod:`latentzoo.inference.fa.em`.

**The block table.** :data:`CAVI_BLOCKS` holds (U1)-(U4) as
:class:`~latentzoo.inference.cavi_blocks.CAVIBlock` records; each is exact for its own site's prior
family and the Normal likelihood (the prior of another site only adds a constant to the terms it
maximises). If a user changes a site's family (``priors={"W": dist.Laplace(0.0, 1.0)}``), that
site's factor keeps the guide's family and is fitted by NumPyro SVI steps, the other three blocks
stay closed-form, and the site's term of (E2) becomes a Monte Carlo estimate
(:mod:`latentzoo.inference.cavi_blocks`); the recipe warns once, naming the block and the site.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.distributions import constraints

from latentzoo.models.factor_analysis import factor_analysis
from latentzoo.models.shapes import data_sizes

from latentzoo.inference.cavi import CoordinateAscent
from latentzoo.inference.cavi_blocks import CAVIBlock, coordinate_ascent
from latentzoo.inference.conjugate import (
    gamma_entropy,
    gamma_expected_log_prior,
    gamma_moments,
    normal_expected_log_prior,
)
from latentzoo.inference.fa.gibbs import W_natural, mu_conditional, z_natural
from latentzoo.inference.gaussian import LOG_2PI, cov_from_tril, gaussian_block, gaussian_entropy
from latentzoo.inference.gibbs import read_model
from latentzoo.inference.updates import prior_params, unwrap
from latentzoo.inference.validation import check_matrix

__all__ = [
    "FAPriors",
    "FAVariational",
    "read_fa_priors",
    "validate_fa_data",
    "start_variances",
    "fa_recipe",
    "cavi_guide",
    "cavi_elbo",
    "cavi_elbo_terms",
    "CAVI_BLOCKS",
    "fa_cavi",
]

NORMAL = (dist.Normal,)
GAMMA = (dist.Gamma,)


# ------------------------------------------------------------------------------ priors, data
class FAPriors(NamedTuple):
    """Prior hyperparameters read from the model, as precisions. Shapes: ``z_*`` (K,) when the z
    prior is shared by rows, else (N, K); ``W_*`` (D, K); ``mu_*``, ``psi_*`` (D,). ``dists`` is the
    site -> distribution dict of :func:`~latentzoo.inference.gibbs.read_model` (what the Gibbs
    helpers take)."""

    z_loc: jax.Array
    z_prec: jax.Array
    W_loc: jax.Array
    W_prec: jax.Array
    mu_loc: jax.Array
    mu_prec: jax.Array
    psi_a: jax.Array
    psi_b: jax.Array
    dists: dict


def read_fa_priors(model, X, *, K, N=None, D=None, priors=None) -> FAPriors:
    """Trace ``model(X, K=K, N=N, D=D, priors=priors)`` and read the FA hyperparameters.

    No family check here: each block's ``requires`` says which families it is exact for, and the
    recipe (:func:`~latentzoo.inference.cavi_blocks.coordinate_ascent`) checks them. A site whose
    prior is not Normal (z, W, mu) or Gamma (psi) gets the Normal / Gamma with its prior's mean
    and variance (standard ones when those are not finite); those serve only to start its factor,
    since its block and its prior term are then replaced.
    """
    N, D = data_sizes(X, N, D)
    # Any values do: the FA priors do not depend on other latent sites; substituting them just
    # spares the trace from sampling.
    values = {
        "z": jnp.zeros((N, K)),
        "W": jnp.zeros((D, K)),
        "mu": jnp.zeros(D),
        "psi": jnp.ones(D),
    }
    fns, _, _ = read_model(model, values, (X,), dict(K=K, N=N, D=D, priors=priors))
    z_shape = (K,) if len(unwrap(fns["z"]).batch_shape) <= 1 else (N, K)
    z_loc, z_prec = _normal_hyper(fns["z"], z_shape)
    W_loc, W_prec = _normal_hyper(fns["W"], (D, K))
    mu_loc, mu_prec = _normal_hyper(fns["mu"], (D,))
    a, b = _gamma_hyper(fns["psi"], (D,))
    return FAPriors(z_loc, z_prec, W_loc, W_prec, mu_loc, mu_prec, a, b, fns)


def _moments(d, shape, positive: bool):
    base = unwrap(d)
    default = 1.0 if positive else 0.0
    try:
        mean = jnp.broadcast_to(base.mean, shape)
        var = jnp.broadcast_to(base.variance, shape)
    except NotImplementedError:  # a swapped-in family without moments (e.g. Cauchy): a neutral start
        return jnp.full(shape, default), jnp.ones(shape)
    ok = jnp.isfinite(mean) & jnp.isfinite(var) & (var > 0) & ((mean > 0) | (not positive))
    return jnp.where(ok, mean, default), jnp.where(ok, var, 1.0)


def _normal_hyper(d, shape):
    """(loc, precision) of a Normal prior; moment-matched for another family."""
    if isinstance(unwrap(d), dist.Normal):
        loc, scale = prior_params(d, shape, "loc", "scale")
        return loc, scale**-2
    mean, var = _moments(d, shape, positive=False)
    return mean, 1.0 / var


def _gamma_hyper(d, shape):
    """(concentration, rate) of a Gamma prior; moment-matched for another family."""
    if isinstance(unwrap(d), dist.Gamma):
        return prior_params(d, shape, "concentration", "rate")
    mean, var = _moments(d, shape, positive=True)
    return mean**2 / var, mean / var


def validate_fa_data(X, K) -> np.ndarray:
    """Check FA data and return it as float64: one-sentence ValueError for non-2-D data, NaN or
    inf, fewer than 2 rows, or K not an integer in 1..D-1 (:func:`latentzoo.inference.validation.check_matrix`)."""
    return check_matrix(X, K=K, name="FA data")


# ------------------------------------------------------------------------- shared algebra
def z_moments(T, N):
    """Moments of q(z) from its scale_tril ``T`` ((K, K) shared by rows, or (N, K, K)).

    Returns ``(Sigma_z (K, K) = sum_n S_n, diag (K,) or (N, K) of S_n, sum_n log|S_n|)``.
    """
    S = cov_from_tril(T)
    logdet = 2.0 * jnp.log(jnp.diagonal(T, axis1=-2, axis2=-1)).sum()
    diag = jnp.diagonal(S, axis1=-2, axis2=-1)
    if T.ndim == 2:  # shared: N identical rows
        return N * S, diag, N * logdet
    return S.sum(0), diag, logdet


def sq_resid(X, m, Sz_sum, W, mu, S_W=None, v_mu=None):
    """The two parts of eq. (E1), ``(point, extra)``, each (D,): sum_n E[r_nd^2] = point + extra.

    ``point`` = sum_n (x_nd - W_d m_n - mu_d)^2 (the residual at the means); ``extra`` = the
    variance terms N v_d + W_d Sigma_z W_dᵀ + tr(S_d Sigma_zz) (``S_W``, ``v_mu`` None for point
    W, mu, as in EM).
    """
    r = X - m @ W.T - mu
    point = (r * r).sum(0)
    extra = jnp.einsum("dk,kl,dl->d", W, Sz_sum, W)
    if S_W is not None:
        extra = extra + jnp.einsum("dkl,lk->d", S_W, m.T @ m + Sz_sum)
    if v_mu is not None:
        extra = extra + X.shape[0] * v_mu
    return point, extra


def start_variances(X, rel: float = 1e-6):
    """Column variances (D,) for starting the noise: each floored at ``rel`` times their mean (the
    data's scale), and 1 where every column is constant. A constant column (a pixel that is always
    0) has variance 0, and a start of psi = 2/var or a rate of var/2 would be infinite or zero;
    its noise then starts tiny relative to the data and the updates take it from there."""
    var = X.var(0)
    scale = var.mean()
    return jnp.where(scale > 0, jnp.maximum(var, rel * scale), 1.0)


def orthonormal_loadings(key, X, K):
    """Initial loadings: orthonormal columns (thesis sec. 4.3: QR of a Gaussian matrix), scaled to
    the data's average standard deviation so that W Wᵀ starts on the data's scale."""
    D = X.shape[1]
    Q, _ = jnp.linalg.qr(jax.random.normal(key, (D, K), dtype=X.dtype))
    return Q * jnp.sqrt(X.var(0).mean())


# ---------------------------------------------------------------------- recipe builder
def fa_recipe(model, blocks, init, objective, guide):
    """The :func:`~latentzoo.inference.cavi_blocks.coordinate_ascent` recipe of an FA table:
    priors re-read from ``model`` on every call (:func:`read_fa_priors`; inside jit this is a
    trace, no data copy), the data checked by ``init``, and ``guide`` for the SVI fallback of a
    block whose prior family a user changed."""

    def validate(X, *, K, **_):
        return (jnp.asarray(validate_fa_data(X, K)),)

    return coordinate_ascent(model, blocks, init, objective, read_fa_priors, guide=guide, validate=validate)


class FAVariational(NamedTuple):
    """A closed-form FA method: the NumPyro ``guide``, the ``algorithm`` for
    :class:`~latentzoo.inference.cavi.CAVI`, and its ordered block table (``blocks``, of
    :class:`~latentzoo.inference.cavi_blocks.CAVIBlock`; for tests and users who want single
    coordinate updates)."""

    guide: Callable
    algorithm: CoordinateAscent
    blocks: tuple[CAVIBlock, ...]


# ------------------------------------------------------------------------------- the guide
def cavi_guide(X=None, *, K, N=None, D=None, priors=None):
    """Mean-field guide. Params: ``z_loc`` (N, K), ``z_scale_tril`` (K, K) [or (N, K, K)],
    ``W_loc`` (D, K), ``W_scale_tril`` (D, K, K), ``mu_loc``, ``mu_scale``, ``psi_concentration``,
    ``psi_rate`` (D,). Sites as in the model: ``mu``, ``psi``, ``W`` (plate D), ``z`` (plate N)."""
    N, D = data_sizes(X, N, D)
    eye = jnp.eye(K)
    z_loc = numpyro.param("z_loc", jnp.zeros((N, K)))
    z_tril = numpyro.param("z_scale_tril", eye, constraint=constraints.lower_cholesky)
    W_loc = numpyro.param("W_loc", jnp.zeros((D, K)))
    W_tril = numpyro.param(
        "W_scale_tril", jnp.broadcast_to(eye, (D, K, K)), constraint=constraints.lower_cholesky
    )
    mu_loc = numpyro.param("mu_loc", jnp.zeros(D))
    mu_scale = numpyro.param("mu_scale", jnp.ones(D), constraint=constraints.positive)
    alpha = numpyro.param("psi_concentration", jnp.ones(D), constraint=constraints.positive)
    beta = numpyro.param("psi_rate", jnp.ones(D), constraint=constraints.positive)
    with numpyro.plate("D", D):
        numpyro.sample("mu", dist.Normal(mu_loc, mu_scale))
        numpyro.sample("psi", dist.Gamma(alpha, beta))
        numpyro.sample("W", dist.MultivariateNormal(W_loc, scale_tril=W_tril))
    with numpyro.plate("N", N):
        numpyro.sample("z", dist.MultivariateNormal(z_loc, scale_tril=z_tril))


# ----------------------------------------------------------------------------- CAVI blocks
def _psi_moments(params):
    return gamma_moments(params["psi_concentration"], params["psi_rate"])

def cavi_z(params, X, pri: FAPriors) -> dict:
    """(U1): q(z_n) given q(W), q(mu), q(psi). The Gibbs natural parameters at the means, plus
    sum_d E[psi_d] S_d, which E[w_d w_dᵀ] = M_d M_dᵀ + S_d adds to the precision."""
    E_psi, _ = _psi_moments(params)
    values = {"z": params["z_loc"], "W": params["W_loc"], "mu": params["mu_loc"], "psi": E_psi}
    P, b = z_natural(values, {"X": X}, pri.dists)
    P = P + jnp.einsum("d,dkl->kl", E_psi, cov_from_tril(params["W_scale_tril"]))
    m, T = gaussian_block(P, b)
    return {**params, "z_loc": m, "z_scale_tril": T}


def cavi_W(params, X, pri: FAPriors) -> dict:
    """(U2): q(w_d) given q(z), q(mu), q(psi); E[Z^T Z] = m^T m + Sigma_z adds E[psi_d] Sigma_z."""
    E_psi, _ = _psi_moments(params)
    N = X.shape[0]
    Sz_sum, _, _ = z_moments(params["z_scale_tril"], N)
    values = {"z": params["z_loc"], "W": params["W_loc"], "mu": params["mu_loc"], "psi": E_psi}
    P, b = W_natural(values, {"X": X}, pri.dists)
    M, T = gaussian_block(P + E_psi[:, None, None] * Sz_sum, b)
    return {**params, "W_loc": M, "W_scale_tril": T}


def cavi_mu(params, X, pri: FAPriors) -> dict:
    """(U3): q(mu_d) is the Gibbs conditional at E[w_d^T z_n] = M_d^T m_n and E[psi_d]."""
    E_psi, _ = _psi_moments(params)
    values = {"z": params["z_loc"], "W": params["W_loc"], "psi": E_psi}
    q = mu_conditional(values, {"X": X}, pri.dists)["mu"]
    return {**params, "mu_loc": q.loc, "mu_scale": q.scale}


def cavi_psi(params, X, pri: FAPriors) -> dict:
    """(U4): q(psi_d) = Gamma(a + N/2, b + R_d/2) with R_d of eq. (E1)."""
    N = X.shape[0]
    Sz_sum, _, _ = z_moments(params["z_scale_tril"], N)
    point, extra = sq_resid(
        X, params["z_loc"], Sz_sum, params["W_loc"], params["mu_loc"],
        cov_from_tril(params["W_scale_tril"]), params["mu_scale"] ** 2,
    )
    return {
        **params,
        "psi_concentration": pri.psi_a + 0.5 * N,
        "psi_rate": pri.psi_b + 0.5 * (point + extra),
    }


# The table: each block is exact for its own site's prior family and the Normal likelihood (the
# families of the matching Gibbs updates); the prior of another site only adds a constant to
# E_{-j}[log p], so it does not enter.
CAVI_BLOCKS: tuple[CAVIBlock, ...] = (
    CAVIBlock("q(z)", ("z",), {"z": NORMAL, "X": NORMAL}, cavi_z, ("z_loc", "z_scale_tril")),
    CAVIBlock("q(W)", ("W",), {"W": NORMAL, "X": NORMAL}, cavi_W, ("W_loc", "W_scale_tril")),
    CAVIBlock("q(mu)", ("mu",), {"mu": NORMAL, "X": NORMAL}, cavi_mu, ("mu_loc", "mu_scale")),
    CAVIBlock(
        "q(psi)", ("psi",), {"psi": GAMMA, "X": NORMAL}, cavi_psi, ("psi_concentration", "psi_rate")
    ),
)


def cavi_elbo(params, X, pri: FAPriors) -> jax.Array:
    """The analytic ELBO, eq. (E2) of the module docstring (a scalar)."""
    return sum(cavi_elbo_terms(params, X, pri).values())


def cavi_elbo_terms(params, X, pri: FAPriors) -> dict:
    """Eq. (E2) as terms: ``"X"`` the expected log-likelihood, ``"z"``, ``"W"``, ``"mu"``,
    ``"psi"`` each site's expected log prior, ``"entropy"`` H[q]."""
    N, D = X.shape
    E_psi, E_log_psi = _psi_moments(params)
    Sz_sum, Sz_diag, z_logdet = z_moments(params["z_scale_tril"], N)
    W_tril = params["W_scale_tril"]
    S_W = cov_from_tril(W_tril)
    point, extra = sq_resid(
        X, params["z_loc"], Sz_sum, params["W_loc"], params["mu_loc"], S_W, params["mu_scale"] ** 2
    )
    loglik = (0.5 * N * (E_log_psi - LOG_2PI) - 0.5 * E_psi * (point + extra)).sum()
    m = params["z_loc"]
    W_var = jnp.diagonal(S_W, axis1=-2, axis2=-1)
    a, b = params["psi_concentration"], params["psi_rate"]
    K = m.shape[1]
    return {
        "X": loglik,
        "z": normal_expected_log_prior(pri.z_loc, pri.z_prec, m, Sz_diag).sum(),
        "W": normal_expected_log_prior(pri.W_loc, pri.W_prec, params["W_loc"], W_var).sum(),
        "mu": normal_expected_log_prior(
            pri.mu_loc, pri.mu_prec, params["mu_loc"], params["mu_scale"] ** 2
        ).sum(),
        "psi": gamma_expected_log_prior(pri.psi_a, pri.psi_b, E_psi, E_log_psi).sum(),
        "entropy": (
            0.5 * N * K * (1.0 + LOG_2PI) + 0.5 * z_logdet  # q(z): N Gaussians (shared S or not)
            + gaussian_entropy(W_tril)
            + (0.5 * (1.0 + LOG_2PI) + jnp.log(params["mu_scale"])).sum()
            + gamma_entropy(a, b).sum()
        ),
    }


def cavi_init(rng_key, X, pri: FAPriors, *, K: int, **_) -> dict:
    """Start: q(z) = the prior's N(0, I)-shaped Gaussian at 0 (the first sweep updates z first, from
    W), W_loc with orthonormal columns (thesis sec. 4.3), small W covariances, mu at the data mean,
    and q(psi) with the posterior's shape and mean 2/var(x_d) (half the variance as noise; a constant
    column's variance floored by :func:`start_variances`)."""
    N, D = X.shape
    var = start_variances(X)
    alpha = pri.psi_a + 0.5 * N
    sd = jnp.sqrt(var.mean())
    return {
        "z_loc": jnp.zeros((N, K)),
        "z_scale_tril": jnp.eye(K),
        "W_loc": orthonormal_loadings(rng_key, X, K),
        "W_scale_tril": jnp.broadcast_to(0.1 * sd * jnp.eye(K), (D, K, K)),
        "mu_loc": X.mean(0),
        "mu_scale": jnp.sqrt(var / N),
        "psi_concentration": alpha,
        "psi_rate": 0.5 * alpha * var,
    }


def fa_cavi(model=factor_analysis, blocks=None) -> FAVariational:
    """Mean-field CAVI for ``model`` (default: the zoo's FA). ``blocks`` replaces the table (a
    sequence of :class:`~latentzoo.inference.cavi_blocks.CAVIBlock`, in sweep order); default
    :data:`CAVI_BLOCKS` = q(z), q(W), q(mu), q(psi).

    A block whose site's prior family differs from its ``requires`` (``priors={"W":
    dist.Laplace(0.0, 1.0)}``) is fitted by SVI steps on :func:`cavi_guide` instead, with one
    :class:`~latentzoo.inference.cavi_blocks.ClosedFormFallbackWarning`.

    Example::

        vb = fa_cavi()
        result = CAVI(factor_analysis, vb.guide, vb.algorithm).run(key, 200, X, K=2)
        Predictive(factor_analysis, guide=vb.guide, params=result.params, num_samples=100)
    """
    blocks = tuple(CAVI_BLOCKS if blocks is None else blocks)
    return FAVariational(
        cavi_guide, fa_recipe(model, blocks, cavi_init, cavi_elbo_terms, cavi_guide), blocks
    )
