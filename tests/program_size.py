"""What a compiled program holds: its StableHLO text's size and its largest literal constant.

A data set (or a table derived from it) captured by a closure is compiled in as a literal
constant, so the program's text and XLA's constant folding grow with N and D. A program that
takes the data as arguments has the same text at every size, up to the shapes in its types.
"""

from __future__ import annotations

import re
from typing import NamedTuple

import jax
import numpy as np

# `stablehlo.constant dense<LITERAL> : tensor<AxBxf64>`: a splat (one scalar broadcast, e.g. zeros)
# is written dense<0.0> whatever its shape; a real table is written dense<[...]> or dense<"0x...">.
_CONSTANT = re.compile(r"constant dense<(.)[^>]*> : tensor<([^>]*)>")


# `stablehlo.custom_call @lapack_dpotrf_ffi(%arg) {...} : (tensor<7129x10x10xf64>) -> ...`
_LAPACK_CALL = re.compile(r"custom_call @(\w*(?:lapack|blas)\w*)\(.*?: \(tensor<([^>]*)>")


class ProgramSize(NamedTuple):
    chars: int  # length of the StableHLO text
    largest_constant: int  # entries of the largest non-splat literal constant (0: none)
    # LAPACK/BLAS custom calls on a batch of matrices (operand of rank > 2), as (target, shape):
    # jaxlib splits such a batch over XLA's thread pool and two at once can deadlock it
    batched_lapack: tuple = ()


def program_size(fn, *args) -> ProgramSize:
    """Lower ``jax.jit(fn)(*args)`` (nothing is compiled or run) and measure its text."""
    text = jax.jit(fn).lower(*args).as_text()
    largest = 0
    for first, shape in _CONSTANT.findall(text):
        if first in '["':
            dims = [int(d) for d in shape.split("x")[:-1] if d.isdigit()]
            largest = max(largest, int(np.prod(dims)) if dims else 1)
    batched = tuple((target, shape) for target, shape in _LAPACK_CALL.findall(text)
                    if shape.count("x") > 2)
    return ProgramSize(len(text), largest, batched)


def gibbs_sweep_size(model, table, model_kwargs, data, init_values=None) -> ProgramSize:
    """The size of one sweep of ``ConjugateGibbs(model, table)`` on ``data`` with the data and
    the array-valued keyword arguments (labels, pairs) as arguments of the program and the rest
    (sizes, priors) bound, as ``MCMC(..., jit_model_args=True)`` compiles it."""
    from functools import partial

    from latentzoo.inference.gibbs import ConjugateGibbs
    from latentzoo.models.tables import split_tables

    static, tables = split_tables(model_kwargs)
    kernel = ConjugateGibbs(partial(model, **static), table)
    # the start's shapes only (jax.eval_shape: nothing computed): the program is lowered, never
    # run, and evaluating the start eagerly compiled a small program per operation of the model
    # at every size a test asks for
    state = jax.eval_shape(lambda d, t, v: kernel.init(jax.random.PRNGKey(0), 1, v, (d,), t),
                           data, tables, init_values)
    return program_size(lambda s, a, t: kernel.sample(s, a, t), state, (data,), tables)


def cavi_sweep_size(driver, data, model_kwargs) -> ProgramSize:
    """The size of one coordinate-ascent sweep of ``driver`` (a
    :class:`~latentzoo.inference.cavi.CAVI`) on ``data``, lowered as the driver compiles it: the
    data and the array-valued keyword arguments traced, the rest bound."""
    from latentzoo.models.tables import split_tables

    static, tables = split_tables(model_kwargs)
    algo = driver.algorithm
    params = algo.init(jax.random.PRNGKey(0), data, **model_kwargs)
    return program_size(lambda p, t, x: algo.update(p, x, **static, **t), params, tables, data)
