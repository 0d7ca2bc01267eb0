"""The rank variants' coarsening of features into at most ``levels`` groups: group sizes, exact
invariance to monotone transforms (of the training columns and of new samples alike), columns
with few values kept as they are, and bad settings refused in one sentence."""

import numpy as np
import pytest

from latentzoo.models.rank_factor_svm import coarsen_ranks, rank_cuts, rank_pairs


def _columns(seed=0, N=200):
    rng = np.random.default_rng(seed)
    return np.stack([rng.normal(size=N), rng.integers(0, 3, N), rng.exponential(size=N),
                     np.zeros(N)], 1)


@pytest.mark.smoke
def test_groups_are_equal_sized_and_few_valued_columns_keep_their_order():
    X = _columns()
    G = coarsen_ranks(X, rank_cuts(X, 8))
    for j in (0, 2):  # continuous: 8 groups of 25
        assert np.array_equal(np.bincount(G[:, j].astype(int)), np.full(8, 25))
        # the order within the column is kept (a group never holds larger values than the next)
        order = np.argsort(X[:, j])
        assert np.all(np.diff(G[order, j]) >= 0)
    assert np.array_equal(G[:, 1], X[:, 1])  # three values, at most 8 groups: kept
    assert np.all(G[:, 3] == 0)  # constant: one group, no pairs
    # grouped ties: each sample of a group pairs with one of the group below, so every column
    # but the constant one gives N - (size of its lowest group) pairs
    lowest = [np.sum(G[:, j] == 0) for j in range(3)]
    assert len(rank_pairs(G).feature) == sum(200 - n for n in lowest)


@pytest.mark.smoke
def test_monotone_transforms_give_the_same_groups_for_training_and_new_samples():
    X = _columns(1)
    new = _columns(2, N=50)
    cuts = rank_cuts(X, 5)
    base, base_new = coarsen_ranks(X, cuts), coarsen_ranks(new, cuts)
    for f in (np.exp, lambda v: v**3, lambda v: np.arctan(v) + 3 * v):
        cuts_f = rank_cuts(f(X), 5)
        assert np.array_equal(coarsen_ranks(f(X), cuts_f), base)
        assert np.array_equal(coarsen_ranks(f(new), cuts_f), base_new)


@pytest.mark.smoke
@pytest.mark.parametrize("levels", [1, 0, 2.5, True, None])
def test_levels_must_be_an_integer_of_at_least_two(levels):
    with pytest.raises(ValueError, match="levels must be an integer of at least 2"):
        rank_cuts(np.zeros((4, 2)), levels)
