"""Four small bugs that once passed the whole suite, kept as controls: each must now fail a check.

1. FA's W conditional without the prior-mean term (``+ loc·prec``): invisible at loc = 0, caught
   by the conditional check at random non-default hyperparameters.
2. The shear move with its indices swapped: caught by the likelihood-invariance check.
3. The scale move with its Metropolis-Hastings accept step removed: caught on its 1-D orbit.
4. A Geweke harness with first moments only: the variance-only control of
   ``test_harness.py`` is caught by second moments alone (asserted there).
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist

from latentzoo.inference.checks import (
    check_conditional,
    check_likelihood_invariance,
    check_move_on_orbit,
)
from latentzoo.inference.fa import gibbs as fa_gibbs
from latentzoo.inference.gaussian import diag_embed, mvn_from_precision
from latentzoo.inference.updates import GibbsUpdate, Move, prior_params
from latentzoo.models.factor_analysis import factor_analysis
from latentzoo.registry import families

FA = families()["fa"]


def _W_natural_without_prior_mean(values, obs, priors):
    X, z, mu, psi = obs["X"], values["z"], values["mu"], values["psi"]
    D, K = values["W"].shape
    _, scale0 = prior_params(priors["W"], (D, K), "loc", "scale")
    P = psi[:, None, None] * (z.T @ z) + diag_embed(1.0 / scale0**2)
    return P, psi[:, None] * ((X - mu).T @ z)  # the mutant: "+ loc0 * prec0" dropped


def test_W_conditional_without_prior_mean_is_caught():
    mutant = GibbsUpdate("W (no prior mean)", ("W",), fa_gibbs.W_update().requires,
                         lambda v, o, p: {"W": mvn_from_precision(*_W_natural_without_prior_mean(v, o, p))})
    priors = [FA.checks.random_priors(np.random.default_rng(s)) for s in range(3)]
    err = check_conditional(factor_analysis, mutant, FA.checks.model_kwargs, jax.random.PRNGKey(0),
                            priors_list=priors)
    assert err > 1e-3
    # ... and the same check at the default priors (loc = 0) cannot see it: why the random ones
    assert check_conditional(factor_analysis, mutant, FA.checks.model_kwargs, jax.random.PRNGKey(0)) < 1e-8


def _shear_swapped(key, values, obs, priors):
    W, z = values["W"], values["z"]
    c = 0.5 + jax.random.normal(key)
    return {"W": W.at[:, 1].add(c * W[:, 0]), "z": z.at[:, 1].add(-c * z[:, 0])}  # z index swapped


def test_shear_with_swapped_indices_is_caught():
    mutant = fa_gibbs.shear_move()._replace(step=_shear_swapped)
    change = check_likelihood_invariance(factor_analysis, mutant, FA.checks.model_kwargs,
                                         jax.random.PRNGKey(0))
    assert change > 1e-3
    # and where the suite runs it: every seed's random hyperparameters in one program
    priors = [FA.checks.random_priors(np.random.default_rng(s)) for s in range(3)]
    assert check_likelihood_invariance(factor_analysis, mutant, FA.checks.model_kwargs,
                                       jax.random.PRNGKey(0), priors_list=priors) > 1e-3
    assert check_likelihood_invariance(factor_analysis, fa_gibbs.shear_move(), FA.checks.model_kwargs,
                                       jax.random.PRNGKey(0), priors_list=priors) < 1e-10


def _scale_always_accepts(key, values, obs, priors):
    W, z = values["W"], values["z"]
    D, K = W.shape
    N = z.shape[0]
    a, b, p = (W**2).sum(0), (z**2).sum(0), D - N
    u = (p + jnp.sqrt(p**2 + 4.0 * a * b)) / (2.0 * a)
    t = 0.5 * jnp.log(u) + jax.random.normal(key, (K,)) / jnp.sqrt(2.0 * a * u + 2.0 * b / u)
    return {"W": W * jnp.exp(t), "z": z * jnp.exp(-t)}  # the proposal, never rejected


def test_scale_move_without_accept_step_is_caught():
    mutant = fa_gibbs.scale_move()._replace(step=_scale_always_accepts)
    assert isinstance(mutant, Move)
    result = check_move_on_orbit(factor_analysis, mutant, FA.checks.orbit_model_kwargs,
                                 jax.random.PRNGKey(0))
    assert not result.passed and np.max(np.abs(result.z_scores)) > 2 * result.threshold


def test_mutant_priors_are_not_defaults():
    # the random hyperparameters really move W's prior mean away from 0
    locs = [float(FA.checks.random_priors(np.random.default_rng(s))["W"].loc) for s in range(3)]
    assert min(abs(v) for v in locs) > 0.01
    assert isinstance(FA.checks.random_priors(np.random.default_rng(0))["W"], dist.Normal)
