"""The conjugacy-aware builder inside NumPyro's drivers: plans, fallback, reuse, chain methods."""

import warnings
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC, Predictive

from latentzoo import arviz_adapter as azx
from latentzoo.inference.checks import check_move_on_orbit, sbc
from latentzoo.inference.fa import gibbs as fa_gibbs
from latentzoo.inference.gibbs import ConjugacyFallbackWarning, ConjugateGibbs, GenericKernelNote
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
    idata = azx.from_mcmc(mcmc)  # ArviZ 0.2x and 1.x alike
    assert {"posterior", "sample_stats", "log_likelihood", "observed_data"} <= set(azx.group_names(idata))
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


# ------------------------------------------------------------------ plans, warnings, moves
def test_plan_prints_as_a_table():
    kernel = ConjugateGibbs(factor_analysis, fa_gibbs.fa_updates())
    text = str(kernel.plan(_data(N=30, D=4, K=1), K=1, priors={"W": dist.Laplace(0.0, 1.0)}))
    assert "GibbsPlan(" not in text and repr(kernel.plan(_data(), K=2)).startswith("GibbsPlan\n")
    lines = text.splitlines()
    assert any(line.split()[:3] == ["psi", "|", "z,"] and line.endswith("conditional") for line in lines)
    assert any("NUTS" in line and " W " in line and "W is Laplace" in line for line in lines)
    assert any(line.strip().startswith("shear") and "W is Laplace" in line for line in lines)


def test_swapped_prior_warns_at_the_users_line_naming_the_update():
    priors = {"psi": dist.LogNormal(0.0, 1.0)}
    X = _data(N=20, D=3, K=1)
    with pytest.warns(ConjugacyFallbackWarning) as record:
        MCMC(ConjugateGibbs(factor_analysis, fa_gibbs.fa_updates()), num_warmup=2, num_samples=2,
             progress_bar=False).run(jax.random.PRNGKey(0), X, K=1, priors=priors)
    (w,) = [w for w in record if w.category is ConjugacyFallbackWarning]
    assert "update 'psi | z, W, mu' does not apply: psi is LogNormal, the update needs Gamma" \
        in str(w.message)
    assert w.filename == __file__  # the MCMC.run line above, not NumPyro's


def test_a_table_without_an_update_for_a_site_gives_a_note_not_a_swap_warning():
    # NOCA's table with theta="nuts" covers pi and s, and leaves theta, theta0 (no conjugate
    # form) to NUTS by design: nothing was changed, so no "prior swapped" warning
    from latentzoo.inference.checks import simulate
    from latentzoo.inference.noca import noca_kernel
    from latentzoo.models.noca import noca

    _, X = simulate(noca, dict(N=6, D=3, K=2), jax.random.PRNGKey(0))
    kernel = noca_kernel(theta="nuts")
    plan = kernel.plan(X, K=2)
    assert plan.swapped == () and set(plan.by_design) == {"theta", "theta0"}
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        kernel.init(jax.random.PRNGKey(0), 2, None, (X,), {"K": 2})
    fallback = [w for w in record if issubclass(w.category, ConjugacyFallbackWarning)]
    assert [w.category for w in fallback] == [GenericKernelNote]
    assert "by design" in str(fallback[0].message) and "differs" not in str(fallback[0].message)
    assert fallback[0].filename == __file__


def test_a_note_from_code_with_no_file_is_shown_not_raised(tmp_path):
    # ``python -c`` (and an interactive line) runs as ``__main__`` with no file: the note names
    # ``<string>``; handing the warning that module's globals made Python ask its loader for the
    # source, which raised ImportError and ended the run (a NOCA run with theta by NUTS, started
    # from ``python -c``, was lost that way)
    import subprocess
    import sys

    code = "from latentzoo.inference.gibbs_plan import warn_at_caller; warn_at_caller('the note', UserWarning)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "<string>:1: UserWarning: the note" in proc.stderr


@pytest.mark.parametrize("prior", [dist.Laplace(0.0, 1.0), dist.StudentT(3.0, 0.0, 1.0)],
                         ids=["Laplace", "StudentT"])
def test_scale_move_stays_under_a_swapped_W_prior_and_is_exact(prior):
    # The scale move's accept step reads the model's own log density of W and z, so it is exact
    # for any elementwise prior: it stays in the plan (beside NUTS on W) and samples the exact
    # target on its orbit. Its twin that accepts with the Normal density it was first derived
    # for leaves the wrong law (|z| of 70-170 here against a threshold of 2.8; the right one < 2.3).
    kernel = ConjugateGibbs(factor_analysis, fa_gibbs.fa_updates())
    plan = kernel.plan(_data(N=20, D=4, K=1), K=1, priors={"W": prior})
    assert plan.fallback_continuous == ("W",)
    assert any(u.name.startswith("scale") for u in plan.moves)
    kw = dict(N=3, D=6, K=1, priors={"W": prior})
    move = fa_gibbs.scale_move()
    result = check_move_on_orbit(factor_analysis, move, kw, jax.random.PRNGKey(0))
    assert result.passed, (result.z_scores, result.exact_moments, result.chain_moments)
    normal = move._replace(step=lambda k, v, o, p: fa_gibbs.scale_step(k, v, o, {**p, "W": dist.Normal(0.0, 1.0)}))
    wrong = check_move_on_orbit(factor_analysis, normal, kw, jax.random.PRNGKey(0))
    assert not wrong.passed, wrong.z_scores


def test_moves_run_beside_the_nuts_block():
    # With W on NUTS the scale move rescales W's columns after the composite's step; the NUTS
    # block must get the moved W back (unconstrained) with its potential energy refreshed, or its
    # next trajectory starts from a stale energy and accepts with the wrong ratio.
    from numpyro.infer.gibbs import with_conditioning
    from numpyro.infer.util import log_density

    kw = {"K": 1, "priors": {"W": dist.Laplace(0.0, 1.0)}}
    X = _data(N=20, D=4, K=1)
    table = [fa_gibbs.z_update(), fa_gibbs.mu_update(), fa_gibbs.psi_update(), fa_gibbs.scale_move()]
    kernel = ConjugateGibbs(factor_analysis, table)
    with pytest.warns(ConjugacyFallbackWarning):
        state = kernel.init(jax.random.PRNGKey(0), 0, None, (X,), kw)
    state = kernel.sample(state, (X,), kw)
    values = kernel.get_constrain_fn((X,), kw)(state.z)
    ((nuts, hmc),) = [(k, s) for (k, sites), s in zip(kernel._composite.blocks, state.inner.block_states)
                      if tuple(sites) == ("W",)]
    siblings = {k: v for k, v in values.items() if k != "W"}
    pe = nuts.get_potential_fn((X,), with_conditioning(kw, siblings))(hmc.z)
    np.testing.assert_allclose(hmc.potential_energy, pe, rtol=1e-10)
    np.testing.assert_allclose(state.potential_energy,
                               -log_density(factor_analysis, (X,), kw, values)[0], rtol=1e-10)
