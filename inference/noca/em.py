r"""NOCA's MAP-EM updates: the variational E-step on the Jaakkola-Jordan bound, and the M-steps of
variational and exact EM with the model's priors as pseudo-counts.

The bound F is in :mod:`latentzoo.inference.noca.bound`; the block tables that run these updates
in :mod:`latentzoo.inference.noca.blocks`, the fitting loop in :mod:`latentzoo.inference.noca.fit`.
The lecture stops at a fragment of the q update; every update below is derived here from F plus
the log prior (derivations in ``docs/models/noca.md``). Write :math:`f(z) = \log(1-e^{-z})`,
:math:`f'(z) = 1/(e^z-1)`, :math:`f''(z) = -(f' + f'^2)`, :math:`h(q) = q f(\theta_0 + \theta/q)`
(concave in q: a perspective of a concave function), :math:`h'(q) = f(a) - (\theta/q) f'(a)` with
:math:`a = \theta_0 + \theta/q`.

**Priors as pseudo-counts.** With :math:`\pi_i\sim\mathrm{Beta}(a_\pi, b_\pi)` and
:math:`p = 1 - e^{-\theta} \sim \mathrm{Beta}(a, b)` (:class:`~latentzoo.models.noca.NoisyOrBeta`),
the log prior of a strength is :math:`(a-1) f(\theta) - b\theta`: the log-likelihood of
:math:`a-1` findings that are on and :math:`b` that are off, each under the gate alone. The MAP
objective :math:`\mathcal L = \mathcal F + \log p(\pi) + \log p(\theta) + \log p(\theta_0)` adds
these to each M-step's equation; for :math:`a \ge 1` every equation stays strictly decreasing.

**E-step, lam given q** (exact; the prior does not touch it). Setting
:math:`\partial F/\partial\lambda_{ni} = 0` gives, for all i at once,

.. math:: \lambda_{ni} = g\Big(\log\tfrac{\pi_i}{1-\pi_i} - \sum_{j:x_{nj}=0}\theta_{ij}
          + \sum_{j:x_{nj}=1} q_{nj}(i)\big[f(\theta_{0j} + \theta_{ij}/q_{nj}(i)) - f(\theta_{0j})\big]\Big).

**E-step, q given lam** (an ascent step). For one positive finding,
:math:`\Phi(q) = \sum_i \lambda_i h(q_i) + (1-\lambda_i) q_i f(\theta_0)` is concave on the simplex,
with gradient :math:`\gamma_i = \lambda_i h'(q_i) + (1-\lambda_i) f(\theta_0)`; its maximiser has
equal :math:`\gamma_i` on the support (KKT), which has no closed form. We take exponentiated-gradient
steps :math:`q_i \propto q_i e^{c(\gamma_i - \max\gamma)/\mathrm{spread}(\gamma)}` for
c in {16, 4, 1, 1/4} and keep, per finding, the best of these and the current q, so Phi never
decreases (a generalised E-step; warm-started across iterations, it converges to the KKT point).

**M-step.** :math:`\pi_i = (\sum_n\lambda_{ni} + a_\pi - 1)/(N + a_\pi + b_\pi - 2)`. For
:math:`\theta_{ij}` (parents decouple given :math:`\theta_{0j}`)

.. math:: \partial\mathcal L/\partial\theta_{ij} = -\sum_{n:x=0}\lambda_{ni} - b_{ij}
    + \sum_{n:x=1}\lambda_{ni} f'(\theta_{0j} + \theta_{ij}/q_{nj}(i)) + (a_{ij} - 1) f'(\theta_{ij}) = 0,

and for the leak :math:`\partial\mathcal L/\partial\theta_{0j} = -N^0_j - b_{0j} + (a_{0j}-1)f'(\theta_{0j})
+ \sum_{n:x=1}\sum_i q_{nj}(i)\big[\lambda_{ni} f'(\theta_{0j} + \theta_{ij}/q_{nj}(i)) + (1-\lambda_{ni})
f'(\theta_{0j})\big] = 0`. Both left sides are strictly decreasing (f' decreasing, a >= 1), so each
is a one-dimensional monotone equation; they are solved for all (i, j) at once by bracketed Newton
in :math:`\log\theta` (bisection when Newton leaves the bracket), on :math:`[10^{-8}, 50]`, and a
solution that does not raise its own one-dimensional objective is rejected (guards round-off), so
the objective never decreases.

**Exact EM.** The E-step enumerates the 2^K states (:mod:`~latentzoo.inference.enumerate`)
and keeps :math:`c^1_{sj} = \sum_n p(s\mid x_n) x_{nj}` and :math:`c^0_{sj}`; the M-step objective
of finding j, :math:`\sum_s c^1_{sj} f(z_{sj}) - c^0_{sj} z_{sj}` with :math:`z_{sj} = \theta_{0j} +
s^\top\theta_{\cdot j}`, plus the log priors, is again a table of this form: K + 1 extra rows,
the unit vectors (leak alone, source i alone), with counts :math:`c^1 = a - 1`, :math:`c^0 = b`.
It is concave in :math:`(\theta_{0j}, \theta_{\cdot j})`; a few sweeps of coordinate-wise monotone
solves raise it (generalised EM), so log-likelihood + log prior never decreases.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from latentzoo.inference.enumerate import all_states
from latentzoo.inference.noca.bound import Q_TINY, dlog1mexp, log1mexp, positive_terms

__all__ = [
    "prior_terms",
    "lam_update",
    "q_update",
    "pi_update",
    "theta_update",
    "theta0_update",
    "exact_m_step",
    "THETA_MIN",
    "THETA_MAX",
    "PI_EPS",
    "solve_decreasing",
]

THETA_MIN, THETA_MAX = 1e-8, 50.0
PI_EPS = 1e-12
_STEPS = (16.0, 4.0, 1.0, 0.25)


# ----------------------------------------------------------------------------- E-step
def lam_update(q, X, theta, theta0, pi, rows, cols):
    """Exact maximiser of F in lam given q (all rows and sources at once). -> (N, K)."""
    N = X.shape[0]
    th_p, th0_p = theta.T[cols], theta0[cols]
    qs = jnp.maximum(q, Q_TINY)
    gain = jnp.where(q > 0, q * (log1mexp(th0_p[:, None] + th_p / qs) - log1mexp(th0_p)[:, None]), 0.0)
    a = jnp.log(pi) - jnp.log1p(-pi) - (1.0 - X) @ theta.T + jax.ops.segment_sum(gain, rows, N)
    return jax.nn.sigmoid(a)


def _q_grad(q, lam_p, th_p, th0_p):
    qs = jnp.maximum(q, Q_TINY)
    u = th_p / qs
    a = th0_p[:, None] + u
    h1 = log1mexp(a) - u * dlog1mexp(a)
    return lam_p * h1 + (1.0 - lam_p) * log1mexp(th0_p)[:, None]


def q_update(q, lam, theta, theta0, rows, cols, num_steps: int = 2):
    """``num_steps`` exponentiated-gradient steps on each positive finding's q, each keeping the
    best of the step sizes in ``_STEPS`` and the current q (so the bound never decreases)."""
    lam_p, th_p, th0_p = lam[rows], theta.T[cols], theta0[cols]
    obj = lambda q: positive_terms(q, lam_p, th_p, th0_p).sum(1)

    def step(q, _):
        g = _q_grad(q, lam_p, th_p, th0_p)
        g = jnp.where(q > 0, g, -jnp.inf)
        gmax = g.max(1, keepdims=True)
        spread = gmax - jnp.where(q > 0, g, gmax).min(1, keepdims=True) + 1e-300
        logq = jnp.log(q)
        best_q, best = q, obj(q)
        for c in _STEPS:
            qn = jax.nn.softmax(logq + (c / spread) * jnp.where(q > 0, g - gmax, 0.0), axis=1)
            val = obj(qn)
            better = val > best
            best_q = jnp.where(better[:, None], qn, best_q)
            best = jnp.where(better, val, best)
        return best_q, None

    return jax.lax.scan(step, q, None, length=num_steps)[0]


# ----------------------------------------------------------------------------- M-step
def solve_decreasing(fn, t0, lo, hi, num_iter: int = 30):
    """Root of g(t) (strictly decreasing) in [lo, hi] for every element at once: Newton from t0,
    bisection whenever Newton leaves the current bracket; an endpoint when there is no sign change.
    ``fn(t) -> (g, dg/dt)``."""
    lo = jnp.broadcast_to(lo, t0.shape)
    hi = jnp.broadcast_to(hi, t0.shape)

    def body(_, c):
        t, lo, hi = c
        g, dg = fn(t)
        pos = g > 0
        lo, hi = jnp.where(pos, t, lo), jnp.where(pos, hi, t)
        tn = t - g / dg
        ok = jnp.isfinite(tn) & (tn >= lo) & (tn <= hi)
        return jnp.where(ok, tn, 0.5 * (lo + hi)), lo, hi

    return jax.lax.fori_loop(0, num_iter, body, (jnp.clip(t0, lo, hi), lo, hi))[0]


def _solve_log(fn, start, num_iter):
    """:func:`solve_decreasing` in log v on [THETA_MIN, THETA_MAX]; ``fn(v) -> (g, dg/dv)``."""

    def in_log(t):
        v = jnp.exp(t)
        g, dg = fn(v)
        return g, dg * v

    t0 = jnp.log(jnp.clip(start, THETA_MIN, THETA_MAX))
    t = solve_decreasing(in_log, t0, np.log(THETA_MIN), np.log(THETA_MAX), num_iter)
    return jnp.clip(jnp.exp(t), THETA_MIN, THETA_MAX)


def prior_terms(v, a, b):
    """The log prior (a - 1) f(v) - b v of a NoisyOrBeta(a, b) strength (no constant), its first
    and second derivatives in v. ``a = 1`` contributes no f terms (exactly, also at v -> 0)."""
    f1 = dlog1mexp(v)
    on = a - 1.0
    val = jnp.where(on == 0.0, 0.0, on * log1mexp(v)) - b * v
    return val, on * f1 - b, -on * (f1 + f1 * f1)


def pi_update(lam, a=1.0, b=1.0):
    """MAP of pi under Beta(a, b), a, b >= 1: (sum_n lam_ni + a - 1) / (N + a + b - 2). -> (K,)."""
    N = lam.shape[0]
    return jnp.clip((lam.sum(0) + a - 1.0) / (N + a + b - 2.0), PI_EPS, 1.0 - PI_EPS)


def theta_update(theta, theta0, lam, q, X, rows, cols, num_iter: int = 30, a=1.0, b=0.0):
    """Solve dL/dtheta_ij = 0 for all (i, j) (theta0 fixed), with the NoisyOrBeta(a, b) prior's
    pseudo-counts (a, b broadcast to (K, D); a = 1, b = 0 is maximum likelihood). -> (K, D)."""
    D = X.shape[1]
    A = (lam.T @ (1.0 - X))  # (K, D): sum over negative findings of lam
    lam_p, th0_p = lam[rows], theta0[cols]
    qs = jnp.maximum(q, Q_TINY)
    seg = lambda v: jax.ops.segment_sum(v, cols, D).T  # (P, K) -> (K, D)

    def fn(th):
        a_ = th0_p[:, None] + th.T[cols] / qs
        f1 = dlog1mexp(a_)
        f2 = -(f1 + f1 * f1)
        _, p1, p2 = prior_terms(th, a, b)
        g = seg(jnp.where(q > 0, lam_p * f1, 0.0)) - A + p1
        dg = seg(jnp.where(q > 0, lam_p * f2 / qs, 0.0)) + p2
        return g, dg

    def objective(th):
        a_ = th0_p[:, None] + th.T[cols] / qs
        return seg(jnp.where(q > 0, q * lam_p * log1mexp(a_), 0.0)) - A * th + prior_terms(th, a, b)[0]

    new = _solve_log(fn, theta, num_iter)
    return jnp.where(objective(new) >= objective(theta), new, theta)


def theta0_update(theta, theta0, lam, q, X, rows, cols, num_iter: int = 30, a=1.0, b=0.0):
    """Solve dL/dtheta0_j = 0 for all j (theta fixed), with the NoisyOrBeta(a, b) prior of the
    leak as pseudo-counts (a, b broadcast to (D,)). -> (D,)."""
    D = X.shape[1]
    N0 = (1.0 - X).sum(0)
    lam_p, th_p = lam[rows], theta.T[cols]
    qs = jnp.maximum(q, Q_TINY)
    seg = lambda v: jax.ops.segment_sum(v, cols, D)

    def fn(th0):
        z = th0[cols][:, None] + th_p / qs
        f1a, f1b = dlog1mexp(z), dlog1mexp(th0[cols])[:, None]
        f2a, f2b = -(f1a + f1a**2), -(f1b + f1b**2)
        w = jnp.where(q > 0, q * (lam_p * f1a + (1.0 - lam_p) * f1b), 0.0).sum(1)
        dw = jnp.where(q > 0, q * (lam_p * f2a + (1.0 - lam_p) * f2b), 0.0).sum(1)
        _, p1, p2 = prior_terms(th0, a, b)
        return seg(w) - N0 + p1, seg(dw) + p2

    def objective(th0):
        return seg(positive_terms(q, lam_p, th_p, th0[cols]).sum(1)) - N0 * th0 + prior_terms(th0, a, b)[0]

    new = _solve_log(fn, theta0, num_iter)
    return jnp.where(objective(new) >= objective(theta0), new, theta0)


def exact_m_step(theta, theta0, c1, c0, sweeps: int = 2, solver_iters: int = 20, prior=None):
    """Coordinate ascent on each finding's concave M-step objective
    Q_j = sum_s c1_sj f(z_sj) - c0_sj z_sj (+ log priors): for each coordinate (leak, then parent
    1..K) in turn, all findings at once, solve the monotone equation dQ_j/dv = 0 on
    [THETA_MIN, THETA_MAX].

    Args:
        theta (K, D), theta0 (D,): the start.
        c1, c0 (2^K, D): expected counts of on / off findings per source state (:func:`all_states`
            order).
        prior: ``(a0 (D,), b0 (D,), a (K, D), b (K, D))`` of the NoisyOrBeta priors, or None
            (maximum likelihood). They enter as K + 1 pseudo-states: the leak alone with counts
            (a0 - 1, b0) and source i alone (no leak) with (a_i - 1, b_i).

    Coordinate-wise solves handle the box constraint exactly; a projected Newton step on all
    coordinates at once can stall at the bound (a coupled step that leaves the box is cut and
    rejected), which is what a first version did.
    """
    K, D = theta.shape
    states = all_states(K, theta.dtype)
    B = jnp.concatenate([jnp.ones((states.shape[0], 1), theta.dtype), states], axis=1)  # (S, K+1)
    if prior is not None:
        a0, b0, a, b = prior
        B = jnp.concatenate([B, jnp.eye(K + 1, dtype=theta.dtype)])  # pseudo-states
        on = jnp.concatenate([jnp.broadcast_to(a0, (D,))[None], jnp.broadcast_to(a, (K, D))]) - 1.0
        off = jnp.concatenate([jnp.broadcast_to(b0, (D,))[None], jnp.broadcast_to(b, (K, D))])
        c1 = jnp.concatenate([c1, on])
        c0 = jnp.concatenate([c0, off])

    def Q(z):
        # c1 * f(z), with 0 where c1 = 0 (a pseudo-state with a = 1 at z -> 0)
        return (jnp.where(c1 == 0.0, 0.0, c1 * log1mexp(z)) - c0 * z).sum(0)

    def coordinate(i, V):
        bcol = B[:, i][:, None]  # (S, 1)
        z_rest = B @ V - bcol * V[i][None, :]

        def fn(v):
            z = z_rest + bcol * v[None, :]
            f1 = dlog1mexp(z)
            g = (bcol * (c1 * f1 - c0)).sum(0)
            dg = -(bcol * c1 * (f1 + f1 * f1)).sum(0)
            return g, dg

        new = _solve_log(fn, V[i], solver_iters)
        keep = Q(z_rest + bcol * new[None, :]) >= Q(z_rest + bcol * V[i][None, :])
        return V.at[i].set(jnp.where(keep, new, V[i]))

    V = jnp.concatenate([theta0[None], theta])
    V = jax.lax.fori_loop(0, sweeps * (K + 1), lambda k, V: coordinate(k % (K + 1), V), V)
    return V[1:], V[0]
