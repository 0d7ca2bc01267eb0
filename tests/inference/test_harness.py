"""Meta-tests of the Geweke and SBC harness: controls that are wrong in one way only must fail both.

On FA (small problem, the registry's test functions plus mu and its cross-moment):
- **variance only**: mu_d = m_d + 1.6 (draw - m_d): the conditional's mean, 2.6 times its
  variance. The kernel stays equivariant under (mu, X, z) -> (-mu, -X, -z), so the stationary
  mean of mu stays 0: only second moments see the fault; a harness that lost its second-moment
  check passes it.
- **cross-correlation only**: mu_0 and mu_1 drawn with one shared standard normal: each marginal
  is exact, their correlation is 1 instead of ~0. Only cross-moments see it (mu01, and the
  contrast mu0 - mu1 whose spread the correlation sets).
- **one coordinate only**: psi_0's Gamma shape off by N/2, psi_1..psi_3 right.
The right table passes both tests at the same seeds and thresholds, so the thresholds separate.
"""

import jax
import numpy as np
import numpyro.distributions as dist
import pytest

from latentzoo.inference.checks import geweke_test, sbc
from latentzoo.inference.fa import gibbs as fa_gibbs
from latentzoo.inference.gibbs import ConjugateGibbs
from latentzoo.inference.updates import GibbsUpdate
from latentzoo.models.factor_analysis import factor_analysis
from latentzoo.registry import families

FA = families()["fa"]
SMALL = FA.checks.model_kwargs
TEST_FUNCTIONS = {
    **FA.checks.test_functions,
    "mu": lambda v: v["mu"],
    "mu01": lambda v: v["mu"][0] * v["mu"][1],
    # a contrast: its spread is var(mu0) + var(mu1) - 2 cov(mu0, mu1), so a wrong correlation
    # narrows the posterior draws of it and SBC's ranks pile up at the ends
    "mu0_minus_mu1": lambda v: v["mu"][0] - v["mu"][1],
}


def _control(site, transform, name):
    right = {"mu": fa_gibbs.mu_update, "psi": fa_gibbs.psi_update}[site]()

    def draw(key, values, obs, priors):
        d = right.conditional(values, obs, priors)[site]
        return {site: transform(key, d, obs)}

    return GibbsUpdate(f"{site} ({name})", (site,), right.requires, draw=draw)


def variance_only():
    return _control("mu", lambda k, d, obs: d.loc + 1.6 * d.scale * jax.random.normal(k, d.loc.shape),
                    "variance x2.6")


def cross_only():
    def draw(k, d, obs):
        eps = jax.random.normal(k, d.loc.shape)
        eps = eps.at[1].set(eps[0])  # exact marginals, correlation 1 between mu_0 and mu_1
        return d.loc + d.scale * eps

    return _control("mu", draw, "mu0, mu1 share their noise")


def one_coordinate_only():
    def draw(k, d, obs):
        shape = d.concentration.at[0].add(0.5 * obs["X"].shape[0])
        return dist.Gamma(shape, d.rate).sample(k)

    return _control("psi", draw, "psi0 shape + N/2")


CONTROLS = {"variance": variance_only, "cross": cross_only, "one_coordinate": one_coordinate_only}


def _table(control):
    site = control.sites[0]
    return [control if u.name.startswith(site + " ") else u for u in fa_gibbs.fa_updates()]


def _geweke(table):
    return geweke_test(factor_analysis, ConjugateGibbs(factor_analysis, table), SMALL, TEST_FUNCTIONS,
                       jax.random.PRNGKey(5), num_steps=20000, num_prior=8192)


def _sbc(table):
    return sbc(factor_analysis, ConjugateGibbs(factor_analysis, table), SMALL, TEST_FUNCTIONS,
               jax.random.PRNGKey(6), num_simulations=200, num_warmup=50, num_draws=99, thin=3)


@pytest.mark.slow
def test_right_table_passes_both():
    g, s = _geweke(fa_gibbs.fa_updates()), _sbc(fa_gibbs.fa_updates())
    assert g.passed, dict(zip(g.labels, np.round(g.z_scores, 2)))
    assert s.passed, dict(zip(s.labels, np.round(s.p_values, 4)))


@pytest.mark.slow
@pytest.mark.parametrize("control", sorted(CONTROLS))
def test_single_fault_control_fails_geweke(control):
    result = _geweke(_table(CONTROLS[control]()))
    assert not result.passed
    z = dict(zip(result.labels, result.z_scores))
    if control == "variance":
        # the means of mu are right: only the second moments give the control away
        assert max(abs(z[f"mu[{d}]"]) for d in range(4)) < result.threshold
        assert max(abs(z[f"mu[{d}]^2"]) for d in range(4)) > result.threshold
    if control == "cross":
        # each mu_d's mean is right: the cross-moment is what fails
        assert max(abs(z[f"mu[{d}]"]) for d in range(4)) < result.threshold
        assert abs(z["mu01"]) > result.threshold


@pytest.mark.slow
@pytest.mark.parametrize("control", sorted(CONTROLS))
def test_single_fault_control_fails_sbc(control):
    result = _sbc(_table(CONTROLS[control]()))
    assert not result.passed, dict(zip(result.labels, np.round(result.p_values, 4)))
