r"""log K_ν(x), the modified Bessel function of the second kind, in log space.

``jax.scipy.special`` has no K_ν; the GIG normaliser and the GIG moments
(:mod:`latentzoo.inference.gig`) need :math:`\log K_\nu(x)` for ν up to 10³ and x over 10⁻⁶..10⁶,
where :math:`K_\nu(x)` itself overflows (:math:`\log K_{1000}(10^{-6}) \approx 2\times10^4`) or
underflows (:math:`\log K_0(10^6) \approx -10^6`). So everything stays in log space.

Method: :math:`e^{x} K_\nu(x) = \int_0^\infty e^{-x(\cosh t - 1)} \cosh(\nu t)\,dt`
(DLMF 10.32.9). The integrand is unimodal in t; its peak and the window where it is within
:math:`e^{-50}` of the peak are found by bisection, and the integral is the trapezoidal rule with
128 nodes on that window, summed by log-sum-exp. The integrand is entire in t, so the trapezoidal
rule converges geometrically once its step resolves the peak's width (a few nodes per width
suffice; 128 nodes over a window of ≈ 14 widths leave a wide margin), and an integrand
negligible at the window's ends makes the truncation error :math:`O(e^{-50})`. Temme's series
with Steed's continued fraction (the classical route, and tensorflow-probability's) needs a
forward recurrence in ν of up to 10³ steps per element and a switch between regimes; the
quadrature is one fixed-shape vectorised computation and is differentiable in both arguments.
Measured accuracy: ``docs/gig.md``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

__all__ = ["log_bessel_kv", "log_bessel_kve", "bessel_kv_ratio"]

_LOG2 = math.log(2.0)
_NODES = 128  # trapezoid nodes over the window
_DROP = 50.0  # the window keeps the integrand within e^-50 of its peak
_BISECT = 60  # bisection steps: 2^-60 of a bracket shorter than 1500 is below float64 spacing


def _log_integrand(t, v, x):
    """log[e^x e^{-x cosh t} cosh(v t)], written so that neither term loses digits:
    -x(cosh t - 1) = -2x sinh^2(t/2) and log cosh(u) = u + log1p(e^{-2u}) - log 2 for u >= 0."""
    vt = v * t
    return -2.0 * x * jnp.sinh(0.5 * t) ** 2 + vt + jnp.log1p(jnp.exp(-2.0 * vt)) - _LOG2


def _bisect(below_root, lo, hi):
    """The point in [lo, hi] where ``below_root`` turns from True to False, elementwise."""

    def step(_, bracket):
        lo, hi = bracket
        mid = 0.5 * (lo + hi)
        up = below_root(mid)
        return jnp.where(up, mid, lo), jnp.where(up, hi, mid)

    lo, hi = lax.fori_loop(0, _BISECT, step, (lo, hi))
    return 0.5 * (lo + hi)


def _window(v, x):
    """The integrand's window [t_lo, t_hi], elementwise (v >= 0, x > 0; no gradient flows here).

    The log integrand h has h(0) = 0 and h'(t) = v tanh(vt) - x sinh t with h'' decreasing, so
    it is unimodal: the peak t* is 0 when v^2 <= x, else the one root of h' in (0, asinh(v/x)]
    (as tanh <= 1). Right end: at T = 2 log(4(v + 50)/x + 4) + 1, x(cosh T - 1) >= vT + 50
    (from cosh T - 1 >= e^T/2 - 1 and log y <= y), so h(T) <= -50 <= h(t*) - 50 and T brackets
    the point where h has fallen by 50. Left end: 0 if h(0) is within the window, else the
    point below t* where h is 50 below its peak.
    """
    t_peak = _bisect(lambda t: v * jnp.tanh(v * t) - x * jnp.sinh(t) > 0, jnp.zeros_like(x),
                     jnp.arcsinh(v / x))
    level = _log_integrand(t_peak, v, x) - _DROP
    t_max = 2.0 * jnp.log(4.0 * (v + _DROP) / x + 4.0) + 1.0
    t_hi = _bisect(lambda t: _log_integrand(t, v, x) > level, t_peak, jnp.maximum(t_max, t_peak))
    # With t_lo = 0 the half weight at 0 makes the rule the symmetric trapezoid on [-t_hi, t_hi]
    # for the even integrand, which keeps the geometric convergence.
    t_lo = jnp.where(level <= 0.0, 0.0,
                     _bisect(lambda t: _log_integrand(t, v, x) < level, jnp.zeros_like(x), t_peak))
    return t_lo, t_hi


@jax.jit  # one compiled program also when called eagerly (a Distribution's methods often are)
def log_bessel_kve(v, x):
    r""":math:`\log(e^x K_v(x))`, the log of ``scipy.special.kve``, elementwise.

    ``v``, ``x``: arrays broadcasting to a common shape; K is even in v (the absolute value of v is used) and x > 0
    (x = 0 gives +inf, x < 0 NaN). Returns float64 of the broadcast shape. Differences of this
    function at one x (Bessel ratios) keep full relative precision even where
    :math:`|\log K_v(x)| \approx x` is large. Differentiable in x and v (the window is held fixed
    under differentiation; moving its ends changes the integral by a relative :math:`e^{-50}`).
    """
    v, x = jnp.broadcast_arrays(jnp.abs(jnp.asarray(v, jnp.float64)), jnp.asarray(x, jnp.float64))
    x_safe = jnp.where(x > 0, x, 1.0)
    t_lo, t_hi = _window(lax.stop_gradient(v), lax.stop_gradient(x_safe))
    k = jnp.arange(_NODES, dtype=jnp.float64)
    step = (t_hi - t_lo) / (_NODES - 1)
    t = t_lo[..., None] + step[..., None] * k
    log_w = jnp.log(step)[..., None] + jnp.where((k == 0) | (k == _NODES - 1), -_LOG2, 0.0)
    out = jax.nn.logsumexp(_log_integrand(t, v[..., None], x_safe[..., None]) + log_w, axis=-1)
    return jnp.where(x > 0, out, jnp.where(x == 0, jnp.inf, jnp.nan))


def log_bessel_kv(v, x):
    r""":math:`\log K_v(x)`, elementwise: :func:`log_bessel_kve` minus x (same shapes and domain).

    Error at most ~1e-13 of :math:`\max(1, |\log K_v(x)|)` for v in [0, 1000], x in [1e-6, 1e6]
    (measured against ``scipy.special.kve`` and the Debye expansion: ``docs/gig.md``); the same down
    to x = 1e-15, then degrading for small v (3e-9 at x = 1e-30, 2e-4 at x = 1e-300).
    """
    x = jnp.asarray(x, jnp.float64)
    return log_bessel_kve(v, x) - jnp.where(x > 0, x, 0.0)


def bessel_kv_ratio(v, r, x):
    r""":math:`K_{v+r}(x) / K_v(x)`, elementwise, as a difference of :func:`log_bessel_kve`
    (no overflow, and no loss of digits to the common factor :math:`e^{-x}`)."""
    v = jnp.asarray(v, jnp.float64)
    return jnp.exp(log_bessel_kve(v + r, x) - log_bessel_kve(v, x))
