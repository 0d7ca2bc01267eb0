"""The Monte Carlo EM driver (latentzoo.inference.mcem) on factor analysis, where log p(X) is exact.

The E-step is FA's hand-derived z update alone (parameters held fixed); the M-step below is
maximum likelihood from the draws' moments: [W mu] by least squares on the features [z; 1] and the
noise variances from the residual second moment. Exact EM's maximum likelihood (the zoo's MAP-EM
with flat priors) is the reference.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest

from latentzoo.inference.fa.fit import fit_fa_variational
from latentzoo.inference.fa.gibbs import fa_updates, z_update
from latentzoo.inference.mcem import MCEM, MCEMResult, MCEMState, doubling_schedule
from latentzoo.models.factor_analysis import default_fa_data, factor_analysis, marginal_log_likelihood

K, D, N = 2, 10, 300
X = jnp.asarray(default_fa_data(0, N=N, D=D, K=K))
START = {
    "W": jnp.asarray(np.random.default_rng(1).normal(size=(D, K))),
    "mu": jnp.zeros(D),
    "psi": jnp.ones(D),
}


def fa_m_step(samples, X, params):
    """ML M-step from draws z (S, N, K): B = [W mu] solves B G = A with G = mean_s sum_n f fᵀ,
    A = sum_n x mean_s fᵀ, f = [z; 1]; noise variance diag(sum x xᵀ - B Aᵀ) / N; psi its inverse."""
    z = samples["z"]
    S, n, k = z.shape
    F = jnp.concatenate([z, jnp.ones((S, n, 1), z.dtype)], -1)
    G = jnp.einsum("snf,sng->fg", F, F) / S
    A = X.T @ F.mean(0)
    B = jax.scipy.linalg.cho_solve((jnp.linalg.cholesky(G), True), A.T).T
    var = (jnp.sum(X * X, 0) - jnp.sum(B * A, 1)) / n
    return {"W": B[:, :k], "mu": B[:, k], "psi": 1.0 / var}


def psi_off_m_step(samples, X, params):
    """Wrong: noise precisions 1.5 times too large."""
    out = fa_m_step(samples, X, params)
    return {**out, "psi": 1.5 * out["psi"]}


def plug_in_m_step(samples, X, params):
    """Wrong: the classic slip of plugging the posterior mean into E[z zᵀ] (drops Var[z | x])."""
    return fa_m_step({"z": samples["z"].mean(0, keepdims=True)}, X, params)


@jax.jit
def loglik(params, X):
    return marginal_log_likelihood(X, params["W"], params["mu"], params["psi"])


def make(m_step=fa_m_step, **kw):
    opts = dict(latent_sites=("z",), num_chains=2, sample_schedule=doubling_schedule(1, 10, 16),
                loglik_fn=loglik)
    return MCEM(factor_analysis, [z_update()], m_step, **{**opts, **kw})


@pytest.fixture(scope="module")
def ml_loglik():
    """Exact EM to convergence: the zoo's MAP-EM under priors so flat that its fixed point is the
    maximum-likelihood one (psi's Gamma(1, 1e-10) mode formula is N / R_d)."""
    flat = {"W": dist.Normal(0.0, 1e4), "mu": dist.Normal(0.0, 1e4), "psi": dist.Gamma(1.0, 1e-10)}
    fit = fit_fa_variational(np.asarray(X), K, method="em", num_steps=3000, rtol=1e-12, priors=flat)
    p = fit.params
    return float(loglik({"W": p["W_loc"], "mu": p["mu_loc"], "psi": p["psi_loc"]}, X))


@pytest.fixture(scope="module")
def mcem_run():
    return make().run(jax.random.PRNGKey(0), 60, X, START, K=K, checkpoints=5, progress_bar=False)


@pytest.mark.smoke
def test_mcem_climbs_to_the_maximum_likelihood(mcem_run, ml_loglik):
    res = mcem_run
    assert isinstance(res, MCEMResult) and isinstance(res.state, MCEMState)
    its, lls = np.asarray(res.loglik_trace).T
    assert list(its) == list(range(0, 61, 5))
    # from a random start (about 2700 nats below the maximum) to the maximum
    assert lls[0] < ml_loglik - 1000
    # increases, allowing Monte Carlo noise: no checkpoint more than 0.5 nats below the best
    # before it (measured: 0.13 at most)
    assert np.all(lls[1:] >= np.maximum.accumulate(lls)[:-1] - 0.5)
    # ends at the maximum within Monte Carlo error: measured 0.14 nats below it with 32 draws of
    # the 300 rows per iteration; the wrong M-steps below end 100 nats or more below
    assert ml_loglik - 0.5 < lls[-1] <= ml_loglik + 1e-6
    np.testing.assert_array_equal(res.num_samples, [min(16, 2 ** (t // 10)) for t in range(60)])
    assert res.state.iteration == 60 and res.state.latents["z"].shape == (2, N, K)


@pytest.mark.parametrize("wrong", [psi_off_m_step, plug_in_m_step])
def test_a_wrong_m_step_ends_measurably_worse(wrong, ml_loglik):
    # measured: 149 nats (psi off by 1.5) and 109 nats (posterior variance dropped) below; the
    # plug-in step can also collapse a noise variance to 0, worse too: the log-likelihood is then
    # NaN, and the run stops with its FloatingPointError at that iteration (seen at iteration 30
    # on one machine and not on another: round-off decides whether it happens within 30)
    try:
        res = make(wrong).run(jax.random.PRNGKey(0), 30, X, START, K=K, checkpoints=30,
                              progress_bar=False)
    except FloatingPointError as err:
        assert "log density became nan" in str(err)
        return
    assert not res.loglik_trace[-1][1] >= ml_loglik - 5.0


def test_run_continues_exactly_from_a_state():
    mcem = make(loglik_fn=None)
    whole = mcem.run(jax.random.PRNGKey(3), 12, X, START, K=K, progress_bar=False)
    first = mcem.run(jax.random.PRNGKey(3), 5, X, START, K=K, progress_bar=False)
    rest = mcem.run(None, 7, X, init_state=first.state, K=K, progress_bar=False)
    for k in START:
        np.testing.assert_allclose(rest.params[k], whole.params[k], rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(np.r_[first.num_samples, rest.num_samples], whole.num_samples)
    assert rest.state.iteration == 12 and whole.loglik_trace == ()


def test_e_step_uses_only_the_latent_updates_and_stacks_the_draws():
    seen = {}

    def recording_m_step(samples, X, params):
        seen["shape"] = samples["z"].shape
        return fa_m_step(samples, X, params)

    mcem = MCEM(factor_analysis, fa_updates(), recording_m_step, latent_sites=("z",),
                num_chains=3, sample_schedule=lambda t: 4, jit_m_step=False, burn_in=0)
    assert [u.name for u in mcem.e_step_updates(X, K=K)] == [z_update().name]
    state = mcem.init(jax.random.PRNGKey(0), X, START, K=K)
    # burn_in=0: the chains are the latents' prior draws, N(0, 1) entries
    z0 = np.asarray(state.latents["z"])
    assert z0.shape == (3, N, K) and abs(z0.mean()) < 0.1 and abs(z0.var() - 1.0) < 0.1
    new, stats = mcem.update(state, X, K=K)
    assert seen["shape"] == (12, N, K) and stats["num_samples"] == 4
    assert np.isfinite(float(stats["log_joint"]))
    # the parameters were held fixed during the E-step and changed by the M-step only
    assert not np.allclose(new.params["W"], START["W"])
    assert new.iteration == 1


def test_doubling_schedule():
    s = doubling_schedule(2, 5, 16)
    assert [s(t) for t in (0, 4, 5, 10, 15, 20, 1000)] == [2, 2, 4, 8, 16, 16, 16]
    assert doubling_schedule()(10**6) == 64


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(latent_sites=()), "latent_sites"),
        (dict(num_chains=0), "num_chains"),
        (dict(num_chains=2.0), "num_chains"),
        (dict(sweeps_per_sample=0), "sweeps_per_sample"),
        (dict(burn_in=-1), "burn_in"),
        (dict(sample_schedule=3), "sample_schedule"),
        (dict(loglik_fn="x"), "loglik_fn"),
        (dict(m_step=None), "m_step"),
    ],
)
def test_bad_settings_are_refused_in_one_sentence(kwargs, match):
    m_step = kwargs.pop("m_step", fa_m_step)
    with pytest.raises(ValueError, match=match):
        MCEM(factor_analysis, [z_update()], m_step, **{"latent_sites": ("z",), **kwargs})


@pytest.mark.parametrize(
    "make_args, match",
    [
        (lambda: ({"latent_sites": ("zz",)}, START), "not latent sample sites"),
        (lambda: ({}, {k: v for k, v in START.items() if k != "psi"}), "lacks values.*psi"),
        (lambda: ({}, {**START, "z": jnp.zeros((N, K))}), "not parameter sites"),
        (lambda: ({}, {**START, "W": jnp.zeros((D, K + 1))}), "shape"),
        (lambda: ({"updates": fa_updates()[1:]}, START), "samples the latent sites \\['z'\\]"),
        (lambda: ({"sample_schedule": lambda t: 0}, START), "sample_schedule\\(0\\)"),
    ],
)
def test_bad_inputs_are_refused_in_one_sentence(make_args, match):
    opts, params = make_args()
    updates = opts.pop("updates", [z_update()])
    mcem = MCEM(factor_analysis, updates, fa_m_step, **{"latent_sites": ("z",), **opts})
    with pytest.raises(ValueError, match=match):
        mcem.init(jax.random.PRNGKey(0), X, params, K=K)


def test_an_m_step_that_drops_a_parameter_is_refused():
    mcem = make(lambda s, X, p: {"W": p["W"], "mu": p["mu"]}, burn_in=0)
    state = mcem.init(jax.random.PRNGKey(0), X, START, K=K)
    with pytest.raises(ValueError, match="m_step must return new values"):
        mcem.update(state, X, K=K)
    with pytest.raises(ValueError, match="num_iterations"):
        make().run(jax.random.PRNGKey(0), 0, X, START, K=K)
