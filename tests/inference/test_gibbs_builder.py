"""The conjugacy-aware builder inside NumPyro's drivers: plans, fallback, reuse, chain methods."""

import warnings
from functools import partial

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC, Predictive

from latentzoo.inference.fa import gibbs as fa_gibbs
from latentzoo.inference.checks import sbc
from latentzoo.inference.gibbs import ConjugacyFallbackWarning, ConjugateGibbs
from latentzoo.models.factor_analysis import factor_analysis

from .fa_fixtures import TEST_FUNCTIONS


def _data(seed=0, N=40, D=5, K=2, **kw):
    sim = Predictive(factor_analysis, num_samples=1)(jax.random.PRNGKey(seed), N=N, D=D, K=K, **kw)
    return sim["X"][0]


def test_mcmc_runs_with_numpyro_and_arviz():
    X = _data()
    mcmc = MCMC(
        ConjugateGibbs(factor_analysis, fa_gibbs.fa_updates()),
        num_warmup=50,
        num_samples=100,
        num_chains=2,
        chain_method="sequential",
        progress_bar=False,
    )
    mcmc.run(jax.random.PRNGKey(1), X, K=2)
    samples = mcmc.get_samples(group_by_chain=True)
    assert samples["W"].shape == (2, 100, 5, 2)
    assert samples["cov"].shape == (2, 100, 5, 5)
    mcmc.print_summary(exclude_deterministic=False)
    idata = az.from_numpyro(mcmc)
    assert {"posterior", "sample_stats", "log_likelihood", "observed_data"} <= set(idata.groups())
    assert idata.log_likelihood["X"].shape == (2, 100, 40)


def test_all_conjugate_plan_has_no_fallback():
    plan = ConjugateGibbs(factor_analysis, fa_gibbs.fa_updates()).plan(_data(), K=2)
    assert plan.fallback == ()
    assert [u.sites for u in plan.updates][:4] == [("z",), ("W",), ("mu",), ("psi",)]


def test_vectorized_chains_match_shapes():
    X = _data()
    mcmc = MCMC(
        ConjugateGibbs(factor_analysis, fa_gibbs.fa_updates()),
        num_warmup=20,
        num_samples=30,
        num_chains=3,
        chain_method="vectorized",
        progress_bar=False,
    )
    mcmc.run(jax.random.PRNGKey(2), X, K=2)
    cov = mcmc.get_samples(group_by_chain=True)["cov"]
    assert cov.shape == (3, 30, 5, 5)
    # chains are distinct draws, not copies
    assert not np.allclose(cov[0], cov[1])


def test_one_kernel_serves_new_data():
    # One kernel and one compiled run for both data sets, as the CLI runs it: K bound into the
    # model (it fixes shapes) and the data an argument of the compiled run (jit_model_args), not a
    # constant baked into it, so the second data set reuses the first one's program. A kernel that
    # kept the first data set (in its state, its plan or a closure) would leave mu 25 away.
    kernel = ConjugateGibbs(partial(factor_analysis, K=2), fa_gibbs.fa_updates())
    mcmc = MCMC(kernel, num_warmup=100, num_samples=100, progress_bar=False, jit_model_args=True)
    means = []
    for seed, shift in ((0, 0.0), (1, 25.0)):
        X = _data(seed) + shift
        mcmc.run(jax.random.PRNGKey(seed), X)
        means.append(mcmc.get_samples()["mu"].mean(0))
        np.testing.assert_allclose(means[-1], X.mean(0), atol=1.0)


def test_init_params_are_used_and_checked():
    X = _data()
    kernel = ConjugateGibbs(factor_analysis, fa_gibbs.fa_updates())
    state = kernel.init(jax.random.PRNGKey(0), 0, {"mu": jnp.full(5, 3.0)}, (X,), {"K": 2})
    np.testing.assert_allclose(state.z["mu"], 3.0)
    with pytest.raises(ValueError, match="sites"):
        kernel.init(jax.random.PRNGKey(0), 0, {"nope": 1.0}, (X,), {"K": 2})


def test_hyperparameter_edit_keeps_conjugate_update_and_moves_draws():
    # A tight Gamma(400, 40) prior (mean 10) on psi with N=3 rows: the conjugate psi draws must
    # follow it (posterior ~ prior), far from anything the default Gamma(2, 1) would give.
    priors = {"psi": dist.Gamma(400.0, 40.0)}
    X = _data(N=3, D=4, K=1, priors=priors)
    kernel = ConjugateGibbs(factor_analysis, fa_gibbs.fa_updates())
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConjugacyFallbackWarning)
        assert kernel.plan(X, K=1, priors=priors).fallback == ()
        mcmc = MCMC(kernel, num_warmup=100, num_samples=2000, progress_bar=False)
        mcmc.run(jax.random.PRNGKey(0), X, K=1, priors=priors)
    psi = mcmc.get_samples()["psi"]
    assert abs(float(psi.mean()) - 10.0) < 0.3
    assert abs(float(psi.std()) - 0.5) < 0.1  # Gamma(400, 40) has sd 0.5


def test_family_change_falls_back_to_nuts_and_warns_once():
    priors = {"W": dist.Laplace(0.0, 1.0)}
    X = _data(N=30, D=4, K=1)
    kernel = ConjugateGibbs(factor_analysis, fa_gibbs.fa_updates())
    plan = kernel.plan(X, K=1, priors=priors)
    assert plan.fallback_continuous == ("W",)
    assert any("W is Laplace" in why for _, why in plan.dropped)
    with pytest.warns(ConjugacyFallbackWarning, match=r"W \(NUTS\)"):
        mcmc = MCMC(kernel, num_warmup=100, num_samples=100, progress_bar=False)
        mcmc.run(jax.random.PRNGKey(0), X, K=1, priors=priors)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConjugacyFallbackWarning)  # second run: no new warning
        mcmc.run(jax.random.PRNGKey(1), X, K=1, priors=priors)
    assert mcmc.get_samples()["cov"].shape == (100, 4, 4)
    with pytest.raises(ValueError, match="vectorized"):
        MCMC(kernel, num_warmup=5, num_samples=5, num_chains=2, chain_method="vectorized",
             progress_bar=False).run(jax.random.PRNGKey(0), X, K=1, priors=priors)


def test_laplace_loadings_pass_sbc_through_fallback():
    # SBC of the composite (conjugate z/mu/psi + NUTS on Laplace W). A wrong conditioning in the
    # composite (e.g. NUTS seeing stale data) skews cov ranks well below p = 0.01/F at 100 sims.
    priors = {"W": dist.Laplace(0.0, 1.0), "mu": dist.Normal(0.0, 1.0)}
    kernel = ConjugateGibbs(factor_analysis, fa_gibbs.fa_updates())
    with pytest.warns(ConjugacyFallbackWarning):
        result = sbc(
            factor_analysis,
            kernel,
            dict(N=10, D=3, K=1, priors=priors),
            {k: TEST_FUNCTIONS[k] for k in ("psi", "cov_diag", "cov01")},
            jax.random.PRNGKey(2),
            num_simulations=100,
            num_warmup=100,
            num_draws=49,
            thin=2,
            num_bins=5,
        )
    assert result.passed, dict(zip(result.labels, np.round(result.p_values, 4)))


def test_init_params_are_constrained_values_on_the_fallback_path_too():
    # psi is positive; on the fallback path NUTS owns it and works unconstrained, so the kernel
    # must map the user's constrained value (psi = 4) through the bijection, not take it as log psi.
    priors = {"psi": dist.LogNormal(0.0, 1.0)}
    X = _data(N=20, D=3, K=1)
    kernel = ConjugateGibbs(factor_analysis, fa_gibbs.fa_updates())
    with pytest.warns(ConjugacyFallbackWarning, match=r"psi \(NUTS\)"):
        state = kernel.init(jax.random.PRNGKey(0), 10, {"psi": jnp.full(3, 4.0)}, (X,),
                            {"K": 1, "priors": priors})
    values = kernel.get_constrain_fn((X,), {"K": 1, "priors": priors})(state.z)
    np.testing.assert_allclose(values["psi"], 4.0, rtol=1e-10)
