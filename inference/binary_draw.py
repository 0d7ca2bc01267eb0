r"""The exact draw of a block of K binary sources per row, shared by CVQ and NOCA.

Both models' Gibbs samplers redraw ``s`` (N, K) given everything else, rows independent. The
block conditional of one row is a table over the 2^K states
(:class:`~latentzoo.inference.enumerate.EnumeratedBinary`). Up to :data:`ENUM_MAX_K` sources it is
drawn exactly from that table; beyond, the table is too large per sweep and the draw is one
systematic scan of the single-site conditionals

.. math:: s_{nk} \mid s_{n,-k} \sim \mathrm{Bernoulli}\big(\sigma(\ell_{nk})\big),
   \qquad \ell_{nk} = \log p(s_{nk}=1, s_{n,-k}, \cdot) - \log p(s_{nk}=0, s_{n,-k}, \cdot),

k = 0, ..., K-1: each step is an exact Gibbs step on one coordinate, so the scan leaves the block
conditional invariant (it is a valid, if less well mixing, replacement for the exact draw). The
model supplies the table and the single-site log-odds; this module holds the switch and the scan.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from latentzoo.inference.enumerate import EnumeratedBinary

__all__ = ["ENUM_MAX_K", "single_site_scan", "draw_binary_block"]

ENUM_MAX_K = 12  # 4096 states per row: the largest K drawn from the enumerated table

# column(carry, s, k) -> (log-odds of s[:, k] = 1 given the other columns (N,), commit), where
# commit(new column (N,)) -> the carry for the next column (a running statistic of s, e.g. a
# residual, kept in step with s so each log-odds costs O(N D) rather than O(N K D)).
Column = Callable[[jax.Array, jax.Array, jax.Array], tuple[jax.Array, Callable]]


def single_site_scan(key, s0: jax.Array, carry0, column: Column) -> jax.Array:
    """One systematic scan over the columns of ``s0`` (N, K), each redrawn from its single-site
    conditional given the current other columns. Returns s (N, K) in ``s0``'s dtype."""
    N, K = s0.shape

    def body(state, inp):
        s, carry = state
        k, u = inp
        logit, commit = column(carry, s, k)
        new = (u < jax.nn.sigmoid(logit)).astype(s.dtype)
        return (s.at[:, k].set(new), commit(new)), None

    u = jax.random.uniform(key, (K, N))
    (s, _), _ = jax.lax.scan(body, (s0, carry0), (jnp.arange(K), u))
    return s


def draw_binary_block(
    key,
    s0: jax.Array,
    enumerated: Callable[[], EnumeratedBinary],
    column: Column,
    carry0: Callable[[], object],
    *,
    max_K: int = ENUM_MAX_K,
) -> jax.Array:
    """s (N, K) from its block conditional: an exact draw from ``enumerated()`` for K <= ``max_K``,
    else one :func:`single_site_scan` from ``s0`` started with ``carry0()`` (both are called only
    on the path taken, so the 2^K table is never built for large K)."""
    if s0.shape[1] <= max_K:
        return enumerated().sample(key)
    return single_site_scan(key, s0, carry0(), column)
