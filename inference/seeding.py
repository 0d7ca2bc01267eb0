"""Data-driven starting points shared by the mixtures (MFA, MTA): k-means++ seeds.

Why seeds at all: from a prior draw a local sampler (or Monte Carlo EM) can lock into a mode that
merges two well-separated clusters into one long component and is slow to leave it; one seed per
cluster avoids that without fixing the answer.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["kmeans_pp_seeds"]


def kmeans_pp_seeds(key, X, J: int):
    """k-means++ seeds (Arthur & Vassilvitskii 2007): the first a uniformly drawn row, each next
    one a row drawn with probability proportional to its squared distance to the nearest seed.

    Shapes: X (N, D) -> centres (J, D), labels (N,) of the nearest seed. jit- and vmap-friendly.
    """
    N, D = X.shape
    k0, key = jax.random.split(key)
    first = X[jax.random.randint(k0, (), 0, N)]
    sq = lambda centre: jnp.sum((X - centre) ** 2, -1)  # noqa: E731

    def seed_one(j, carry):
        centres, d2, key = carry
        key, k = jax.random.split(key)
        # the tiny floor keeps the draw defined when every row coincides with a seed
        row = X[jax.random.choice(k, N, p=(d2 + 1e-300) / jnp.sum(d2 + 1e-300))]
        return centres.at[j].set(row), jnp.minimum(d2, sq(row)), key

    centres0 = jnp.zeros((J, D), X.dtype).at[0].set(first)
    centres, _, _ = jax.lax.fori_loop(1, J, seed_one, (centres0, sq(first), key))
    labels = jnp.argmin(jnp.sum((X[:, None, :] - centres[None]) ** 2, -1), -1)
    return centres, labels
