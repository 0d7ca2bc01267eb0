"""Exact inference over K binary sources by enumerating the 2^K states (CVQ and NOCA references).

Both models have a posterior over ``s_n`` that is a table of 2^K numbers per row. Everything the
exact E-steps need is a handful of sums over that table, so rows are processed in chunks (a
``lax.scan``) and only the sums are kept:

- ``loglik`` (N,): log p(x_n) = logsumexp_s log p(x_n, s);
- ``Es`` (N, K): posterior marginals E[s_n];
- ``weights`` (S,): sum_n p(s | x_n) (gives sum_n E[s_n s_n^T] = B^T diag(weights) B);
- ``RtX`` (S, D): sum_n p(s | x_n) x_n (NOCA's exact M-step statistics).

Memory is O(chunk * 2^K + 2^K * D), so K = 16 fits easily; the intended range is K <= 12.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from numpyro.distributions import constraints


__all__ = ["MAX_EXACT_K", "all_states", "EnumStats", "chunk_size", "enumerate_posterior", "EnumeratedBinary"]

MAX_EXACT_K = 16  # 65 536 states: the largest K the exact methods accept (reference use: K <= 12)


def all_states(K: int, dtype=jnp.float64) -> jax.Array:
    """The 2^K binary vectors as rows of a (2^K, K) array; row b is the binary expansion of b with
    bit k in column k (so the index of a state s is ``s @ 2**arange(K)``)."""
    if K > MAX_EXACT_K:
        raise ValueError(f"Exact enumeration is limited to K <= {MAX_EXACT_K} sources, got K = {K}.")
    b = np.arange(2**K)[:, None]
    return jnp.asarray((b >> np.arange(K)[None, :]) & 1, dtype=dtype)


class EnumStats(NamedTuple):
    loglik: jax.Array  # (N,)
    Es: jax.Array  # (N, K)
    weights: jax.Array  # (S,)
    RtX: jax.Array  # (S, D)


def chunk_size(num_states: int, N: int, budget: int = 1 << 21) -> int:
    """Rows per chunk of :func:`enumerate_posterior`: at most ``budget`` table entries (rows x
    states) at a time, and at least one row."""
    return int(max(1, min(N, budget // num_states)))


def enumerate_posterior(log_joint: Callable, X: jax.Array, states: jax.Array) -> EnumStats:
    """Posterior sums over all states, rows in chunks.

    Args:
        log_joint: ``(X_chunk (C, D)) -> (C, S)`` log p(x_n, s) for every state s (rows of
            ``states``); must be row-wise (a padded zero row must not affect other rows).
        X: data (N, D).
        states: (S, K) from :func:`all_states`.
    """
    N, D = X.shape
    S = states.shape[0]
    C = chunk_size(S, N)
    M = -(-N // C)
    pad = M * C - N
    Xp = jnp.concatenate([X, jnp.zeros((pad, D), X.dtype)]).reshape(M, C, D)
    valid = (jnp.arange(M * C) < N).reshape(M, C).astype(X.dtype)

    def body(carry, inp):
        weights, RtX = carry
        Xc, vc = inp
        lj = log_joint(Xc)  # (C, S)
        ll = jax.scipy.special.logsumexp(lj, axis=1)
        R = jnp.exp(lj - ll[:, None]) * vc[:, None]  # posterior table, padded rows zeroed
        return (weights + R.sum(0), RtX + R.T @ Xc), (ll, R @ states)

    init = (jnp.zeros(S, X.dtype), jnp.zeros((S, D), X.dtype))
    (weights, RtX), (ll, Es) = jax.lax.scan(body, init, (Xp, valid))
    return EnumStats(ll.reshape(-1)[:N], Es.reshape(-1, states.shape[1])[:N], weights, RtX)


class EnumeratedBinary(dist.Distribution):
    """A distribution over binary vectors given by the (unnormalised) log probability of every
    state: batch shape (N,), event shape (K,). Used as the exact block conditional of ``s_n``.

    Args:
        logits: (N, S) unnormalised log probabilities of the states.
        states: (S, K) from :func:`all_states`.
    """

    arg_constraints = {"logits": constraints.real}
    support = constraints.boolean

    def __init__(self, logits, states, *, validate_args=None):
        self.logits = logits - jax.scipy.special.logsumexp(logits, axis=-1, keepdims=True)
        self.states = states
        K = states.shape[1]
        self._powers = 2 ** jnp.arange(K)
        super().__init__(batch_shape=logits.shape[:-1], event_shape=(K,), validate_args=validate_args)

    def sample(self, key, sample_shape=()):
        idx = jax.random.categorical(key, self.logits, shape=sample_shape + self.batch_shape)
        return self.states[idx]

    def log_prob(self, value):
        idx = (jnp.asarray(value).astype(jnp.int32) * self._powers).sum(-1)
        return jnp.take_along_axis(
            jnp.broadcast_to(self.logits, idx.shape + self.logits.shape[-1:]), idx[..., None], -1
        )[..., 0]
