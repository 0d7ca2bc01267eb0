"""``score_samples`` / ``score`` of the closed-form fits (scikit-learn's sense: each new row's
log-likelihood at the fitted parameters, latents integrated out), checked against the exact
answers the families' other code computes independently, and bad new rows."""

import numpy as np
import pytest

from latentzoo.inference.cvq import fit_cvq
from latentzoo.inference.cvq.em import cvq_exact_loglik
from latentzoo.inference.fa.fit import fit_fa_variational
from latentzoo.inference.noca import fit_noca
from latentzoo.inference.noca.bound import noca_exact_loglik
from latentzoo.models.factor_analysis import marginal_log_likelihood


def _binary(rng, n=40, d=6):
    return (rng.random((n, d)) < 0.4).astype(float)


def test_fa_scores_equal_the_marginal_likelihood_and_leave_nan_out():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 5))
    for method in ("em", "vb"):
        fit = fit_fa_variational(X[:50], 2, method=method, num_steps=20)
        p = fit.params
        psi = p["psi_loc"] if method == "em" else p["psi_concentration"] / p["psi_rate"]
        want = np.asarray(marginal_log_likelihood(X[50:], p["W_loc"], p["mu_loc"], psi, per_row=True))
        np.testing.assert_allclose(fit.score_samples(X[50:]), want, rtol=1e-10)
        assert fit.score(X[50:]) == pytest.approx(want.mean())
        assert fit.score_kind == "exact"
    holed = X[50:].copy()
    holed[0, 1] = np.nan  # the density of the other four entries: the model without column 1
    keep = np.array([0, 2, 3, 4])
    want0 = marginal_log_likelihood(holed[:1, keep], p["W_loc"][keep], p["mu_loc"][keep], psi[keep], per_row=True)
    assert fit.score_samples(holed)[0] == pytest.approx(float(want0[0]), rel=1e-10)


def test_binary_fits_score_exactly_up_to_12_sources():
    rng = np.random.default_rng(1)
    X = _binary(rng)
    cvq = fit_cvq(X[:30], 2, num_steps=10)
    p = cvq.params
    assert cvq.score_samples(X[30:]).sum() == pytest.approx(
        float(cvq_exact_loglik(X[30:], p["W_loc"], p["pi_loc"], p["sigma_loc"])), rel=1e-10)
    noca = fit_noca(X[:30], 2, num_steps=10)
    q = noca.params
    assert noca.score_samples(X[30:]).sum() == pytest.approx(
        float(noca_exact_loglik(X[30:], q["theta_loc"], q["theta0_loc"], q["pi_loc"])), rel=1e-10)
    assert cvq.score_kind == noca.score_kind == "exact"


def test_beyond_12_sources_the_score_is_a_lower_bound_and_says_so():
    rng = np.random.default_rng(2)
    X = _binary(rng, n=30, d=16)
    fit = fit_cvq(X, 13, num_steps=3)
    assert fit.score_kind == "lower bound"
    assert np.all(np.isfinite(fit.score_samples(X[:5])))


@pytest.mark.parametrize("rows, message", [
    (np.zeros((3, 4)), "with 6 columns, as the fit had"),
    (np.zeros(6), "2-D array"),
    ([["a"] * 6], "numeric array"),
])
def test_bad_new_rows_are_one_sentence(rows, message):
    fit = fit_noca(_binary(np.random.default_rng(3)), 2, num_steps=3)
    with pytest.raises(ValueError, match=message):
        fit.score_samples(rows)


def test_binary_models_refuse_what_they_cannot_score():
    rng = np.random.default_rng(4)
    X = _binary(rng)
    noca = fit_noca(X, 2, num_steps=3)
    with pytest.raises(ValueError, match="0/1 values only"):
        noca.score_samples(X + 0.5)
    cvq = fit_cvq(X, 2, num_steps=3)
    holed = X.copy()
    holed[0, 0] = np.nan
    with pytest.raises(ValueError, match="complete rows only"):
        cvq.score_samples(holed)
