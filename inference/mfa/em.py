r"""Exact maximum-likelihood EM for the mixture of factor analysers (Ghahramani & Hinton 1996):
the baseline the tensor-analyser experiments compare with.

Model as :mod:`latentzoo.models.mfa` with the parameters as points: :math:`x_n \sim \sum_j \pi_j
\mathcal N(\mu_j, W_j W_j^\top + \Psi)`, :math:`\Psi = \mathrm{diag}(\Psi_d)` noise *variances*
shared by the components (``per_component_noise=True`` gives each its own), factors
:math:`z \sim \mathcal N(0, I_K)`.

**E-step** (exact): responsibilities :math:`r_{nj} \propto \pi_j \mathcal N(x_n; \mu_j, C_j)`,
:math:`C_j = W_j W_j^\top + \Psi`; given :math:`c_n = j`, :math:`z_n \sim \mathcal N(G_j W_j^\top
\Psi^{-1}(x_n - \mu_j), G_j)` with :math:`G_j = (I + W_j^\top \Psi^{-1} W_j)^{-1}` (K x K; no
D x D inverse: :math:`\log|C_j|` and :math:`C_j^{-1}` go through the same K x K factor by the
determinant lemma and Woodbury).

**M-step** (Ghahramani & Hinton eqs. 11-15): with :math:`\tilde z = (z, 1)`,
:math:`[W_j, \mu_j] = (\sum_n r_{nj} x_n E[\tilde z_n \mid j]^\top)(\sum_n r_{nj} E[\tilde z_n
\tilde z_n^\top \mid j])^{-1}` (one least-squares problem per component), :math:`\Psi =
\tfrac1N \mathrm{diag}\sum_{n,j} r_{nj}(x_n - [W_j, \mu_j] E[\tilde z_n \mid j]) x_n^\top`,
:math:`\pi_j = \tfrac1N \sum_n r_{nj}`. Each step maximises the expected complete
log-likelihood exactly, so the log-likelihood never decreases.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from latentzoo.inference import small_linalg
from latentzoo.inference.gaussian import LOG_2PI
from latentzoo.inference.seeding import kmeans_pp_seeds

__all__ = ["MFAFit", "mfa_log_likelihood", "mfa_em_step", "fit_mfa_em"]

# Floor on every noise variance, relative to the data's variance per coordinate: a component
# that collapses onto a few rows drives its Psi to zero and the likelihood to infinity.
PSI_FLOOR = 1e-4


class MFAFit(NamedTuple):
    """params: pi (J,), W (J, D, K), mu (J, D), Psi (J, D) (equal rows when shared);
    log_likelihood: total log p(X) per iteration (iterations,)."""

    params: dict
    log_likelihood: np.ndarray


def _component_terms(X, W, mu, Psi):
    """log N(x_n; mu_j, W_j W_jᵀ + diag Psi_j) (J, N) and the posterior pieces of z | c = j:
    G_j (J, K, K) and the means m_nj (J, N, K)."""
    D = X.shape[-1]
    K = W.shape[-1]
    WtPi = jnp.swapaxes(W, -1, -2) / Psi[:, None, :]  # (J, K, D) = W_jᵀ Psi_j^{-1}
    M = jnp.eye(K) + WtPi @ W  # (J, K, K) = G_j^{-1}
    L = small_linalg.cholesky(M)  # plain XLA (batched LAPACK can deadlock; see small_linalg)
    L_inv = small_linalg.tril_inverse(L)
    r = X[None] - mu[:, None, :]  # (J, N, D)
    proj = jnp.einsum("jkd,jnd->jkn", WtPi, r)
    v = L_inv @ proj  # (J, K, N)
    quad = jnp.einsum("jnd,jd->jn", r * r, 1.0 / Psi) - jnp.sum(v * v, 1)
    log_det = 2.0 * jnp.sum(jnp.log(jnp.diagonal(L, axis1=-2, axis2=-1)), -1) + jnp.sum(jnp.log(Psi), -1)
    loglik = -0.5 * (D * LOG_2PI + log_det[:, None] + quad)
    means = jnp.swapaxes(jnp.swapaxes(L_inv, -1, -2) @ v, -1, -2)
    G = jnp.swapaxes(L_inv, -1, -2) @ L_inv  # M^{-1} = L^{-T} L^{-1}
    return loglik, G, means


def mfa_log_likelihood(X, params, *, per_row: bool = False):
    """log p(x_n | pi, W, mu, Psi), (N,) per row or its sum. Shapes as :class:`MFAFit`."""
    ll, _, _ = _component_terms(X, params["W"], params["mu"], params["Psi"])
    rows = jax.nn.logsumexp(jnp.log(params["pi"])[:, None] + ll, axis=0)
    return rows if per_row else rows.sum()


def mfa_em_step(X, params, *, shared_noise: bool = True, floor=None):
    """One exact EM iteration; returns (new params, log p(X) at the old params)."""
    N, D = X.shape
    ll, G, m = _component_terms(X, params["W"], params["mu"], params["Psi"])
    joint = jnp.log(params["pi"])[:, None] + ll
    total = jax.nn.logsumexp(joint, axis=0)
    R = jnp.exp(joint - total)  # (J, N) responsibilities
    Nj = R.sum(1)
    # E[z̃] = (m, 1), E[z̃ z̃ᵀ] = [[G + m mᵀ, m], [mᵀ, 1]] per row and component
    Ez = jnp.concatenate([m, jnp.ones((*m.shape[:2], 1))], -1)  # (J, N, K+1)
    K = m.shape[-1]
    S = jnp.einsum("jn,jnk,jnl->jkl", R, Ez, Ez)
    S = S.at[:, :K, :K].add(Nj[:, None, None] * G)
    XtZ = jnp.einsum("jn,nd,jnk->jdk", R, X, Ez)  # (J, D, K+1)
    S_inv_tril = small_linalg.tril_inverse(small_linalg.cholesky(S))  # S symmetric positive definite
    B = XtZ @ (jnp.swapaxes(S_inv_tril, -1, -2) @ S_inv_tril)  # XtZ S^{-1}
    resid = jnp.einsum("jn,nd->jd", R, X * X) - jnp.sum(B * XtZ, -1)  # diag(Σ r (x xᵀ - B E[z̃] xᵀ))
    floor = PSI_FLOOR * jnp.var(X, 0) + 1e-12 if floor is None else floor
    if shared_noise:
        Psi = jnp.broadcast_to(resid.sum(0) / N, resid.shape)
    else:
        Psi = resid / jnp.maximum(Nj, 1e-12)[:, None]
    new = {"pi": Nj / N, "W": B[..., :K], "mu": B[..., K], "Psi": jnp.maximum(Psi, floor)}
    return new, total.sum()


def _start(key, X, J, K):
    centres, c = kmeans_pp_seeds(key, X, J)
    r = X - centres[c]
    var = jnp.maximum(jnp.mean(r * r, 0), PSI_FLOOR * jnp.var(X, 0) + 1e-12)
    W = 0.1 * jnp.sqrt(var)[None, :, None] * jax.random.normal(jax.random.fold_in(key, 1), (J, X.shape[1], K))
    return {"pi": jnp.full(J, 1.0 / J), "W": W, "mu": centres, "Psi": jnp.broadcast_to(var, (J, X.shape[1]))}


def fit_mfa_em(X, *, J: int, K: int, num_iterations: int = 300, seed: int = 0, restarts: int = 3,
               shared_noise: bool = True, tol: float = 1e-8) -> MFAFit:
    """Exact EM from k-means++ starts; the best of ``restarts`` by final log-likelihood.

    Args: X (N, D); J components; K factors each. Stops when the log-likelihood gains less than
    ``tol`` per row. Raises ValueError for sizes that do not fit the data.
    """
    X = jnp.asarray(X, dtype=jnp.float64)
    if X.ndim != 2 or X.shape[0] < 2:
        raise ValueError(f"MFA EM needs data of shape (N, D) with N >= 2, got {tuple(X.shape)}.")
    N, D = X.shape
    if not 1 <= J <= N or not 1 <= K:
        raise ValueError(f"MFA EM needs 1 <= J <= N = {N} and K >= 1, got J = {J}, K = {K}.")
    step = jax.jit(lambda p: mfa_em_step(X, p, shared_noise=shared_noise))
    best = None
    for r in range(restarts):
        params = _start(jax.random.PRNGKey(seed * 1000 + r), X, J, K)
        trace = []
        for _ in range(num_iterations):
            params, ll = step(params)
            trace.append(float(ll))
            if len(trace) > 1 and trace[-1] - trace[-2] < tol * N:
                break
        final = float(mfa_log_likelihood(X, params))
        trace.append(final)
        if best is None or final > best[1][-1]:
            best = (params, trace)
    return MFAFit({k: np.asarray(v) for k, v in best[0].items()}, np.asarray(best[1]))
