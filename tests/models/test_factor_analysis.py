"""The FA model: its deterministic sites at small and large D, and the marginal log-likelihood
(Woodbury identity) against a dense Gaussian."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpyro.handlers import seed, trace
from scipy.stats import multivariate_normal

import latentzoo  # noqa: F401
from latentzoo.models.factor_analysis import (
    COV_SITE_MAX_DIM,
    factor_analysis,
    factor_variances,
    marginal_log_likelihood,
)


def _trace(**kw):
    return trace(seed(factor_analysis, jax.random.PRNGKey(0))).get_trace(None, **kw)


def test_cov_site_up_to_the_limit_and_none_above_it():
    small = _trace(N=3, D=COV_SITE_MAX_DIM, K=2)
    W, psi = small["W"]["value"], small["psi"]["value"]
    np.testing.assert_allclose(small["cov"]["value"], W @ W.T + jnp.diag(1.0 / psi), rtol=1e-12)
    large = _trace(N=3, D=COV_SITE_MAX_DIM + 1, K=2)
    # a D x D site per draw is what made 7129 features need 8 GB for 10 draws
    assert "cov" not in large
    for tr in (small, large):
        assert tr["factor_variance"]["type"] == "deterministic"
        assert tr["factor_variance"]["value"].shape == (2,)


def test_factor_variances_are_the_rotation_invariant_spectrum_of_the_loadings():
    rng = np.random.default_rng(0)
    W = rng.normal(size=(6, 3))
    R, _ = np.linalg.qr(rng.normal(size=(3, 3)))  # W R gives the same likelihood
    fv = np.asarray(factor_variances(jnp.asarray(W)))
    np.testing.assert_allclose(fv, np.sort(np.linalg.eigvalsh(W @ W.T))[::-1][:3], rtol=1e-10)
    np.testing.assert_allclose(np.asarray(factor_variances(jnp.asarray(W @ R))), fv, rtol=1e-10)
    assert np.all(np.diff(fv) <= 0)  # descending: no label switching between draws


@pytest.mark.smoke
@pytest.mark.parametrize("D, K", [(1, 1), (5, 2), (12, 4)])
def test_woodbury_log_likelihood_equals_the_dense_gaussian(D, K):
    rng = np.random.default_rng(D)
    N, S = 9, 3
    X = rng.normal(size=(N, D)) * 3.0
    W = rng.normal(size=(S, D, K))
    mu = rng.normal(size=(S, D))
    psi = rng.gamma(2.0, size=(S, D)) + 0.05  # precisions, some large, some small
    ll = np.asarray(marginal_log_likelihood(X, W, mu, psi, per_row=True))
    assert ll.shape == (S, N)
    for s in range(S):
        dense = multivariate_normal(mu[s], W[s] @ W[s].T + np.diag(1.0 / psi[s])).logpdf(X)
        np.testing.assert_allclose(ll[s], np.atleast_1d(dense), rtol=1e-12, atol=1e-10)
    np.testing.assert_allclose(np.asarray(marginal_log_likelihood(X, W, mu, psi)), ll.sum(-1), rtol=1e-13)


def _exact_fa_log_density(X, W, psi):
    """log N(x; 0, W Wᵀ + diag(1/psi)) per row in exact rational arithmetic: the covariance,
    quadratic form and determinant from Fractions of the float inputs (a covariance rounded to
    float64 first would already be off by 1e-8 relative in its 1e-8 noise directions)."""
    from fractions import Fraction
    from math import log, pi

    D, K = W.shape
    Wf = [[Fraction(float(W[i, k])) for k in range(K)] for i in range(D)]
    C = [[sum(Wf[i][k] * Wf[j][k] for k in range(K)) + (1 / Fraction(float(psi[i])) if i == j else 0)
          for j in range(D)] for i in range(D)]
    out = []
    for x in X:
        A = [C[i] + [Fraction(float(x[i]))] for i in range(D)]
        det = Fraction(1)
        for k in range(D):  # C is positive definite: no pivoting needed
            det *= A[k][k]
            for i in range(k + 1, D):
                f = A[i][k] / A[k][k]
                A[i] = [a - f * b for a, b in zip(A[i], A[k])]
        y = [Fraction(0)] * D
        for i in reversed(range(D)):
            y[i] = (A[i][D] - sum(A[i][j] * y[j] for j in range(i + 1, D))) / A[i][i]
        quad = sum(Fraction(float(x[i])) * y[i] for i in range(D))
        out.append(-0.5 * (float(quad) + log(det) + D * log(2 * pi)))
    return np.array(out)


def test_woodbury_log_likelihood_is_accurate_where_the_low_rank_part_dominates():
    """Noise variances 1e-8 of the signal, checked against exact rational arithmetic. The
    covariance has condition number ~1e9; the sum-of-squares Woodbury form keeps 12 digits
    (rtol 1e-12), while the textbook form r'Psi r - m'W'Psi r, which subtracts two numbers of
    order 1e9, and scipy's dense log-density are off by ~1e-7."""
    rng = np.random.default_rng(3)
    D, K, N = 8, 2, 4
    W = rng.normal(size=(D, K))
    psi = np.full(D, 1e8)
    X = rng.normal(size=(N, K)) @ W.T + rng.normal(size=(N, D)) * 1e-4
    exact = _exact_fa_log_density(X, W, psi)
    ll = np.asarray(marginal_log_likelihood(X, W, np.zeros(D), psi, per_row=True))
    np.testing.assert_allclose(ll, exact, rtol=1e-12)
