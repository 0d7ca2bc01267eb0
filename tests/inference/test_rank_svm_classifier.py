"""RankFactorSVC: scikit-learn's conventions (clone, get/set_params, classes_, predict_proba
rows, decision_function's sign, score), input validation in one sentence, and right answers on a
small separable problem for an R and a G variant."""

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError

from latentzoo.inference.rank_svm.classifier import RankFactorSVC

SMALL = dict(K=2, num_warmup=100, num_samples=100, max_draws=30)


def _problem(seed=0, N=60, D=4):
    """A one-factor problem: every feature a noisy copy of a score s, the class its sign (string
    labels); rows 40.. held out. The copies are warped differently (R sees only their order)."""
    rng = np.random.default_rng(seed)
    s = rng.normal(size=N)
    X = np.stack([s + 0.3 * rng.normal(size=N) for _ in range(D)], 1)
    X[:, 1] = np.exp(2.0 * X[:, 1])
    return X, np.where(s > 0, "yes", "no")


@pytest.fixture(scope="module")
def rank_fit():
    X, y = _problem()
    return RankFactorSVC(variant="R-L", **SMALL).fit(X[:40], y[:40]), X, y


@pytest.mark.smoke
def test_sklearn_parameters_and_clone():
    est = RankFactorSVC(variant="G-NL", K=3, T=4, priors={"epsilon": 0.5})
    params = est.get_params()
    assert params["variant"] == "G-NL" and params["K"] == 3 and params["T"] == 4
    twin = clone(est)
    assert twin is not est and twin.get_params() == params
    assert est.set_params(K=5).K == 5
    with pytest.raises(NotFittedError):
        est.predict(np.zeros((2, 3)))


@pytest.mark.smoke
@pytest.mark.parametrize("X, y, phrase", [
    (np.zeros((5, 3)), np.array([0, 1, 0, 1]), "one label per row of X \\(5\\)"),
    (np.zeros(5), np.array([0, 1, 0, 1, 0]), "2-D array"),
    (np.array([[0.0, np.nan], [1.0, 2.0], [3.0, 4.0]]), np.array([0, 1, 0]), "1 NaN"),
    (np.zeros((4, 2)), np.array([1, 1, 1, 1]), "only one class"),
    (np.zeros((4, 2)), np.array([1, 2, 3, 1]), "3 classes"),
    (np.zeros((4, 2)), np.array([1.0, np.inf, 0.0, 1.0]), "NaN or infinite label"),
    (np.zeros((1, 2)), np.array([1]), "at least 2"),
    (np.array([["a", "b"], ["c", "d"]]), np.array([0, 1]), "numeric"),
])
def test_bad_data_is_one_sentence(X, y, phrase):
    with pytest.raises(ValueError, match=phrase):
        RankFactorSVC().fit(X, y)


@pytest.mark.smoke
@pytest.mark.parametrize("setting, phrase", [
    (dict(variant="R-X"), "Unknown variant"), (dict(method="nuts"), "Unknown method"),
    (dict(K=0), "K must be a positive integer"), (dict(T=2.5), "T must be"),
    (dict(num_warmup=-1), "num_warmup"), (dict(burn_in=30), "burn_in"),
    (dict(levels=1), "levels must be None or an integer of at least 2"),
    (dict(levels=3.5), "levels must be None"),
])
def test_bad_settings_are_one_sentence(setting, phrase):
    with pytest.raises(ValueError, match=phrase):
        RankFactorSVC(**setting).fit(np.zeros((4, 2)), np.array([0, 1, 0, 1]))


def test_rank_variant_classifies_held_out_rows(rank_fit):
    est, X, y = rank_fit
    assert list(est.classes_) == ["no", "yes"] and est.n_features_in_ == 4
    proba = est.predict_proba(X[40:])
    assert proba.shape == (20, 2)
    np.testing.assert_allclose(proba.sum(1), 1.0)
    # the problem is separable up to the copies' noise: a broken predictor is near 0.5
    assert est.score(X[40:], y[40:]) >= 0.85
    pred = est.predict(X[40:])
    assert set(pred) <= {"no", "yes"}
    np.testing.assert_array_equal(pred == "yes", est.decision_function(X[40:]) > 0)
    np.testing.assert_array_equal(pred, est.classes_[proba.argmax(1)])
    assert est.loadings_.shape == (4, 2) and est.coef_.shape == (1, 2)
    # same seed, same predictions
    np.testing.assert_array_equal(est.predict_proba(X[40:]), proba)


def test_rank_variant_sees_grouped_values_and_is_exactly_invariant(rank_fit):
    """The fit sees each column in at most ``levels`` groups (SMALL fits have 40 rows, so 16
    groups of 2-3), and a monotone transform of the columns gives the same probabilities bit
    for bit: the cuts are order statistics, so they move with the data."""
    est, X, y = rank_fit
    assert all(len(np.unique(est.X_fit_[:, j])) == 16 for j in range(X.shape[1]))
    warped = np.exp(X) + X**3
    twin = RankFactorSVC(variant="R-L", **SMALL).fit(warped[:40], y[:40])
    np.testing.assert_array_equal(twin.predict_proba(warped[40:]), est.predict_proba(X[40:]))


def test_predict_refuses_other_widths_and_nan(rank_fit):
    est, X, _ = rank_fit
    with pytest.raises(ValueError, match="3 features, but the classifier was fitted with 4"):
        est.predict(X[:5, :3])
    with pytest.raises(ValueError, match="NaN"):
        est.predict_proba(np.where(X[:5] > 1, np.nan, X[:5]))


def test_gaussian_variant_standardises_and_keeps_a_constant_column():
    X, y = _problem(seed=1)
    X = np.concatenate([X, np.full((len(X), 1), 7.0)], 1)  # a constant column: scale 1, no NaN
    X[:, 0] *= 1000.0  # far from unit scale: standardised inside
    est = RankFactorSVC(variant="G-L", **SMALL).fit(X[:40], y[:40])
    assert est.scale_[-1] == 1.0 and np.all(np.isfinite(est.loadings_))
    assert est.score(X[40:], y[40:]) >= 0.85


def test_sign_alignment_leaves_one_sign_per_factor():
    from latentzoo.inference.rank_svm.classifier import align_signs

    rng = np.random.default_rng(0)
    A = rng.normal(size=(1, 5, 2)) + np.array([2.0, -1.0])
    flips = np.array([1, -1, 1, -1, -1, 1])[:, None, None] * np.array([1, -1])  # (6, 1, 2)
    draws = {"A": A * flips, "z": np.ones((6, 3, 2)) * flips, "beta": np.ones((6, 1, 2)) * flips}
    out = align_signs(draws)
    np.testing.assert_allclose(out["A"], np.broadcast_to(out["A"][-1], out["A"].shape))
    # z and beta flip with A: their ratio to A (the identified products) is unchanged
    np.testing.assert_allclose(out["z"] / out["A"][:, :1], draws["z"] / draws["A"][:, :1])
    np.testing.assert_allclose(out["beta"] / out["A"][:, :1], draws["beta"] / draws["A"][:, :1])
    np.testing.assert_allclose(out["beta"], np.ones((6, 1, 2)) * flips[-1])


def test_registry_run_stores_the_labels_and_their_posterior_predictive():
    """A rank-svm run keeps the labels as observed data and one label replicate per draw (the
    normalised hinge at that draw's score), which is what az.plot_ppc draws."""
    from latentzoo.registry import RunConfig, get_family

    X, y = _problem(N=40)
    cfg = RunConfig(K=2, chains=2, samples=40, warmup=40)
    idata = get_family("rank-svm").method("gibbs").run((X, (y == "yes").astype(float)), cfg)
    observed = np.asarray(idata.observed_data["y"])
    reps = np.asarray(idata.posterior_predictive["y"].transpose("chain", "draw", ...))
    assert reps.shape == (2, 40, 40) and set(np.unique(reps)) <= {-1, 1}
    assert set(np.unique(observed)) == {-1, 1}
    # a separable problem: the replicates agree with the observed labels far above chance
    assert np.mean(reps[:, -20:] == observed) > 0.8
