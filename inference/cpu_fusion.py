"""Per-program XLA options for streaming kernels on the CPU.

XLA's CPU backend (jaxlib 0.10 and 0.12) hands parts of a program to its YNNPACK library: by
default whole chains of elementwise operations, reductions and matrix products become one
library call each. For the online factor-analysis step (two passes over blocks of 8192 features,
each a few small matrix products between elementwise updates, at D = 10^6) that is slower than
XLA's own loops: with only the matrix products handed over
(``xla_cpu_experimental_ynn_fusion_type = LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT``) a batch of 32
rows took 126-129 ms instead of 160-170 ms on 2 cores (jaxlib 0.10; 158 against 184 ms on
jaxlib 0.12), the same arithmetic in a different order of fused loops.

The option is passed to one program at a time (``jax.jit(..., compiler_options=...)``), not
through ``XLA_FLAGS``: the zoo's small Gibbs programs compile and run as fast or faster with the
default (a cold ``tests/inference/test_ta_gibbs.py`` took 97 s with XLA's default, 108 s
with the option set for every program). It is used
only on the CPU backend, only where this jaxlib accepts it (asked once per process with a
one-line program; an unknown option is an error there, not an abort), and not when
``LATENTZOO_XLA_DOT_ONLY_FUSION=0``.
"""

from __future__ import annotations

import functools
import os

import jax

__all__ = ["DOT_ONLY_FUSION", "dot_only_fusion_enabled", "jit_dot_only_fusion"]

DOT_ONLY_FUSION = {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}


@functools.lru_cache(maxsize=None)
def _accepted(backend: str, options: tuple) -> bool:
    if backend != "cpu":
        return False
    try:
        probe = jax.jit(lambda x: x + 1, compiler_options=dict(options))
        jax.block_until_ready(probe(1.0))
    except Exception:  # an unknown option or enum value: this jaxlib compiles without it
        return False
    return True


def dot_only_fusion_enabled() -> bool:
    """Whether :func:`jit_dot_only_fusion` programs get :data:`DOT_ONLY_FUSION` here: the
    default backend is the CPU, this jaxlib knows the option and
    ``LATENTZOO_XLA_DOT_ONLY_FUSION`` is not ``0``."""
    if os.environ.get("LATENTZOO_XLA_DOT_ONLY_FUSION") == "0":
        return False
    return _accepted(jax.default_backend(), tuple(sorted(DOT_ONLY_FUSION.items())))


def jit_dot_only_fusion(fun=None, **jit_kwargs):
    """``jax.jit(fun, **jit_kwargs)`` compiled with :data:`DOT_ONLY_FUSION` where
    :func:`dot_only_fusion_enabled` says so, plainly elsewhere. Usable as a decorator, with or
    without keyword arguments (``static_argnames``, ``donate_argnums``, ...)."""
    if fun is None:
        return functools.partial(jit_dot_only_fusion, **jit_kwargs)
    plain = jax.jit(fun, **jit_kwargs)
    tuned = jax.jit(fun, compiler_options=dict(DOT_ONLY_FUSION), **jit_kwargs)

    @functools.wraps(fun)
    def call(*args, **kwargs):
        return (tuned if dot_only_fusion_enabled() else plain)(*args, **kwargs)

    call.plain = plain
    call.tuned = tuned
    return call
