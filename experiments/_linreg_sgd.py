"""Exact posterior, learning rate and SGD of ``online_fa_linear_regression.py`` (thesis ch. 6).

Private to that script: the exact linear-regression posterior N(m, S), the KL-optimal constant
SGD learning rate (Mandt, Hoffman & Blei 2017, with the discrete-time stationary covariance), and
the jitted mini-batch SGD, vmapped over seeds, whose iterates the online FA models are fitted to.

Posterior (thesis sec. 2.2, 6)
------------------------------
beta = 1 / var(y) (= 1 after standardising), alpha = 0.01 * mean(diag(beta X^T X)),
A = alpha I + beta X^T X, b = beta X^T y, m = A^-1 b, S = A^-1; lambda = alpha / beta is the L2
strength of the thesis' loss sum_n (y_n - theta^T x_n)^2 + lambda theta^T theta (eq. 6.4).

SGD: loss scaling and learning rate
-----------------------------------
SGD minimises the per-example *mean* of the negative log posterior (eq. 6.4 times beta / 2N):

    l_n(theta) = (beta/2) (y_n - theta^T x_n)^2 + (alpha / 2N) theta^T theta,
    L(theta)  = (1/N) sum_n l_n = -(1/N) log p(theta | D) + const,

with one mini-batch of B = 32 rows (a fresh shuffle each epoch; the last batch of an epoch may be
smaller) estimating grad L by the batch mean, theta <- theta - eps grad L_B. Near the optimum
this is a linear recursion (Mandt, Hoffman & Blei 2017, "SGD as approximate Bayesian
inference"):

    theta_{t+1} - m = (I - eps H)(theta_t - m) - eps xi_t,    H = A / N,
    Cov(xi_t) = C_B = (1 - f) C / B,   C = Cov_n(grad l_n(m)) = beta^2 Cov_n(r_n x_n),

r_n = y_n - m^T x_n the residuals and f = (B-1)/(N-1) the finite-population correction of a
batch drawn without replacement. The stationary covariance Sigma(eps) solves the discrete
Lyapunov equation Sigma = (I - eps H) Sigma (I - eps H) + eps^2 C_B; in the eigenbasis
H = V diag(h) V^T it is  [V^T Sigma V]_ij = eps [V^T C_B V]_ij / (h_i + h_j - eps h_i h_j).
Mandt et al. choose the constant learning rate that minimises KL(N(m, Sigma(eps)) || N(m, S)).
In continuous time (eps h << 1) Sigma is linear in eps, tr(A Sigma) = N eps tr(C_B) / 2, and the
minimiser is their closed form

    eps_ct = 2 D / (N tr C_B) = 2 (B/N) D / ((1 - f) tr C)           ("lr_mandt_continuous").

On standardised data tr C ~ (1 - R^2) D, so eps_ct ~ 2 (B/N) / (1 - R^2); on Boston and Energy
that exceeds the stability limit 2 / h_max of the recursion and SGD would diverge. We therefore
minimise the same KL with the exact discrete-time Sigma(eps) over 0 < eps < 2 / h_max (a
log-spaced grid; Sigma blows up at the limit, so the minimiser stays inside). This is the
learning rate used (``lr`` in results.json; ``--lr`` overrides it). Approximations: residual
noise taken at m (no multiplicative, theta-dependent part) and independent batches; the real
sampler reshuffles every epoch, which cancels the gradient noise over an epoch and leaves even
less variance in the slow directions.
"""

from __future__ import annotations

import numpy as np

from _online_fa_common import relative_covariance_distance

BATCH_SIZE = 32
ALPHA_SCALE = 0.01


# ----------------------------------------------------------------------------- posterior, lr
def exact_posterior(X, y, alpha_scale=ALPHA_SCALE):
    """Eq. 2.11-2.13 with beta = 1/var(y), alpha = alpha_scale * mean diag(beta X^T X)."""
    beta = 1.0 / float(np.var(y))
    G = beta * X.T @ X
    alpha = alpha_scale * float(np.mean(np.diag(G)))
    A = alpha * np.eye(X.shape[1]) + G
    S = np.linalg.inv(A)
    S = 0.5 * (S + S.T)
    m = S @ (beta * X.T @ y)
    return {"alpha": alpha, "beta": beta, "A": A, "S": S, "m": m}


def stationary_covariance(eps, h, V, CB):
    """Stationary covariance of theta <- theta - eps (H (theta - m) + xi), Cov xi = CB,
    H = V diag(h) V^T (discrete Lyapunov equation solved in H's eigenbasis)."""
    Ct = V.T @ CB @ V
    denom = h[:, None] + h[None, :] - eps * h[:, None] * h[None, :]
    return V @ (eps * Ct / denom) @ V.T


def gaussian_kl(Sigma, A):
    """KL(N(m, Sigma) || N(m, A^-1))."""
    M = A @ Sigma
    sign, logdet = np.linalg.slogdet(M)
    if sign <= 0:
        return np.inf
    return 0.5 * (np.trace(M) - logdet - Sigma.shape[0])


def choose_learning_rate(X, y, post, batch_size=BATCH_SIZE, n_grid=2000):
    """Mandt et al.'s KL-optimal constant learning rate, with the discrete-time stationary
    covariance (see the module docstring). Returns a dict of the numbers involved."""
    N, D = X.shape
    A, m, beta, alpha = post["A"], post["m"], post["beta"], post["alpha"]
    H = A / N
    r = y - X @ m
    grads = -beta * r[:, None] * X + (alpha / N) * m  # grad l_n at m
    C = np.cov(grads.T, ddof=0)
    f = (batch_size - 1) / (N - 1)
    CB = (1.0 - f) * C / batch_size
    h, V = np.linalg.eigh(H)
    eps_max = 2.0 / h[-1]
    eps_ct = 2.0 * D / (N * np.trace(CB))
    grid = np.exp(np.linspace(np.log(eps_max * 1e-4), np.log(eps_max * (1 - 1e-4)), n_grid))
    kl = np.array([gaussian_kl(stationary_covariance(e, h, V, CB), A) for e in grid])
    i = int(np.argmin(kl))
    eps = float(grid[i])
    Sig = stationary_covariance(eps, h, V, CB)
    r2 = 1.0 - float(np.var(r) / np.var(y))
    return {
        "lr": eps,
        "lr_mandt_continuous": float(eps_ct),
        "lr_stability_limit": float(eps_max),
        "lr_mandt_continuous_times_hmax": float(eps_ct * h[-1]),
        "kl_at_lr": float(kl[i]),
        "predicted_rel_cov_dist_at_lr": relative_covariance_distance(Sig, post["S"]),
        "batch_finite_population_factor": float(1.0 - f),
        "train_r2_at_posterior_mean": r2,
        "hessian_condition_number": float(h[-1] / h[0]),
    }


# ----------------------------------------------------------------------------- SGD
def make_sgd(X, y, alpha, beta, lr, batch_size=BATCH_SIZE):
    """Jitted ``run(theta (S, D), keys (S, E, 2)) -> (theta, iterates (S, E, nb, D))``: E epochs of
    reshuffled mini-batch SGD for S seeds at once (vmap over seeds, lax.scan over epochs and
    over the mini-batches of an epoch)."""
    import latentzoo  # noqa: F401  (float64)
    import jax
    import jax.numpy as jnp

    N, D = X.shape
    nb = -(-N // batch_size)
    pad = nb * batch_size - N
    Xp = jnp.asarray(np.vstack([X, np.zeros((pad, D))]))
    yp = jnp.asarray(np.concatenate([y, np.zeros(pad)]))
    fill = jnp.arange(N, N + pad)

    def epoch(theta, key):
        perm = jnp.concatenate([jax.random.permutation(key, N), fill]).reshape(nb, batch_size)
        mask = (perm < N).astype(Xp.dtype)

        def step(th, batch):
            idx, mk = batch
            xb = Xp[idx]
            res = (xb @ th - yp[idx]) * mk
            grad = beta * (xb.T @ res) / jnp.sum(mk) + (alpha / N) * th
            th = th - lr * grad
            return th, th

        return jax.lax.scan(step, theta, (perm, mask))

    def run_one(theta, keys):
        return jax.lax.scan(epoch, theta, keys)

    return jax.jit(jax.vmap(run_one)), nb


def init_weights(seeds, D):
    """Per-seed initial weights, U(-1/sqrt(D), 1/sqrt(D)) (PyTorch's nn.Linear default)."""
    import jax

    return np.stack([
        np.asarray(jax.random.uniform(jax.random.PRNGKey(s), (D,), minval=-1.0, maxval=1.0)) / np.sqrt(D)
        for s in seeds
    ])


def epoch_keys(seeds, n_epochs):
    import jax

    return np.stack([np.asarray(jax.random.split(jax.random.fold_in(jax.random.PRNGKey(s), 1), n_epochs))
                     for s in seeds])
