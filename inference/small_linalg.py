"""Batched factorisations and triangular solves of small (K x K) matrices in plain JAX.

The zoo's conditionals factor a batch of small precisions at once (one K x K matrix per row or
per feature: 7129 of them for the rank SVM's loadings on gene expression). jaxlib's CPU LAPACK
kernels split such a batch over XLA's intra-op thread pool and wait for the pieces on a pool
thread; two of them running at once on a two-thread pool wait for each other forever (seen with
jax 0.10: two batched ``solve_triangular`` calls over 7129 10 x 10 factors hang at zero CPU).
These loops over the K columns, vectorised over the batch, are pure XLA: no custom call, no
waiting, O(K^3) work per matrix like LAPACK's, and fast for the small K of latent-factor models.

Shapes: ``P``/``L`` (..., K, K), right-hand sides ``b`` (..., K). Non-positive-definite input
gives NaN, as LAPACK's Cholesky does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["cholesky", "solve_lower", "solve_upper", "cho_solve", "tril_inverse", "cholesky_of_inverse"]


def cholesky(P):
    """Lower Cholesky factor L of P = L Lᵀ (left-looking, one column per step)."""
    K = P.shape[-1]
    idx = jnp.arange(K)

    def column(j, L):
        row = L[..., j, :]  # entries k < j are final, k >= j still 0
        d = jnp.sqrt(P[..., j, j] - jnp.sum(row * row, -1))
        col = (P[..., :, j] - jnp.einsum("...ik,...k->...i", L, row)) / d[..., None]
        col = jnp.where(idx > j, col, jnp.where(idx == j, d[..., None], 0.0))
        return L.at[..., :, j].set(col)

    return jax.lax.fori_loop(0, K, column, jnp.zeros_like(P))


def solve_lower(L, b):
    """x with L x = b, L lower triangular (forward substitution)."""
    K = L.shape[-1]

    def step(i, x):  # x_k = 0 for k >= i
        xi = (b[..., i] - jnp.sum(L[..., i, :] * x, -1)) / L[..., i, i]
        return x.at[..., i].set(xi)

    return jax.lax.fori_loop(0, K, step, jnp.zeros(jnp.broadcast_shapes(L.shape[:-1], b.shape), b.dtype))


def solve_upper(L, b):
    """x with Lᵀ x = b, L lower triangular (back substitution)."""
    K = L.shape[-1]

    def step(t, x):  # i = K-1-t; x_k = 0 for k <= i
        i = K - 1 - t
        xi = (b[..., i] - jnp.sum(L[..., :, i] * x, -1)) / L[..., i, i]
        return x.at[..., i].set(xi)

    return jax.lax.fori_loop(0, K, step, jnp.zeros(jnp.broadcast_shapes(L.shape[:-1], b.shape), b.dtype))


def cho_solve(L, b):
    """P^{-1} b for P = L Lᵀ."""
    return solve_upper(L, solve_lower(L, b))


def tril_inverse(L):
    """L^{-1} (lower triangular) of a lower triangular L, column by column."""
    K = L.shape[-1]
    eye = jnp.broadcast_to(jnp.eye(K, dtype=L.dtype), L.shape)
    return jax.vmap(lambda e: solve_lower(L, e), in_axes=-1, out_axes=-1)(eye)


def cholesky_of_inverse(P):
    """Lower Cholesky factor T of P^{-1} (T Tᵀ = P^{-1}) without forming P^{-1}: with
    J P J = U Uᵀ (J the reversal), P^{-1} = (J U^{-T} J)(J U^{-T} J)ᵀ and J U^{-T} J is lower."""
    flip = lambda A: A[..., ::-1, ::-1]  # noqa: E731
    U = cholesky(flip(P))
    return flip(jnp.swapaxes(tril_inverse(U), -1, -2))
