r"""The hinge's augmentation at any inverse temperature: the draw of λ and the hinge with λ
integrated out, for the rank SVM's updates (:mod:`latentzoo.inference.rank_svm.gibbs`,
:mod:`latentzoo.inference.rank_svm.dp`, :mod:`latentzoo.inference.rank_svm.classifier_scale`).

Each hinge of :mod:`latentzoo.models.rank_factor_svm` is a latent :math:`\lambda` with prior
:math:`h(\lambda)` (flat, the paper's, or Exp(r)) and an observed margin
:math:`o \sim \mathcal N(u - \lambda, \lambda)`. Replica exchange
(:mod:`latentzoo.inference.samplers.replica_exchange`) runs copies whose likelihood sites are
raised to a power :math:`\beta \in (0, 1]`
(:func:`~latentzoo.inference.tempering.temper`). With :math:`c = o - u`,

.. math::

    \mathcal N(o; u - \lambda, \lambda)^\beta
    = (2\pi)^{-\beta/2}\lambda^{-\beta/2}\,e^{-\beta c}\,
      \exp\{-\beta c^2/(2\lambda) - \beta\lambda/2\},

because :math:`(c + \lambda)^2/(2\lambda) = c^2/(2\lambda) + c + \lambda/2`.

- **λ | ·** (the density above times :math:`e^{-r\lambda}`, r = 0 for the flat measure):
  :math:`\lambda^{p-1}\exp\{-(a\lambda + b/\lambda)/2\}`, that is :math:`\mathrm{GIG}(a, b, p)`
  with :math:`a = \beta + 2r`, :math:`b = \beta c^2`, :math:`p = 1 - \beta/2`. At β = 1 it is
  GIG(1 + 2r, c², 1/2), the Polson–Scott draw (drawn by
  :func:`~latentzoo.inference.gig.polson_scott_lambda`, exact at c = 0); at β < 1 by Devroye's
  GIG sampler (:class:`~latentzoo.inference.gig.GeneralizedInverseGaussian`; b = 0 at c = 0 is
  its Gamma(p, a/2) limit, p > 0 here).
- **The hinge with λ integrated out**, from
  :math:`\int_0^\infty\lambda^{p-1}e^{-(a\lambda + b/\lambda)/2}d\lambda = 2(b/a)^{p/2}K_p(\sqrt{ab})`:

  .. math::

      \log\int h(\lambda)\,\mathcal N(o; u - \lambda, \lambda)^\beta d\lambda
      = -\beta c + p\log|c| + \log K_p\bigl(\sqrt{a\beta}\,|c|\bigr) + \text{const}(\beta, r),

  and as :math:`c \to 0`, :math:`K_p(x) \sim \tfrac12\Gamma(p)(2/x)^p` (p > 0) gives the finite
  limit :math:`\log\Gamma(p) + (p - 1)\log 2 - \tfrac p2\log(a\beta)`. At β = 1,
  :math:`K_{1/2}(x) = \sqrt{\pi/(2x)}e^{-x}` turns it into :math:`-c - |c|\sqrt{1 + 2r}`, and at
  r = 0 into the hinge :math:`-2\max(0, c)`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpyro.distributions as dist
from jax.scipy.special import gammaln

from latentzoo.inference.bessel import log_bessel_kve
from latentzoo.inference.gig import GeneralizedInverseGaussian, polson_scott_lambda
from latentzoo.inference.updates import unwrap

__all__ = ["lam_rate", "is_untempered", "hinge_lam_law", "hinge_lam_draw", "hinge_log_marginal"]

# below this argument K_p is its small-x limit: the next term is O(x^{2p}) relative, p >= 1/2
_SMALL_X = 1e-12


def lam_rate(prior) -> jax.Array:
    """The rate r of the augmentation's Exp(r) prior; 0 for the paper's flat measure."""
    base = unwrap(prior)
    return jnp.zeros(()) if isinstance(base, dist.ImproperUniform) else base.rate


def is_untempered(beta) -> bool:
    """True when ``beta`` is known, at trace time, to be 1 (an untempered site's
    :func:`~latentzoo.inference.tempering.temperature` is the Python float 1.0)."""
    return isinstance(beta, (int, float)) and beta == 1


def hinge_lam_law(c, rate, beta=1.0) -> GeneralizedInverseGaussian:
    """λ's conditional GIG(β + 2r, βc², 1 - β/2) for hinge residuals c = o - u (any shape)."""
    c = jnp.asarray(c)
    a = jnp.broadcast_to(beta + 2.0 * rate, c.shape)
    return GeneralizedInverseGaussian(a, beta * c**2, jnp.broadcast_to(1.0 - 0.5 * beta, c.shape))


def hinge_lam_draw(key, c, rate, beta=1.0):
    """λ ~ GIG(β + 2r, βc², 1 - β/2) for hinge residuals c = o - u, finite at c = 0.

    Untempered (β the Python 1.0): GIG scales as s·GIG(a, b, p) = GIG(a/s, s b, p), so this is
    (1 + 2r)⁻¹ times the Polson–Scott draw GIG(1, (1 + 2r) c², 1/2) of
    :func:`~latentzoo.inference.gig.polson_scott_lambda`. Otherwise (a tempered copy, β traced
    or below 1) Devroye's general GIG draw."""
    if is_untempered(beta):
        a = 1.0 + 2.0 * rate
        return polson_scott_lambda(key, jnp.sqrt(a) * jnp.abs(c)) / a
    return hinge_lam_law(c, rate, beta).sample(key)


def hinge_log_marginal(delta, rate, beta=1.0):
    """log ∫ h(λ) N(o; o - δ - λ, λ)^β dλ up to a constant in δ (module docstring); ``delta`` =
    margin - score, any shape. Untempered: -δ - abs(δ) √(1 + 2r), and at r = 0 the hinge
    -2 max(0, δ)."""
    delta = jnp.asarray(delta)
    if is_untempered(beta):
        return -delta - jnp.abs(delta) * jnp.sqrt(1.0 + 2.0 * rate)
    a = beta + 2.0 * rate
    p = 1.0 - 0.5 * beta
    scale = jnp.sqrt(a * beta)
    x = scale * jnp.abs(delta)
    small = x < _SMALL_X
    x_safe = jnp.where(small, 1.0, x)
    # log K_p(x) = log kve(x) - x; p log|δ| = p (log x - log scale)
    body = p * (jnp.log(x_safe) - jnp.log(scale)) + log_bessel_kve(p, x_safe) - x_safe
    limit = gammaln(p) + (p - 1.0) * jnp.log(2.0) - 0.5 * p * jnp.log(a * beta)
    return -beta * delta + jnp.where(small, limit, body)
