"""Geweke, SBC and conditional-consistency tests of the CVQ Gibbs updates, with a broken control.

Thresholds are the harness's Bonferroni-corrected ones (familywise 0.01). The broken tau update
(Gamma shape off by N/2) moves tau's posterior by ~N/(ND) = 1/D relative, i.e. by many posterior
standard deviations at these sizes, so it fails both tests by a wide margin.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC

from latentzoo.inference.cvq import gibbs as cvq_gibbs
from latentzoo.inference.checks import check_conditional, geweke_test, sbc, sbc_runs, simulate
from latentzoo.inference.gibbs import ConjugateGibbs, read_model
from latentzoo.inference.tempering import temper
from latentzoo.inference.updates import GibbsUpdate
from latentzoo.models.cvq import cvq

# tau ~ Gamma(2, 4) (sigma ~ 1.4 against W ~ N(0, 1)) keeps the posterior unimodal enough for the
# short SBC chains; with the default tau prior the s-W posterior has well separated modes, and
# short chains fail SBC by under-dispersion (U-shaped ranks) even though Geweke passes.
SMALL = {"K": 2, "N": 12, "D": 4, "priors": {"tau": dist.Gamma(2.0, 4.0)}}
TEST_FUNCTIONS = {
    "pi": lambda v: v["pi"],
    "tau": lambda v: jnp.log(v["tau"]),
    "W": lambda v: v["W"][:2].ravel(),
    "s_mean": lambda v: v["s"].mean(),
}


def broken_tau_update(knob=1.0):
    """tau | rest with the Gamma shape off by knob x N/2 (knob 0: the right update exactly)."""
    good = cvq_gibbs.tau_update()

    def conditional(values, obs, priors):
        d = good.conditional(values, obs, priors)["tau"]
        N = obs["X"].shape[0]
        return {"tau": dist.Gamma(d.concentration + knob * 0.5 * N, d.rate)}

    return GibbsUpdate("tau (broken)", ("tau",), good.requires, conditional, tempered=True)


def table_with_broken_tau(knob=1.0, with_split_merge=True):
    table = cvq_gibbs.cvq_updates(with_split_merge=with_split_merge)
    return [u for u in table if u.sites != ("tau",)] + [broken_tau_update(knob)]


@pytest.mark.parametrize("update", cvq_gibbs.cvq_updates(with_source_move=False), ids=lambda u: u.name.split()[0])
def test_conditional_matches_joint_density(update):
    assert check_conditional(cvq, update, SMALL, jax.random.PRNGKey(0)) < 1e-9


def test_conditional_check_catches_broken_update():
    assert check_conditional(cvq, broken_tau_update(), SMALL, jax.random.PRNGKey(0)) > 1e-2


def test_plan_has_no_fallback():
    X = jnp.zeros((SMALL["N"], SMALL["D"]))
    plan = ConjugateGibbs(cvq, cvq_gibbs.cvq_updates()).plan(X, K=SMALL["K"])
    assert plan.fallback == ()


def _geweke(table, seed=1):
    kernel = ConjugateGibbs(cvq, table)
    return geweke_test(cvq, kernel, SMALL, TEST_FUNCTIONS, jax.random.PRNGKey(seed), num_steps=5000, num_prior=5000)


def test_geweke_passes():
    r = _geweke(cvq_gibbs.cvq_updates())
    assert r.passed, dict(zip(r.labels, np.round(r.z_scores, 2)))


def test_geweke_fails_broken_tau():
    r = _geweke(table_with_broken_tau())
    assert not r.passed and r.max_abs_z > 2 * r.threshold


def test_sbc_passes_and_fails_broken_tau():
    # knob 0 is the table exactly (tau last, as the broken table orders it), knob 1 the broken
    # tau update: one compiled program
    good, bad = sbc_runs(cvq, lambda knob: ConjugateGibbs(cvq, table_with_broken_tau(knob)), [0.0, 1.0],
                         SMALL, TEST_FUNCTIONS, jax.random.PRNGKey(3), num_simulations=120,
                         num_warmup=30, num_draws=59, thin=2)
    assert good.passed, dict(zip(good.labels, np.round(good.p_values, 4)))
    assert not bad.passed


@pytest.mark.parametrize("beta", [1.0, 0.3])
def test_column_scan_draw_for_large_K_leaves_conditional_invariant(beta):
    # K > ENUM_MAX_K uses the single-site scan: started from an exact draw of the enumerated
    # conditional, one scan must keep the per-source marginals (checked on a K=13 toy by
    # comparing with the enumerated table's marginals), on the tempered posterior too (the
    # enumerated table's tempered form is checked against the joint by the conformance tests).
    K, N, D = 13, 3, 14

    # One jitted program: run eagerly, the simulation and the 2^13-state table would compile
    # each of their primitives on its own.
    @jax.jit
    def draws_and_exact(key):
        values, X = simulate(cvq, {"K": K, "N": N, "D": D}, key)
        priors, obs, _ = read_model(temper(cvq, beta), values, (X,), {"K": K})
        cond = cvq_gibbs.s_conditional(values, obs, priors)["s"]
        exact = jnp.exp(cond.logits) @ cond.states  # (N, K) marginals

        def one(k):
            k1, k2 = jax.random.split(k)
            s0 = cond.sample(k1)
            return cvq_gibbs.s_draw(k2, {**values, "s": s0}, obs, priors)["s"]

        return jax.vmap(one)(jax.random.split(key, 4000)), exact

    draws, exact = draws_and_exact(jax.random.PRNGKey(5))
    assert float(jnp.abs(draws.mean(0) - exact).max()) < 0.04  # 4000 draws: s.e. <= 0.008


def test_replica_exchange_calibrates_where_plain_gibbs_does_not():
    """At the default priors the s-W posterior of a small CVQ has separated modes (see SMALL):
    Gibbs without the split-merge move fails SBC by under-dispersion (pi's ranks p ~ 1e-7 here),
    replica exchange over that tempered table (6 rungs down to beta = 0.05) passes at the same
    budget and seed (smallest p 0.21, measured), and the same kernel with the broken tau update
    fails on 40 of the simulations (p = 2.6e-13 against the threshold 1.25e-3, measured: the
    other 160 added nothing but run time). (The default table, with the split-merge move, passes this SBC by itself: smallest p
    0.07, measured; the table without it is what replica exchange is shown to rescue here, and
    it keeps this test's programs small.)"""
    from latentzoo.inference.samplers import ReplicaExchange

    kw = {"K": 2, "N": 12, "D": 4}
    opts = dict(num_simulations=200, num_warmup=200, num_draws=99, thin=5)
    plain = sbc(cvq, ConjugateGibbs(cvq, cvq_gibbs.cvq_updates(with_split_merge=False)), kw, TEST_FUNCTIONS,
                jax.random.PRNGKey(3), **opts)
    good, bad = sbc_runs(
        cvq, lambda knob: ReplicaExchange(cvq, table_with_broken_tau(knob, with_split_merge=False),
                                     num_replicas=6, min_beta=0.05),
        [0.0, 1.0], kw, TEST_FUNCTIONS, jax.random.PRNGKey(3), **{**opts, "num_simulations": [200, 40]})
    assert not plain.passed, dict(zip(plain.labels, np.round(plain.p_values, 4)))
    assert good.passed, dict(zip(good.labels, np.round(good.p_values, 4)))
    assert not bad.passed


@pytest.mark.parametrize("method", ["gibbs", "em"])
def test_runs_store_the_marginal_pointwise_log_likelihood(method):
    # PSIS-LOO needs log p(x_n | W, pi, sigma) with the sources summed out; NumPyro's own would be
    # p(x_n | s_n, ...), conditional on sources the run does not even store. Checked per draw
    # against the enumeration of the 2^K states row by row.
    from latentzoo import arviz_adapter as azx
    from latentzoo.inference.cvq import cvq_exact_loglik
    from latentzoo.registry import RunConfig, get_family

    family = get_family("cvq")
    X = np.asarray(family.default_data(0))[:30]
    cfg = RunConfig(K=3, chains=2, samples=6, warmup=4, sweeps=5, restarts=1)
    idata = family.method(method).run(X, cfg)
    ll = np.asarray(idata.log_likelihood["X"].transpose("chain", "draw", ...).values)
    lead = (2, 6) if method == "gibbs" else (1, 1)
    assert ll.shape == (*lead, 30)
    c, d = lead[0] - 1, lead[1] - 1
    draw = {k: azx.posterior_array(idata, k)[c, d] for k in ("W", "pi", "sigma")}
    want = cvq_exact_loglik(jnp.asarray(X), draw["W"], draw["pi"], draw["sigma"], per_row=True)
    np.testing.assert_allclose(ll[c, d], want, rtol=1e-10)
    assert np.all(np.isfinite(ll))


def test_chains_from_the_data_driven_start_find_sources_on_digits():
    """Real data: 100 of scikit-learn's digits scaled to [0, 1], K = 8, 4 chains of 10 + 10
    sweeps. From ``init_from_data`` every chain finds sources (sigma about 0.19); the control,
    NumPyro's default start (W uniform on (-2, 2)), leaves chains with every source off (sigma
    0.49, the data's root mean square: measured 3 of 4 chains here). Thresholds: 0.3 lies
    between the two by a wide margin at these seeds."""
    from functools import partial

    from sklearn.datasets import load_digits

    from latentzoo.inference.cvq import cvq_updates, init_from_data

    X = jnp.asarray(load_digits().data[:100] / 16.0)
    sigma = {}
    for start in ("data", "default"):
        init = None if start == "default" else \
            jax.vmap(lambda k: init_from_data(k, X, K=8))(jax.random.split(jax.random.PRNGKey(1), 4))
        mcmc = MCMC(ConjugateGibbs(partial(cvq, K=8), cvq_updates()), num_warmup=10, num_samples=10,
                    num_chains=4, chain_method="vectorized", progress_bar=False)
        mcmc.run(jax.random.PRNGKey(0), X, init_params=init)
        tau = np.asarray(mcmc.get_samples(group_by_chain=True)["tau"])
        sigma[start] = 1.0 / np.sqrt(tau.mean(1))
    assert (sigma["data"] < 0.3).all(), sigma
    assert (sigma["default"] > 0.4).any(), sigma  # the collapse the start avoids


def test_the_data_driven_start_refuses_more_sources_than_rows():
    from latentzoo.inference.cvq import init_from_data

    with pytest.raises(ValueError, match="K must be between 1 and N = 3, got 4"):
        init_from_data(jax.random.PRNGKey(0), jnp.ones((3, 2)), K=4)
