"""Starting point of the rank-SVM CAVI (:mod:`latentzoo.inference.rank_svm.vb`).

The factor scores and loadings start at the principal components of what each variant sees: the
centred features (G), or each feature's tie-grouped level in its own order times the margin ε
(R; read from the rank pairs, so the data itself is not needed). The level is the smallest
integer labelling with level(hi) >= level(lo) + 1 for every pair, i.e. the rank among the
distinct values, so adjacent values sit ε apart: where the rank margins are first satisfied.
Everything else is filled in by the sweep's own coordinate updates (see ``rank_svm_vb``'s init).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from latentzoo.inference.rank_svm.vb_moments import Setup

__all__ = ["feature_levels", "initial_params"]


def feature_levels(pairs, N: int, D: int) -> np.ndarray:
    """(N, D) integer levels: level[hi, f] >= level[lo, f] + 1 for every pair, the smallest such
    (longest-path relaxation over the pairs; at most one pass per distinct value of a feature)."""
    f, lo, hi = (np.asarray(v) for v in (pairs.feature, pairs.lo, pairs.hi))
    level = np.zeros((N, D))
    for _ in range(N):
        new = level.copy()
        np.maximum.at(new, (hi, f), level[lo, f] + 1.0)
        if np.array_equal(new, level):
            break
        level = new
    return level


def initial_params(rng_key, data, y, pairs, st: Setup) -> dict:
    """Every guide param at a start: A, z from principal components (plus a little noise from
    ``rng_key``, so restarts differ), β at 0; the rest placeholders that the recipe's init
    replaces by their coordinate updates (λ, τ, the shrinkage hierarchies, the DP factors)."""
    N, D, K, T = st.N, st.D, st.K, st.T
    if st.gaussian:
        W = np.asarray(data["X"])
    else:
        W = feature_levels(pairs, N, D) * float(np.mean(np.asarray(data["rank_margin"])))
    W = W - W.mean(0)
    U, s, Vt = np.linalg.svd(W, full_matrices=False)
    k = min(K, len(s))
    z = np.zeros((N, K))
    A = np.zeros((D, K))
    z[:, :k] = U[:, :k] * np.sqrt(N)
    A[:, :k] = Vt[:k].T * s[:k] / np.sqrt(N)
    k_z, k_mu = jax.random.split(rng_key)
    z = jnp.asarray(z) + 0.1 * jax.random.normal(k_z, (N, K))
    eye = jnp.eye(K)
    ones = lambda shape: jnp.ones(shape)  # noqa: E731
    p = {
        "A_loc": jnp.asarray(A), "A_scale_tril": jnp.broadcast_to(0.1 * eye, (D, K, K)),
        "z_loc": z, "z_scale_tril": jnp.broadcast_to(0.1 * eye, (N, K, K)),
        "beta_loc": jnp.zeros((T, K)), "beta_scale_tril": jnp.broadcast_to(0.1 * eye, (T, K, K)),
        "lam_svm_gig_a": ones(N), "lam_svm_gig_b": ones(N),
    }
    for name, shape in (("Phi_tilde_a", ()), ("Phi_a", (K,)), ("eta_a", (D, K)),
                        ("Phi_tilde_beta", ()), ("Phi_beta", ()), ("e_beta", (T, K))):
        p[f"{name}_concentration"], p[f"{name}_rate"] = ones(shape), ones(shape)
    p["xi_a_gig_a"], p["xi_a_gig_b"] = ones((D, K)), ones((D, K))
    p["b_beta_gig_a"], p["b_beta_gig_b"] = ones((T, K)), ones((T, K))
    if st.gaussian:
        p["tau_concentration"], p["tau_rate"] = ones(D), ones(D)
    else:
        p["lam_rank_gig_a"], p["lam_rank_gig_b"] = ones(st.P), ones(st.P)
    if st.mixture:
        # clusters start at T distinct rows of z; q(t) then follows from them
        rows = jax.random.choice(k_mu, N, (T,), replace=False)
        p.update({
            "t_probs": jnp.full((N, T), 1.0 / T),
            "nu_concentration1": ones(T - 1), "nu_concentration0": ones(T - 1),
            "alpha_concentration": jnp.asarray(1.0), "alpha_rate": jnp.asarray(1.0),
            "mu_loc": z[rows], "mu_scale": jnp.full(T, 0.1),
            "psi_concentration": ones(T), "psi_rate": ones(T),
        })
    return p
