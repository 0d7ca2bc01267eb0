"""Compiled programs take the data as arguments: a family's Gibbs sweep lowered at (N, D) and at
(4N, 4D) has the same program, up to the shapes in its types, and holds no literal table.

A closure over the data (or over a table derived from it: labels, rank pairs) puts it into the
program as a constant; XLA then constant-folds it, and compile time and memory grow with the data
(the rank SVM on 1000 x 784 pixels compiled for minutes and then hung). The planted closure at the
bottom shows the test catches that.
"""

from functools import partial

import jax
import pytest

from latentzoo.inference.checks import simulate
from latentzoo.registry import families
from tests.program_size import cavi_sweep_size, gibbs_sweep_size, program_size

SIZED = [f for f in families().values() if f.checks and f.checks.gibbs_table and f.checks.sized_model_kwargs]
BASE = (6, 5)
# The text grows only with the digits of the shapes in its types: measured 1.00-1.01 x for every
# family. A table of data in the program grows it by its size (at (24, 20): 480 numbers for X).
MAX_GROWTH = 1.2
# Constants the sweeps legitimately hold are scalars and short coefficient lists; the data at the
# larger size have at least 24 entries (the labels, one per row), so a captured table exceeds this.
MAX_CONSTANT = 16


def _simulated_shapes(family, kw):
    """The shapes of a prior-predictive draw (latent values, data), traced, not drawn: the sweep is
    lowered, never run, and drawing eagerly compiled a small program per operation of the model
    at each size."""
    return jax.eval_shape(lambda key: simulate(family.model, kw, key, family.checks.data_sites),
                          jax.random.PRNGKey(1))


def _sweep_size(family, N, D, table=None, K=None):
    kw = family.checks.sized_model_kwargs(N, D)
    if K is not None:
        kw = {**kw, "K": K}
    values, data = _simulated_shapes(family, kw)
    table = family.checks.gibbs_table() if table is None else table
    return gibbs_sweep_size(family.model, table, kw, data, values)


@pytest.mark.parametrize("family", SIZED, ids=lambda f: f.name)
def test_sweep_program_does_not_grow_with_the_data(family):
    small = _sweep_size(family, *BASE)
    large = _sweep_size(family, 4 * BASE[0], 4 * BASE[1])
    assert large.chars < MAX_GROWTH * small.chars, (small, large)
    assert large.largest_constant <= MAX_CONSTANT, large
    # nor with K: a Python loop over the factors unrolls into the program (FA's shear move over
    # the K(K - 1) pairs did: 2.7x the text at K = 8, and compile time with it); measured
    # 0.98-1.09x from K = 2 to K = 8 (K = 1 to 4 for MFA) with every per-factor loop a scan
    K = family.checks.sized_model_kwargs(*BASE).get("K")
    if K is not None:
        wide = _sweep_size(family, *BASE, K=4 * K)
        assert wide.chars < MAX_GROWTH * small.chars, (small, wide)


def test_cfa_sweep_with_the_element_move_does_not_grow_with_the_data():
    """The opt-in element birth/death move (off in the registry's table) reads one image's
    patches by index arithmetic, not a table (measured: the text 1.3 % longer at 4x the images and
    4x the sides, largest constant 4 entries)."""
    from latentzoo.inference.conv_factor import cfa_updates

    cfa = families()["cfa"]
    table = cfa_updates(element_move=True)
    small = _sweep_size(cfa, *BASE, table=table)
    large = _sweep_size(cfa, 4 * BASE[0], 4 * BASE[1], table=table)
    assert large.chars < MAX_GROWTH * small.chars, (small, large)
    assert large.largest_constant <= MAX_CONSTANT, large


POINT = [f for f in families().values() if f.checks and f.checks.vb]


@pytest.mark.parametrize("family", POINT, ids=lambda f: f.name)
def test_point_fit_sweep_does_not_grow_with_the_data(family):
    """The coordinate-ascent sweep (the CAVI driver's jitted update) on the family's check data
    and on it tiled to 4x the rows and 4x the columns (the same kind of data: binary stays
    binary): the same program, no literal table."""
    import numpy as np

    driver, X, kw = family.checks.vb()
    X = np.asarray(X)
    small = cavi_sweep_size(driver, X, kw)
    large = cavi_sweep_size(driver, np.tile(X, (4, 4)), kw)
    assert large.chars < MAX_GROWTH * small.chars, (small, large)
    assert large.largest_constant <= MAX_CONSTANT, large


def test_rank_svm_sweep_calls_no_batched_lapack():
    """The hang at 72 x 7129 (R-L) and 1000 x 784: two batched LAPACK kernels (jaxlib splits a
    batch over XLA's intra-op pool and waits on a pool thread) deadlocked the two-thread pool at
    zero CPU. Its sweep factors its per-row and per-feature precisions in plain XLA instead
    (inference/small_linalg.py); this keeps any batched LAPACK call out of it."""
    family = families()["rank-svm"]
    assert _sweep_size(family, 4 * BASE[0], 4 * BASE[1]).batched_lapack == ()


def test_batched_lapack_calls_are_detected():
    import jax.numpy as jnp

    size = program_size(lambda P: jnp.linalg.cholesky(P), jnp.ones((7, 3, 3)))
    assert size.batched_lapack and "potrf" in size.batched_lapack[0][0], size


def test_every_family_with_a_gibbs_table_is_sized():
    missing = [f.name for f in families().values() if f.checks and f.checks.gibbs_table and f not in SIZED]
    assert not missing, f"FamilyChecks.sized_model_kwargs missing for {missing}"


def test_labels_bound_into_the_model_fail_the_check():
    """The planted closure: the rank SVM with its labels bound into the model by ``partial``
    (as the fit did before) compiles them in; the check sees a constant of N entries."""
    (family,) = [f for f in families().values() if f.name == "rank-svm"]
    N, D = 4 * BASE[0], 4 * BASE[1]
    kw = family.checks.sized_model_kwargs(N, D)
    values, data = _simulated_shapes(family, kw)
    planted = partial(family.model, y=kw["y"])
    rest = {k: v for k, v in kw.items() if k != "y"}
    size = gibbs_sweep_size(planted, family.checks.gibbs_table(), rest, data, values)
    assert size.largest_constant >= N, size
