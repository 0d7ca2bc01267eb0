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
hit, and a run holds one compiled loop per loop length (the warm-up's, the segments', a shorter
last segment's). Nothing else changes: the same functions are jitted with the same options, so
the draws are identical. Where NumPyro no longer has ``maybe_jit`` the context does nothing.
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

    def maybe_jit(fn, *args, **kwargs):
        try:
            key = (fn, args, tuple(sorted(kwargs.items())))
            hash(key)
        except TypeError:  # an unhashable option: NumPyro's own behaviour
            return original(fn, *args, **kwargs)
        if key not in memo:
            memo[key] = original(fn, *args, **kwargs)
        return memo[key]

    maybe_jit._latentzoo_memo = True
    nutil.maybe_jit = maybe_jit
    try:
        yield
    finally:
        nutil.maybe_jit = original
        memo.clear()
