"""FA numerics: constant columns, data on extreme scales, and the marginal log-likelihood.

Digit images (scikit-learn's ``load_digits``: 1797 rows, 64 pixels, 3 of them always 0 and
others 0 for long runs of rows) are the test case for constant columns: every FA fit must stay
finite there, give a constant column no loading and a tiny noise variance, and fit the other
columns as well as scikit-learn's batch FA does.
"""

import numpy as np
import pytest

import latentzoo  # noqa: F401
from latentzoo.inference.fa import OnlineFactorAnalysis, fit_fa_variational
from latentzoo.inference.validation import check_matrix
from latentzoo.models.factor_analysis import marginal_log_likelihood


@pytest.fixture(scope="module")
def digits():
    from sklearn.datasets import load_digits

    X = load_digits().data
    return X, X.std(0) > 0


def _standardised(X):
    sd = X.std(0)
    return (X - X.mean(0)) / np.where(sd > 0, sd, 1.0)


def _sklearn_score(X, K):
    from sklearn.decomposition import FactorAnalysis

    return FactorAnalysis(K, random_state=0).fit(X).score(X)


def _stream(model, X, chunk=200):
    for lo in range(0, X.shape[0], chunk):
        model.partial_fit(X[lo : lo + chunk])
    return model


# ------------------------------------------------------------------ online EM, constant columns
@pytest.mark.parametrize("standardise", [False, True])
def test_online_em_on_digits_with_constant_columns(digits, standardise):
    X, varies = digits
    X = _standardised(X) if standardise else X
    fa = _stream(OnlineFactorAnalysis(5, random_state=0), X)
    psi, F = fa.noise_variance_, fa.components_.T
    # Before: every noise variance NaN (a zero floor on a zero variance, then 0 * inf).
    assert np.all(np.isfinite(psi)) and np.all(psi > 0)
    assert np.all(np.isfinite(fa.score_samples(X)))
    scale = X.var(0).mean()
    assert np.all(F[~varies] == 0.0)  # a constant column has no loading...
    assert np.all(psi[~varies] <= 1e-10 * scale)  # ...and a tiny noise variance (1e-12 x scale)
    # The other columns are fitted as batch FA fits them. One streaming pass is within 1.4 %
    # (raw) and 3.3 % (standardised) of scikit-learn's log-likelihood on the 61 varying pixels;
    # on those pixels alone, seeds 0-3 give 2.4-4.1 % (standardised), so the constant columns
    # cost nothing. A fit without factors (diagonal Gaussian) is 13.5 % below.
    ll = np.mean(marginal_log_likelihood(
        X[:, varies], F[varies], fa.mean_[varies], 1.0 / psi[varies], per_row=True))
    ref = _sklearn_score(X[:, varies], 5)
    assert ll > 1.05 * ref, (ll, ref)


def test_online_em_column_constant_over_the_first_batches(digits):
    X, varies = digits
    X = X[:, varies]
    j = 39  # a pixel that is 0 in 642 of the 1797 images: put those first in the stream
    Xo = X[np.argsort(X[:, j] != 0, kind="stable")]
    assert np.all(Xo[:640, j] == 0) and Xo[:, j].var() > 10.0
    fa = _stream(OnlineFactorAnalysis(5, random_state=0), Xo)
    psi = fa.noise_variance_
    # Before: NaN from the first batch after warm-up (the column's variance, 0 so far, floored
    # at 1e-6 x 0).
    assert np.all(np.isfinite(psi)) and np.all(np.isfinite(fa.score_samples(Xo)))
    # Once it varies it gets an ordinary noise variance and a loading, not the floor.
    var = Xo[:, j].var()
    assert 0.1 * var < psi[j] < var, (psi[j], var)
    assert np.abs(fa.components_[:, j]).max() > 0.1 * np.sqrt(var)
    assert fa.score(Xo) > 1.05 * _sklearn_score(Xo, 5)


def test_noise_floor_is_relative_to_the_data_scale(digits):
    """The floor of a constant column scales with the data: fitting 1000 X gives it 1e6 times the
    noise variance of fitting X (an absolute floor would give the same number for both)."""
    X, _ = digits
    X = X[:600]
    const = X.std(0) == 0
    psi1 = _stream(OnlineFactorAnalysis(3, random_state=0), X).noise_variance_
    psi2 = _stream(OnlineFactorAnalysis(3, random_state=0), 1e3 * X).noise_variance_
    # (the other columns are not compared: the start, psi = 1 and orthonormal F, is not scaled)
    np.testing.assert_allclose(psi2[const], 1e6 * psi1[const], rtol=1e-8)
    assert np.all(psi1[const] < 1e-10 * X.var(0).mean())


# -------------------------------------------------------------- batch EM / VB, constant columns
@pytest.mark.parametrize("method", ["em", "vb"])
def test_batch_em_and_vb_on_digits_with_constant_columns(digits, method):
    X, _ = digits
    X = X[:400]  # more pixels are constant in fewer rows: 7 of 64 here
    varies = X.std(0) > 0
    assert (~varies).sum() >= 3
    # Before: the start psi = 2 / var (EM) or the Gamma rate var / 2 (VB) of a constant column is
    # infinite or zero, and the first sweep's objective is NaN (the driver raised).
    fit = fit_fa_variational(X, 4, method=method, num_steps=150)
    assert np.all(np.isfinite(np.asarray(fit.losses)))
    p = {k: np.asarray(v) for k, v in fit.params.items()}
    psi = p["psi_loc"] if method == "em" else p["psi_concentration"] / p["psi_rate"]
    assert np.all(np.isfinite(psi)) and np.all(psi > 0)
    assert np.all(np.abs(p["W_loc"][~varies]) < 1e-8)
    # Not a collapsed fit: on the varying pixels within 2 % of scikit-learn's log-likelihood
    # (measured 0.3 %; the diagonal-only fit, no factors, is 25 % below).
    ll = np.mean(marginal_log_likelihood(
        X[:, varies], p["W_loc"][varies], p["mu_loc"][varies], psi[varies], per_row=True))
    ref = _sklearn_score(X[:, varies], 4)
    assert ll > 1.02 * ref, (ll, ref)


# ------------------------------------------------------------------------------ extreme scales
@pytest.mark.parametrize("scale", [1e200, 1e308 / 4, 1e-150])
def test_matrix_validator_refuses_data_whose_squares_overflow(scale):
    X = np.random.default_rng(0).normal(size=(20, 4)) * scale
    word = "underflow" if scale < 1 else "overflow"
    with pytest.raises(ValueError, match=word) as err:
        check_matrix(X)
    assert "rescale" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ValueError, match=word):
        fit_fa_variational(X, 2, method="em", num_steps=2)


def test_matrix_validator_keeps_large_but_safe_scales_and_zeros():
    X = np.random.default_rng(0).normal(size=(20, 4))
    check_matrix(1e90 * X)
    check_matrix(1e-90 * X)
    check_matrix(np.zeros((5, 3)))  # all constant: not a scale problem


def test_csv_on_the_edge_of_float64_is_refused(tmp_path):
    from latentzoo.data import load_matrix

    path = tmp_path / "huge.csv"
    path.write_text("1e308,2e307,-1e308\n3e307,1e308,5e307\n1e306,-2e307,1e308\n")
    with pytest.raises(ValueError, match="overflow"):
        load_matrix(str(path))


def test_partial_fit_checks_every_chunk():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(64, 5))
    fa = OnlineFactorAnalysis(2, random_state=0)
    with pytest.raises(ValueError, match="overflow"):
        fa.partial_fit(X * 1e200)
    fa.partial_fit(X)
    psi = fa.noise_variance_.copy()
    for bad in (X * 1e200, X[0] * 1e200, X * 1e-200):
        with pytest.raises(ValueError, match="rescale"):
            fa.partial_fit(bad)
    assert fa.n_samples_seen_ == 64  # a refused chunk leaves the fit as it was
    np.testing.assert_array_equal(fa.noise_variance_, psi)
    fa.partial_fit(X * 1e90)  # large but safe: finite
    assert np.all(np.isfinite(fa.noise_variance_))
