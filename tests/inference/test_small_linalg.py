"""The plain-XLA factorisations agree with LAPACK's to round-off, batched and broadcast, and give
NaN (not garbage) for a matrix that is not positive definite."""

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
import pytest
from numpyro.distributions.util import cholesky_of_inverse as numpyro_cholesky_of_inverse

from latentzoo.inference import small_linalg as sl


@pytest.fixture(scope="module")
def problem():
    A = jax.random.normal(jax.random.PRNGKey(0), (5, 3, 4, 4))
    P = A @ jnp.swapaxes(A, -1, -2) + 0.3 * jnp.eye(4) + jnp.diag(jnp.array([0.0, 1.0, 2.0, 5.0]))
    b = jax.random.normal(jax.random.PRNGKey(1), (5, 3, 4))
    return P, b


def test_cholesky_matches_lapack(problem):
    P, _ = problem
    np.testing.assert_allclose(sl.cholesky(P), jnp.linalg.cholesky(P), atol=1e-12)


def test_triangular_solves_match_lapack(problem):
    P, b = problem
    L = jnp.linalg.cholesky(P)
    lower = jsl.solve_triangular(L, b[..., None], lower=True)[..., 0]
    upper = jsl.solve_triangular(jnp.swapaxes(L, -1, -2), b[..., None], lower=False)[..., 0]
    np.testing.assert_allclose(sl.solve_lower(L, b), lower, atol=1e-12)
    np.testing.assert_allclose(sl.solve_upper(L, b), upper, atol=1e-12)
    np.testing.assert_allclose(sl.cho_solve(L, b), jnp.linalg.solve(P, b[..., None])[..., 0], atol=1e-10)


def test_inverses_match(problem):
    P, _ = problem
    L = jnp.linalg.cholesky(P)
    np.testing.assert_allclose(sl.tril_inverse(L), jnp.linalg.inv(L), atol=1e-12)
    np.testing.assert_allclose(sl.cholesky_of_inverse(P), numpyro_cholesky_of_inverse(P), atol=1e-12)


def test_shared_factor_broadcasts_over_rows(problem):
    P, b = problem
    L = jnp.linalg.cholesky(P[0, 0])
    expected = jnp.linalg.solve(P[0, 0], b.reshape(-1, 4).T).T.reshape(b.shape)
    np.testing.assert_allclose(sl.cho_solve(L, b), expected, atol=1e-10)


def test_indefinite_matrix_gives_nan():
    P = jnp.array([[1.0, 2.0], [2.0, 1.0]])
    assert bool(jnp.isnan(sl.cholesky(P)).any())
