"""Annealed importance sampling (latentzoo.inference.ais) on factor analysis, where log p(X) is exact.

With W, mu, psi fixed, z integrates out: x_n ~ N(mu + W m_z, s_z^2 W Wᵀ + diag(1/psi)) for the
prior z ~ N(m_z, s_z^2). The parameters are one prior draw at non-default hyperparameters, z's
prior included, so an update or a weight that read a default would be caught.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest

from latentzoo.inference.ais import (
    AISResult,
    ais,
    beta_schedule,
    log_mean_exp_with_stderr,
    prior_sampling_log_marginal,
)
from latentzoo.inference.ais_weights import AISSetup, compiled_weights, supplement_log_c, supplement_log_weights
from latentzoo.inference.checks import check_conditional, simulate
from latentzoo.inference.fa import gibbs as fa_gibbs
from latentzoo.inference.gaussian import gaussian_draw, mvn_from_precision
from latentzoo.inference.tempering import temper
from latentzoo.inference.updates import GibbsUpdate, unwrap
from latentzoo.models.factor_analysis import factor_analysis, marginal_log_likelihood

Z_LOC, Z_SCALE = 0.3, 0.7
PRIORS = {
    "W": dist.Normal(0.0, 1.5),
    "mu": dist.Normal(0.5, 2.0),
    "psi": dist.Gamma(4.0, 2.0),
    "z": dist.Normal(Z_LOC, Z_SCALE),
}
K = 2


def problem(N, D=5, seed=3):
    """(X, params, exact log p(X | params)) from one prior-predictive draw."""
    values, X = simulate(factor_analysis, dict(K=K, N=N, D=D, priors=PRIORS), jax.random.PRNGKey(seed))
    params = {k: values[k] for k in ("W", "mu", "psi")}
    W, mu, psi = params["W"], params["mu"], params["psi"]
    exact = marginal_log_likelihood(X, Z_SCALE * W, mu + W @ jnp.full(K, Z_LOC), psi, per_row=True)
    return X, params, exact


def untempered_z_update() -> GibbsUpdate:
    """Wrong: z's conditional at beta = 1 whatever the temperature (the likelihood read through
    its wrapper, so beta is dropped): the control that AIS and the tempered check must reject."""

    def natural(values, obs, priors):
        return fa_gibbs.z_natural(values, obs, {**priors, "X": unwrap(priors["X"])})

    return GibbsUpdate(
        "z ignoring beta", ("z",), fa_gibbs.z_update().requires,
        lambda v, o, p: {"z": mvn_from_precision(*natural(v, o, p))},
        lambda k, v, o, p: {"z": gaussian_draw(k, *natural(v, o, p))},
        tempered=True,  # a false claim, so AIS runs it and the bias shows
    )


def test_ais_refuses_updates_that_ignore_the_temperature():
    import pytest

    rng = np.random.default_rng(0)
    X = rng.normal(size=(6, 3))
    update = untempered_z_update()._replace(tempered=False)
    params = {"W": jnp.zeros((3, 2)), "mu": jnp.zeros(3), "psi": jnp.ones(3)}
    with pytest.raises(ValueError, match="temperature"):
        ais(factor_analysis, [update], X, params, {"K": 2}, latent_sites=("z",),
            rng_key=jax.random.PRNGKey(0), num_temps=5)


def run(X, params, updates=None, **kw):
    opts = dict(latent_sites=("z",), rng_key=jax.random.PRNGKey(1))
    return ais(factor_analysis, fa_gibbs.fa_updates() if updates is None else updates, X, params,
               dict(K=K, priors=PRIORS), **{**opts, **kw})


@pytest.fixture(scope="module")
def fa20():
    X, params, exact = problem(N=20)
    # 4000 temperatures and 100 chains: the estimate's spread over seeds is ~0.03 nats (measured
    # over 8 seeds at 2000 x 50: sd 0.06), so 0.1 nats is > 3 sd away for a right sampler.
    return X, params, float(exact.sum()), run(X, params, num_chains=100, num_temps=4000)


# ------------------------------------------------------------------------- the FA z update
def test_tempered_z_conditional_matches_tempered_joint():
    kw = dict(N=12, D=4, K=2, priors=PRIORS)
    err = check_conditional(temper(factor_analysis, 0.3), fa_gibbs.z_update(), kw, jax.random.PRNGKey(0))
    assert err < 1e-9


def test_untempered_z_update_fails_the_tempered_check():
    kw = dict(N=12, D=4, K=2, priors=PRIORS)
    err = check_conditional(temper(factor_analysis, 0.3), untempered_z_update(), kw, jax.random.PRNGKey(0))
    # a wrong precision changes Δlog q by O(1) relative to Δlog p; round-off is ~1e-15
    assert err > 1e-2


# --------------------------------------------------------------------------- AIS estimates
@pytest.mark.smoke
def test_ais_matches_exact_log_marginal(fa20):
    X, params, exact, result = fa20
    assert isinstance(result, AISResult) and result.log_weights.shape == (100,)
    err = float(result.log_marginal) - exact
    assert abs(err) < 3.0 * float(result.stderr), (err, float(result.stderr))
    assert abs(err) < 0.1, err
    assert float(result.ess) > 50  # weights nearly even: the standard error is trustworthy


def test_ais_per_row_at_the_supplements_setting():
    """Each row on its own, M = 10 chains, 500 temperatures (the supplement's Fig. 3 setting): the
    estimates' spread over 10 independent runs is below 0.1 nats and their mean within 0.1 nats
    of the exact log p(x_n). (Measured: spread 0.05-0.06 nats per row; the mean of 10 runs has
    sd ~0.02, so 0.1 is ~5 sd away; a transition that ignores beta is off by nats.)"""
    X, params, exact = problem(N=4)
    # 100 chains per row = 10 independent runs of M = 10
    r = run(X, params, num_chains=100, num_temps=500, per_row=True)
    assert r.log_marginal.shape == r.stderr.shape == (4,) and r.log_weights.shape == (4, 100)
    runs = np.asarray(log_mean_exp_with_stderr(r.log_weights.reshape(4, 10, 10))[0])  # (rows, runs)
    assert np.all(runs.std(1, ddof=1) < 0.1), runs.std(1, ddof=1)
    assert np.all(np.abs(runs.mean(1) - np.asarray(exact)) < 0.1), runs.mean(1) - np.asarray(exact)
    # the per-row estimate is the log-mean-exp of all 100 chains of that row
    assert np.allclose(r.log_marginal, log_mean_exp_with_stderr(r.log_weights)[0])


def test_untempered_transition_gives_a_biased_estimate(fa20):
    X, params, exact, _ = fa20
    # Drawing z from the beta = 1 posterior at every step makes log w an average of log p(X | z)
    # over the posterior: too high by about KL(posterior || prior), tens of nats here.
    r = run(X, params, [untempered_z_update()], num_chains=100, num_temps=4000)
    err = float(r.log_marginal) - exact
    assert abs(err) > 3.0 * float(r.stderr) and abs(err) > 0.1, err


def test_prior_sampling_agrees_on_a_small_problem():
    X, params, exact = problem(N=2)
    r = prior_sampling_log_marginal(factor_analysis, X, params, dict(K=K, priors=PRIORS),
                                    latent_sites=("z",), num_samples=100_000, batch=10_000,
                                    rng_key=jax.random.PRNGKey(0))
    err = float(r.log_marginal) - float(exact.sum())
    assert r.log_weights.shape == (100_000,)
    assert abs(err) < 3.0 * float(r.stderr) and abs(err) < 0.05, err


def test_prior_sampling_per_row():
    X, params, exact = problem(N=5)
    r = prior_sampling_log_marginal(factor_analysis, X, params, dict(K=K, priors=PRIORS),
                                    latent_sites=("z",), num_samples=20_000, batch=5_000,
                                    rng_key=jax.random.PRNGKey(0), per_row=True)
    assert r.log_marginal.shape == (5,) and r.log_weights.shape == (5, 20_000)
    err = np.asarray(r.log_marginal) - np.asarray(exact)
    # one row has a 2-D latent: 2e4 prior draws give ~0.01 nats (a row's own draws, not shared)
    assert np.all(np.abs(err) < 4.0 * np.asarray(r.stderr)) and np.all(np.abs(err) < 0.05), err


def test_prior_sampling_fails_where_ais_works(fa20):
    """At N = 20 the posterior of z (40 dimensions) is far narrower than its prior."""
    X, params, exact, _ = fa20
    r = prior_sampling_log_marginal(factor_analysis, X, params, dict(K=K, priors=PRIORS),
                                    latent_sites=("z",), num_samples=10_000, rng_key=jax.random.PRNGKey(0))
    assert float(r.log_marginal) < exact - 10.0


# ------------------------------------------------------------- the supplement's C(beta)
def test_supplement_constant():
    """Eq. 19 as printed does not normalise the tempered likelihood; with log|Psi / beta| for its
    log|beta Psi| it does. Both vanish at beta = 1 and are infinite at beta = 0."""
    var = jnp.array([0.5, 2.0, 1.3])
    x, e = jnp.array([0.1, -1.0, 2.0]), jnp.array([0.4, 0.2, 1.0])
    for beta in (0.2, 0.7):
        lhs = beta * dist.Normal(e, jnp.sqrt(var)).log_prob(x).sum()
        rhs = dist.Normal(e, jnp.sqrt(var / beta)).log_prob(x).sum()
        fixed = supplement_log_c(beta, var, as_printed=False)
        assert abs(float(lhs + fixed - rhs)) < 1e-12
        printed = supplement_log_c(beta, var)
        assert abs(float(printed - fixed + 3 * np.log(beta))) < 1e-12  # fixed = printed + D log beta
    for as_printed, at_zero in ((True, np.inf), (False, -np.inf)):
        assert abs(float(supplement_log_c(1.0, var, as_printed=as_printed))) < 1e-12
        assert float(supplement_log_c(0.0, var, as_printed=as_printed)) == at_zero


def test_supplement_weights_give_a_wrong_answer(fa20):
    X, params, exact, result = fa20
    var, N = 1.0 / params["psi"], X.shape[0]
    # from beta_0 = 0 the weights carry -C(0): zero as printed, infinite when normalising
    est, _ = log_mean_exp_with_stderr(supplement_log_weights(result, var, N))
    assert float(est) == -np.inf
    est, _ = log_mean_exp_with_stderr(supplement_log_weights(result, var, N, as_printed=False))
    assert float(est) == np.inf
    # starting the same path at beta_0 = 1e-3 instead leaves a bias of -C(1e-3), hundreds of nats
    shifted = result._replace(betas=result.betas.at[0].set(1e-3))
    est, _ = log_mean_exp_with_stderr(supplement_log_weights(shifted, var, N))
    assert float(est) - exact < -100.0
    assert abs(float(est) - exact + float(supplement_log_c(1e-3, var, N))) < 0.2


# -------------------------------------------------------------------------- schedules, input
@pytest.mark.parametrize("kind", ["sigmoid", "geometric", "linear"])
def test_schedules_run_from_zero_to_one(kind):
    b = beta_schedule(50, kind)
    assert b.shape == (50,) and b[0] == 0.0 and b[-1] == 1.0 and np.all(np.diff(b) > 0)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(num_chains=1), "num_chains"),
        (dict(schedule=np.array([0.0, 0.6, 0.4, 1.0])), "strictly increases"),
        (dict(schedule=np.array([0.0, 0.0, 0.5, 1.0])), "strictly increases"),
        (dict(schedule=np.array([0.1, 1.0])), "starts at 0"),
        (dict(schedule="cosine"), "schedule must be one of"),
        (dict(num_temps=1), "num_temps"),
        (dict(latent_sites=("q",)), "not latent sample sites"),
        (dict(data_site="Y"), "no observed site"),
        (dict(updates=[fa_gibbs.psi_update()]), "samples the latent sites ['z']"),
    ],
)
def test_bad_input_is_one_sentence(kwargs, words):
    X, params, _ = problem(N=3)
    updates = kwargs.pop("updates", None)
    with pytest.raises(ValueError, match=None) as info:
        run(X, params, updates, **kwargs)
    message = str(info.value)
    assert words in message and message.count(". ") == 0, message


def test_per_row_needs_per_row_latents():
    X, params, _ = problem(N=3)
    with pytest.raises(ValueError, match="one entry per row"):
        ais(factor_analysis, fa_gibbs.fa_updates(), X, {"W": params["W"], "psi": params["psi"]},
            dict(K=K, priors=PRIORS), latent_sites=("z", "mu"), per_row=True, rng_key=jax.random.PRNGKey(0))


def test_params_must_be_the_parameter_sites():
    X, params, _ = problem(N=3)
    with pytest.raises(ValueError, match=re.escape("['psi'] are missing")):
        run(X, {k: params[k] for k in ("W", "mu")})
    with pytest.raises(ValueError, match="has shape"):
        run(X, {**params, "mu": params["mu"][:2]})
    with pytest.raises(ValueError, match="finite"):
        run(X.at[0, 0].set(jnp.nan), params)


def test_a_rebuilt_table_reuses_the_compiled_program():
    """fa_updates() makes new records on every call; the cache matches them by what they compute
    (a second compilation would cost seconds per estimate), and tells a different update apart."""
    z = (fa_gibbs.z_update(),)
    setup = AISSetup(factor_analysis, z, (("K", K),), ("z",), "X")
    assert compiled_weights(setup) is compiled_weights(setup._replace(updates=(fa_gibbs.z_update(),)))
    assert compiled_weights(setup) is not compiled_weights(setup._replace(updates=(untempered_z_update(),)))
    assert compiled_weights(setup) is not compiled_weights(setup._replace(static_kwargs=(("K", 3),)))


def test_row_params_leave_a_rows_missing_entries_out_and_latents_come_back():
    """``row_params``: each row its own noise precisions, 1e-10 at the entries it lacks, so AIS
    estimates the density of its observed entries (plus a known constant) in one program: within
    0.1 nats of the exact marginal on those columns (the same tolerance as the complete rows'
    test). ``return_latents``: every chain's final z, (rows, chains, 1, K), finite."""
    X, params, _ = problem(N=4)
    missing = np.zeros(X.shape, bool)
    missing[0, 1] = missing[2, [0, 3]] = True
    tiny = 1e-10
    psi_rows = jnp.where(missing, tiny, params["psi"][None])
    r = run(jnp.where(missing, 0.0, X), params, num_chains=100, num_temps=500, per_row=True,
            row_params={"psi": psi_rows}, return_latents=True)
    estimate = np.asarray(r.log_marginal) - 0.5 * np.log(tiny / (2 * np.pi)) * missing.sum(1)
    W, mu, psi = (np.asarray(params[k]) for k in ("W", "mu", "psi"))
    for n in range(X.shape[0]):
        o = ~missing[n]
        exact = marginal_log_likelihood(X[n:n + 1, o], Z_SCALE * W[o], mu[o] + W[o] @ jnp.full(K, Z_LOC), psi[o],
                                        per_row=True)[0]
        assert abs(estimate[n] - float(exact)) < 0.1, (n, estimate[n], float(exact))
    assert r.latents["z"].shape == (4, 100, 1, K) and np.isfinite(np.asarray(r.latents["z"])).all()


def test_row_params_are_checked():
    X, params, _ = problem(N=4)
    with pytest.raises(ValueError, match="needs per_row=True"):
        run(X, params, num_temps=5, row_params={"psi": jnp.ones((4, 5))})
    with pytest.raises(ValueError, match="leading axis of 4 rows"):
        run(X, params, num_temps=5, per_row=True, row_params={"psi": jnp.ones((3, 5))})
    with pytest.raises(ValueError, match="must be parameter sites"):
        run(X, params, num_temps=5, per_row=True, row_params={"z": jnp.ones((4, 2))})
