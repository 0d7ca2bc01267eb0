"""The NOCA model file: the NoisyOrBeta prior (a Beta prior on p written on theta = -log(1 - p))
and the simulated sets of the experiments."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest
from scipy.integrate import quad

from latentzoo.models.noca import (
    NoisyOrBeta,
    attribute_parameters,
    basket_parameters,
    default_priors,
    simulate_noca,
)


@pytest.mark.parametrize("a,b", [(1.0, 2.0), (2.0, 2.0), (0.7, 3.0), (3.5, 0.4)])
def test_noisy_or_beta_is_the_beta_density_of_p_times_the_jacobian(a, b):
    theta = jnp.array([1e-6, 0.01, 0.3, 1.0, 4.0, 20.0])
    p = -jnp.expm1(-theta)
    # p(theta) = Beta(p; a, b) |dp/dtheta| with dp/dtheta = exp(-theta)
    expected = dist.Beta(a, b).log_prob(p) - theta
    # (rtol 1e-7: at theta = 20 the Beta side loses digits forming 1 - p; ours does not)
    np.testing.assert_allclose(NoisyOrBeta(a, b).log_prob(theta), expected, rtol=1e-7)
    total, _ = quad(lambda t: float(jnp.exp(NoisyOrBeta(a, b).log_prob(t))), 0.0, 80.0, limit=200)
    assert total == pytest.approx(1.0, abs=1e-6)


def test_noisy_or_beta_draws_have_its_mean_and_variance():
    d = NoisyOrBeta(jnp.array([1.0, 2.0]), jnp.array([2.0, 0.5]))
    x = d.sample(jax.random.PRNGKey(0), (100_000,))
    assert x.shape == (100_000, 2) and bool(jnp.all(x > 0))
    # standard errors of the mean are below 0.01 here; a wrong Beta orientation moves it by > 0.5
    np.testing.assert_allclose(x.mean(0), d.mean, rtol=0.02)
    np.testing.assert_allclose(x.var(0), d.variance, rtol=0.05)


def test_noisy_or_beta_with_a_equal_one_is_finite_at_zero():
    assert float(NoisyOrBeta(1.0, 2.0).log_prob(0.0)) == pytest.approx(np.log(2.0))


def test_default_priors_are_the_families_the_point_fits_read():
    p = default_priors()
    assert isinstance(p["pi"], dist.Beta)
    assert isinstance(p["theta"], NoisyOrBeta) and isinstance(p["theta0"], NoisyOrBeta)


def test_simulated_sets_have_the_intended_sparsity():
    rng = np.random.default_rng(0)
    Xb = simulate_noca(*basket_parameters(0), 10_000, rng)[0]
    assert Xb.shape == (10_000, 169) and 0.022 < Xb.mean() < 0.030  # about 4.4 items per row
    Xa = simulate_noca(*attribute_parameters(0), 2_000, rng)[0]
    assert Xa.shape == (2_000, 85) and 0.25 < Xa.mean() < 0.40
