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


@pytest.mark.slow
def test_gibbs_runner_starts_from_a_map_fit_and_keeps_sources_alive():
    # Two to three minutes on 2 cores (marked slow). 50 attribute-like rows x 85 items, K = 3: a
    # chain started from the prior switches sources off for good (posterior means of pi 0.13,
    # 0.02, 0.03 at this seed and length; 0.02 = 1 / (N + 2) is a source that is never on);
    # started from the exact MAP-EM fit, every source stays on (true pi in 0.2-0.5).
    from latentzoo.models.noca import attribute_parameters, simulate_noca
    from latentzoo.registry import RunConfig, get_family

    X = simulate_noca(*attribute_parameters(0), 50, np.random.default_rng(0))[0]
    gibbs = next(m for m in get_family("noca").methods if m.name == "gibbs")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConjugacyFallbackWarning)
        idata = gibbs.run(X, RunConfig(K=3, chains=1, samples=20, warmup=20, progress=False))
    pi = np.asarray(idata.posterior["pi"]).reshape(-1, 3)
    assert pi.mean(0).min() > 0.1, pi.mean(0)
