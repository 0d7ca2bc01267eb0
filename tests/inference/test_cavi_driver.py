"""The CAVI driver on a toy problem with a known answer: q(mu) for a Normal mean.

Model: mu ~ N(0, 1), x_i ~ N(mu, 1). The exact posterior is N(sum x / (n + 1), 1 / (n + 1)); one
closed-form update reaches it, and the analytic ELBO there equals log p(x).
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
