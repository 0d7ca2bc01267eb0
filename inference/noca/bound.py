r"""NOCA's variational bound (Jaakkola & Jordan 1999 for positive findings) and exact likelihood.

Notation: X (N, D) binary, theta (K, D), theta0 (D,), pi (K,), lam (N, K) = Q(s_ni = 1),
:math:`f(z) = \log(1 - e^{-z})` (concave, increasing), :math:`z_{nj} = \theta_{0j} + \sum_i
\theta_{ij}s_{ni}`.

**Negative findings** are exact under the mean field: :math:`\log P(x_{nj}=0\mid s) = -z_{nj}` is
linear in s, so :math:`\langle\log P\rangle = -\theta_{0j} - \sum_i\theta_{ij}\lambda_{ni}`.

**Positive findings** (lecture, "A further lower bound is required"): for any distribution
:math:`q_{nj}(\cdot)` over the parents i = 1..K, write
:math:`z = \sum_i q(i)\,(\theta_{0j} + \theta_{ij}s_i/q(i))` and use concavity of f (Jensen):

.. math::

    f(z) \ge \sum_i q(i) f(\theta_{0j} + \theta_{ij}s_i/q(i))
         = \sum_i q(i)\big[s_i f(\theta_{0j} + \theta_{ij}/q(i)) + (1-s_i) f(\theta_{0j})\big],

the second form because :math:`s_i \in \{0,1\}`. It is linear in s, so its mean under Q is the
same expression with :math:`\lambda_{ni}` for :math:`s_i`. A term with :math:`q(i) = 0` is 0 (the
limit of :math:`q f(\cdot/q)`, as f <= 0 and f -> 0).

The bound on the log-likelihood is therefore

.. math::

    \mathcal F = \sum_{n,i}\big[\lambda\log\pi_i + (1-\lambda)\log(1-\pi_i) + H(\lambda_{ni})\big]
      - \sum_{n,j:x=0}\big(\theta_{0j} + \textstyle\sum_i\theta_{ij}\lambda_{ni}\big)
      + \sum_{n,j:x=1}\sum_i q_{nj}(i)\big[\lambda_{ni} f(\theta_{0j} + \tfrac{\theta_{ij}}{q_{nj}(i)})
      + (1-\lambda_{ni}) f(\theta_{0j})\big].

**Layout.** Only positive findings carry a q. They are stored flat, in ``jnp.nonzero`` (row-major)
order: ``rows``, ``cols`` (P,) and ``q`` (P, K). The number of positives P must be static under
``jit``: it is passed as ``num_pos`` (see :func:`positive_index`).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax.scipy.special import xlog1py, xlogy


from latentzoo.inference.enumerate import all_states, enumerate_posterior

__all__ = [
    "log1mexp",
    "dlog1mexp",
    "positive_index",
    "positive_terms",
    "noca_bound",
    "noca_bound_rows",
    "noca_importance_loglik",
    "noca_exact_loglik",
    "noca_exact_rows",
    "noca_state_log_joint",
]

Q_TINY = 1e-300


def log1mexp(z):
    """f(z) = log(1 - e^{-z}) for z >= 0 (-inf at 0), accurate for small and large z."""
    # one formula for all z: near z = 0 expm1 keeps the digits; for large z, 1 - e^-z rounds to
    # 1 and the result to 0 with an absolute error below 1e-16, which is all a sum of logs needs.
    return jnp.log(-jnp.expm1(-z))


def dlog1mexp(z):
    """f'(z) = 1 / (e^z - 1) (positive, decreasing)."""
    return 1.0 / jnp.expm1(z)


@partial(jax.jit, static_argnums=1)  # eagerly, nonzero would compile op by op (seconds)
def positive_index(X, num_pos: int):
    """(rows, cols) of the ``num_pos`` positive findings of binary X, row-major (jit-safe)."""
    return jnp.nonzero(X, size=num_pos, fill_value=0)


def positive_terms(q, lam_p, th_p, th0_p):
    """Per (positive finding, parent) contributions to the bound, (P, K):
    q [lam f(theta0 + theta/q) + (1 - lam) f(theta0)], and 0 where q = 0.

    Shapes: q, lam_p, th_p (P, K) (rows gathered for each positive), th0_p (P,).
    """
    qs = jnp.maximum(q, Q_TINY)
    on = log1mexp(th0_p[:, None] + th_p / qs)
    off = log1mexp(th0_p)[:, None]
    return jnp.where(q > 0, q * (lam_p * on + (1.0 - lam_p) * off), 0.0)


def _entropy(lam):
    return -(xlogy(lam, lam) + xlog1py(1.0 - lam, -lam))


def noca_bound_rows(params, X, *, num_pos: int):
    """The bound F split by rows, (N,): F = noca_bound_rows(...).sum()."""
    pi, theta, theta0, lam, q = (params[k] for k in ("pi_loc", "theta_loc", "theta0_loc", "lam", "q"))
    rows, cols = positive_index(X, num_pos)
    prior = (xlogy(lam, pi) + xlog1py(1.0 - lam, -pi) + _entropy(lam)).sum(1)
    neg = 1.0 - X
    negative = -(neg @ theta0) - (lam * (neg @ theta.T)).sum(1)
    positive = jax.ops.segment_sum(positive_terms(q, lam[rows], theta.T[cols], theta0[cols]).sum(1), rows, X.shape[0])
    return prior + negative + positive


def noca_bound(params, X, *, num_pos: int):
    """The bound F (a scalar) at params {pi_loc (K,), theta_loc (K, D), theta0_loc (D,), lam (N, K),
    q (P, K)} (the keys of :func:`~latentzoo.inference.noca.blocks.noca_guide`)."""
    pi, theta, theta0, lam, q = (params[k] for k in ("pi_loc", "theta_loc", "theta0_loc", "lam", "q"))
    rows, cols = positive_index(X, num_pos)
    prior = (xlogy(lam, pi) + xlog1py(1.0 - lam, -pi) + _entropy(lam)).sum()
    neg = 1.0 - X
    negative = -(neg.sum(0) * theta0).sum() - (lam * (neg @ theta.T)).sum()
    positive = positive_terms(q, lam[rows], theta.T[cols], theta0[cols]).sum()
    return prior + negative + positive


def noca_state_log_joint(theta, theta0, pi):
    """``X_chunk (C, D) -> (C, 2^K)`` log p(x_n, s) for every state s (for enumeration)."""

    def log_joint(Xc):
        K = theta.shape[0]
        states = all_states(K, theta.dtype)
        z = theta0[None, :] + states @ theta  # (S, D) total inhibition of each state
        lp = states @ jnp.log(pi) + (1.0 - states) @ jnp.log1p(-pi)
        # x f(z) - (1 - x) z = x (f(z) + z) - z: one (C, D) x (D, S) product instead of two
        return Xc @ (log1mexp(z) + z).T + (lp - z.sum(1))[None, :]

    return log_joint


def noca_exact_loglik(X, theta, theta0, pi, *, per_row: bool = False):
    """log p(X | theta, theta0, pi) by enumerating the 2^K states (scalar, or (N,) per row)."""
    ll = noca_exact_rows(X, theta, theta0, pi)[0]
    return ll if per_row else ll.sum()



def noca_exact_rows(X, theta, theta0, pi):
    """``(loglik (N,), Es (N, K))``: log p(x_n | theta, theta0, pi) and the posterior marginals
    p(s_ni = 1 | x_n), both by enumerating the 2^K states."""
    stats = enumerate_posterior(noca_state_log_joint(theta, theta0, pi), X,
                                all_states(theta.shape[0], X.dtype))
    return stats.loglik, stats.Es


def noca_importance_loglik(X, theta, theta0, pi, rng_key, *, lam=None, num_samples: int = 2000):
    r"""log p(x_n) per row, (N,), by importance sampling over the sources, for K too large to
    enumerate: proposal :math:`r_n(s) = \prod_i \mathrm{Bernoulli}(\tfrac12\lambda_{ni} +
    \tfrac12\pi_i)` (half the mean-field posterior ``lam`` (N, K), half the prior, so the weights
    stay bounded where lam is overconfident; ``lam=None`` samples the prior), and
    :math:`\log\frac1M\sum_m p(x_n, s_m)/r_n(s_m)`. Its mean is below log p(x_n) (Jensen), by
    a bias that shrinks as 1/M."""
    N, D = X.shape
    r = pi[None, :] * jnp.ones((N, 1)) if lam is None else 0.5 * (lam + pi[None, :])
    r = jnp.clip(r, 1e-12, 1.0 - 1e-12)

    def one(key):
        s = (jax.random.uniform(key, r.shape) < r).astype(X.dtype)  # (N, K)
        z = theta0[None, :] + s @ theta
        log_px = (X * log1mexp(z) - (1.0 - X) * z).sum(1)
        log_ps = (s * jnp.log(pi) + (1.0 - s) * jnp.log1p(-pi)).sum(1)
        log_r = (s * jnp.log(r) + (1.0 - s) * jnp.log1p(-r)).sum(1)
        return log_px + log_ps - log_r

    logw = jax.lax.map(one, jax.random.split(rng_key, num_samples))  # (M, N)
    return jax.scipy.special.logsumexp(logw, axis=0) - jnp.log(num_samples)
