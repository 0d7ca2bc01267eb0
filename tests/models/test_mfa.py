"""The MFA model: sites, plates, priors, deterministic covariance and the mixture's moments."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest
from numpyro.handlers import condition, seed, trace

from latentzoo.models.mfa import default_priors, mfa


def _trace(**kw):
    return trace(seed(mfa, jax.random.PRNGKey(0))).get_trace(None, **kw)


def test_sites_and_shapes():
    tr = _trace(N=7, D=4, K=2, J=3)
    shapes = {n: tr[n]["value"].shape for n in ["pi", "psi", "mu", "W", "c", "z", "X", "cov"]}
    assert shapes == {
        "pi": (3,), "psi": (4,), "mu": (3, 4), "W": (3, 4, 2),
        "c": (7,), "z": (7, 2), "X": (7, 4), "cov": (3, 4, 4),
    }
    assert jnp.issubdtype(tr["c"]["value"].dtype, jnp.integer)
    assert tr["c"]["value"].min() >= 0 and tr["c"]["value"].max() < 3


def test_labels_live_in_the_data_plate():
    # DiscreteGibbs (the generic fallback) updates element-wise over a plate; a label vector
    # folded into an event (``.to_event``) would be one 3^N-state site instead.
    tr = _trace(N=5, D=2, K=1, J=3)
    assert tr["c"]["fn"].event_shape == ()
    assert [f.name for f in tr["c"]["cond_indep_stack"]] == ["N"]
    assert tr["X"]["fn"].batch_shape == (5,)  # one log-likelihood term per row


def test_cov_is_each_components_marginal_covariance():
    tr = _trace(N=3, D=4, K=2, J=2)
    W, psi, cov = tr["W"]["value"], tr["psi"]["value"], tr["cov"]["value"]
    for j in range(2):
        np.testing.assert_allclose(cov[j], W[j] @ W[j].T + np.diag(1.0 / psi), rtol=1e-12)


def test_sizes_from_data_and_error_without():
    X = jnp.zeros((6, 3))
    tr = trace(seed(mfa, 0)).get_trace(X, K=1, J=2)
    assert tr["z"]["value"].shape == (6, 1) and tr["X"]["is_observed"]
    with pytest.raises(ValueError, match="sizes"):
        mfa(None, K=1, J=2)


def test_prior_overrides_reach_the_sites():
    alpha = jnp.array([1.0, 2.0, 5.0])
    tr = _trace(N=3, D=2, K=1, J=3, priors={"pi": alpha, "psi": dist.Gamma(7.0, 3.0)})
    np.testing.assert_allclose(tr["pi"]["fn"].concentration, alpha)
    assert float(tr["psi"]["fn"].base_dist.concentration) == 7.0
    # the defaults stay untouched by an override
    assert default_priors()["pi"] == 1.0


def test_prior_predictive_moments_match_the_mixture():
    # With parameters fixed, x ~ sum_j pi_j N(mu_j, W_j W_jᵀ + diag(1/psi)): its mean is
    # sum_j pi_j mu_j and its covariance the mixture's. 20000 rows put the standard error of
    # each mean near 0.02 and of each covariance entry near 0.05; the tolerances sit at ~5 SE.
    J, D, K, N = 2, 3, 1, 20000
    p = {
        "pi": jnp.array([0.3, 0.7]),
        "mu": jnp.array([[-2.0, 0.0, 1.0], [1.0, 1.0, -1.0]]),
        "W": jnp.array([[[1.0], [0.5], [0.0]], [[0.0], [1.0], [-1.0]]]),
        "psi": jnp.array([4.0, 2.0, 1.0]),
    }
    m = condition(mfa, data=p)
    tr = trace(seed(m, jax.random.PRNGKey(1))).get_trace(None, N=N, D=D, K=K, J=J)
    X = np.asarray(tr["X"]["value"])
    mean = p["pi"] @ p["mu"]
    covs = np.einsum("jdk,jek->jde", p["W"], p["W"]) + np.diag(1.0 / p["psi"])
    second = np.einsum("j,jde->de", p["pi"], covs + np.einsum("jd,je->jde", p["mu"], p["mu"]))
    np.testing.assert_allclose(X.mean(0), mean, atol=0.1)
    np.testing.assert_allclose(np.cov(X.T), second - np.outer(mean, mean), atol=0.25)
    np.testing.assert_allclose(np.bincount(tr["c"]["value"]) / N, p["pi"], atol=0.02)
