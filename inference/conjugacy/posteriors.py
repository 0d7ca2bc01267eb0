r"""The conditional of a conjugate site, read off the log density of the site's prior and
children as a function of the site's value.

Write :math:`\ell(w) = \log p(w \mid \cdot) + \sum_c \beta_c \log p(x_c \mid w, \cdot)` (the
prior and the children the detector found, masks, handler scales and temperatures
:math:`\beta_c` included). For a conjugate pair :math:`\ell` is, up to a constant, the log
density of the posterior family, linear in that family's sufficient statistics :math:`T(w)`:
:math:`\ell(w) = \eta^\top T(w) + c`. The coefficients :math:`\eta` are the posterior's natural
parameters, and a few derivatives of :math:`\ell` give them exactly:

- **Gaussian** (:math:`T = (w, ww^\top)`): :math:`\ell` is quadratic, so its Hessian is the
  constant :math:`-P` and :math:`b = \nabla\ell(w_0) + P w_0` at any :math:`w_0`; the posterior is
  :math:`\mathcal N(P^{-1}b, P^{-1})`. :math:`P` is read in blocks of ``k`` coupled elements
  (the site's trailing axes) by ``k`` Hessian-vector products with the unit patterns of a block
  repeated over every block (exact when :math:`P` is block-diagonal, which is checked).
- **Gamma** (:math:`T = (\log\tau, \tau)`), **InverseGamma** (:math:`T = (\log v, 1/v)`),
  **Beta** (:math:`T = (\log p, \log(1 - p))`), elementwise: :math:`\partial\ell/\partial w_i =
  \eta_{1i} T_1'(w_i) + \eta_{2i} T_2'(w_i)`; the gradient at two constant points gives a 2 x 2
  system per element.
- **Dirichlet** (:math:`T = \log p`): on the simplex only directions summing to zero are
  defined, so :math:`\ell` is read in softmax coordinates, :math:`p = \mathrm{softmax}(u)`, where
  :math:`\nabla_u \ell = \eta - p\,\textstyle\sum_j \eta_j`; two points give :math:`\eta`.

The ``*_probe`` functions compute, in one compiled program, what the ``verify_*`` functions
compare (in NumPy) to check the form at a random point; the detector calls them once. The
others are pure jnp and run in every sweep under ``jit``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from numpyro.distributions.transforms import ReshapeTransform

from latentzoo.inference.gaussian import gaussian_draw, mvn_from_precision

from .forms import RTOL

__all__ = [
    "ELEMENTWISE",
    "gaussian_natural",
    "gaussian_conditional",
    "gaussian_sample",
    "gaussian_probe",
    "verify_gaussian",
    "elementwise_natural",
    "elementwise_conditional",
    "elementwise_probe",
    "verify_elementwise",
    "dirichlet_natural",
    "dirichlet_conditional",
    "dirichlet_probe",
    "verify_dirichlet",
    "parameters_valid",
]


def _events(d, event_ndim: int):
    return d.to_event(event_ndim) if event_ndim > 0 else d


def _close(lhs, rhs, terms) -> bool:
    lhs, rhs, terms = (np.asarray(a) for a in (lhs, rhs, terms))
    scale = max(float(np.max(np.abs(lhs))) if lhs.size else 0.0, float(np.max(terms)) if terms.size else 0.0)
    return bool(np.all(np.abs(lhs - rhs) <= RTOL * (terms + np.abs(lhs)) + 1e-12 * scale))


# ----------------------------------------------------------------------------- Gaussian
def _blocks(shape, t):
    lead, tail = tuple(shape[: len(shape) - t]), tuple(shape[len(shape) - t:])
    return lead, tail, math.prod(tail), math.prod(lead)


def gaussian_natural(logp, theta0, t: int):
    """``(P, b)`` of the Gaussian conditional: ``P`` (m, k, k) block precisions and ``b`` (m, k)
    linear terms, for blocks over the last ``t`` axes of the site (k their size, m the number of
    blocks); ``theta0`` is any value of the site (the current one in a sweep)."""
    shape = theta0.shape
    lead, tail, k, m = _blocks(shape, t)
    grad = jax.grad(logp)
    g0 = grad(theta0)
    units = jnp.eye(k, dtype=theta0.dtype).reshape((k,) + (1,) * len(lead) + tail)
    V = jnp.broadcast_to(units, (k,) + tuple(shape))
    HV = jax.vmap(lambda v: jax.jvp(grad, (theta0,), (v,))[1])(V)  # (k, *shape)
    H = jnp.transpose(HV.reshape(k, m, k), (1, 2, 0))  # H[b, i, j]
    P = -0.5 * (H + jnp.swapaxes(H, -1, -2))
    b = g0.reshape(m, k) + jnp.einsum("bij,bj->bi", P, theta0.reshape(m, k))
    return P, b


def gaussian_conditional(P, b, shape, t: int, event_ndim: int) -> dist.Distribution:
    """The conditional as a NumPyro distribution of the site's shape: Normal for t = 0, else a
    MultivariateNormal per block (reshaped when a block spans several axes); ``event_ndim`` is
    the site's own event rank."""
    lead, tail, k, m = _blocks(shape, t)
    if t == 0:
        prec = P[:, 0, 0]
        d = dist.Normal((b[:, 0] / prec).reshape(shape), (prec ** -0.5).reshape(shape))
        return _events(d, event_ndim)
    if m == 1 and not lead:
        d = mvn_from_precision(P[0], b[0])
    else:
        d = mvn_from_precision(P.reshape(lead + (k, k)), b.reshape(lead + (k,)))
    if t > 1:
        d = dist.TransformedDistribution(d, ReshapeTransform(tail, (k,)))
    return _events(d, event_ndim - t)


def gaussian_sample(key, P, b, shape, t: int):
    """One draw of the site from ``N(P^{-1} b, P^{-1})`` (blocks as in :func:`gaussian_natural`)."""
    if t == 0:
        prec = P[:, 0, 0]
        eps = jax.random.normal(key, b[:, 0].shape, dtype=b.dtype)
        return (b[:, 0] / prec + eps / jnp.sqrt(prec)).reshape(shape)
    return gaussian_draw(key, P, b).reshape(shape)


def gaussian_probe(logp, theta0, t: int, v, theta_c):
    """``(P, b, hv, gc)``: the natural parameters, the Hessian-vector product with ``v`` and the
    gradient at ``theta_c`` (what :func:`verify_gaussian` compares; one compiled program)."""
    P, b = gaussian_natural(logp, theta0, t)
    grad = jax.grad(logp)
    return P, b, jax.jvp(grad, (theta0,), (v,))[1], grad(theta_c)


def verify_gaussian(P, b, v, hv, theta_c, gc) -> bool:
    """The Hessian is block-diagonal with blocks ``P`` (``hv``: its product with a random
    direction ``v``), and the gradient is affine (``gc``: the gradient at a random value
    ``theta_c``, which the quadratic with these ``P``, ``b`` predicts)."""
    m, k = b.shape
    P, b = np.asarray(P), np.asarray(b)
    v, theta_c = np.asarray(v).reshape(m, k), np.asarray(theta_c).reshape(m, k)
    Pv = np.einsum("bij,bj->bi", P, v)
    if not _close(-np.asarray(hv).reshape(m, k), Pv, np.einsum("bij,bj->bi", np.abs(P), np.abs(v))):
        return False
    pred = b - np.einsum("bij,bj->bi", P, theta_c)
    terms = np.abs(b) + np.einsum("bij,bj->bi", np.abs(P), np.abs(theta_c))
    return _close(np.asarray(gc).reshape(m, k), pred, terms)


# ------------------------------------------------------------- Gamma, InverseGamma, Beta
def _gamma(e1, e2):
    return dist.Gamma(e1 + 1.0, -e2)


def _inverse_gamma(e1, e2):
    return dist.InverseGamma(-e1 - 1.0, -e2)


def _beta(e1, e2):
    return dist.Beta(e1 + 1.0, e2 + 1.0)


#: family -> (T1', T2', two reference points, natural parameters -> posterior); the derivatives
#: are plain arithmetic, so they take Python floats (the 2 x 2 system, built once) and arrays.
ELEMENTWISE = {
    dist.Gamma: (lambda x: 1.0 / x, lambda x: 0.0 * x + 1.0, (1.0, 2.0), _gamma),
    dist.InverseGamma: (lambda x: 1.0 / x, lambda x: -1.0 / x**2, (1.0, 2.0), _inverse_gamma),
    dist.Beta: (lambda x: 1.0 / x, lambda x: -1.0 / (1.0 - x), (1.0 / 3.0, 2.0 / 3.0), _beta),
}


def elementwise_natural(family, logp, shape, dtype=jnp.float64):
    """``(eta1, eta2)``, each of the site's shape: the coefficients of T1 and T2 in the
    conditional log density, from its gradient at two constant values of the site."""
    d1, d2, (a, c), _ = ELEMENTWISE[family]
    grad = jax.grad(logp)
    ga = grad(jnp.full(shape, a, dtype))
    gc = grad(jnp.full(shape, c, dtype))
    M = np.array([[d1(a), d2(a)], [d1(c), d2(c)]], dtype=np.float64)
    det = M[0, 0] * M[1, 1] - M[0, 1] * M[1, 0]
    e1 = (M[1, 1] * ga - M[0, 1] * gc) / det
    e2 = (-M[1, 0] * ga + M[0, 0] * gc) / det
    return e1, e2


def elementwise_conditional(family, e1, e2, event_ndim: int) -> dist.Distribution:
    return _events(ELEMENTWISE[family][3](e1, e2), event_ndim)


def elementwise_probe(family, logp, shape, point):
    """``(eta1, eta2, g)``: the coefficients and the gradient at ``point`` (one program)."""
    e1, e2 = elementwise_natural(family, logp, shape, point.dtype)
    return e1, e2, jax.grad(logp)(point)


def verify_elementwise(family, e1, e2, point, g) -> bool:
    """The gradient ``g`` at a random value ``point`` of the site is the one the fitted
    coefficients predict, element by element (fails when a child couples elements, or the
    log density is not of the family's form)."""
    d1, d2, _, _ = ELEMENTWISE[family]
    a, c = np.asarray(e1 * d1(point)), np.asarray(e2 * d2(point))
    return _close(np.asarray(g), a + c, np.abs(a) + np.abs(c))


# -------------------------------------------------------------------------- Dirichlet
def _softmax_gradient(logp):
    return jax.grad(lambda u: logp(jax.nn.softmax(u, axis=-1)))


def dirichlet_natural(logp, shape, dtype=jnp.float64):
    """``eta`` (the site's shape): the coefficients of log p in the conditional log density."""
    k = shape[-1]
    G = _softmax_gradient(logp)
    ua = jnp.zeros(shape, dtype)
    ub = jnp.broadcast_to(jnp.log(jnp.arange(1, k + 1, dtype=dtype)), shape)
    pa, pb = jax.nn.softmax(ua, axis=-1), jax.nn.softmax(ub, axis=-1)
    Ga, Gb = G(ua), G(ub)
    dp = pa - pb
    total = -jnp.sum((Ga - Gb) * dp, -1) / jnp.sum(dp * dp, -1)  # sum_j eta_j, per row
    return Ga + pa * total[..., None]


def dirichlet_conditional(eta, event_ndim: int) -> dist.Distribution:
    return _events(dist.Dirichlet(eta + 1.0), event_ndim - 1)


def dirichlet_probe(logp, shape, u):
    """``(eta, g)``: the coefficients and the softmax-coordinate gradient at ``u``."""
    return dirichlet_natural(logp, shape, u.dtype), _softmax_gradient(logp)(u)


def verify_dirichlet(eta, u, g) -> bool:
    """At random softmax coordinates ``u``: the gradient ``g`` is eta - p sum(eta)."""
    eta, g = np.asarray(eta), np.asarray(g)
    p = np.asarray(jax.nn.softmax(u, axis=-1))
    s = np.sum(eta, -1, keepdims=True)
    return _close(g, eta - p * s, np.abs(eta) + p * np.sum(np.abs(eta), -1, keepdims=True))


# ------------------------------------------------------------------------------- validity
def parameters_valid(family, natural) -> bool:
    """Eager, in NumPy: the conditional's parameters from its natural parameters (as the
    ``*_natural`` functions return them) are finite, positive where the family needs it, and a
    Gaussian's block precisions are positive definite."""
    if family in (dist.Normal, dist.MultivariateNormal):
        P, b = (np.asarray(a) for a in natural)
        if not (np.all(np.isfinite(P)) and np.all(np.isfinite(b))):
            return False
        try:
            np.linalg.cholesky(P)
        except np.linalg.LinAlgError:
            return False
        return True
    if family is dist.Dirichlet:
        params = (np.asarray(natural) + 1.0,)
    else:
        e1, e2 = (np.asarray(a) for a in natural)
        params = {dist.Gamma: (e1 + 1.0, -e2), dist.InverseGamma: (-e1 - 1.0, -e2),
                  dist.Beta: (e1 + 1.0, e2 + 1.0)}[family]
    return all(np.all(np.isfinite(a)) and np.all(a > 0) for a in params)
