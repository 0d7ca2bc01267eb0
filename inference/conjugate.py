r"""The conjugate pairs the zoo reuses: posterior draws (Gibbs) and expected sufficient
statistics (coordinate ascent).

Each posterior is derived from the joint density of the pair; the posterior is returned as a
NumPyro distribution so that one object both samples and is checked against the model
(:func:`latentzoo.inference.checks.check_conditional`).

- **Normal–Gamma** (precision of Gaussian residuals): prior :math:`\tau \sim \mathrm{Gamma}(a, b)`
  (rate ``b``), :math:`n` residuals :math:`r_i \sim \mathcal N(0, 1/\tau)` give
  :math:`\tau \mid r \sim \mathrm{Gamma}(a + n/2,\ b + \tfrac12\sum_i r_i^2)`.
- **Normal mean** with known precisions: prior :math:`\mathcal N(m_0, 1/\lambda_0)`, observations
  with total precision :math:`\Lambda` and precision-weighted sum :math:`h` give
  :math:`\mathcal N\big((\lambda_0 m_0 + h)/(\lambda_0 + \Lambda),\ 1/(\lambda_0 + \Lambda)\big)`.
- **Beta–Bernoulli**: :math:`\pi \sim \mathrm{Beta}(a, b)`, :math:`n` trials with :math:`k` ones give
  :math:`\mathrm{Beta}(a + k, b + n - k)`.
- **Dirichlet–Categorical**: :math:`\pi \sim \mathrm{Dirichlet}(\alpha)`, counts :math:`c` give
  :math:`\mathrm{Dirichlet}(\alpha + c)`.

The VB moments are the expectations the mean-field updates and ELBOs need:
:math:`\mathbb E[\tau], \mathbb E[\log\tau]` under a Gamma, :math:`\mathbb E[\log\pi],
\mathbb E[\log(1-\pi)]` under a Beta, :math:`\mathbb E[\log\pi_j]` under a Dirichlet, and the
expected log densities of Normal and Gamma priors.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpyro.distributions as dist
from jax.scipy.special import digamma, gammaln

from latentzoo.inference.gaussian import LOG_2PI

__all__ = [
    "gamma_precision_posterior",
    "normal_mean_posterior",
    "beta_bernoulli_posterior",
    "dirichlet_categorical_posterior",
    "gamma_moments",
    "gamma_entropy",
    "beta_log_moments",
    "dirichlet_log_moments",
    "normal_expected_log_prior",
    "gamma_expected_log_prior",
    "beta_bernoulli_update",
]


# ------------------------------------------------------------------------------ posteriors
def gamma_precision_posterior(a0, b0, num, sum_sq) -> dist.Gamma:
    """Gamma(a0 + num/2, b0 + sum_sq/2): a precision's posterior given ``num`` zero-mean Gaussian
    residuals whose squares sum to ``sum_sq`` (broadcasts elementwise)."""
    return dist.Gamma(a0 + 0.5 * num, b0 + 0.5 * sum_sq)


def normal_mean_posterior(loc0, prec0, prec_sum, weighted_sum) -> dist.Normal:
    """A Normal mean's posterior: prior N(loc0, 1/prec0); the observations contribute total
    precision ``prec_sum`` and precision-weighted sum ``weighted_sum`` (broadcasts elementwise)."""
    P = prec0 + prec_sum
    return dist.Normal((loc0 * prec0 + weighted_sum) / P, 1.0 / jnp.sqrt(P))


def beta_bernoulli_posterior(a0, b0, ones, trials) -> dist.Beta:
    """Beta(a0 + ones, b0 + trials - ones)."""
    return dist.Beta(a0 + ones, b0 + trials - ones)


def dirichlet_categorical_posterior(alpha0, counts) -> dist.Dirichlet:
    """Dirichlet(alpha0 + counts); ``counts`` (..., J)."""
    return dist.Dirichlet(alpha0 + counts)


# ---------------------------------------------------------------------------- VB moments
def gamma_moments(a, b):
    """(E[tau], E[log tau]) under Gamma(a, b) (rate b)."""
    return a / b, digamma(a) - jnp.log(b)


def gamma_entropy(a, b):
    """Entropy of Gamma(a, b), elementwise."""
    return a - jnp.log(b) + gammaln(a) + (1.0 - a) * digamma(a)


def beta_log_moments(a, b):
    """(E[log pi], E[log(1 - pi)]) under Beta(a, b)."""
    total = digamma(a + b)
    return digamma(a) - total, digamma(b) - total


def dirichlet_log_moments(alpha):
    """E[log pi_j] under Dirichlet(alpha), alpha (..., J)."""
    return digamma(alpha) - digamma(alpha.sum(-1, keepdims=True))


def normal_expected_log_prior(loc0, prec0, mean, var):
    """E_q[log N(theta; loc0, 1/prec0)] elementwise for q with this mean and variance (var = 0:
    the log density at a point)."""
    return 0.5 * (jnp.log(prec0) - LOG_2PI) - 0.5 * prec0 * ((mean - loc0) ** 2 + var)


def gamma_expected_log_prior(a, b, E_tau, E_log_tau):
    """E_q[log Gamma(tau; a, b)] elementwise given E[tau] and E[log tau]."""
    return a * jnp.log(b) - gammaln(a) + (a - 1.0) * E_log_tau - b * E_tau


# ------------------------------------------------------------------------ shared updates
def beta_bernoulli_update(pi_site: str = "pi", s_site: str = "s"):
    """The Gibbs update ``pi_k | s ~ Beta(a_k + sum_n s_nk, b_k + N - sum_n s_nk)`` for binary
    sources ``s`` (N, K) drawn Bernoulli(pi_k) with ``pi_k ~ Beta(a_k, b_k)`` (CVQ, NOCA)."""
    from latentzoo.inference.updates import GibbsUpdate, prior_params

    def conditional(values, obs, priors):
        s = values[s_site]
        N, K = s.shape
        a0, b0 = prior_params(priors[pi_site], (K,), "concentration1", "concentration0")
        return {pi_site: beta_bernoulli_posterior(a0, b0, s.sum(0), N)}

    return GibbsUpdate(
        f"{pi_site} | {s_site}",
        (pi_site,),
        {pi_site: (dist.Beta,), s_site: (dist.BernoulliProbs, dist.BernoulliLogits)},
        conditional,
    )
