"""The CAVI driver on a toy problem with a known answer: q(mu) for a Normal mean.

Model: mu ~ N(0, 1), x_i ~ N(mu, 1). The exact posterior is N(sum x / (n + 1), 1 / (n + 1)); one
closed-form update reaches it, and the analytic ELBO there equals log p(x). Also: restarts, and
the block-table builder (its family checks, its SVI fallback under mu ~ Laplace(0, 1), where the
best Gaussian is known from the closed-form ELBO).
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import Predictive
from numpyro.infer.svi import SVIRunResult

from latentzoo.inference.cavi import CAVI, CoordinateAscent, ELBODecreaseError
from latentzoo.inference.cavi_blocks import CAVIBlock, coordinate_ascent, plan_blocks
from latentzoo.inference.gibbs import ConjugacyFallbackWarning


def model(x):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("n", x.shape[0]):
        numpyro.sample("x", dist.Normal(mu, 1.0), obs=x)


def guide(x):
    loc = numpyro.param("loc", 0.0)
    scale = numpyro.param("scale", 1.0, constraint=dist.constraints.positive)
    numpyro.sample("mu", dist.Normal(loc, scale))


def elbo(params, x):
    m, s = params["loc"], params["scale"]
    n = x.shape[0]
    e_lik = -0.5 * n * jnp.log(2 * jnp.pi) - 0.5 * jnp.sum((x - m) ** 2 + s**2)
    e_prior = -0.5 * jnp.log(2 * jnp.pi) - 0.5 * (m**2 + s**2)
    entropy = 0.5 * jnp.log(2 * jnp.pi * jnp.e * s**2)
    return e_lik + e_prior + entropy


def exact_update(params, x):
    n = x.shape[0]
    return {"loc": x.sum() / (n + 1), "scale": jnp.sqrt(1.0 / (n + 1))}


def init(key, x):
    return {"loc": jnp.asarray(3.0), "scale": jnp.asarray(2.0)}


X = jnp.asarray(np.random.default_rng(0).normal(1.0, 1.0, size=20))


def test_run_returns_svi_result_and_reaches_exact_answer():
    cavi = CAVI(model, guide, CoordinateAscent(init, exact_update, elbo))
    result = cavi.run(jax.random.PRNGKey(0), 50, X, progress_bar=False)
    assert isinstance(result, SVIRunResult)
    assert len(result.losses) == 2  # the second sweep changes nothing: early stop
    n = X.shape[0]
    np.testing.assert_allclose(result.params["loc"], X.sum() / (n + 1))
    log_evidence = dist.MultivariateNormal(jnp.zeros(n), jnp.eye(n) + 1.0).log_prob(X)
    np.testing.assert_allclose(-result.losses[-1], log_evidence, rtol=1e-10)
    draws = Predictive(model, guide=guide, params=result.params, num_samples=7)(
        jax.random.PRNGKey(1), X
    )
    assert draws["x"].shape == (7, n)


def test_decreasing_elbo_raises_or_warns():
    def bad_update(params, x):  # moves away from the optimum after the first sweep
        return {"loc": params["loc"] + 1.0, "scale": params["scale"]}

    start = {"loc": X.sum() / 21, "scale": jnp.sqrt(1 / 21.0)}
    cavi = CAVI(model, guide, CoordinateAscent(init, bad_update, elbo))
    with pytest.raises(ELBODecreaseError, match="decreased"):
        cavi.run(jax.random.PRNGKey(0), 5, X, progress_bar=False, init_params=start)
    warn = CAVI(model, guide, CoordinateAscent(init, bad_update, elbo), on_decrease="warn")
    with pytest.warns(RuntimeWarning, match="decreased"):
        warn.run(jax.random.PRNGKey(0), 3, X, progress_bar=False, init_params=start)


def test_update_and_evaluate_follow_svi():
    cavi = CAVI(model, guide, CoordinateAscent(init, exact_update, elbo))
    state = cavi.init(jax.random.PRNGKey(0), X)
    state, loss = cavi.update(state, X)
    np.testing.assert_allclose(loss, cavi.evaluate(state, X))
    assert cavi.get_params(state)["scale"] == pytest.approx(np.sqrt(1 / 21))
    with pytest.raises(ValueError, match="unknown parameters"):
        cavi.init(jax.random.PRNGKey(0), X, init_params={"nope": 1.0})


# ------------------------------------------------------------------------------- restarts
def _random_start(key, x):
    return {"loc": jax.random.normal(key, ()) * 3.0, "scale": jnp.asarray(1.0)}


def _stay(params, x):  # a recipe that never moves: each start's final ELBO is its own
    return params


def test_restarts_keep_the_best_of_their_own_starts():
    cavi = CAVI(model, guide, CoordinateAscent(_random_start, _stay, elbo))
    key = jax.random.PRNGKey(3)
    best = cavi.run(key, 3, X, progress_bar=False, restarts=3)
    singles = [cavi.run(k, 3, X, progress_bar=False) for k in jax.random.split(key, 3)]
    finals = [float(-r.losses[-1]) for r in singles]
    assert len(set(finals)) == 3  # each restart has its own key
    i = int(np.argmax(finals))
    assert float(-best.losses[-1]) == finals[i]
    np.testing.assert_array_equal(best.params["loc"], singles[i].params["loc"])
    # init_params start the first restart only
    start = {"loc": X.sum() / 21, "scale": jnp.sqrt(1 / 21.0)}  # the optimum: the best start
    res = cavi.run(key, 3, X, progress_bar=False, restarts=3, init_params=start)
    np.testing.assert_allclose(res.params["loc"], start["loc"])
    with pytest.raises(ValueError, match="restarts"):
        cavi.run(key, 3, X, progress_bar=False, restarts=0)


# ---------------------------------------------------------------------------- block tables
def prior_model(x, prior=None):
    """The toy model with a swappable prior on mu (default N(0, 1))."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0) if prior is None else prior)
    with numpyro.plate("n", x.shape[0]):
        numpyro.sample("x", dist.Normal(mu, 1.0), obs=x)


def prior_guide(x, prior=None):
    guide(x)


def elbo_terms(params, x, priors):
    m, s = params["loc"], params["scale"]
    n = x.shape[0]
    return {
        "x": -0.5 * n * jnp.log(2 * jnp.pi) - 0.5 * jnp.sum((x - m) ** 2 + s**2),
        "mu": -0.5 * jnp.log(2 * jnp.pi) - 0.5 * (m**2 + s**2),
        "entropy": 0.5 * jnp.log(2 * jnp.pi * jnp.e * s**2),
    }


def block_update(params, x, priors):
    return exact_update(params, x)


MU_BLOCK = CAVIBlock("q(mu)", ("mu",), {"mu": (dist.Normal,), "x": (dist.Normal,)}, block_update, ("loc", "scale"))


def _recipe(model_=prior_model, guide_=prior_guide, blocks=(MU_BLOCK,)):
    return coordinate_ascent(model_, blocks, lambda key, x, priors, **kw: init(key, x), elbo_terms, guide=guide_)


def _laplace_elbo(m, s, x):
    """The exact ELBO of N(m, s^2) under mu ~ Laplace(0, 1): E|mu| of a Normal in closed form."""
    from scipy.stats import norm

    n = x.shape[0]
    e_abs = s * np.sqrt(2 / np.pi) * np.exp(-(m**2) / (2 * s**2)) + m * (1 - 2 * norm.cdf(-m / s))
    lik = -0.5 * n * np.log(2 * np.pi) - 0.5 * np.sum((np.asarray(x) - m) ** 2 + s**2)
    return lik - np.log(2.0) - e_abs + 0.5 * np.log(2 * np.pi * np.e * s**2)


def test_block_table_matches_the_plain_recipe():
    cavi = CAVI(prior_model, prior_guide, _recipe())
    result = cavi.run(jax.random.PRNGKey(0), 50, X, progress_bar=False)
    np.testing.assert_allclose(result.params["loc"], X.sum() / 21)
    log_evidence = dist.MultivariateNormal(jnp.zeros(20), jnp.eye(20) + 1.0).log_prob(X)
    np.testing.assert_allclose(-result.losses[-1], log_evidence, rtol=1e-10)
    assert plan_blocks(prior_model, [MU_BLOCK], X).exact == (True,)


def test_changed_prior_family_falls_back_to_svi_and_keeps_the_elbo_rising():
    # mu ~ Laplace(0, 1): q(mu) has no closed form. The recipe warns, naming the block and the
    # site, fits q(mu) by SVI steps, never lowers its (Monte Carlo) ELBO, and lands on the best
    # Gaussian: the maximiser of the exact ELBO, found here by scipy on the closed form.
    from scipy.optimize import minimize

    laplace = dist.Laplace(0.0, 1.0)
    assert plan_blocks(prior_model, [MU_BLOCK], X, prior=laplace).exact == (False,)
    cavi = CAVI(prior_model, prior_guide, _recipe(), on_decrease="raise")
    with pytest.warns(ConjugacyFallbackWarning, match=r"'q\(mu\)'.*'mu' has a Laplace prior"):
        result = cavi.run(jax.random.PRNGKey(0), 20, X, progress_bar=False, rtol=-1.0, prior=laplace)
    start = float(cavi.init(jax.random.PRNGKey(0), X, prior=laplace).elbo)
    elbo_path = -np.asarray(result.losses)
    assert np.all(np.diff(np.concatenate([[start], elbo_path])) >= -1e-9)
    assert elbo_path[-1] > start + 10.0
    assert all(np.all(np.isfinite(v)) for v in result.params.values())
    best = minimize(lambda v: -_laplace_elbo(v[0], np.exp(v[1]), X), [0.0, 0.0]).x
    m, s = float(result.params["loc"]), float(result.params["scale"])
    assert abs(m - best[0]) < 0.02 and abs(np.log(s) - best[1]) < 0.05, (m, s, best)
    # the reported ELBO is a Monte Carlo estimate of the exact one
    assert abs(elbo_path[-1] - _laplace_elbo(m, s, X)) < 0.05


def test_changed_prior_family_without_a_guide_is_one_value_error():
    recipe = coordinate_ascent(prior_model, [MU_BLOCK], lambda key, x, priors, **kw: init(key, x), elbo_terms)
    with pytest.raises(ValueError, match=r"Site 'mu' has a Laplace prior but block 'q\(mu\)'"):
        CAVI(prior_model, prior_guide, recipe).init(jax.random.PRNGKey(0), X, prior=dist.Laplace(0.0, 1.0))


def test_a_scalar_objective_cannot_fall_back():
    recipe = coordinate_ascent(
        prior_model, [MU_BLOCK], lambda key, x, priors, **kw: init(key, x),
        lambda p, x, priors: elbo(p, x), guide=prior_guide,
    )
    with pytest.raises(ValueError, match=r"'q\(mu\)'.*'mu'.*prior term"):
        with pytest.warns(ConjugacyFallbackWarning):
            CAVI(prior_model, prior_guide, recipe).init(jax.random.PRNGKey(0), X, prior=dist.Laplace(0.0, 1.0))


def student_model(x):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("n", x.shape[0]):
        numpyro.sample("x", dist.StudentT(4.0, mu, 1.0), obs=x)


def test_likelihood_of_another_family_and_uncovered_sites_are_refused():
    with pytest.raises(ValueError, match=r"likelihood site 'x' is StudentT but block 'q\(mu\)'"):
        plan_blocks(student_model, [MU_BLOCK], X)

    def extra_model(x):
        numpyro.sample("tau", dist.Gamma(1.0, 1.0))
        model(x)

    with pytest.raises(ValueError, match="'tau' is written by no block"):
        plan_blocks(extra_model, [MU_BLOCK], X)
    with pytest.raises(ValueError, match="no sample site 'nu'"):
        plan_blocks(model, [MU_BLOCK._replace(sites=("nu",))], X)


# ---------------------------------------------------------------------------- checkpoints
def _interrupting(cavi, after):
    """Make ``cavi.update`` raise KeyboardInterrupt on its ``after + 1``-th call (a kill)."""
    real, calls = cavi.update, []

    def update(state, *args, **kwargs):
        calls.append(state.step)
        if len(calls) > after:
            raise KeyboardInterrupt
        return real(state, *args, **kwargs)

    cavi.update = update
    return calls


@pytest.mark.parametrize("restarts", [1, 2])
def test_resumed_fit_equals_the_uninterrupted_one(restarts, tmp_path):
    # The SVI-fallback path draws from the state's key every sweep, so a resume that lost or
    # reused a key (or restarted the objective trace) differs from the uninterrupted run.
    from latentzoo.inference.cavi import checkpointing

    laplace = dist.Laplace(0.0, 1.0)
    kw = dict(progress_bar=False, rtol=-1.0, prior=laplace, restarts=restarts)
    key = jax.random.PRNGKey(5)
    with pytest.warns(ConjugacyFallbackWarning):
        ref = CAVI(prior_model, prior_guide, _recipe()).run(key, 10, X, **kw)

    cavi = CAVI(prior_model, prior_guide, _recipe())
    calls = _interrupting(cavi, after=7 + 10 * (restarts - 1))  # sweep 8 of the last start
    with checkpointing(str(tmp_path), every=3), pytest.warns(ConjugacyFallbackWarning):
        with pytest.raises(KeyboardInterrupt):
            cavi.run(key, 10, X, **kw)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"cavi-0-{r}.npz" for r in range(restarts)]

    resumed = CAVI(prior_model, prior_guide, _recipe())
    calls = _interrupting(resumed, after=10**6)
    with checkpointing(str(tmp_path), every=3, resume=True), pytest.warns(ConjugacyFallbackWarning):
        res = resumed.run(key, 10, X, **kw)
    assert calls == [6, 7, 8, 9]  # from the checkpoint of sweep 6; a finished start is not rerun
    np.testing.assert_array_equal(np.asarray(res.losses), np.asarray(ref.losses))
    for k in ref.params:
        np.testing.assert_array_equal(np.asarray(res.params[k]), np.asarray(ref.params[k]))


def test_resume_from_the_checkpoint_of_another_fit_is_refused(tmp_path):
    from latentzoo.inference.cavi import checkpointing

    cavi = CAVI(model, guide, CoordinateAscent(init, exact_update, elbo))
    with checkpointing(str(tmp_path), every=1):
        cavi.run(jax.random.PRNGKey(0), 5, X, progress_bar=False)
    other = CAVI(model, guide, CoordinateAscent(lambda k, x: {**init(k, x), "extra": jnp.zeros(2)},
                                                exact_update, elbo))
    with checkpointing(str(tmp_path), resume=True), pytest.raises(ValueError, match="another fit"):
        other.run(jax.random.PRNGKey(0), 5, X, progress_bar=False)


# ---------------------------------------------------------------------------- plans, warnings
def test_cavi_plan_prints_which_block_keeps_its_closed_form():
    text = str(plan_blocks(prior_model, [MU_BLOCK], X, prior=dist.Laplace(0.0, 1.0)))
    assert text.startswith("CAVIPlan") and "CAVIPlan(" not in text
    assert "q(mu)" in text and "SVI steps on loc, scale: site 'mu' has a Laplace prior" in text
    assert "closed form" in str(plan_blocks(prior_model, [MU_BLOCK], X))


def test_fallback_warning_points_at_the_users_line():
    cavi = CAVI(prior_model, prior_guide, _recipe())
    with pytest.warns(ConjugacyFallbackWarning) as record:
        cavi.run(jax.random.PRNGKey(0), 2, X, progress_bar=False, prior=dist.Laplace(0.0, 1.0))
    assert [w.filename for w in record] == [__file__]  # not numpyro's or jax's files
