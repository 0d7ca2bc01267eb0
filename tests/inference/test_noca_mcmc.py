"""NOCA MCMC through the builder's fallback path (pi conjugate; s DiscreteGibbs; theta NUTS)."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpyro.infer import MCMC

from latentzoo.inference.checks import sbc, simulate
from latentzoo.inference.gibbs import ConjugacyFallbackWarning
from latentzoo.inference.noca.mcmc import noca_kernel
from latentzoo.models.noca import noca

SMALL = {"K": 2, "N": 6, "D": 3}
TEST_FUNCTIONS = {
    "pi": lambda v: v["pi"],
    "log_theta": lambda v: jnp.log(v["theta"][:, 0]),
    "log_theta0": lambda v: jnp.log(v["theta0"][:1]),
    "s_mean": lambda v: v["s"].mean(),
}


def test_plan_uses_the_fallback():
    _, X = simulate(noca, SMALL, jax.random.PRNGKey(0))
    plan = noca_kernel().plan(X, K=2)
    assert [u.name for u in plan.updates] == ["pi | s"]
    assert set(plan.fallback_continuous) == {"theta", "theta0"}
    assert plan.fallback_discrete == ("s",)


def test_mcmc_runs_and_warns():
    _, X = simulate(noca, SMALL, jax.random.PRNGKey(0))
    mcmc = MCMC(noca_kernel(), num_warmup=20, num_samples=20, progress_bar=False)
    with pytest.warns(ConjugacyFallbackWarning):
        mcmc.run(jax.random.PRNGKey(1), X, K=2)
    s = mcmc.get_samples()
    assert s["theta"].shape == (20, 2, 3) and s["s"].shape == (20, 6, 2)
    assert bool(jnp.all(s["theta"] > 0)) and set(np.unique(np.asarray(s["s"]))) <= {0, 1}


@pytest.mark.slow
def test_sbc_small_problem():
    # Several minutes on 2 cores (marked slow): 100 simulations of a 6 x 3 problem with 2
    # sources, ranks of 19 draws in 5 bins, Bonferroni-corrected chi-square tests.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConjugacyFallbackWarning)
        r = sbc(noca, noca_kernel(), SMALL, TEST_FUNCTIONS, jax.random.PRNGKey(2),
                num_simulations=100, num_warmup=30, num_draws=19, thin=2, num_bins=5)
    assert r.passed, dict(zip(r.labels, np.round(r.p_values, 4)))
