r"""Distributions NumPyro lacks: the generalised inverse Gaussian (GIG) and the inverse Gaussian
(Wald), whose normaliser and moments need :math:`\log K_\nu(x)`.

They are NumPyro :class:`~numpyro.distributions.Distribution` classes, so model files sample them
and Gibbs conditionals return them (:func:`latentzoo.inference.checks.check_conditional` reads
their ``log_prob``). Everything is float64, jit-able and vmap-able, with no hidden state.

- The normaliser and the moments use :math:`\log K_\nu` from :mod:`latentzoo.inference.bessel`.
- :class:`GeneralizedInverseGaussian` ``(a, b, p)``: density
  :math:`\propto x^{p-1} e^{-(a x + b/x)/2}`, sampled by Devroye (2014).
- :class:`InverseGaussian` ``(mean, concentration)``: IG(μ, λ), sampled by Michael, Schucany &
  Haas (1976) in a form without cancellation.
- :func:`polson_scott_lambda` — the SVM augmentation variable of Polson & Scott (2011), exact at a
  zero margin (``docs/gig.md`` gives the derivations and the measured accuracy).
"""

from __future__ import annotations

import math
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.scipy.special import digamma, gammaln
from numpyro.distributions import Distribution, constraints
from numpyro.distributions.util import promote_shapes, validate_sample
from numpyro.util import not_jax_tracer

from latentzoo.inference.bessel import log_bessel_kv, log_bessel_kve

__all__ = [
    "GeneralizedInverseGaussian",
    "InverseGaussian",
    "DevroyeEnvelope",
    "devroye_envelope",
    "devroye_round",
    "standard_gig_log_sample",
    "polson_scott_lambda",
    "polson_scott_inverse_lambda",
]

_LOG2 = math.log(2.0)
_TINY = float(jnp.finfo(jnp.float64).tiny)


# GIG sampling: Devroye (2014) ---------------------------------------------------------------------


class DevroyeEnvelope(NamedTuple):
    r"""Devroye's (2014) envelope for :math:`Y = \log(X/c)`, X ~ GIG(λ, ω), λ >= 0, elementwise.

    The log density of Y is :math:`\psi(y) = -\alpha(\cosh y - 1) - \lambda(e^y - y - 1)` with
    :math:`\alpha = \sqrt{\omega^2 + \lambda^2} - \lambda`, concave with maximum 0 at y = 0. The
    envelope is 1 on [-s', t'] and the tangent lines at t and -s beyond (Devroye's section 3).
    """

    alpha: jax.Array
    lam: jax.Array
    t: jax.Array
    s: jax.Array
    eta: jax.Array  # -psi(t)
    zeta: jax.Array  # -psi'(t)
    theta: jax.Array  # -psi(-s)
    xi: jax.Array  # psi'(-s)
    t_flat: jax.Array  # t' = t - eta/zeta, where the right tangent reaches 0
    s_flat: jax.Array  # s' = s - theta/xi


def _psi(y, alpha, lam):
    # A zero coefficient needs its own branch: 0 * inf is NaN once sinh or expm1 overflows.
    cosh_part = jnp.where(alpha > 0, alpha * 2.0 * jnp.sinh(0.5 * y) ** 2, 0.0)
    gamma_part = jnp.where(lam > 0, lam * (jnp.expm1(y) - y), 0.0)
    return -cosh_part - gamma_part


def _dpsi(y, alpha, lam):
    return -jnp.where(alpha > 0, alpha * jnp.sinh(y), 0.0) - jnp.where(lam > 0, lam * jnp.expm1(y), 0.0)


def devroye_envelope(lam, omega) -> DevroyeEnvelope:
    """Devroye's envelope for GIG(λ, ω), λ >= 0, ω > 0 (arrays of one shape).

    The tangent points t and s are Devroye's choices, which bound the expected number of tries
    uniformly in (λ, ω); any t, s > 0 would give an exact sampler, only a slower one. They are
    capped at 700 so that cosh stays finite (this binds only for ω below ~1e-300, where α is
    subnormal).
    """
    lam = jnp.asarray(lam, jnp.float64)
    omega = jnp.asarray(omega, jnp.float64)
    # sqrt(ω² + λ²) - λ = ω · ω / (hypot(ω, λ) + λ): no cancellation when λ >> ω, and no
    # underflow of ω² when λ = 0 (α = ω).
    alpha = omega * (omega / (jnp.hypot(omega, lam) + lam))
    right = -_psi(1.0, alpha, lam)
    t = jnp.where((right >= 0.5) & (right <= 2.0), 1.0,
                  jnp.where(right > 2.0, jnp.sqrt(2.0 / (alpha + lam)), jnp.log(4.0 / (alpha + 2.0 * lam))))
    left = -_psi(-1.0, alpha, lam)
    # Devroye's log(1 + 1/α + sqrt(1/α² + 2/α)), written as log(1 + α + sqrt(1 + 2α)) - log α so
    # that 1/α² cannot overflow.
    s_small = jnp.minimum(jnp.where(lam > 0, 1.0 / jnp.where(lam > 0, lam, 1.0), jnp.inf),
                          jnp.log(1.0 + alpha + jnp.sqrt(1.0 + 2.0 * alpha)) - jnp.log(alpha))
    s = jnp.where((left >= 0.5) & (left <= 2.0), 1.0,
                  jnp.where(left > 2.0, jnp.sqrt(4.0 / (alpha * math.cosh(1.0) + lam)), s_small))
    t, s = jnp.minimum(t, 700.0), jnp.minimum(s, 700.0)
    eta, zeta = -_psi(t, alpha, lam), -_dpsi(t, alpha, lam)
    theta, xi = -_psi(-s, alpha, lam), _dpsi(-s, alpha, lam)
    return DevroyeEnvelope(alpha, lam, t, s, eta, zeta, theta, xi, t - eta / zeta, s - theta / xi)


def devroye_round(key, env: DevroyeEnvelope):
    """One proposal per element from the envelope and its accept decision.

    Returns ``(y, accepted)`` of ``env``'s shape; ``y`` is a draw of Y = log(X/c) only where
    ``accepted``. :func:`standard_gig_log_sample` repeats rounds until every element accepted.
    """
    k_u, k_v, k_w = jax.random.split(key, 3)
    shape = jnp.shape(env.alpha)
    u = jax.random.uniform(k_u, shape, jnp.float64)
    # (0, 1): log(0) would propose an infinite point.
    v = jax.random.uniform(k_v, shape, jnp.float64, minval=_TINY)
    w = jax.random.uniform(k_w, shape, jnp.float64, minval=_TINY)
    q, r, p = env.t_flat + env.s_flat, 1.0 / env.zeta, 1.0 / env.xi
    total = p + q + r
    y = jnp.where(u * total < q, -env.s_flat + q * v,
                  jnp.where(u * total < q + r, env.t_flat - r * jnp.log(v), -env.s_flat + p * jnp.log(v)))
    log_chi = jnp.where(y > env.t_flat, -env.eta - env.zeta * (y - env.t),
                        jnp.where(y < -env.s_flat, -env.theta + env.xi * (y + env.s), 0.0))
    return y, jnp.log(w) + log_chi <= _psi(y, env.alpha, env.lam)


@partial(jax.jit, static_argnames="return_rounds")
def standard_gig_log_sample(key, p, omega, *, return_rounds=False):
    r"""log of X ~ GIG(p, ω), density :math:`\propto x^{p-1} e^{-\omega(x + 1/x)/2}`, ω > 0.

    ``p``, ``omega``: arrays of one shape (the draw's shape). A true accept/reject: a
    ``lax.while_loop`` draws a round for every element and keeps the first accepted proposal of
    each, until all have one; there is no cap on the number of rounds (Devroye bounds its
    expectation uniformly in the parameters). For p < 0, :math:`1/\mathrm{GIG}(-p, ω)` is
    GIG(p, ω). The scale is :math:`c = \lambda/\omega + \sqrt{1 + \lambda^2/\omega^2}
    = e^{\operatorname{asinh}(\lambda/\omega)}`, the mode of GIG(λ+1, ω).
    With ``return_rounds`` also returns the number of rounds the loop took.

    Elements whose parameters have no GIG (ω <= 0, NaN or infinite p or ω), or whose envelope
    is not finite, return NaN and are never looped on: the loop cannot spin on an element that
    could never accept. Checked for ω from 1e-300 to 1e300 (``tests/inference/test_gig.py``).
    """
    p = jnp.asarray(p, jnp.float64)
    omega = jnp.asarray(omega, jnp.float64)
    lam = jnp.abs(p)
    env = devroye_envelope(lam, omega)
    valid = (omega > 0) & jnp.isfinite(omega) & jnp.isfinite(p)
    for field in env:
        valid &= ~jnp.isnan(field)
    valid &= jnp.isfinite(env.t_flat) & jnp.isfinite(env.s_flat) & (env.zeta > 0) & (env.xi > 0)

    def cond(state):
        return ~jnp.all(state[2])

    def body(state):
        key, y, done, rounds = state
        key, sub = jax.random.split(key)
        proposal, accepted = devroye_round(sub, env)
        return key, jnp.where(done, y, proposal), done | accepted, rounds + 1

    init = (key, jnp.zeros_like(lam), ~valid, jnp.zeros((), jnp.int32))
    _, y, _, rounds = lax.while_loop(cond, body, init)
    # log c; the second form where λ/ω could overflow (it has no cancellation there).
    log_c = jnp.where(lam <= omega, jnp.arcsinh(lam / omega),
                      jnp.log(lam + jnp.hypot(lam, omega)) - jnp.log(omega))
    log_x = jnp.where(valid, log_c + y, jnp.nan)
    log_x = jnp.where(p < 0, -log_x, log_x)
    return (log_x, rounds) if return_rounds else log_x


# The distributions --------------------------------------------------------------------------------


def _inf_like(safe):
    """+inf, or NaN where the safe parameter is NaN (parameters outside the supported set)."""
    return jnp.where(jnp.isnan(safe), jnp.nan, jnp.inf)


def _check_gig(a, b, p):
    """The ValueError for unsupported concrete (a, b, p); traced values are not checked."""
    if not all(not_jax_tracer(z) for z in (a, b, p)):
        return
    # numpy, not jnp: inside a jit trace even concrete inputs would give traced comparisons.
    a, b, p = (np.asarray(z) for z in (a, b, p))
    good = (a > 0) & (b > 0) | (a > 0) & (b == 0) & (p > 0) | (a == 0) & (b > 0) & (p < 0)
    if not np.all(good & ~np.isnan(p)):
        raise ValueError(
            "GeneralizedInverseGaussian(a, b, p) needs a > 0 and b > 0, or b = 0 with p > 0 "
            "(Gamma limit), or a = 0 with p < 0 (inverse-Gamma limit).")


class GeneralizedInverseGaussian(Distribution):
    r"""GIG(a, b, p): density :math:`\frac{(a/b)^{p/2}}{2K_p(\sqrt{ab})} x^{p-1}
    e^{-(a x + b/x)/2}`, x > 0 (the supplement's GIG(a, b, p), e.g. ξ | · ~ GIG(2η, a², r − ½)).

    Supported: a > 0 and b > 0 with any real p; b = 0 with p > 0 (the Gamma(p, rate a/2) limit);
    a = 0 with p < 0 (the inverse-Gamma(−p, scale b/2) limit). Concrete parameters outside this
    set raise a ValueError. Batch shape: the broadcast of a, b, p.

    Moments (the VB updates' expectations). From the normaliser,
    :math:`\int_0^\infty x^{q-1} e^{-(ax + b/x)/2}dx = 2 (b/a)^{q/2} K_q(\sqrt{ab})`, so
    :math:`E[X^r] = (b/a)^{r/2} K_{p+r}(\omega)/K_p(\omega)` with :math:`\omega = \sqrt{ab}`:

    - :math:`E[X] = \sqrt{b/a}\, K_{p+1}(\omega)/K_p(\omega)`;
    - :math:`E[1/X] = \sqrt{a/b}\, K_{p-1}(\omega)/K_p(\omega)
      = \sqrt{a/b}\, K_{p+1}(\omega)/K_p(\omega) - 2p/b` (the recurrence
      :math:`K_{p+1} = K_{p-1} + (2p/\omega) K_p`, DLMF 10.29.1). The supplement's
      :math:`\langle\xi^{-1}\rangle` has :math:`K_p/K_{p-1}`, the ratio upside down; the two agree
      only where :math:`K_p = K_{p-1}`, i.e. p = 1/2 (r_a = 1);
    - :math:`E[\log X] = \tfrac12\log(b/a) + \partial_p \log K_p(\omega)`.

    ``mean_reciprocal`` evaluates the first form of E[1/X], which has no cancellation (the second
    subtracts two nearly equal terms when ω is small).
    """

    arg_constraints = {"a": constraints.nonnegative, "b": constraints.nonnegative, "p": constraints.real}
    support = constraints.positive
    reparametrized_params = []

    def __init__(self, a, b, p, *, validate_args=None):
        _check_gig(a, b, p)
        a, b, p = (jnp.asarray(z, jnp.float64) for z in (a, b, p))
        self.a, self.b, self.p = promote_shapes(a, b, p)
        batch_shape = lax.broadcast_shapes(jnp.shape(a), jnp.shape(b), jnp.shape(p))
        super().__init__(batch_shape=batch_shape, validate_args=validate_args)

    # The three regimes, elementwise; each formula below is evaluated at safe parameters and the
    # regime's value selected, so no branch produces a NaN that a gradient would see. Traced
    # parameters outside the supported set (not checked in __init__) get NaN safe parameters,
    # so every method returns NaN there (and the sampler does not loop on them).
    def _regimes(self):
        a, b, p = (jnp.broadcast_to(z, self.batch_shape) for z in (self.a, self.b, self.p))
        gamma_limit = b == 0
        inv_gamma_limit = a == 0
        ok = (a > 0) & (b > 0) | (a > 0) & gamma_limit & (p > 0) | inv_gamma_limit & (b > 0) & (p < 0)
        a_s = jnp.where(ok, jnp.where(inv_gamma_limit, 1.0, a), jnp.nan)
        b_s = jnp.where(ok, jnp.where(gamma_limit, 1.0, b), jnp.nan)
        return a, b, p, a_s, b_s, gamma_limit, inv_gamma_limit

    def sample(self, key, sample_shape=()):
        shape = tuple(sample_shape) + self.batch_shape
        a, b, p, a_s, b_s, g_lim, ig_lim = (jnp.broadcast_to(z, shape) for z in self._regimes())
        k_gig, k_gamma = jax.random.split(key)
        # Limit elements run the Devroye loop at (p, ω) = (p, 1), which terminates; their value
        # is the Gamma / inverse-Gamma draw.
        omega = jnp.where(g_lim | ig_lim, 1.0, jnp.sqrt(a_s * b_s))
        log_x = 0.5 * (jnp.log(b_s) - jnp.log(a_s)) + standard_gig_log_sample(k_gig, p, omega)
        log_g = jnp.log(jax.random.gamma(k_gamma, jnp.where(g_lim | ig_lim, jnp.abs(p), 1.0), shape,
                                         jnp.float64))
        log_x = jnp.where(g_lim, log_g + _LOG2 - jnp.log(a_s),
                          jnp.where(ig_lim, jnp.log(b_s) - _LOG2 - log_g, log_x))
        return jnp.exp(log_x)

    @validate_sample
    def log_prob(self, value):
        a, b, p, a_s, b_s, g_lim, ig_lim = self._regimes()
        omega = jnp.sqrt(a_s * b_s)
        log_norm = 0.5 * p * (jnp.log(a_s) - jnp.log(b_s)) - _LOG2 - log_bessel_kv(p, omega)
        p_s = jnp.where(g_lim | ig_lim, jnp.abs(p), 1.0)
        log_norm = jnp.where(g_lim, p * (jnp.log(a_s) - _LOG2) - gammaln(p_s),
                             jnp.where(ig_lim, -p * (jnp.log(b_s) - _LOG2) - gammaln(p_s), log_norm))
        return log_norm + (p - 1.0) * jnp.log(value) - 0.5 * (a * value + b / value)

    def _moment(self, r):
        """E[X^r] for a > 0, b > 0 (NaN-free placeholder elsewhere)."""
        a, b, p, a_s, b_s, _, _ = self._regimes()
        omega = jnp.sqrt(a_s * b_s)
        # kve differences: the common factor e^{-ω} would cost digits when ω is large.
        return jnp.exp(0.5 * r * (jnp.log(b_s) - jnp.log(a_s)) + log_bessel_kve(p + r, omega)
                       - log_bessel_kve(p, omega))

    @property
    def mean(self):
        a, b, p, a_s, b_s, g_lim, ig_lim = self._regimes()
        return jnp.where(g_lim, 2.0 * p / a_s,
                         jnp.where(ig_lim, jnp.where(p < -1, b_s / (2.0 * (-p - 1.0)), _inf_like(b_s)),
                                   self._moment(1.0)))

    @property
    def variance(self):
        a, b, p, a_s, b_s, g_lim, ig_lim = self._regimes()
        gig = self._moment(2.0) - self._moment(1.0) ** 2
        k = -p  # inverse-Gamma shape
        inv_gamma = jnp.where(k > 2, (b_s / 2.0) ** 2 / ((k - 1.0) ** 2 * (k - 2.0)), _inf_like(b_s))
        return jnp.where(g_lim, 4.0 * p / a_s**2, jnp.where(ig_lim, inv_gamma, gig))

    def mean_reciprocal(self):
        r""":math:`E[1/X]`: :math:`\sqrt{a/b}\,K_{p-1}(\sqrt{ab})/K_p(\sqrt{ab})` (see the class
        docstring; ``inf`` for a Gamma limit with p <= 1)."""
        a, b, p, a_s, b_s, g_lim, ig_lim = self._regimes()
        return jnp.where(g_lim, jnp.where(p > 1, a_s / (2.0 * (p - 1.0)), _inf_like(a_s)),
                         jnp.where(ig_lim, -2.0 * p / b_s, self._moment(-1.0)))

    def mean_log(self):
        r""":math:`E[\log X] = \tfrac12\log(b/a) + \partial_p\log K_p(\sqrt{ab})` (derivative by
        forward-mode differentiation of the Bessel function in its order)."""
        a, b, p, a_s, b_s, g_lim, ig_lim = self._regimes()
        omega = jnp.sqrt(a_s * b_s)
        _, d_log_k = jax.jvp(lambda q: log_bessel_kve(q, omega), (p,), (jnp.ones_like(p),))
        p_s = jnp.where(g_lim | ig_lim, jnp.abs(p), 1.0)
        return jnp.where(g_lim, digamma(p_s) - jnp.log(a_s) + _LOG2,
                         jnp.where(ig_lim, jnp.log(b_s) - _LOG2 - digamma(p_s),
                                   0.5 * (jnp.log(b_s) - jnp.log(a_s)) + d_log_k))


class InverseGaussian(Distribution):
    r"""IG(μ, λ), the Wald distribution: density :math:`\sqrt{\lambda/(2\pi x^3)}
    \exp\{-\lambda(x-\mu)^2/(2\mu^2 x)\}`, x > 0; mean μ, variance μ³/λ, E[1/X] = 1/μ + 1/λ.
    It is GIG(a = λ/μ², b = λ, p = −1/2).

    Sampled by Michael, Schucany & Haas (1976): with :math:`y = n^2`, n ~ N(0, 1) and
    :math:`r = \mu y/(2\lambda)`, the smaller root of their quadratic is
    :math:`\mu/D`, :math:`D = 1 + r + \sqrt{r^2 + 2r}` (written this way it has no cancellation,
    unlike :math:`\mu + \mu r - \mu\sqrt{r^2 + 2r}`, which ``jax.random.wald`` evaluates), kept with
    probability :math:`1/(1 + 1/D)`, else the larger root :math:`\mu D`.
    """

    arg_constraints = {"mean": constraints.positive, "concentration": constraints.positive}
    support = constraints.positive
    reparametrized_params = []
    pytree_data_fields = ("loc", "concentration")

    def __init__(self, mean, concentration=1.0, *, validate_args=None):
        mean, concentration = (jnp.asarray(z, jnp.float64) for z in (mean, concentration))
        self.loc, self.concentration = promote_shapes(mean, concentration)
        batch_shape = lax.broadcast_shapes(jnp.shape(mean), jnp.shape(concentration))
        super().__init__(batch_shape=batch_shape, validate_args=validate_args)

    def sample(self, key, sample_shape=()):
        shape = tuple(sample_shape) + self.batch_shape
        k_n, k_u = jax.random.split(key)
        y = jax.random.normal(k_n, shape, jnp.float64) ** 2
        u = jax.random.uniform(k_u, shape, jnp.float64)
        mu = jnp.broadcast_to(self.loc, shape)
        r = mu * y / (2.0 * jnp.broadcast_to(self.concentration, shape))
        d = 1.0 + r + jnp.sqrt(r * (r + 2.0))
        return jnp.where(u * (d + 1.0) <= d, mu / d, mu * d)

    @validate_sample
    def log_prob(self, value):
        mu, lam = self.loc, self.concentration
        return (0.5 * (jnp.log(lam) - math.log(2.0 * math.pi)) - 1.5 * jnp.log(value)
                - lam * (value - mu) ** 2 / (2.0 * mu**2 * value))

    @property
    def mean(self):
        return jnp.broadcast_to(self.loc, self.batch_shape)

    @property
    def variance(self):
        return jnp.broadcast_to(self.loc**3 / self.concentration, self.batch_shape)

    def mean_reciprocal(self):
        """E[1/X] = 1/μ + 1/λ."""
        return jnp.broadcast_to(1.0 / self.loc + 1.0 / self.concentration, self.batch_shape)


# Polson & Scott (2011): the SVM augmentation variable ---------------------------------------------


def polson_scott_lambda(key, margin):
    r"""Draws of :math:`\lambda_n` given the margin :math:`m_n = 1 - y_n\beta^\top z_n`.

    ``margin``: any shape; returns λ of that shape, finite and > 0 for every margin, zero included.

    The supplement's conditional is :math:`\lambda_n^{-1} \mid \cdot \sim \mathrm{IG}(|m|^{-1}, 1)`,
    whose mean diverges as m → 0. Its reciprocal is :math:`\lambda \sim \mathrm{GIG}(a = 1,
    b = m^2, p = 1/2)`, which at m = 0 is its Gamma limit Ga(1/2, rate 1/2) = χ²₁. So instead of a
    floor on :math:`|m|`, λ is drawn as the reciprocal of the Michael–Schucany–Haas draw of
    :math:`\mathrm{IG}(1/|m|, 1)` rewritten in terms of :math:`|m|`
    (:math:`\mu = 1/|m|`, :math:`r = y/(2|m|)`, :math:`y = n^2`, n ~ N(0, 1)):
    :math:`L = |m|D = |m| + y/2 + \sqrt{y^2/4 + |m|y}` with probability :math:`L/(L + |m|)`, else
    :math:`m^2/L`. This is exact for every m and continuous at m = 0, where it is L = y = n².
    The one clamp is λ >= the smallest normal float64 (2.2e-308), so that 1/λ is finite; a χ²₁
    draw falls below it with probability about 1e-154. The density of these draws, for a Gibbs
    conditional that ``check_conditional`` reads, is ``GeneralizedInverseGaussian(1.0, margin**2,
    0.5)`` (its Gamma limit at a zero margin).
    """
    m = jnp.abs(jnp.asarray(margin, jnp.float64))
    k_n, k_u = jax.random.split(key)
    y = jax.random.normal(k_n, m.shape, jnp.float64) ** 2
    u = jax.random.uniform(k_u, m.shape, jnp.float64)
    big = jnp.maximum(m + 0.5 * y + jnp.sqrt(0.25 * y**2 + m * y), _TINY)
    return jnp.maximum(jnp.where(u * (big + m) <= big, big, m**2 / big), _TINY)


def polson_scott_inverse_lambda(key, margin):
    r""":math:`\lambda_n^{-1} \sim \mathrm{IG}(|m_n|^{-1}, 1)`, finite at m = 0: the reciprocal of
    :func:`polson_scott_lambda` (same key, same draw)."""
    return 1.0 / polson_scott_lambda(key, margin)
