"""AIS on tensor analyzers against the quadrature oracle (latentzoo.inference.ta.oracle), and the
oracle against exact and Monte Carlo answers.

TA{2,2,2}: 2-D data, two groups of 2 factors, parameters drawn at random (additive loadings of
scale 0.5, multiplicative 1, noise s.d. 0.2 unless said otherwise), as the supplement's 2-D
check of its Fig. 3.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from latentzoo.inference.ais import ais, log_mean_exp_with_stderr, prior_sampling_log_marginal
from latentzoo.inference.ta import group_update, ta_updates
from latentzoo.inference.ta.mcem import log_likelihood_estimate
from latentzoo.inference.ta.oracle import ta_oracle_log_marginal
from latentzoo.inference.updates import GibbsUpdate, unwrap
from latentzoo.models.factor_analysis import marginal_log_likelihood
from latentzoo.models.tensor_analyzer import random_ta_parameters, sample_ta, tensor_analyzer

d = (2, 2)
LATENTS = ("z_1", "z_2")


def problem(N=10, noise=0.2, seed=0):
    rng = np.random.default_rng(seed)
    p = random_ta_parameters(rng, 2, d, noise=noise, additive=0.5, multiplicative=1.0)
    X, _ = sample_ta(rng, p, N, d)
    params = {k: jnp.asarray(v) for k, v in p.items()}
    return jnp.asarray(X), params


def oracle(X, p, **kw):
    return ta_oracle_log_marginal(X, p["W"], p["T"], p["mu"], p["Psi"], **kw)


# ------------------------------------------------------------------------------- the oracle
def test_oracle_is_exact_with_one_group():
    """J = 1: x = (W + T) z_1 + mu + eps is factor analysis, whose marginal is closed-form."""
    rng = np.random.default_rng(1)
    W, T = rng.normal(size=(4, 3)), rng.normal(size=(4, 3))
    mu, Psi = rng.normal(size=4), rng.uniform(0.1, 1.0, size=4)
    X = rng.normal(size=(7, 4))
    got = ta_oracle_log_marginal(X, W, T, mu, Psi, per_row=True)
    want = marginal_log_likelihood(jnp.asarray(X), jnp.asarray(W + T), jnp.asarray(mu),
                                   jnp.asarray(1.0 / Psi), per_row=True)
    assert np.allclose(got, want, rtol=0, atol=1e-10)


def test_oracle_rule_has_converged():
    """Composite Gauss-Legendre at 1024 and 2048 points per dimension agree to 1e-6 per row at
    noise 0.1 (and 512 with 1024 to 1e-3); Gauss-Hermite at 80 and 160 points still disagree by
    > 0.03 there (its nodes are too sparse for the ridges of p(x | z_2): why it is not the
    default)."""
    X, p = problem(noise=0.1)
    fine = oracle(X, p, quadrature_points=1024, per_row=True)
    assert np.max(np.abs(oracle(X, p, quadrature_points=2048, per_row=True) - fine)) < 1e-6
    assert np.max(np.abs(oracle(X, p, quadrature_points=512, per_row=True) - fine)) < 1e-3
    h80 = oracle(X, p, quadrature_points=80, rule="hermite", per_row=True)
    h160 = oracle(X, p, quadrature_points=160, rule="hermite", per_row=True)
    assert np.max(np.abs(h80 - h160)) > 0.03


def test_oracle_agrees_with_monte_carlo():
    """Two independent estimators: the TA family's Rao-Blackwellised one (z_1 integrated out,
    2^16 draws of z_2: ~0.01 nats per row here), and prior sampling through the NumPyro model
    (1e5 draws of both groups per row), each within its error."""
    X, p = problem()
    exact = np.asarray(oracle(X, p, per_row=True))
    rb = np.asarray(log_likelihood_estimate(X, p, d=d, num_draws=2**16, per_row=True,
                                            rng_key=jax.random.PRNGKey(0)))
    assert np.max(np.abs(rb - exact)) < 0.03, rb - exact
    ps = prior_sampling_log_marginal(tensor_analyzer, X, p, dict(d=d), latent_sites=LATENTS,
                                     num_samples=100_000, batch=10_000, per_row=True,
                                     rng_key=jax.random.PRNGKey(1))
    err = np.asarray(ps.log_marginal) - exact
    assert np.all(np.abs(err) < 4.0 * np.asarray(ps.stderr) + 1e-3), (err, np.asarray(ps.stderr))


def test_oracle_refuses_large_quadrature():
    with pytest.raises(ValueError, match="at most 3"):
        ta_oracle_log_marginal(np.zeros((2, 2)), np.zeros((2, 6)), np.zeros((2, 2, 2, 2)),
                               np.zeros(2), np.ones(2))


# ------------------------------------------------------------------------------------- AIS
def untempered_group(j):
    """Wrong: z_j's conditional at beta = 1 whatever the temperature."""
    right = group_update(j)

    def strip(priors):
        return {**priors, "X": unwrap(priors["X"])}

    return GibbsUpdate(f"z_{j + 1} ignoring beta", right.sites, right.requires,
                       lambda v, o, pr: right.conditional(v, o, strip(pr)),
                       lambda k, v, o, pr: right.sample(k, v, o, strip(pr)),
                       tempered=True)  # a false claim, so AIS runs it and the bias shows


def ais_rows(X, p, updates, num_temps, num_chains=10, seed=0):
    return ais(tensor_analyzer, updates, X, p, dict(d=d), latent_sites=LATENTS, per_row=True,
               num_chains=num_chains, num_temps=num_temps, rng_key=jax.random.PRNGKey(seed))


@pytest.mark.smoke
def test_ais_matches_the_oracle_at_500_temperatures():
    """M = 10 chains per row, 500 temperatures: the average log-likelihood per data point within
    0.1 nats of the oracle (measured spread of that average over repeats: 0.03-0.04 nats) and the
    total within 3 standard errors."""
    X, p = problem()
    exact = np.asarray(oracle(X, p, per_row=True))
    r = ais_rows(X, p, ta_updates(d), 500)
    err = np.asarray(r.log_marginal) - exact
    assert abs(err.mean()) < 0.1, err
    assert abs(err.sum()) < 3.0 * float(jnp.sqrt(jnp.sum(r.stderr**2))), err


def test_ais_with_an_untempered_group_update_is_rejected():
    """The same check fails a table whose z_2 draw ignores beta (z_1 right, no collapsed move)."""
    X, p = problem()
    exact = np.asarray(oracle(X, p, per_row=True))
    table = [group_update(0), untempered_group(1)]
    r = ais_rows(X, p, table, 500)
    err = np.asarray(r.log_marginal) - exact
    assert abs(err.mean()) > 0.1 and abs(err.sum()) > 3.0 * float(jnp.sqrt(jnp.sum(r.stderr**2))), err


@pytest.mark.slow
def test_ais_spread_below_a_tenth_of_a_nat_at_small_noise():
    """Noise s.d. 0.1 (posterior near a curved surface): 10 repeats of M = 10 chains at 1000
    temperatures; the average per data point has spread < 0.1 nats and mean within 0.1 nats."""
    X, p = problem(noise=0.1)
    exact = np.asarray(oracle(X, p, per_row=True))
    r = ais_rows(X, p, ta_updates(d), 1000, num_chains=100)
    runs = np.asarray(log_mean_exp_with_stderr(r.log_weights.reshape(X.shape[0], 10, 10))[0])
    avg = runs.mean(0) - exact.mean()  # (repeats,): each repeat's average error per data point
    assert avg.std(ddof=1) < 0.1 and abs(avg.mean()) < 0.1, avg
