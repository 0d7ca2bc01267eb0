r"""Gibbs updates of the three-parameter-beta normal shrinkage (Armagan, Dunson & Clyde 2011), as
the rank-likelihood factor SVM uses it for its loadings and coefficients (supplement section 2,
blocks "A" and "β").

For a coefficient :math:`v \sim \mathcal N(m, \xi)` with :math:`\xi \sim \mathrm{Ga}(r, \eta)`,
:math:`\eta \sim \mathrm{Ga}(s, \Phi)`, :math:`\Phi \sim \mathrm{Ga}(c, \tilde\Phi)`,
:math:`\tilde\Phi \sim \mathrm{Ga}(c_0, d_0)` (shape, rate), the joint density gives:

- :math:`\xi \mid \cdot \propto \xi^{r-1}e^{-\eta\xi}\,\xi^{-1/2}e^{-(v-m)^2/(2\xi)}`:
  :math:`\mathrm{GIG}(a = 2\eta,\ b = (v-m)^2,\ p = r - \tfrac12)` (supplement: right);
- :math:`\eta \mid \cdot \propto \eta^{s-1}e^{-\Phi\eta}\,\eta^{r}e^{-\eta\xi}`:
  :math:`\mathrm{Ga}(r + s,\ \xi + \Phi)` (supplement: right);
- :math:`\Phi_k \mid \cdot \propto \Phi_k^{c-1}e^{-\tilde\Phi\Phi_k}\prod_i\Phi_k^{s}e^{-\Phi_k\eta_{ik}}`:
  :math:`\mathrm{Ga}(c + \sum_i s,\ \tilde\Phi + \sum_i \eta_{ik})`. The supplement's rate has
  :math:`\tfrac12\sum_i\eta_{ik}`: a stray ½;
- :math:`\tilde\Phi \mid \cdot`: :math:`\mathrm{Ga}(c_0 + \sum_k c,\ d_0 + \sum_k\Phi_k)`; with
  K global scales that is :math:`\mathrm{Ga}(\tfrac12 + K/2, 1 + \sum_k\Phi_k)`, where the
  supplement has shape 1 (right only for one global scale, as on the β side).

Every update reads its hyperparameters from the model's own distributions (the shapes r, s, c,
c_0, d_0 and the parents' current values), so editing them in the model file changes the draws.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpyro.distributions as dist

from latentzoo.inference.gig import GeneralizedInverseGaussian
from latentzoo.inference.updates import GibbsUpdate, unwrap

__all__ = ["tpb_updates"]

NORMAL, GAMMA = (dist.Normal,), (dist.Gamma,)


def _sum_to(x, shape):
    """Sum ``x`` over its leading axes down to ``shape`` (a trailing slice of x's shape)."""
    extra = x.ndim - len(shape)
    return jnp.sum(x, axis=tuple(range(extra))) if extra else x


def tpb_updates(coef: str, variance: str, rate: str, scale: str, scale_rate: str) -> list[GibbsUpdate]:
    """The four updates of one shrinkage hierarchy, leaves first.

    Args:
        coef: the coefficient site (Normal(m, sqrt(variance))), e.g. ``"A"``.
        variance: its variance site (ξ, Ga(r, rate)), e.g. ``"xi_a"``.
        rate: the variance's rate site (η, Ga(s, scale)), e.g. ``"eta_a"``.
        scale: the global scale site (Φ, Ga(c, scale_rate)), per column or scalar.
        scale_rate: its rate site (Φ̃, Ga(c0, d0)), scalar.
    """

    def variance_conditional(values, obs, priors):
        m = unwrap(priors[coef]).loc
        r, eta = unwrap(priors[variance]).concentration, unwrap(priors[variance]).rate
        shape = values[variance].shape
        b = jnp.broadcast_to((values[coef] - m) ** 2, shape)
        return {variance: GeneralizedInverseGaussian(jnp.broadcast_to(2.0 * eta, shape), b,
                                                     jnp.broadcast_to(r - 0.5, shape))}

    def rate_conditional(values, obs, priors):
        s, Phi = unwrap(priors[rate]).concentration, unwrap(priors[rate]).rate
        r = unwrap(priors[variance]).concentration
        shape = values[rate].shape
        return {rate: dist.Gamma(jnp.broadcast_to(r + s, shape),
                                 jnp.broadcast_to(values[variance] + Phi, shape))}

    def scale_conditional(values, obs, priors):
        c, d = unwrap(priors[scale]).concentration, unwrap(priors[scale]).rate
        shape = values[scale].shape
        s = jnp.broadcast_to(unwrap(priors[rate]).concentration, values[rate].shape)
        return {scale: dist.Gamma(jnp.broadcast_to(c + _sum_to(s, shape), shape),
                                  jnp.broadcast_to(d + _sum_to(values[rate], shape), shape))}

    def scale_rate_conditional(values, obs, priors):
        c0, d0 = unwrap(priors[scale_rate]).concentration, unwrap(priors[scale_rate]).rate
        c = jnp.broadcast_to(unwrap(priors[scale]).concentration, values[scale].shape)
        return {scale_rate: dist.Gamma(c0 + jnp.sum(c), d0 + jnp.sum(values[scale]))}

    return [
        GibbsUpdate(f"{variance} | {coef}, {rate}", (variance,),
                    {coef: NORMAL, variance: GAMMA}, variance_conditional, tempered=True),
        GibbsUpdate(f"{rate} | {variance}, {scale}", (rate,),
                    {variance: GAMMA, rate: GAMMA}, rate_conditional, tempered=True),
        GibbsUpdate(f"{scale} | {rate}, {scale_rate}", (scale,),
                    {rate: GAMMA, scale: GAMMA}, scale_conditional, tempered=True),
        GibbsUpdate(f"{scale_rate} | {scale}", (scale_rate,),
                    {scale: GAMMA, scale_rate: GAMMA}, scale_rate_conditional, tempered=True),
    ]  # prior sites only: the same on a tempered copy
