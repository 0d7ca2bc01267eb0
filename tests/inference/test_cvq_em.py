"""CVQ variational EM and exact EM: the bound, its monotone ascent, and source recovery."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import Predictive
from scipy.optimize import linear_sum_assignment

from latentzoo.inference.cavi import CAVI, VariationalFit
from latentzoo.inference.cavi_blocks import plan_blocks
from latentzoo.inference.cvq.em import (
    EXACT_EM_BLOCKS,
    cvq_bound,
    cvq_e_step,
    cvq_exact_em,
    cvq_exact_loglik,
    cvq_guide,
    cvq_vb_blocks,
    cvq_vem,
    fit_cvq,
)
from latentzoo.inference.enumerate import all_states
from latentzoo.models.cvq import complete_log_likelihood, cvq, default_cvq_data


def _random_problem(seed, N=40, D=6, K=3):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(N, D)) * rng.uniform(0.2, 3.0)
    params = {
        "W_loc": rng.normal(size=(D, K)) * rng.uniform(0.1, 3.0),
        "pi_loc": rng.uniform(0.02, 0.98, K),
        "sigma_loc": rng.uniform(0.2, 2.0),
        "lam": rng.uniform(size=(N, K)),
    }
    return jnp.asarray(X), {k: jnp.asarray(v) for k, v in params.items()}


def test_bound_matches_brute_force_functional():
    # F = sum_s Q(s) [log p(x, s) - log Q(s)] summed over all 2^K states, row by row.
    X, p = _random_problem(0, N=7)
    S = all_states(3)
    lj = jax.vmap(
        lambda x: jax.vmap(lambda s: complete_log_likelihood(x[None], s[None], p["W_loc"], p["pi_loc"], p["sigma_loc"]))(S)
    )(X)  # (N, S)
    logq = S @ jnp.log(p["lam"]).T + (1 - S) @ jnp.log1p(-p["lam"]).T  # (S, N)
    brute = (jnp.exp(logq.T) * (lj - logq.T)).sum()
    assert abs(float(cvq_bound(p, X)) - float(brute)) < 1e-8 * abs(float(brute))
    exact = jax.scipy.special.logsumexp(lj, axis=1).sum()
    assert abs(float(cvq_exact_loglik(X, p["W_loc"], p["pi_loc"], p["sigma_loc"])) - float(exact)) < 1e-9 * abs(float(exact))


@pytest.mark.parametrize("seed", range(8))
def test_bound_never_exceeds_exact_loglik(seed):
    X, p = _random_problem(seed)
    exact = float(cvq_exact_loglik(X, p["W_loc"], p["pi_loc"], p["sigma_loc"]))
    assert float(cvq_bound(p, X)) <= exact + 1e-9 * abs(exact)
    # also at the E-step optimum, where the bound is tightest for these parameters
    lam = cvq_e_step(p["lam"], X, p["W_loc"], p["pi_loc"], p["sigma_loc"], num_sweeps=50)
    assert float(cvq_bound({**p, "lam": lam}, X)) <= exact + 1e-9 * abs(exact)


def test_e_step_is_coordinatewise_maximiser():
    # each lambda_u update is the argmax of F in lambda_u: the gradient there is zero, and a
    # perturbation of one column can only lower F (a wrong fixed point fails this).
    X, p = _random_problem(3)
    lam = cvq_e_step(p["lam"], X, p["W_loc"], p["pi_loc"], p["sigma_loc"], num_sweeps=200)
    g = jax.grad(lambda l: cvq_bound({**p, "lam": l}, X))(lam)
    assert float(jnp.abs(g).max()) < 1e-6


@pytest.mark.parametrize("method", ["vb", "em"])
def test_objective_never_decreases(method):
    # Every block table (variational EM: E-step, M-step; exact EM: one block) on overlapping, noisy
    # data from random parameters: many sweeps of real movement.
    X, p = _random_problem(5, N=60, D=8, K=4)
    algo = cvq_vem(e_sweeps=1) if method == "vb" else cvq_exact_em()
    cavi = CAVI(cvq, cvq_guide, algo, on_decrease="ignore")
    res = cavi.run(jax.random.PRNGKey(1), 150, X, K=4, progress_bar=False, rtol=0.0)
    objective = -np.asarray(res.losses)
    steps = np.diff(objective)
    assert steps.min() >= -1e-9 * np.abs(objective).max(), steps.min()
    assert objective[-1] - objective[0] > 1.0  # it did move


def _matched_correlation(W_true, W):
    K = W_true.shape[1]
    C = np.corrcoef(W_true.T, W.T)[:K, K:]
    r, c = linear_sum_assignment(-C)
    return C[r, c]


@pytest.mark.parametrize("method,restarts", [("vb", 5), ("em", 1)])
def test_recovers_bar_sources(method, restarts):
    X, W_true, _ = default_cvq_data(0)
    res = fit_cvq(X, 8, method=method, num_steps=300, seed=0, restarts=restarts)
    corr = _matched_correlation(W_true, np.asarray(res.params["W_loc"]))
    assert corr.min() >= 0.95, corr


def test_variational_bound_close_to_exact_at_fit():
    X, _, _ = default_cvq_data(0)
    res = fit_cvq(X, 8, method="vb", num_steps=300, seed=0, restarts=5)
    p = res.params
    exact = float(cvq_exact_loglik(jnp.asarray(X), p["W_loc"], p["pi_loc"], p["sigma_loc"]))
    bound = float(cvq_bound(p, jnp.asarray(X)))
    assert bound <= exact
    assert (exact - bound) / X.shape[0] < 0.05  # nats per row; separated bars: nearly exact


@pytest.mark.parametrize(
    "X,K,match",
    [
        (np.full((5, 4), np.nan), 2, "NaN"),
        (np.ones((5, 4)), 4, "K"),
        (np.ones(5), 2, "2-D"),
    ],
)
def test_bad_input(X, K, match):
    with pytest.raises(ValueError, match=match):
        fit_cvq(X, K)


def test_unknown_method():
    with pytest.raises(ValueError, match=r"^Unknown CVQ fitting method 'vem'; the valid names are 'vb' and 'em'\.$"):
        fit_cvq(np.random.default_rng(0).normal(size=(10, 5)), 2, method="vem")


def test_fit_returns_a_variational_fit():
    X, _ = _random_problem(2, N=30, D=5, K=2)
    fit = fit_cvq(np.asarray(X), 2, method="em", num_steps=20, restarts=2, progress_bar=False)
    assert isinstance(fit, VariationalFit)
    assert fit.guide is cvq_guide and fit.model is cvq and fit.params is fit.result.params
    pred = Predictive(fit.model, guide=fit.guide, params=fit.params, num_samples=2)(
        jax.random.PRNGKey(0), None, K=2, N=30, D=5
    )
    assert pred["X"].shape == (2, 30, 5)


def test_tables_read_no_prior_and_refuse_another_likelihood():
    # Maximum likelihood: a prior of another family (W ~ Laplace) changes neither the plan nor
    # the fit. A model whose likelihood is not Normal is refused in one sentence naming the site
    # and the block.
    X, _ = _random_problem(3, N=30, D=5, K=2)
    laplace = {"W": dist.Laplace(0.0, 1.0)}
    for blocks in (cvq_vb_blocks(), EXACT_EM_BLOCKS):
        assert all(plan_blocks(cvq, blocks, X, K=2, priors=laplace).exact)
    cavi = CAVI(cvq, cvq_guide, cvq_vem())
    a = cavi.run(jax.random.PRNGKey(0), 5, X, K=2, progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning either
        b = cavi.run(jax.random.PRNGKey(0), 5, X, K=2, progress_bar=False, priors=laplace)
    np.testing.assert_array_equal(a.params["W_loc"], b.params["W_loc"])

    def student_cvq(X=None, *, K, N=None, D=None, priors=None):
        with numpyro.plate("K", K, dim=-1):
            pi = numpyro.sample("pi", dist.Beta(1.0, 1.0))
        with numpyro.plate("D", X.shape[1], dim=-1):
            W = numpyro.sample("W", dist.Normal(0.0, 1.0).expand([K]).to_event(1))
        numpyro.sample("tau", dist.Gamma(2.0, 0.5))
        with numpyro.plate("N", X.shape[0], dim=-2), numpyro.plate("K", K, dim=-1):
            s = numpyro.sample("s", dist.Bernoulli(probs=pi))
        with numpyro.plate("N", X.shape[0], dim=-2), numpyro.plate("D", X.shape[1], dim=-1):
            numpyro.sample("X", dist.StudentT(3.0, s @ W.T, 1.0), obs=X)

    with pytest.raises(ValueError, match=r"^The likelihood site 'X' is StudentT but block 'E-step Q\(s\)'"):
        CAVI(student_cvq, cvq_guide, cvq_vem(model=student_cvq)).init(jax.random.PRNGKey(0), X, K=2)


def test_trace_elbo_of_guide_is_bound_plus_log_prior():
    # The guide's Delta sites add the log prior of the point estimates; Bernoulli q(s) makes
    # Trace_ELBO a Monte Carlo estimate of F (s.e. ~0.02 nats with 10 000 particles here).
    from numpyro.infer import Trace_ELBO

    from latentzoo.models.cvq import default_priors

    X, p = _random_problem(9, N=5, D=4, K=2)
    elbo = -Trace_ELBO(num_particles=10000).loss(jax.random.PRNGKey(0), p, cvq, cvq_guide, X, K=2)
    pr = default_priors()
    log_prior = (
        pr["pi"].log_prob(p["pi_loc"]).sum()
        + pr["W"].log_prob(p["W_loc"]).sum()
        + pr["tau"].log_prob(1.0 / p["sigma_loc"] ** 2)
    )
    assert abs(float(elbo) - float(cvq_bound(p, X) + log_prior)) < 0.1


def test_exact_loglik_whole_table_and_chunked_paths_agree():
    # Up to 2^21 table entries the per-row log-likelihood is one logsumexp over the (N, 2^K)
    # table; beyond, enumerate_posterior's row chunks. K = 12, N = 600 takes the chunked path;
    # the same rows in two halves (300 rows each) take the whole-table path.
    rng = np.random.default_rng(5)
    K, D = 12, 5
    W = jnp.asarray(rng.normal(size=(D, K)))
    pi = jnp.asarray(rng.uniform(0.1, 0.6, K))
    X = jnp.asarray(rng.normal(size=(600, D)) * 2.0)
    whole = jnp.concatenate([cvq_exact_loglik(X[:300], W, pi, 0.7, per_row=True),
                             cvq_exact_loglik(X[300:], W, pi, 0.7, per_row=True)])
    chunked = cvq_exact_loglik(X, W, pi, 0.7, per_row=True)
    np.testing.assert_allclose(chunked, whole, rtol=1e-11)
    np.testing.assert_allclose(cvq_exact_loglik(X, W, pi, 0.7), whole.sum(), rtol=1e-11)
