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

**Block tables.** Variational EM (``fit_cvq(method="vb")``) is the table :func:`cvq_vb_blocks`
(E-step, M-step), exact EM (``method="em"``) the one-block :data:`EXACT_EM_BLOCKS`, both run by
:func:`~latentzoo.inference.cavi_blocks.coordinate_ascent`. Each block requires Bernoulli sources
and the Normal likelihood and reads no prior, so editing a prior of W, pi or tau (its family
included) leaves the fit unchanged; a model whose likelihood is of another family is refused in
one sentence naming the site and the block.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpyro
import numpyro.distributions as dist
from jax.scipy.special import xlog1py, xlogy
from numpyro.distributions import constraints

from latentzoo.models.cvq import cvq

from latentzoo.inference.binary_draw import ENUM_MAX_K
from latentzoo.inference.cavi import CAVI, CoordinateAscent, VariationalFit, new_rows
from latentzoo.inference.cavi_blocks import CAVIBlock, coordinate_ascent
from latentzoo.inference.enumerate import all_states, enumerate_posterior
from latentzoo.inference.validation import check_matrix

__all__ = [
    "cvq_guide",
    "sources_from_rows",
    "cvq_vem",
    "cvq_exact_em",
    "cvq_vb_blocks",
    "EXACT_EM_BLOCKS",
    "cvq_bound",
    "cvq_bound_rows",
    "cvq_exact_rows",
    "cvq_mean_field_rows",
    "cvq_exact_loglik",
    "cvq_e_step",
    "cvq_m_step",
    "fit_cvq",
]

_PI_EPS = 1e-12
NORMAL = (dist.Normal,)
BERNOULLI = (dist.BernoulliProbs, dist.BernoulliLogits)  # dist.Bernoulli is a factory, not a class
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


def cvq_bound_rows(X, W, pi, sigma, lam):
    r"""The functional F(Q, theta) of the lecture split by rows, (N,): for each row n a lower
    bound on log p(x_n | W, pi, sigma) at any mean-field Q(s_n) = prod_k Bernoulli(lam_nk),

    .. math::

        F_n = -\tfrac D2\log(2\pi\sigma^2) - \tfrac1{2\sigma^2}\Big(\lVert x_n - W\lambda_n
              \rVert^2 + \sum_k \lambda_{nk}(1-\lambda_{nk})\lVert w_k\rVert^2\Big)
              + \sum_k \mathbb E_Q\log p(s_{nk}\mid\pi_k) + H(Q_n).

    X (N, D), W (D, K), pi (K,), sigma scalar, lam (N, K)."""
    D = X.shape[1]
    R = X - lam @ W.T
    G_diag = (W * W).sum(0)
    sq = (R * R).sum(1) + (lam * (1.0 - lam)) @ G_diag
    ll = -0.5 * D * jnp.log(2.0 * jnp.pi * sigma**2) - 0.5 * sq / sigma**2
    prior = (xlogy(lam, pi) + xlog1py(1.0 - lam, -pi)).sum(1)
    return ll + prior + _entropy(lam).sum(1)


def cvq_bound(params, X):
    """The functional F(Q, theta) of the lecture, summed over rows (a scalar)."""
    return cvq_bound_rows(X, params["W_loc"], params["pi_loc"], params["sigma_loc"], params["lam"]).sum()


def _state_log_joint(W, pi, sigma):
    def log_joint(Xc):
        states = all_states(W.shape[1], W.dtype)
        M = states @ W.T  # (S, D) the mean image of each state
        quad = (Xc * Xc).sum(1)[:, None] - 2.0 * Xc @ M.T + (M * M).sum(1)[None, :]
        D = W.shape[0]
        lp = states @ jnp.log(pi) + (1.0 - states) @ jnp.log1p(-pi)  # (S,)
        return -0.5 * quad / sigma**2 - 0.5 * D * jnp.log(2.0 * jnp.pi * sigma**2) + lp[None, :]

    return log_joint


def cvq_exact_loglik(X, W, pi, sigma, *, per_row: bool = False):
    """log p(X | W, pi, sigma) by enumerating the 2^K source states (a scalar, or (N,) per row
    with ``per_row``: the pointwise log-likelihood PSIS-LOO needs)."""
    K = W.shape[1]
    if X.shape[0] << K <= 1 << 21:  # the whole (N, 2^K) table at once: no posterior statistics
        ll = jax.scipy.special.logsumexp(_state_log_joint(W, pi, sigma)(X), axis=1)
    else:
        ll = cvq_exact_rows(X, W, pi, sigma)[0]
    return ll if per_row else ll.sum()


def cvq_exact_rows(X, W, pi, sigma):
    """``(loglik (N,), Es (N, K))``: log p(x_n | W, pi, sigma) and the posterior marginals
    p(s_nk = 1 | x_n), both by enumerating the 2^K source states."""
    stats = enumerate_posterior(_state_log_joint(W, pi, sigma), X, all_states(W.shape[1], X.dtype))
    return stats.loglik, stats.Es


def cvq_mean_field_rows(X, W, pi, sigma, num_sweeps: int = 100):
    """``(bound (N,), lam (N, K))`` for K too large to enumerate: the mean-field posterior of
    each row's sources at fixed parameters (``num_sweeps`` sweeps of :func:`cvq_e_step` from
    lam = pi; each coordinate step maximises F_n, so F_n never decreases) and the lower bound
    :func:`cvq_bound_rows` on log p(x_n) it reaches. Rows are independent: held-out rows too."""
    lam = jnp.broadcast_to(pi, (X.shape[0], W.shape[1])).astype(X.dtype)
    lam = cvq_e_step(lam, X, W, pi, sigma, num_sweeps)
    return cvq_bound_rows(X, W, pi, sigma, lam), lam


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


def sources_from_rows(rng_key, X, K: int):
    """(D, K) source images for a start: K distinct data rows, halved, plus noise at a tenth of
    the data's s.d. (sources are positive parts of the data in the lecture's images). Used by
    the point fits' start and the Gibbs sampler's (:func:`~latentzoo.inference.cvq.gibbs.init_from_data`)."""
    N, D = X.shape
    k1, k2 = jax.random.split(rng_key)
    rows = jax.random.choice(k1, N, (K,), replace=False)
    return 0.5 * X[rows].T + 0.1 * jnp.std(X) * jax.random.normal(k2, (D, K), dtype=X.dtype)


def _init(rng_key, X, ctx=None, *, K, N=None, D=None, **_):
    """W from :func:`sources_from_rows`; pi = 1/2; sigma = data s.d.; lam = 1/2."""
    N, D = X.shape
    W = sources_from_rows(rng_key, X, K)
    scale = jnp.std(X)
    return {
        "W_loc": W,
        "pi_loc": jnp.full(K, 0.5, X.dtype),
        "sigma_loc": scale,
        "lam": jnp.full((N, K), 0.5, X.dtype),
    }


# ----------------------------------------------------------------------------- block tables
# Maximum likelihood: no block reads the priors of W, pi or tau, so editing them (family included)
# does not change the fit. The derivations need the Bernoulli sources and the Normal likelihood.
REQUIRES = {"s": BERNOULLI, "X": NORMAL}
_M_PARAMS = ("W_loc", "pi_loc", "sigma_loc")


def _m_step(params, X, ctx=None):
    """pi, W, sigma from the mean-field marginals lam: M2 = lam^T lam + diag(sum lam (1 - lam))."""
    lam = params["lam"]
    M2 = lam.T @ lam + jnp.diag((lam * (1.0 - lam)).sum(0))
    W, pi, sigma = cvq_m_step(X, lam, M2)
    return {**params, "W_loc": W, "pi_loc": pi, "sigma_loc": sigma}


def cvq_vb_blocks(e_sweeps: int = 3) -> tuple[CAVIBlock, ...]:
    """The mean-field variational EM table: E-step (``e_sweeps`` sequential sweeps over the
    sources), then the M-step."""

    def e_step(params, X, ctx=None):
        lam = cvq_e_step(params["lam"], X, params["W_loc"], params["pi_loc"], params["sigma_loc"], e_sweeps)
        return {**params, "lam": lam}

    return (
        CAVIBlock("E-step Q(s)", ("s",), REQUIRES, e_step, ("lam",)),
        CAVIBlock("M-step (W, pi, sigma)", ("W", "pi", "tau"), REQUIRES, _m_step, _M_PARAMS),
    )


def _exact_sweep(params, X, ctx=None):
    """E-step over the 2^K states, then the M-step with the exact E[s_n] and sum_n E[s_n s_n^T];
    ``lam`` keeps the exact posterior marginals the M-step used."""
    K = params["W_loc"].shape[1]
    states = all_states(K, X.dtype)
    st = enumerate_posterior(
        _state_log_joint(params["W_loc"], params["pi_loc"], params["sigma_loc"]), X, states
    )
    M2 = states.T @ (st.weights[:, None] * states)
    W, pi, sigma = cvq_m_step(X, st.Es, M2)
    return {"W_loc": W, "pi_loc": pi, "sigma_loc": sigma, "lam": st.Es}


# One block: the M-step needs the state weights of the enumeration, not only lam.
EXACT_EM_BLOCKS = (
    CAVIBlock(
        "exact EM sweep (s by enumeration; W, pi, sigma)", ("s", "W", "pi", "tau"), REQUIRES,
        _exact_sweep, ("lam", *_M_PARAMS),
    ),
)


def cvq_vem(e_sweeps: int = 3, *, model=cvq) -> CoordinateAscent:
    """Mean-field variational EM (method ``"vb"``): the table :func:`cvq_vb_blocks`, checked
    against ``model``. Objective: the bound F (:func:`cvq_bound`)."""
    return coordinate_ascent(model, cvq_vb_blocks(e_sweeps), _init, lambda p, X, ctx: cvq_bound(p, X))


def cvq_exact_em(*, model=cvq) -> CoordinateAscent:
    """Exact EM over the 2^K states (method ``"em"``): the table :data:`EXACT_EM_BLOCKS`, checked
    against ``model``. Objective: the exact log-likelihood at the current params."""

    def loglik(params, X, ctx):
        return cvq_exact_loglik(X, params["W_loc"], params["pi_loc"], params["sigma_loc"])

    return coordinate_ascent(model, EXACT_EM_BLOCKS, _init, loglik)


# --------------------------------------------------------------------------------- fitting
def fit_cvq(
    X,
    K: int,
    *,
    method: str = "vb",
    num_steps: int = 500,
    seed: int = 0,
    restarts: int = 1,
    progress_bar: bool = False,
    rtol: float = 1e-9,
    e_sweeps: int = 3,
    init_params=None,
) -> VariationalFit:
    """Fit CVQ by mean-field variational EM (``method="vb"``) or exact EM by enumerating the 2^K
    source states (``"em"``), keeping the best of ``restarts`` starts by final objective (the
    driver's ``restarts``; keys split from ``seed``).

    Returns :class:`~latentzoo.inference.cavi.VariationalFit` (``.params``, ``.losses`` =
    -objective after each sweep, ``.guide`` = :func:`cvq_guide`, ``.model``).
    """
    if method not in ("vb", "em"):
        raise ValueError(f"Unknown CVQ fitting method {method!r}; the valid names are 'vb' and 'em'.")
    X = jnp.asarray(check_matrix(X, K=K, name="CVQ data"))
    algo = cvq_vem(e_sweeps) if method == "vb" else cvq_exact_em()
    result = CAVI(cvq, cvq_guide, algo).run(
        jax.random.PRNGKey(seed), num_steps, X, K=K, progress_bar=progress_bar, rtol=rtol,
        init_params=init_params, restarts=restarts,
    )
    K_fit = int(result.params["W_loc"].shape[1])
    return VariationalFit(result, cvq_guide, cvq, row_log_likelihood=_cvq_rows,
                          score_kind="exact" if K_fit <= ENUM_MAX_K else "lower bound")


def _cvq_rows(params, X):
    """Each new row's log p(x_n | W, pi, sigma): exact by enumeration up to ENUM_MAX_K sources,
    the mean-field lower bound above."""
    W, pi, sigma = params["W_loc"], params["pi_loc"], params["sigma_loc"]
    X = new_rows(X, W.shape[0])
    if bool(jnp.any(jnp.isnan(X))):
        raise ValueError("The CVQ scores complete rows only; the new rows have missing (NaN) entries.")
    if W.shape[1] <= ENUM_MAX_K:
        return cvq_exact_rows(X, W, pi, sigma)[0]
    return cvq_mean_field_rows(X, W, pi, sigma)[0]
