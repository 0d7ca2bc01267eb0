r"""Variational EM (Jaakkola-Jordan bound) and exact EM for NOCA, as CAVI block tables.

``fit_noca(method="vb")`` is the variational EM (the table :func:`noca_vb_blocks`: E-step, pi,
theta, theta0), ``method="em"`` the exact EM (:func:`noca_exact_em_blocks`, one block), both run
by :func:`~latentzoo.inference.cavi_blocks.coordinate_ascent`. They are maximum likelihood: each
block requires the Bernoulli sources and the Bernoulli (noisy-OR) likelihood and reads no prior,
so editing a prior of pi, theta or theta0 leaves the fit unchanged, and a model whose likelihood
is of another family is refused in one sentence naming the site and the block.

The bound F is in :mod:`latentzoo.inference.noca.bound`. The lecture stops at a fragment of the
q update; every update below is derived here from F (derivations in ``docs/models/noca.md``).
Write :math:`f(z) = \log(1-e^{-z})`, :math:`f'(z) = 1/(e^z-1)`, :math:`f''(z) = -(f' + f'^2)`,
:math:`h(q) = q f(\theta_0 + \theta/q)` (concave in q: a perspective of a concave function),
:math:`h'(q) = f(a) - (\theta/q) f'(a)` with :math:`a = \theta_0 + \theta/q`.

**E-step, lam given q** (exact). F is linear in each :math:`\lambda_{ni}` apart from its entropy, so
setting :math:`\partial F/\partial\lambda_{ni} = 0` gives, for all i at once,

.. math:: \lambda_{ni} = g\Big(\log\tfrac{\pi_i}{1-\pi_i} - \sum_{j:x_{nj}=0}\theta_{ij}
          + \sum_{j:x_{nj}=1} q_{nj}(i)\big[f(\theta_{0j} + \theta_{ij}/q_{nj}(i)) - f(\theta_{0j})\big]\Big).

**E-step, q given lam** (an ascent step). For one positive finding,
:math:`\Phi(q) = \sum_i \lambda_i h(q_i) + (1-\lambda_i) q_i f(\theta_0)` is concave on the simplex,
with gradient :math:`\gamma_i = \lambda_i h'(q_i) + (1-\lambda_i) f(\theta_0)`; its maximiser has
equal :math:`\gamma_i` on the support (KKT), which has no closed form. We take exponentiated-gradient
steps :math:`q_i \propto q_i e^{c(\gamma_i - \max\gamma)/\mathrm{spread}(\gamma)}` for
c in {16, 4, 1, 1/4} and keep, per finding, the best of these and the current q, so Phi never
decreases (a generalised E-step; warm-started across iterations, it converges to the KKT point).

**M-step.** :math:`\pi_i = \frac1N\sum_n\lambda_{ni}`. For :math:`\theta_{ij}` (parents decouple given
:math:`\theta_{0j}`) :math:`\partial F/\partial\theta_{ij} = -\sum_{n:x=0}\lambda_{ni} +
\sum_{n:x=1}\lambda_{ni} f'(\theta_{0j} + \theta_{ij}/q_{nj}(i)) = 0`, and for the leak
:math:`\partial F/\partial\theta_{0j} = -N^0_j + \sum_{n:x=1}\sum_i q_{nj}(i)\big[\lambda_{ni}
f'(\theta_{0j} + \theta_{ij}/q_{nj}(i)) + (1-\lambda_{ni}) f'(\theta_{0j})\big] = 0`. Both left sides
are strictly decreasing (f' decreasing), so each is a one-dimensional monotone equation; they are
solved for all (i, j) at once by bracketed Newton in :math:`\log\theta` (bisection when Newton
leaves the bracket), on :math:`[10^{-8}, 50]`, and a solution that does not raise its own
one-dimensional objective is rejected (guards round-off), so F never decreases.

**Exact EM.** The E-step enumerates the 2^K states (:mod:`~latentzoo.inference.enumerate`)
and keeps :math:`c^1_{sj} = \sum_n p(s\mid x_n) x_{nj}` and :math:`c^0_{sj}`; the expected complete
log-likelihood of finding j, :math:`\sum_s c^1_{sj} f(z_{sj}) - c^0_{sj} z_{sj}` with
:math:`z_{sj} = \theta_{0j} + s^\top\theta_{\cdot j}`, is concave in :math:`(\theta_{0j},
\theta_{\cdot j})`; a few sweeps of coordinate-wise monotone solves (the same bracketed
Newton) raise it (generalised EM), so the log-likelihood never decreases.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.distributions import constraints

from latentzoo.models.noca import noca

from latentzoo.inference.cavi import CAVI, CoordinateAscent, VariationalFit
from latentzoo.inference.cavi_blocks import CAVIBlock, coordinate_ascent
from latentzoo.inference.enumerate import all_states, enumerate_posterior
from latentzoo.inference.validation import check_matrix
from latentzoo.inference.noca.bound import (
    Q_TINY,
    dlog1mexp,
    log1mexp,
    noca_bound,
    noca_exact_loglik,
    noca_state_log_joint,
    positive_index,
    positive_terms,
)

__all__ = [
    "noca_guide",
    "noca_vem",
    "noca_exact_em",
    "noca_vb_blocks",
    "noca_exact_em_blocks",
    "Positives",
    "lam_update",
    "q_update",
    "theta_update",
    "theta0_update",
    "fit_noca",
    "THETA_MIN",
    "THETA_MAX",
    "solve_decreasing",
]

THETA_MIN, THETA_MAX = 1e-8, 50.0
_PI_EPS = 1e-12
BERNOULLI = (dist.BernoulliProbs, dist.BernoulliLogits)  # dist.Bernoulli is a factory, not a class
_STEPS = (16.0, 4.0, 1.0, 0.25)


def noca_guide(X=None, *, K, N=None, D=None, priors=None, num_pos=None):
    """Guide: point estimates pi, theta, theta0 (``Delta``) and Q(s) = prod Bernoulli(lam).
    ``q`` (P, K), the Jensen weights of the positive findings, is a parameter of the bound only."""
    N = X.shape[0] if X is not None else N
    D = X.shape[1] if X is not None else D
    pi = numpyro.param("pi_loc", jnp.full(K, 0.5), constraint=constraints.unit_interval)
    theta = numpyro.param("theta_loc", jnp.ones((K, D)), constraint=constraints.positive)
    theta0 = numpyro.param("theta0_loc", jnp.full(D, 0.01), constraint=constraints.positive)
    lam = numpyro.param("lam", jnp.full((N, K), 0.5), constraint=constraints.unit_interval)
    numpyro.param("q", jnp.full((1, K), 1.0 / K), constraint=constraints.simplex)
    with numpyro.plate("K", K, dim=-1):
        numpyro.sample("pi", dist.Delta(pi))
    with numpyro.plate("D", D, dim=-1):
        numpyro.sample("theta0", dist.Delta(theta0))
    with numpyro.plate("Ksrc", K, dim=-2), numpyro.plate("D", D, dim=-1):
        numpyro.sample("theta", dist.Delta(theta))
    with numpyro.plate("N", N, dim=-2), numpyro.plate("K", K, dim=-1):
        numpyro.sample("s", dist.Bernoulli(probs=lam))


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


def theta_update(theta, theta0, lam, q, X, rows, cols, num_iter: int = 30):
    """Solve dF/dtheta_ij = 0 for all (i, j) (theta0 fixed). -> theta (K, D)."""
    D = X.shape[1]
    A = (lam.T @ (1.0 - X))  # (K, D): sum over negative findings of lam
    lam_p, th0_p = lam[rows], theta0[cols]
    qs = jnp.maximum(q, Q_TINY)
    seg = lambda v: jax.ops.segment_sum(v, cols, D).T  # (P, K) -> (K, D)

    def fn(t):
        th = jnp.exp(t)
        a = th0_p[:, None] + th.T[cols] / qs
        f1 = dlog1mexp(a)
        f2 = -(f1 + f1 * f1)
        g = seg(jnp.where(q > 0, lam_p * f1, 0.0)) - A
        dg = seg(jnp.where(q > 0, lam_p * f2 / qs, 0.0)) * th
        return g, dg

    def objective(th):
        a = th0_p[:, None] + th.T[cols] / qs
        return seg(jnp.where(q > 0, q * lam_p * log1mexp(a), 0.0)) - A * th

    t = solve_decreasing(fn, jnp.log(jnp.clip(theta, THETA_MIN, THETA_MAX)), np.log(THETA_MIN), np.log(THETA_MAX), num_iter)
    new = jnp.clip(jnp.exp(t), THETA_MIN, THETA_MAX)
    return jnp.where(objective(new) >= objective(theta), new, theta)


def theta0_update(theta, theta0, lam, q, X, rows, cols, num_iter: int = 30):
    """Solve dF/dtheta0_j = 0 for all j (theta fixed). -> theta0 (D,)."""
    D = X.shape[1]
    N0 = (1.0 - X).sum(0)
    lam_p, th_p = lam[rows], theta.T[cols]
    qs = jnp.maximum(q, Q_TINY)
    seg = lambda v: jax.ops.segment_sum(v, cols, D)

    def fn(t):
        th0 = jnp.exp(t)
        a = th0[cols][:, None] + th_p / qs
        f1a, f1b = dlog1mexp(a), dlog1mexp(th0[cols])[:, None]
        f2a, f2b = -(f1a + f1a**2), -(f1b + f1b**2)
        w = jnp.where(q > 0, q * (lam_p * f1a + (1.0 - lam_p) * f1b), 0.0).sum(1)
        dw = jnp.where(q > 0, q * (lam_p * f2a + (1.0 - lam_p) * f2b), 0.0).sum(1)
        return seg(w) - N0, seg(dw) * th0

    def objective(th0):
        return seg(positive_terms(q, lam_p, th_p, th0[cols]).sum(1)) - N0 * th0

    t = solve_decreasing(fn, jnp.log(jnp.clip(theta0, THETA_MIN, THETA_MAX)), np.log(THETA_MIN), np.log(THETA_MAX), num_iter)
    new = jnp.clip(jnp.exp(t), THETA_MIN, THETA_MAX)
    return jnp.where(objective(new) >= objective(theta0), new, theta0)


# ----------------------------------------------------------------------------- recipes
NOCA_REQUIRES = {"s": BERNOULLI, "X": BERNOULLI}


class Positives(NamedTuple):
    """What the variational blocks read besides the params: the (row, column) index of the
    ``num_pos`` ones of X (static under jit)."""

    rows: jax.Array
    cols: jax.Array
    num_pos: int


def _positives(model, X, *, num_pos, **_) -> Positives:
    rows, cols = positive_index(X, num_pos)
    return Positives(rows, cols, num_pos)


def _init(rng_key, X, ctx=None, *, K, N=None, D=None, priors=None, num_pos=None):
    """theta_ij ~ U(0.05, 1), theta0 = 0.01, pi = 1/2, lam = 1/2, q = 1/K (uniform over parents)."""
    N, D = X.shape
    P = int(X.sum()) if num_pos is None else num_pos
    return {
        "pi_loc": jnp.full(K, 0.5, X.dtype),
        "theta_loc": jax.random.uniform(rng_key, (K, D), X.dtype, 0.05, 1.0),
        "theta0_loc": jnp.full(D, 0.01, X.dtype),
        "lam": jnp.full((N, K), 0.5, X.dtype),
        "q": jnp.full((P, K), 1.0 / K, X.dtype),
    }


def noca_vb_blocks(e_iters: int = 1, q_steps: int = 2, solver_iters: int = 12) -> tuple[CAVIBlock, ...]:
    """The variational EM table on the bound F: E-step (``e_iters`` x (q steps, lam)), then pi,
    theta, theta0. Maximum likelihood: no block reads a prior of pi, theta or theta0; each needs
    the Bernoulli sources and the (noisy-OR) Bernoulli likelihood."""

    def e_step(params, X, pos: Positives):
        lam, q = params["lam"], params["q"]
        theta, theta0 = params["theta_loc"], params["theta0_loc"]
        for _ in range(e_iters):
            q = q_update(q, lam, theta, theta0, pos.rows, pos.cols, q_steps)
            lam = lam_update(q, X, theta, theta0, params["pi_loc"], pos.rows, pos.cols)
        return {**params, "lam": lam, "q": q}

    def pi_step(params, X, pos: Positives):
        return {**params, "pi_loc": jnp.clip(params["lam"].mean(0), _PI_EPS, 1.0 - _PI_EPS)}

    def theta_step(params, X, pos: Positives):
        theta = theta_update(
            params["theta_loc"], params["theta0_loc"], params["lam"], params["q"], X,
            pos.rows, pos.cols, solver_iters,
        )
        return {**params, "theta_loc": theta}

    def theta0_step(params, X, pos: Positives):
        theta0 = theta0_update(
            params["theta_loc"], params["theta0_loc"], params["lam"], params["q"], X,
            pos.rows, pos.cols, solver_iters,
        )
        return {**params, "theta0_loc": theta0}

    return (
        CAVIBlock("E-step (q, Q(s))", ("s",), NOCA_REQUIRES, e_step, ("q", "lam")),
        CAVIBlock("M-step pi", ("pi",), NOCA_REQUIRES, pi_step, ("pi_loc",)),
        CAVIBlock("M-step theta", ("theta",), NOCA_REQUIRES, theta_step, ("theta_loc",)),
        CAVIBlock("M-step theta0", ("theta0",), NOCA_REQUIRES, theta0_step, ("theta0_loc",)),
    )


def noca_vem(e_iters: int = 1, q_steps: int = 2, solver_iters: int = 12, *, model=noca) -> CoordinateAscent:
    """Variational EM on the bound F (method ``"vb"``): the table :func:`noca_vb_blocks`, checked
    against ``model``. Needs the keyword ``num_pos`` = number of ones in X (static under jit)."""

    def bound(params, X, pos: Positives):
        return noca_bound(params, X, num_pos=pos.num_pos)

    blocks = noca_vb_blocks(e_iters, q_steps, solver_iters)
    return coordinate_ascent(model, blocks, _init, bound, _positives)


def _exact_m_step(theta, theta0, c1, c0, sweeps: int = 2, solver_iters: int = 20):
    """Coordinate ascent on each finding's concave expected complete log-likelihood
    Q_j = sum_s c1_sj f(z_sj) - c0_sj z_sj: for each coordinate (leak, then parent 1..K) in turn,
    all findings at once, solve the monotone equation dQ_j/dv = 0 on [THETA_MIN, THETA_MAX].

    Coordinate-wise solves handle the box constraint exactly; a projected Newton step on all
    coordinates at once can stall at the bound (a coupled step that leaves the box is cut and
    rejected), which is what a first version did.
    """
    K, D = theta.shape
    states = all_states(K, theta.dtype)
    B = jnp.concatenate([jnp.ones((states.shape[0], 1), theta.dtype), states], axis=1)  # (S, K+1)

    def Q(z):
        return (c1 * log1mexp(z) - c0 * z).sum(0)

    def coordinate(i, V):
        b = B[:, i][:, None]  # (S, 1)
        z_rest = B @ V - b * V[i][None, :]

        def fn(t):
            v = jnp.exp(t)
            z = z_rest + b * v[None, :]
            f1 = dlog1mexp(z)
            g = (b * (c1 * f1 - c0)).sum(0)
            dg = -(b * c1 * (f1 + f1 * f1)).sum(0) * v
            return g, dg

        t = solve_decreasing(
            fn, jnp.log(jnp.clip(V[i], THETA_MIN, THETA_MAX)), np.log(THETA_MIN), np.log(THETA_MAX), solver_iters
        )
        new = jnp.clip(jnp.exp(t), THETA_MIN, THETA_MAX)
        keep = Q(z_rest + b * new[None, :]) >= Q(z_rest + b * V[i][None, :])
        return V.at[i].set(jnp.where(keep, new, V[i]))

    V = jnp.concatenate([theta0[None], theta])
    V = jax.lax.fori_loop(0, sweeps * (K + 1), lambda k, V: coordinate(k % (K + 1), V), V)
    return V[1:], V[0]


def noca_exact_em_blocks(m_sweeps: int = 2) -> tuple[CAVIBlock, ...]:
    """Exact EM as a one-block table: enumeration E-step, then the generalised M-step (the
    M-step needs the state weights of the enumeration, not only lam)."""

    def sweep(params, X, ctx=None):
        K = params["theta_loc"].shape[0]
        st = enumerate_posterior(
            noca_state_log_joint(params["theta_loc"], params["theta0_loc"], params["pi_loc"]), X, all_states(K, X.dtype)
        )
        c1 = st.RtX
        c0 = st.weights[:, None] - c1
        theta, theta0 = _exact_m_step(params["theta_loc"], params["theta0_loc"], c1, c0, m_sweeps)
        pi = jnp.clip(st.Es.mean(0), _PI_EPS, 1.0 - _PI_EPS)
        return {**params, "pi_loc": pi, "theta_loc": theta, "theta0_loc": theta0, "lam": st.Es}

    return (
        CAVIBlock(
            "exact EM sweep (s by enumeration; pi, theta, theta0)", ("s", "pi", "theta", "theta0"),
            NOCA_REQUIRES, sweep, ("lam", "pi_loc", "theta_loc", "theta0_loc"),
        ),
    )


def noca_exact_em(m_sweeps: int = 2, *, model=noca) -> CoordinateAscent:
    """Exact EM by enumeration (K <= 16; method ``"em"``), checked against ``model``. Objective:
    the exact log-likelihood.
    ``lam`` holds the exact posterior marginals used by the last M-step; ``q`` is carried unchanged."""

    def loglik(params, X, ctx=None):
        return noca_exact_loglik(X, params["theta_loc"], params["theta0_loc"], params["pi_loc"])

    return coordinate_ascent(model, noca_exact_em_blocks(m_sweeps), _init, loglik)


# --------------------------------------------------------------------------------- fitting
def fit_noca(
    X,
    K: int,
    *,
    method: str = "vb",
    num_steps: int = 300,
    seed: int = 0,
    restarts: int = 1,
    progress_bar: bool = False,
    rtol: float = 1e-7,
    init_params=None,
    **algo_kwargs,
) -> VariationalFit:
    """Fit NOCA by variational EM on the Jaakkola-Jordan bound (``method="vb"``) or exact EM by
    enumerating the 2^K source states (``"em"``), keeping the best of ``restarts`` starts by final
    objective (the driver's ``restarts``; keys split from ``seed``). ``algo_kwargs`` go to
    :func:`noca_vem` or :func:`noca_exact_em`.

    Returns :class:`~latentzoo.inference.cavi.VariationalFit` (``.params``, ``.losses`` =
    -objective after each sweep, ``.guide`` = :func:`noca_guide`, ``.model``).
    """
    if method not in ("vb", "em"):
        raise ValueError(f"Unknown NOCA fitting method {method!r}; the valid names are 'vb' and 'em'.")
    X = jnp.asarray(check_matrix(X, K=K, binary=True, name="NOCA data"))
    algo = noca_vem(**algo_kwargs) if method == "vb" else noca_exact_em(**algo_kwargs)
    result = CAVI(noca, noca_guide, algo).run(
        jax.random.PRNGKey(seed), num_steps, X, K=K, num_pos=int(X.sum()), progress_bar=progress_bar,
        rtol=rtol, init_params=init_params, restarts=restarts,
    )
    return VariationalFit(result, noca_guide, noca)
