r"""EM with point loadings (MAP-EM) for Bayesian factor analysis, the batch EM of thesis sec. 4.2
under the model's priors.

Notation and priors as in :mod:`latentzoo.inference.fa.vb`; here :math:`\theta = (W, \mu, \psi)`
are points and only z has a distribution, :math:`q(z_n) = \mathcal N(m_n, S)`.

**Objective** (thesis eq. 4.27 plus the log prior): for any q,

.. math::

    \log p(X, \theta) \ \ge\ \mathcal F(q, \theta) = \mathbb E_q[\log p(X, z, \theta)] + H[q(z)]
    = \sum_d\Big[\tfrac N2(\log\psi_d - \log 2\pi) - \tfrac{\psi_d}2 R_d\Big]
      + \mathbb E_q[\log p(z)] + H[q(z)] + \log p(W) + \log p(\mu) + \log p(\psi),

with :math:`R_d = \sum_n (x_{nd} - w_d^\top m_n - \mu_d)^2 + w_d^\top \Sigma_z w_d` (eq. (E1) with
point W, mu). It equals ``Trace_ELBO``'s expectation for :func:`em_guide` (``Delta`` sites add no
guide density) and is tight, :math:`\mathcal F = \log p(X\mid\theta) + \log p(\theta)`, right after
the E-step.

**E-step** (thesis eq. 4.28): :math:`q(z_n) = p(z_n \mid x_n, \theta)`, the Gaussian with precision
:math:`P = \mathrm{diag}(\lambda^z) + W^\top\mathrm{diag}(\psi)W` (shared by rows) and mean
:math:`P^{-1}[\lambda^z m^z + W^\top\mathrm{diag}(\psi)(x_n - \mu)]`; it is the Gibbs z-conditional.

**M-step, (w_d, mu_d) jointly.** With :math:`\tilde z_n = (z_n, 1)`, :math:`\tilde w_d = (w_d, \mu_d)`,
:math:`G = \sum_n\mathbb E[\tilde z_n\tilde z_n^\top] = \begin{pmatrix} m^\top m + \Sigma_z & m^\top 1\\
1^\top m & N\end{pmatrix}` and :math:`c_d = \sum_n x_{nd}\,\mathbb E[\tilde z_n]`, the terms of
:math:`\mathcal F` in :math:`\tilde w_d` are
:math:`-\tfrac{\psi_d}2(\tilde w_d^\top G\tilde w_d - 2\tilde w_d^\top c_d) - \tfrac12(\tilde w_d -
\tilde m_d)^\top\Lambda_d(\tilde w_d - \tilde m_d)`, a concave quadratic maximised at

.. math:: (\psi_d G + \Lambda_d)\,\tilde w_d = \psi_d c_d + \Lambda_d\tilde m_d,
   \qquad \Lambda_d = \mathrm{diag}(\lambda^W_d, \lambda^\mu_d),\ \tilde m_d = (m^W_d, m^\mu_d).

With flat priors (:math:`\Lambda_d \to 0`) this is the thesis' :math:`F = AH^{-1}` (4.29-4.30)
extended by the bias column.

**M-step, psi** (at the new W, mu): the terms in :math:`\psi_d` are
:math:`(a_d - 1 + N/2)\log\psi_d - (b_d + R_d/2)\psi_d`, maximised at

.. math:: \psi_d = \frac{a_d - 1 + N/2}{b_d + R_d/2}\qquad (a_d + N/2 > 1),

the mode of :math:`\mathrm{Gamma}(a_d + N/2, b_d + R_d/2)`. With a flat prior on the variance
:math:`1/\psi_d` this is the thesis' :math:`\Psi_{dd} = R_d/N` (4.31). The mode exists when
:math:`a_d + N/2 > 1`, which always holds here: a Gamma shape is positive and the data check
(:func:`~latentzoo.inference.fa.vb.validate_fa_data`) requires :math:`N \ge 2`.

Every step maximises :math:`\mathcal F` over its block exactly, so :math:`\mathcal F` never
decreases, and since the E-step makes the bound tight, neither does :math:`\log p(X, \theta)`.

**The block table** :data:`EM_BLOCKS` (E-step, (W, mu), psi) declares the families each step is
exact for. A changed family (``priors={"psi": dist.LogNormal(0.0, 1.0)}``) hands that M-step to
SVI steps on its point estimates, i.e. MAP by gradient ascent under the model's exact log prior
(:mod:`latentzoo.inference.cavi_blocks`), with one warning naming the block and the site.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
from numpyro.distributions import constraints

from latentzoo.models.factor_analysis import factor_analysis
from latentzoo.models.shapes import data_sizes


from latentzoo.inference.cavi_blocks import CAVIBlock
from latentzoo.inference.conjugate import gamma_expected_log_prior, normal_expected_log_prior
from latentzoo.inference.fa.gibbs import z_natural
from latentzoo.inference.gaussian import LOG_2PI, diag_embed, gaussian_block, precision_solve
from latentzoo.inference.fa.vb import (
    GAMMA,
    NORMAL,
    FAPriors,
    FAVariational,
    fa_recipe,
    orthonormal_loadings,
    sq_resid,
    start_variances,
    z_moments,
)

__all__ = [
    "em_guide", "em_objective", "em_objective_terms", "em_e_step", "em_W_mu", "em_psi",
    "EM_BLOCKS", "fa_em",
]


def em_guide(X=None, *, K, N=None, D=None, priors=None):
    """Point W, mu, psi (``Delta``) and Gaussian q(z). Params: ``W_loc`` (D, K), ``mu_loc`` (D,),
    ``psi_loc`` (D,), ``z_loc`` (N, K), ``z_scale_tril`` (K, K) [or (N, K, K)]. (A param cannot
    share its name with a sample site in NumPyro's trace, hence ``*_loc``.)"""
    N, D = data_sizes(X, N, D)
    W = numpyro.param("W_loc", jnp.zeros((D, K)))
    mu = numpyro.param("mu_loc", jnp.zeros(D))
    psi = numpyro.param("psi_loc", jnp.ones(D), constraint=constraints.positive)
    z_loc = numpyro.param("z_loc", jnp.zeros((N, K)))
    z_tril = numpyro.param("z_scale_tril", jnp.eye(K), constraint=constraints.lower_cholesky)
    with numpyro.plate("D", D):
        numpyro.sample("mu", dist.Delta(mu))
        numpyro.sample("psi", dist.Delta(psi))
        numpyro.sample("W", dist.Delta(W, event_dim=1))
    with numpyro.plate("N", N):
        numpyro.sample("z", dist.MultivariateNormal(z_loc, scale_tril=z_tril))


def em_e_step(params, X, pri: FAPriors) -> dict:
    """Exact q(z_n) = p(z_n | x_n, W, mu, psi) (thesis eq. 4.28): the Gibbs z-conditional."""
    values = {
        "z": params["z_loc"],
        "W": params["W_loc"],
        "mu": params["mu_loc"],
        "psi": params["psi_loc"],
    }
    m, T = gaussian_block(*z_natural(values, {"X": X}, pri.dists))
    return {**params, "z_loc": m, "z_scale_tril": T}


def em_W_mu(params, X, pri: FAPriors) -> dict:
    """(w_d, mu_d) jointly: the (K+1)-dim ridge regression (psi_d G + Lambda_d) w~_d = psi_d c_d +
    Lambda_d m~_d of the module docstring, all D rows in one batched Cholesky solve."""
    N = X.shape[0]
    m, psi = params["z_loc"], params["psi_loc"]
    Sz_sum, _, _ = z_moments(params["z_scale_tril"], N)
    m1 = jnp.concatenate([m, jnp.ones((N, 1), m.dtype)], axis=1)  # E[z~_n], (N, K+1)
    G = m1.T @ m1
    G = G.at[:-1, :-1].add(Sz_sum)  # E[z z^T] = m m^T + S in the z block; the 1 is exact
    prec0 = jnp.concatenate([pri.W_prec, pri.mu_prec[:, None]], axis=1)  # (D, K+1)
    loc0 = jnp.concatenate([pri.W_loc, pri.mu_loc[:, None]], axis=1)
    P = psi[:, None, None] * G + diag_embed(prec0)
    b = psi[:, None] * (X.T @ m1) + prec0 * loc0
    _, w = precision_solve(P, b)
    return {**params, "W_loc": w[:, :-1], "mu_loc": w[:, -1]}


def em_psi(params, X, pri: FAPriors) -> dict:
    """psi_d = (a_d - 1 + N/2) / (b_d + R_d/2), the mode of the Gamma-shaped terms in psi_d."""
    N = X.shape[0]
    Sz_sum, _, _ = z_moments(params["z_scale_tril"], N)
    point, extra = sq_resid(X, params["z_loc"], Sz_sum, params["W_loc"], params["mu_loc"])
    return {**params, "psi_loc": (pri.psi_a - 1.0 + 0.5 * N) / (pri.psi_b + 0.5 * (point + extra))}


# The table. The (W, mu) M-step solves one ridge regression for both, so it needs both priors
# Normal; a changed family of either (or of psi's Gamma) hands that block to SVI steps on the
# point estimates, with the exact log prior of the changed site in F.
EM_BLOCKS: tuple[CAVIBlock, ...] = (
    CAVIBlock("E-step q(z)", ("z",), {"z": NORMAL, "X": NORMAL}, em_e_step, ("z_loc", "z_scale_tril")),
    CAVIBlock(
        "M-step (W, mu)", ("W", "mu"), {"W": NORMAL, "mu": NORMAL, "X": NORMAL}, em_W_mu,
        ("W_loc", "mu_loc"),
    ),
    CAVIBlock("M-step psi", ("psi",), {"psi": GAMMA, "X": NORMAL}, em_psi, ("psi_loc",)),
)


def em_objective(params, X, pri: FAPriors) -> jax.Array:
    """F(q, theta) = E_q[log p(X, z, theta)] + H[q(z)] of the module docstring (a scalar)."""
    return sum(em_objective_terms(params, X, pri).values())


def em_objective_terms(params, X, pri: FAPriors) -> dict:
    """F as terms: ``"X"`` the expected log-likelihood, ``"z"`` E_q[log p(z)], ``"entropy"``
    H[q(z)], ``"W"``, ``"mu"``, ``"psi"`` the log priors of the point estimates."""
    N = X.shape[0]
    m, W, mu, psi = params["z_loc"], params["W_loc"], params["mu_loc"], params["psi_loc"]
    T = params["z_scale_tril"]
    Sz_sum, Sz_diag, z_logdet = z_moments(T, N)
    point, extra = sq_resid(X, m, Sz_sum, W, mu)
    loglik = (0.5 * N * (jnp.log(psi) - LOG_2PI) - 0.5 * psi * (point + extra)).sum()
    K = m.shape[1]
    return {
        "X": loglik,
        "z": normal_expected_log_prior(pri.z_loc, pri.z_prec, m, Sz_diag).sum(),
        "entropy": 0.5 * N * K * (1.0 + LOG_2PI) + 0.5 * z_logdet,  # H[q(z)]
        "W": normal_expected_log_prior(pri.W_loc, pri.W_prec, W, 0.0).sum(),
        "mu": normal_expected_log_prior(pri.mu_loc, pri.mu_prec, mu, 0.0).sum(),
        "psi": gamma_expected_log_prior(pri.psi_a, pri.psi_b, psi, jnp.log(psi)).sum(),
    }


def em_init(rng_key, X, pri: FAPriors, *, K: int, **_) -> dict:
    """Start (thesis Alg. 2 / sec. 4.3): W with orthonormal columns scaled to the data, mu the data
    mean, psi = 2 / var(x_d) (half the variance as noise; a constant column's variance floored by
    :func:`~latentzoo.inference.fa.vb.start_variances`), q(z) at the prior's N(0, I) shape."""
    N = X.shape[0]
    return {
        "W_loc": orthonormal_loadings(rng_key, X, K),
        "mu_loc": X.mean(0),
        "psi_loc": 2.0 / start_variances(X),
        "z_loc": jnp.zeros((N, K)),
        "z_scale_tril": jnp.eye(K),
    }


def fa_em(model=factor_analysis, blocks=None) -> FAVariational:
    """MAP-EM for ``model``: E-step, (W, mu), psi. ``blocks`` replaces :data:`EM_BLOCKS` (a
    sequence of :class:`~latentzoo.inference.cavi_blocks.CAVIBlock`, in sweep order).

    A block whose sites' prior family differs from its ``requires`` is fitted by SVI steps on
    :func:`em_guide` (for point estimates: MAP by gradient steps under the exact log prior), with
    one :class:`~latentzoo.inference.cavi_blocks.ClosedFormFallbackWarning`.

    Example::

        em = fa_em()
        result = CAVI(factor_analysis, em.guide, em.algorithm).run(key, 200, X, K=2)
    """
    blocks = tuple(EM_BLOCKS if blocks is None else blocks)
    return FAVariational(em_guide, fa_recipe(model, blocks, em_init, em_objective_terms, em_guide), blocks)
