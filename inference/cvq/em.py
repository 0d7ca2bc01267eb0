r"""Variational EM and exact EM for the CVQ (:mod:`latentzoo.models.cvq`), as CAVI recipes.

Notation: X (N, D), W (D, K), pi (K,), sigma (noise s.d.), lam (N, K) the mean-field parameters
:math:`\lambda_{nk} = Q(s_{nk} = 1)`, :math:`G = W^\top W`.

**The functional** (lecture, "Functional F (for all data points)"), per row

.. math::

    F_n = -\tfrac D2 \log(2\pi\sigma^2) - \tfrac1{2\sigma^2}\Big[\lVert x_n - W\lambda_n\rVert^2
          + \textstyle\sum_k \lambda_{nk}(1-\lambda_{nk}) G_{kk}\Big]
          + \sum_k \lambda_{nk}\log\pi_k + (1-\lambda_{nk})\log(1-\pi_k) + H(\lambda_{nk}),

which is the lecture's expression with :math:`\langle s_i s_j\rangle = \lambda_i\lambda_j +
\delta_{ij}(\lambda_i - \lambda_i^2)` collected into a residual. Two slips in the slides are fixed
here: the entropy term enters with a minus sign on :math:`\lambda\log\lambda`, and the density has
:math:`(2\pi\sigma^2)^{-D/2}`, not :math:`2^{-d/2}\sigma^{-d/2}`.

**E-step** (slide "Variational EM - E-step"): for u = 1..K *in turn* (each is the exact maximiser
of F in :math:`\lambda_u` given the others, so F never decreases; a simultaneous update of all u
does not have that guarantee)

.. math:: \lambda_{nu} = g\big(\sigma^{-2}(x_n - \textstyle\sum_{j\ne u}\lambda_{nj}w_j)^\top w_u
          - \tfrac1{2\sigma^2}w_u^\top w_u + \log\tfrac{\pi_u}{1-\pi_u}\big).

**M-step** (slides "Variational EM - M-step"): :math:`\pi_u = \frac1N\sum_n\lambda_{nu}`;
setting :math:`\partial F/\partial W = 0` gives the K linear equations
:math:`W\,M_2 = X^\top\Lambda` with :math:`M_2 = \sum_n\langle s_n s_n^\top\rangle =
\Lambda^\top\Lambda + \mathrm{diag}(\sum_n\lambda_n(1-\lambda_n))` (solved by Cholesky);
then :math:`\sigma^2 = \frac1{ND}\sum_n\langle\lVert x_n - W s_n\rVert^2\rangle`.

**Exact EM** replaces Q by the exact posterior over the 2^K states
(:mod:`~latentzoo.inference.enumerate`); the M-step is the same with the exact
:math:`E[s_n]` and :math:`\sum_n E[s_n s_n^\top]`, and the reported objective is the exact
log-likelihood :math:`\log p(X\mid W,\pi,\sigma)`, which EM never decreases.

Both are maximum-likelihood methods (as in the lecture): the priors of the Bayesian model are not
used. The guide exposes W, pi, tau = 1/sigma^2 as ``Delta`` sites, so ``Trace_ELBO`` of
(``cvq``, :func:`cvq_guide`) equals F plus the log prior density of the point estimates.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
import numpyro
import numpyro.distributions as dist
from jax.scipy.special import xlog1py, xlogy
from numpyro.distributions import constraints

from latentzoo.models.cvq import cvq

from latentzoo.inference.cavi import CAVI, CoordinateAscent
from latentzoo.inference.enumerate import all_states, enumerate_posterior
from latentzoo.inference.validation import check_matrix

__all__ = [
    "cvq_guide",
    "cvq_vem",
    "cvq_exact_em",
    "cvq_bound",
    "cvq_exact_loglik",
    "cvq_e_step",
    "cvq_m_step",
    "fit_cvq",
]

_PI_EPS = 1e-12
_JITTER = 1e-10  # keeps M2 positive definite when a source is switched off in every row


def cvq_guide(X=None, *, K, N=None, D=None, priors=None):
    """Guide: point estimates W, pi, tau = 1/sigma^2 (``Delta``) and Q(s) = prod Bernoulli(lam).

    Params (named apart from the sample sites, which share NumPyro's namespace): ``W_loc`` (D, K),
    ``pi_loc`` (K,), ``sigma_loc`` (), ``lam`` (N, K).
    """
    N = X.shape[0] if X is not None else N
    D = X.shape[1] if X is not None else D
    W = numpyro.param("W_loc", jnp.zeros((D, K)))
    pi = numpyro.param("pi_loc", jnp.full(K, 0.5), constraint=constraints.unit_interval)
    sigma = numpyro.param("sigma_loc", jnp.asarray(1.0), constraint=constraints.positive)
    lam = numpyro.param("lam", jnp.full((N, K), 0.5), constraint=constraints.unit_interval)
    with numpyro.plate("K", K, dim=-1):
        numpyro.sample("pi", dist.Delta(pi))
    with numpyro.plate("D", D, dim=-1):
        numpyro.sample("W", dist.Delta(W, event_dim=1))
    numpyro.sample("tau", dist.Delta(1.0 / sigma**2))
    with numpyro.plate("N", N, dim=-2), numpyro.plate("K", K, dim=-1):
        numpyro.sample("s", dist.Bernoulli(probs=lam))


# ----------------------------------------------------------------------------- objective
def _entropy(lam):
    return -(xlogy(lam, lam) + xlog1py(1.0 - lam, -lam))


def cvq_bound(params, X):
    """The functional F(Q, theta) of the lecture, summed over rows (a scalar)."""
    W, pi, sigma, lam = params["W_loc"], params["pi_loc"], params["sigma_loc"], params["lam"]
    N, D = X.shape
    R = X - lam @ W.T
    G_diag = (W * W).sum(0)
    sq = (R * R).sum() + ((lam * (1.0 - lam)) @ G_diag).sum()
    ll = -0.5 * N * D * jnp.log(2.0 * jnp.pi * sigma**2) - 0.5 * sq / sigma**2
    prior = (xlogy(lam, pi) + xlog1py(1.0 - lam, -pi)).sum()
    return ll + prior + _entropy(lam).sum()


def _state_log_joint(W, pi, sigma):
    def log_joint(Xc):
        states = all_states(W.shape[1], W.dtype)
        M = states @ W.T  # (S, D) the mean image of each state
        quad = (Xc * Xc).sum(1)[:, None] - 2.0 * Xc @ M.T + (M * M).sum(1)[None, :]
        D = W.shape[0]
        lp = states @ jnp.log(pi) + (1.0 - states) @ jnp.log1p(-pi)  # (S,)
        return -0.5 * quad / sigma**2 - 0.5 * D * jnp.log(2.0 * jnp.pi * sigma**2) + lp[None, :]

    return log_joint


def cvq_exact_loglik(X, W, pi, sigma):
    """log p(X | W, pi, sigma) by enumerating the 2^K source states (a scalar)."""
    K = W.shape[1]
    return enumerate_posterior(_state_log_joint(W, pi, sigma), X, all_states(K, X.dtype)).loglik.sum()


# ------------------------------------------------------------------------------- updates
def cvq_e_step(lam, X, W, pi, sigma, num_sweeps: int = 1):
    r"""``num_sweeps`` sequential sweeps of the lecture's fixed point over u = 1..K (a scan over
    columns, vectorised over rows). lam (N, K) -> (N, K).

    The residual :math:`X - \Lambda W^\top` is carried through the scan, so one column costs O(ND).
    """
    logit_pi = jnp.log(pi) - jnp.log1p(-pi)
    tau = 1.0 / sigma**2
    G_diag = (W * W).sum(0)
    K = W.shape[1]

    def col(carry, u):
        lam, R = carry
        w = W[:, u]
        R_u = R + lam[:, u][:, None] * w[None, :]  # residual without source u
        new = jax.nn.sigmoid(tau * (R_u @ w) - 0.5 * tau * G_diag[u] + logit_pi[u])
        return (lam.at[:, u].set(new), R_u - new[:, None] * w[None, :]), None

    def sweep(carry, _):
        return jax.lax.scan(col, carry, jnp.arange(K))[0], None

    (lam, _), _ = jax.lax.scan(sweep, (lam, X - lam @ W.T), None, length=num_sweeps)
    return lam


def cvq_m_step(X, Es, M2):
    """Closed-form M-step from E[s_n] (N, K) and M2 = sum_n E[s_n s_n^T] (K, K).

    Returns (W (D, K), pi (K,), sigma ()). W solves W M2 = X^T E[S] (Cholesky); sigma^2 is the
    expected squared residual per entry at the new W.
    """
    N, D = X.shape
    K = Es.shape[1]
    # a source that is on (off) in every row drives the mean to 1 (0) up to rounding, and then
    # log(1 - pi) of a row with lam = 1 - 1e-16 is -inf; the clip costs < N * 1e-12 nats of F.
    pi = jnp.clip(Es.mean(0), _PI_EPS, 1.0 - _PI_EPS)
    B = X.T @ Es  # (D, K)
    L = jnp.linalg.cholesky(M2 + _JITTER * jnp.eye(K, dtype=M2.dtype))
    W = jsl.cho_solve((L, True), B.T).T
    sq = (X * X).sum() - 2.0 * (W * B).sum() + jnp.trace(W.T @ W @ M2)
    sigma = jnp.sqrt(jnp.maximum(sq / (N * D), 1e-300))
    return W, pi, sigma


def _init(rng_key, X, *, K, N=None, D=None, priors=None):
    """W: K random data rows shrunk towards zero plus noise (sources are positive parts of the
    data in the lecture's images); pi = 1/2; sigma = data s.d.; lam = 1/2."""
    N, D = X.shape
    k1, k2 = jax.random.split(rng_key)
    rows = jax.random.choice(k1, N, (K,), replace=False)
    scale = jnp.std(X)
    W = 0.5 * X[rows].T + 0.1 * scale * jax.random.normal(k2, (D, K), dtype=X.dtype)
    return {
        "W_loc": W,
        "pi_loc": jnp.full(K, 0.5, X.dtype),
        "sigma_loc": scale,
        "lam": jnp.full((N, K), 0.5, X.dtype),
    }


def cvq_vem(e_sweeps: int = 3) -> CoordinateAscent:
    """Mean-field variational EM: E-step (``e_sweeps`` sequential sweeps), then pi, W, sigma.
    Objective: the bound F (:func:`cvq_bound`)."""

    def update(params, X, *, K, N=None, D=None, priors=None):
        lam = cvq_e_step(params["lam"], X, params["W_loc"], params["pi_loc"], params["sigma_loc"], e_sweeps)
        M2 = lam.T @ lam + jnp.diag((lam * (1.0 - lam)).sum(0))
        W, pi, sigma = cvq_m_step(X, lam, M2)
        return {"W_loc": W, "pi_loc": pi, "sigma_loc": sigma, "lam": lam}

    def elbo(params, X, *, K, N=None, D=None, priors=None):
        return cvq_bound(params, X)

    return CoordinateAscent(_init, update, elbo)


def cvq_exact_em() -> CoordinateAscent:
    """Exact EM over the 2^K states. Objective: the exact log-likelihood at the current params.
    ``lam`` holds the exact posterior marginals used by the last M-step."""

    def update(params, X, *, K, N=None, D=None, priors=None):
        states = all_states(K, X.dtype)
        st = enumerate_posterior(
            _state_log_joint(params["W_loc"], params["pi_loc"], params["sigma_loc"]), X, states
        )
        M2 = states.T @ (st.weights[:, None] * states)
        W, pi, sigma = cvq_m_step(X, st.Es, M2)
        return {"W_loc": W, "pi_loc": pi, "sigma_loc": sigma, "lam": st.Es}

    def elbo(params, X, *, K, N=None, D=None, priors=None):
        return cvq_exact_loglik(X, params["W_loc"], params["pi_loc"], params["sigma_loc"])

    return CoordinateAscent(_init, update, elbo)


# --------------------------------------------------------------------------------- fitting
def fit_cvq(
    X,
    K: int,
    *,
    method: str = "vem",
    num_steps: int = 500,
    seed: int = 0,
    restarts: int = 1,
    rtol: float = 1e-9,
    e_sweeps: int = 3,
    init_params=None,
):
    """Fit CVQ by variational EM (``"vem"``) or exact EM (``"em"``); keep the best of
    ``restarts`` random starts by final objective. Returns the ``SVIRunResult`` (losses = -objective)."""
    X = jnp.asarray(check_matrix(X, K=K, name="CVQ data"))
    if method == "vem":
        algo = cvq_vem(e_sweeps)
    elif method == "em":
        algo = cvq_exact_em()
    else:
        raise ValueError(f"Unknown CVQ fitting method {method!r}; use 'vem' or 'em'.")
    cavi = CAVI(cvq, cvq_guide, algo)
    best = None
    for r, key in enumerate(jax.random.split(jax.random.PRNGKey(seed), restarts)):
        res = cavi.run(
            key, num_steps, X, K=K, progress_bar=False, rtol=rtol,
            init_params=init_params if r == 0 else None,
        )
        if best is None or float(res.losses[-1]) < float(best.losses[-1]):
            best = res
    return best
