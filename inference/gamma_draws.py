r"""Exact Gamma draws for many elements at once: Marsaglia and Tsang's (2000) squeeze method,
vectorised over the elements, with an exact fallback.

``jax.random.gamma`` splits a key per element and runs each element's rejection loop inside a
batched ``while_loop``; at the hundreds of thousands of per-coefficient precisions a sparse
model redraws every sweep (convolutional FA's :math:`\alpha_{nki}`) that is the costliest part of
a CPU sweep. Here every element draws ``rounds`` candidates at once from a few bulk ``normal``
and ``uniform`` calls:

- **shape a >= 1** (Marsaglia & Tsang 2000, sec. 3): :math:`d = a - 1/3`,
  :math:`c = 1/\sqrt{9d}`; a candidate is :math:`v = (1 + cz)^3`, :math:`z \sim \mathcal N(0,1)`,
  rejected if :math:`v \le 0`, accepted if :math:`u < 1 - 0.0331 z^4` (the squeeze) or
  :math:`\log u < z^2/2 + d(1 - v + \log v)`, :math:`u \sim U(0, 1)`; then :math:`dv \sim
  \mathrm{Gamma}(a, 1)`. A round is rejected with probability below 5 % for every a >= 1 (about
  4.8 % at a = 1, less as a grows).
- **shape a < 1**: the boost :math:`X = Y\,U^{1/a}`, :math:`Y \sim \mathrm{Gamma}(a + 1, 1)`
  (the paper's sec. 6), in log space (:math:`\log Y + \log U / a`) so that a small shape does
  not underflow before the rate divides.

Each element keeps its first accepted candidate of ``rounds`` drawn at once (default 1). The
elements still pending (about 2-5 % after one round) are gathered into a buffer of ``buffer``
slots (default n/16) that a ``while_loop`` redraws, one fresh candidate per pending slot a pass,
until every slot is accepted; if more elements were pending than the buffer holds, an outer
``while_loop`` gathers the next ones. So the result is an exact draw, never a truncated one:
each element's value is the first accepted candidate of its own sequence of independent
candidates, and which slot an element gets depends only on earlier rejections, never on the
candidates it is given. One bulk round and a small buffer cost about a third of four bulk rounds
on a CPU (measured at 430 000 elements; the passes over a buffer of n/16 are cheap).
Shapes and rates are elementwise (any positive floats); a non-positive (or NaN) shape or
rate gives NaN. A draw that underflows to 0 is returned as the dtype's smallest normal number, as
``jax.random.gamma`` does (a precision of exactly 0 would be an infinite variance).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["gamma_draw"]

_SQUEEZE = 0.0331  # Marsaglia & Tsang's constant: 1 - 0.0331 z^4 lies below the acceptance bound


def _candidates(key, d, c, shape, dtype):
    """Marsaglia-Tsang candidates: (accepted, d v), both of ``shape`` (leading axes: rounds)."""
    kz, ku = jax.random.split(key)
    z = jax.random.normal(kz, shape, dtype)
    u = jax.random.uniform(ku, shape, dtype)
    v = (1.0 + c * z) ** 3
    positive = v > 0
    v = jnp.where(positive, v, 1.0)  # log v below only where v > 0
    z2 = z * z
    accept = positive & ((u < 1.0 - _SQUEEZE * z2 * z2)
                         | (jnp.log(u) < 0.5 * z2 + d * (1.0 - v + jnp.log(v))))
    return accept, d * v


def _unit_gamma(key, a_eff, rounds, buffer):
    """Gamma(a_eff, 1) for a_eff >= 1, flat (n,)."""
    n = a_eff.shape[0]
    dtype = a_eff.dtype
    d = a_eff - 1.0 / 3.0
    c = 1.0 / jnp.sqrt(9.0 * d)
    k_bulk, k_more = jax.random.split(key)
    value = jnp.zeros((n,), dtype)
    done = jnp.zeros((n,), bool)
    if rounds > 0:
        accept, cand = _candidates(k_bulk, d, c, (rounds, n), dtype)
        for r in reversed(range(rounds)):  # the first accepted round wins
            value = jnp.where(accept[r], cand[r], value)
        done = jnp.any(accept, axis=0)
    m = min(buffer, n)

    def gather(state):  # the first m pending elements into a buffer, redrawn until all accepted
        i, value, done = state
        idx = jnp.flatnonzero(~done, size=m, fill_value=n)
        di = d.at[idx].get(mode="fill", fill_value=1.0)
        ci = c.at[idx].get(mode="fill", fill_value=1.0)

        def retry(inner):  # one fresh candidate per pending slot
            j, v_buf, d_buf = inner
            accept, cand = _candidates(jax.random.fold_in(jax.random.fold_in(k_more, i), j),
                                       di, ci, (m,), dtype)
            accept = accept & ~d_buf
            return j + 1, jnp.where(accept, cand, v_buf), d_buf | accept

        _, v_buf, _ = jax.lax.while_loop(lambda inner: ~jnp.all(inner[2]), retry,
                                         (jnp.zeros((), jnp.int32), jnp.zeros((m,), dtype),
                                          idx >= n))
        value = value.at[idx].set(v_buf, mode="drop")
        done = done.at[idx].set(True, mode="drop")
        return i + 1, value, done

    _, value, _ = jax.lax.while_loop(lambda state: ~jnp.all(state[2]), gather,
                                     (jnp.zeros((), jnp.int32), value, done))
    return value


def gamma_draw(key, concentration, rate=1.0, *, rounds: int = 1, buffer: int | None = None):
    """Exact independent draws of Gamma(concentration, rate) (rate parametrisation), elementwise.

    Args:
        key: a JAX PRNG key.
        concentration, rate: positive arrays broadcasting to the output's shape (each element may
            have its own shape and rate; a few distinct shapes is the common case).
        rounds: candidates drawn for every element at once (>= 0); the elements whose rounds all
            fail are redrawn exactly by the ``while_loop`` (``rounds=0`` sends all there).
        buffer: how many pending elements the loop redraws together (default: a sixteenth of
            the elements, at least 64); any positive size is exact, only the speed changes.

    Returns:
        Array of the broadcast shape, the floating dtype of ``concentration`` and ``rate``.
    """
    if isinstance(rounds, bool) or int(rounds) != rounds or rounds < 0:
        raise ValueError(f"rounds must be a non-negative integer, got {rounds!r}.")
    if buffer is not None and (isinstance(buffer, bool) or int(buffer) != buffer or buffer < 1):
        raise ValueError(f"buffer must be a positive integer, got {buffer!r}.")
    a, rate = jnp.asarray(concentration), jnp.asarray(rate)
    dtype = jnp.result_type(a, rate, float)
    shape = jnp.broadcast_shapes(a.shape, rate.shape)
    a = jnp.broadcast_to(a.astype(dtype), shape).ravel()
    rate = jnp.broadcast_to(rate.astype(dtype), shape).ravel()
    if a.size == 0:
        return jnp.zeros(shape, dtype)
    k_gamma, k_boost = jax.random.split(key)
    valid = (a > 0) & (rate > 0)  # False for NaN too; those elements would never be accepted
    small = valid & (a < 1.0)
    a_eff = jnp.where(small, a + 1.0, jnp.where(valid, a, 1.0))
    if buffer is None:
        buffer = max(64, -(-a.size // 16))
    y = _unit_gamma(k_gamma, a_eff, int(rounds), int(buffer))

    def boosted(y):  # Y U^(1/a) / rate in log space where a < 1
        log_u = jnp.log(jax.random.uniform(k_boost, a.shape, dtype))
        return jnp.exp(jnp.log(y) + jnp.where(small, log_u / a, 0.0) - jnp.log(rate))

    x = jax.lax.cond(jnp.any(small), boosted, lambda y: y / rate, y)
    x = jnp.where(valid, jnp.where(x > 0, x, jnp.finfo(dtype).tiny), jnp.nan)
    return x.reshape(shape)
