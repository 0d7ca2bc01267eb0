"""A data-driven starting state for TA / MTA samplers and Monte Carlo EM.

Per component (MTA: k-means++ seeds, :func:`latentzoo.inference.seeding.kmeans_pp_seeds`, rows
to the nearest seed): mu the component mean, W the top P principal directions of its rows scaled
by their standard deviations (the factor-analysis answer with T = 0), T small random entries
(one tenth of the residual scale: exactly zero is a fixed point of the symmetric updates, so the
multiplicative term would never grow), Psi the residual variance per coordinate, and every group
z_j zero. The principal directions come from a thin SVD of the (N, D) rows, never a D x D
covariance, so thousands of columns cost N^2 D.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from latentzoo.inference.seeding import kmeans_pp_seeds
from latentzoo.models.tensor_analyzer import group_names

__all__ = ["init_from_data"]


def _component_start(key, X, weight, d):
    """mu (D,), W (D, P), T (D, *d), Psi (D,) from the rows with weight 1 (others 0)."""
    N, D = X.shape
    P = sum(d)
    n = jnp.maximum(weight.sum(), 1.0)
    mu = weight @ X / n
    R = jnp.sqrt(weight)[:, None] * (X - mu)
    _, s, Vt = jnp.linalg.svd(R, full_matrices=False)
    k = min(P, s.shape[0])
    sd = s[:k] / jnp.sqrt(n)
    W = jnp.zeros((D, P), X.dtype).at[:, :k].set(Vt[:k].T * sd)
    total = jnp.sum(R * R, 0) / n
    explained = jnp.sum((Vt[:k].T * sd) ** 2, 1)
    # floor at a thousandth of the coordinate's variance (and a tiny absolute one): a constant
    # column, or a component with fewer rows than factors, would otherwise start at Psi = 0
    Psi = jnp.maximum(total - explained, 1e-3 * total + 1e-8)
    scale = jnp.sqrt(jnp.mean(Psi))
    T = 0.1 * scale * jax.random.normal(key, (D, *d), X.dtype) / math.sqrt(max(1, math.prod(d)))
    return mu, W, T, Psi


def init_from_data(key, X, *, d, C: int | None = None):
    """Starting values for every site of :func:`~latentzoo.models.tensor_analyzer.tensor_analyzer`
    (C None) or :func:`~latentzoo.models.tensor_analyzer.mixture_of_tensor_analyzers`; pass as
    ``init_params`` (vmap over keys for several chains). Shapes as the model's sites."""
    d = tuple(int(v) for v in d)
    N, _ = X.shape
    zs = {name: jnp.zeros((N, dj), X.dtype) for name, dj in zip(group_names(d), d)}
    k_seed, k_T = jax.random.split(key)
    if C is None:
        mu, W, T, Psi = _component_start(k_T, X, jnp.ones(N, X.dtype), d)
        return {"W": W, "T": T, "mu": mu, "Psi": Psi, **zs}
    _, c = kmeans_pp_seeds(k_seed, X, C)
    R = jax.nn.one_hot(c, C, dtype=X.dtype)
    mu, W, T, Psi = jax.vmap(lambda k, w: _component_start(k, X, w, d))(jax.random.split(k_T, C), R.T)
    return {"pi": jnp.full((C,), 1.0 / C, X.dtype), "W": W, "T": T, "mu": mu, "Psi": Psi, "c": c, **zs}
