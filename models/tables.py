"""Data tables a model records in its trace, so inference code reads them as traced arguments.

Some models take, besides their observed sites, tables derived from the data that are not
random: the rank SVM's labels ``y`` and rank pairs. A hand-derived update needs them, and it
must read them from the model's arguments, not from a closure: a table captured by a closure is
compiled into the program as a constant, so compile time and memory grow with the data (a rank
SVM on 1000 x 784 pixels took minutes to constant-fold its pairs, then hung).

``data_table(name, value)`` returns ``value`` unchanged and records it in the trace as a site of
type ``"data_table"``; :func:`latentzoo.inference.gibbs.read_model` hands such sites to the
updates beside the observed sites. No NumPyro handler acts on this type: it adds no density,
no draw and nothing to ``Predictive``'s or ArviZ's output.
"""

from __future__ import annotations

import jax
import numpy as np
from numpyro.primitives import apply_stack

__all__ = ["data_table", "DATA_TABLE", "is_table", "split_tables"]

DATA_TABLE = "data_table"


def _identity(value):
    return value


def data_table(name: str, value):
    """Record ``value`` (an array or a pytree of arrays) as the data table ``name``; returns it."""
    msg = {"type": DATA_TABLE, "name": name, "fn": _identity, "args": (value,), "kwargs": {},
           "value": value, "cond_indep_stack": [], "infer": {}}
    return apply_stack(msg)["value"]


def is_table(value) -> bool:
    """True for a keyword argument that is data: an array, or a pytree whose leaves all are."""
    leaves = jax.tree_util.tree_leaves(value)
    return bool(leaves) and all(isinstance(x, (jax.Array, np.ndarray)) for x in leaves)


def split_tables(kwargs: dict) -> tuple[dict, dict]:
    """``(static, tables)``: keyword arguments to bind into a compiled program (sizes, names,
    prior dicts) and those to pass as its arguments (arrays and pytrees of arrays)."""
    tables = {k: v for k, v in kwargs.items() if is_table(v)}
    return {k: v for k, v in kwargs.items() if k not in tables}, tables
