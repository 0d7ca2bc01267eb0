"""NumPyro's sampling loop compiled once per run, not once per chain and checkpoint segment.

``numpyro.util.fori_collect`` (NumPyro 0.22), which ``MCMC.run`` and ``MCMC.warmup`` call once
per chain of a sequential run, wraps its step in a new ``jax.jit`` object on every call and
passes it to the jitted loop as a *static* argument. Two ``jit`` objects of one function are
never equal, so JAX's caches miss on every call: each chain and each checkpoint segment traced
and compiled the same loop again (the rank SVM's quick run: 13.7 s of XLA compiling per chain
where no persistent cache holds the loop), and the in-memory caches kept every copy (about 50 MB
a chain and segment for NOCA, whose default run grew to 5.7 GB; 210 MB a chain for G-NL).

:func:`one_compiled_loop` makes NumPyro's ``maybe_jit`` return the same ``jit`` object for the
same function and options while the context is open. The step function it wraps is already the
same object between calls (NumPyro caches it by the sampler's ``sample`` function and the
collection transform), so the loop's static argument is equal, the second chain's loop is a cache
hit.

**One loop for warm-up and every segment.** NumPyro's loop also takes its length (``upper``) as a
static argument, and its collection of draws has the length of the call's draws, so warm-up,
the checkpoint segments and a shorter last segment were each a program of their own: the sweep
compiled two or three times in a run with checkpoints (the rank SVM's G-NL table with its moves:
17 s a time). Within the context the loop's length is a traced argument (its ``fori_loop`` is then
a ``while`` loop), and each call's collection is padded to the longest one this context has
seen (the warm-up's, which is the whole run's ``num_samples``; the padding is cut off again), so
a run holds one compiled loop. The step function and the order of its operations are
unchanged, so the draws are identical (tested). Where NumPyro no longer has ``maybe_jit`` or
``_fori_collect_loop`` with that signature, the context does only what it can.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["one_compiled_loop"]


@contextlib.contextmanager
def one_compiled_loop() -> Iterator[None]:
    """Within the context, ``numpyro.util.maybe_jit(fn, **options)`` returns one ``jit`` object
    per ``(fn, options)``; the objects are dropped when it closes. Re-entrant. The patch is
    process-wide while the context is open (a run in another thread at the same time shares it,
    which changes nothing but what is compiled)."""
    import numpyro.util as nutil

    original = getattr(nutil, "maybe_jit", None)
    if original is None or getattr(original, "_latentzoo_memo", False):
        yield
        return
    memo: dict = {}
    longest = [0]  # the longest collection of draws a loop in this context has been given
    loop = getattr(nutil, "_fori_collect_loop", None)

    def maybe_jit(fn, *args, **kwargs):
        try:
            key = (fn, args, tuple(sorted(kwargs.items())))
            hash(key)
        except TypeError:  # an unhashable option: NumPyro's own behaviour
            return original(fn, *args, **kwargs)
        if key not in memo:
            if fn is loop and loop is not None and not args and kwargs.get("static_argnums") == (0, 1):
                memo[key] = _any_length(original(fn, **{**kwargs, "static_argnums": (0,)}), longest)
            else:
                memo[key] = original(fn, *args, **kwargs)
        return memo[key]

    maybe_jit._latentzoo_memo = True
    nutil.maybe_jit = maybe_jit
    try:
        yield
    finally:
        nutil.maybe_jit = original
        memo.clear()


def _any_length(jitted_loop, longest):
    """NumPyro's ``_fori_collect_loop(body, upper, init_val, collection, start_idx, thinning)``,
    jitted with only ``body`` static: ``upper`` is traced, and ``collection`` (each leaf (n, ...))
    is padded with zeros to ``longest[0]`` rows, the most seen so far, for the call and cut back
    to n rows after it, so loops of every length and collection share one program. The body
    writes draw i to row i < n only, so the padding stays zeros and is never read."""
    import jax
    import jax.numpy as jnp

    def run(body, upper, init_val, collection, start_idx, thinning):
        leaves = jax.tree.leaves(collection)
        n = int(leaves[0].shape[0]) if leaves else 0
        if not leaves or any(leaf.shape[:1] != (n,) for leaf in leaves):
            return jitted_loop(body, upper, init_val, collection, start_idx, thinning)
        longest[0] = rows = max(longest[0], n)
        if rows > n:
            collection = jax.tree.map(
                lambda leaf: jnp.concatenate([leaf, jnp.zeros((rows - n, *leaf.shape[1:]), leaf.dtype)]),
                collection)
        last, collection, start_idx, thinning = jitted_loop(body, upper, init_val, collection, start_idx,
                                                            thinning)
        if rows > n:
            collection = jax.tree.map(lambda leaf: leaf[:n], collection)
        return last, collection, start_idx, thinning

    return run
