"""latentzoo.predictive_checks: the statistics, the Bayesian p-values and the table."""

import numpy as np
import pytest

from latentzoo import predictive_checks as pc
from latentzoo.data import BINARY_MATRIX, IMAGE_STACK, MATRIX
from latentzoo.registry import Family, families

pytestmark = pytest.mark.smoke


# ------------------------------------------------------------------------------ p-values
def test_p_value_counts_ties_half():
    t_rep = np.array([1.0, 2.0, 2.0, 3.0])
    assert pc.bayesian_p_value(t_rep, np.array(2.0)) == pytest.approx(0.25 + 0.5 * 0.5)
    assert pc.bayesian_p_value(t_rep, np.array(0.0)) == 1.0  # every replicate above
    assert pc.bayesian_p_value(t_rep, np.array(9.0)) == 0.0
    # a statistic that is always tied (a column that is never on) sits at 0.5, not 1
    assert pc.bayesian_p_value(np.zeros(10), np.array(0.0)) == 0.5


def test_p_value_is_elementwise_and_nan_for_nan():
    t_rep = np.arange(10.0)[:, None] * np.array([1.0, -1.0])  # (10, 2)
    p = pc.bayesian_p_value(t_rep, np.array([4.5, np.nan]))
    assert p[0] == 0.5 and np.isnan(p[1])


def test_p_values_are_uniform_when_the_data_come_from_the_replicating_distribution():
    # 400 columns, each an observed draw compared with 200 replicates of the same law: the
    # p-values are uniform (a reversed inequality would be too, but test_direction checks that)
    rng = np.random.default_rng(0)
    X_obs = rng.normal(size=(100, 400))
    X_rep = rng.normal(size=(200, 100, 400))
    p = pc.bayesian_p_value(pc.evaluate(pc.column_max, X_rep), pc.column_max(X_obs))
    assert abs(p.mean() - 0.5) < 0.05
    assert 0.05 < np.mean((p < 0.05) | (p > 0.95)) < 0.16  # 10% expected


def test_direction_heavy_tails_give_p_near_zero_for_the_max():
    rng = np.random.default_rng(1)
    X_obs = rng.standard_t(1.5, size=(300, 20))
    X_rep = rng.normal(size=(100, 300, 20)) * X_obs.std(0)
    r = {x.name: x for x in pc.run_checks(X_obs, X_rep, pc.MATRIX_STATISTICS)}
    # P(T_rep >= T_obs) is small when the observed maximum is larger than every replicate's
    assert np.mean(r["col_max"].p_value < 0.05) > 0.5
    assert np.mean(r["col_min"].p_value > 0.95) > 0.5


# ---------------------------------------------------------------------------- statistics
def test_matrix_statistics_shapes_and_values():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(50, 6)) @ rng.normal(size=(6, 6))
    np.testing.assert_allclose(pc.column_mean(X), X.mean(0))
    np.testing.assert_allclose(pc.column_var(X), X.var(0))
    C = np.corrcoef(X.T)
    iu = np.triu_indices(6, 1)
    assert pc.corr_mean_abs(X) == pytest.approx(np.abs(C[iu]).mean())
    assert pc.corr_max_abs(X) == pytest.approx(np.abs(C[iu]).max())
    stack = np.stack([X, 2 * X + 1, -X])
    assert pc.corr_mean_abs(stack).shape == (3,)
    np.testing.assert_allclose(pc.corr_mean_abs(stack), pc.corr_mean_abs(X))  # invariant to scale
    assert pc.corr_pairs(stack).shape == (3, 15)  # 6 columns have 15 < 16 pairs
    assert pc.shown_pairs(6)[0] == "(0, 1)"


def test_pairs_are_a_fixed_subset_at_large_D():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(30, 100))
    i, j = pc.column_pairs(100)
    assert i.size == pc.MAX_PAIRS and np.all(i < j)
    i2, j2 = pc.column_pairs(100)
    assert np.array_equal(i, i2) and np.array_equal(j, j2)  # same pairs for observed and replicates
    C = np.corrcoef(X.T)
    assert pc.corr_mean_abs(X) == pytest.approx(np.abs(C[i, j]).mean())
    assert pc.corr_pairs(X).shape == (pc.NUM_SHOWN_PAIRS,)


def test_constant_column_has_zero_correlation_not_nan():
    X = np.column_stack([np.arange(5.0), np.ones(5), np.arange(5.0) ** 2])
    assert np.isfinite(pc.corr_mean_abs(X)) and np.isfinite(pc.corr_max_abs(X))


def test_binary_statistics():
    X = np.array([[1, 1, 0], [1, 0, 0], [0, 0, 1], [1, 1, 1]], float)
    assert pc.row_sum_mean(X) == pytest.approx(1.75)
    assert pc.row_sum_var(X) == pytest.approx(np.var([2, 1, 1, 3]))
    assert pc.row_sum_max(X) == 3
    co = [np.mean(X[:, a] * X[:, b]) for a, b in [(0, 1), (0, 2), (1, 2)]]
    assert pc.cooccurrence_mean(X) == pytest.approx(np.mean(co))
    assert pc.cooccurrence_max(X) == pytest.approx(max(co))
    f = X.mean(0)
    dep = [abs(co[k] - f[a] * f[b]) for k, (a, b) in enumerate([(0, 1), (0, 2), (1, 2)])]
    assert pc.dependence_mean(X) == pytest.approx(np.mean(dep))
    # independent columns: dependence near 0; a shared switch: clearly positive
    rng = np.random.default_rng(4)
    ind = (rng.random((4000, 8)) < 0.3).astype(float)
    shared = np.repeat(rng.random((4000, 1)) < 0.3, 8, axis=1).astype(float)
    assert pc.dependence_mean(ind) < 0.01 < 0.1 < pc.dependence_mean(shared)


def test_evaluate_in_blocks_matches_one_call():
    rng = np.random.default_rng(5)
    X_rep = rng.normal(size=(13, 40, 7))
    for fn in (pc.corr_mean_abs, pc.column_var, pc.corr_pairs):
        np.testing.assert_allclose(pc.evaluate(fn, X_rep, max_elements=600), fn(X_rep))


def test_images_are_checked_per_pixel():
    rng = np.random.default_rng(6)
    obs = rng.random((20, 4, 5))
    rep = rng.random((30, 20, 4, 5))
    r = {x.name: x for x in pc.run_checks(obs, rep, pc.IMAGE_STATISTICS)}
    assert r["pixel_mean"].p_value.shape == (20,)
    np.testing.assert_allclose(r["pixel_mean"].observed, obs.reshape(20, -1).mean(0))
    with pytest.raises(ValueError, match="shaped"):
        pc.run_checks(obs, rep[:, :, :3], pc.IMAGE_STATISTICS)


# --------------------------------------------------------------------- registry defaults
def _family(kind, stats=None):
    return Family(name="f", title="", paper="", model=None, data_kind=kind, default_data=None,
                  methods=(), identified=(), test_statistics=stats)


def test_defaults_come_from_the_data_kind_and_a_family_may_declare_its_own():
    assert pc.statistics_for(_family(MATRIX)) is pc.MATRIX_STATISTICS
    assert pc.statistics_for(_family(BINARY_MATRIX)) is pc.BINARY_STATISTICS
    assert pc.statistics_for(_family(IMAGE_STACK)) is pc.IMAGE_STATISTICS
    own = {"total": lambda X: X.sum((-1, -2))}
    assert pc.statistics_for(_family(MATRIX, own)) == own
    with pytest.raises(ValueError, match="no default test statistics"):
        pc.statistics_for(_family(MATRIX._replace(name="graph")))


def test_every_registered_family_has_statistics():
    for family in families().values():
        stats = pc.statistics_for(family)
        assert stats and all(callable(fn) for fn in stats.values())


# ------------------------------------------------------------------------------- tables
@pytest.fixture
def results():
    rng = np.random.default_rng(7)
    X_obs = rng.normal(size=(60, 5))
    X_obs[:, 2] += 3.0  # column 2's mean is far from every replicate's
    X_rep = rng.normal(size=(50, 60, 5))
    return pc.run_checks(X_obs, X_rep, pc.MATRIX_STATISTICS)


def test_check_table_summarises_vector_statistics(results):
    table = pc.check_table(results, "posterior").set_index("statistic")
    assert list(table.columns) == ["check", "about", "observed", "replicated_mean", "p_value",
                                   "replicates", "n_values", "frac_extreme"]
    row = table.loc["col_mean"]
    assert row["about"] == "column 2" and row["p_value"] == 0.0 and row["n_values"] == 5
    assert (table["replicates"] == results[0].replicates).all() and results[0].replicates > 1
    assert row["frac_extreme"] >= 0.2
    assert row["observed"] == pytest.approx(results[0].observed[2])
    scalar = table.loc["corr_mean_abs"]
    assert scalar["n_values"] == 1 and np.isnan(scalar["frac_extreme"]) and scalar["about"] == "whole data"
    assert table.loc["corr_pairs", "about"].startswith("(")
    assert "col_mean" in pc.format_table(pc.check_table(results))


def test_column_table_and_extreme_columns(results):
    cols = pc.column_table(results, "prior")
    assert set(cols["statistic"]) == {"col_mean", "col_var", "col_max", "col_min", "corr_pairs"}
    assert len(cols[cols["statistic"] == "col_mean"]) == 5
    assert (cols["check"] == "prior").all() and cols["p_value"].between(0, 1).all()
    order = pc.extreme_columns(results, 5)
    assert order[0] == 2 and sorted(order) == list(range(5))
    assert pc.extreme_columns(results, 5, limit=2)[0] == 2
    assert pc.extreme_columns([], 30) == list(range(16))
