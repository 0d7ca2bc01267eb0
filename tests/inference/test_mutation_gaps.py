"""Tests that close gaps mutation testing found (experiments/mutation_score.py):

- the shear move's draw of c (its precision and its noise scale) against the exact target on its
  orbit, at random prior scales: the likelihood check passes whatever c is;
- the NOCA M-step's safeguarded Newton solver reaches round-off in a dozen iterations: a wrong Newton
  step falls back to bisection, which still meets loose tolerances but not this one.
"""

import jax
import jax.numpy as jnp
import numpy as np

from latentzoo.inference.checks import check_move_on_orbit
from latentzoo.inference.fa import gibbs as fa_gibbs
from latentzoo.inference.noca.em import solve_decreasing
from latentzoo.models.factor_analysis import factor_analysis
from latentzoo.registry import families

FA = families()["fa"]


def test_shear_draw_matches_its_exact_orbit_target_at_random_prior_scales():
    # K = 2, one pair: a one-dimensional orbit W_1 + t W_0, z_0 - t z_1 (determinant 1)
    priors = FA.checks.random_priors(np.random.default_rng(4))
    kw = dict(N=4, D=3, K=2, priors=priors)
    for seed in (0, 1):
        result = check_move_on_orbit(factor_analysis, fa_gibbs.shear_pair_move(0, 1), kw,
                                     jax.random.PRNGKey(seed), num_steps=8000, half_width=40.0,
                                     num_grid=20001)
        assert result.passed, (result.z_scores, result.exact_moments, result.chain_moments)


def test_safeguarded_newton_reaches_round_off_in_a_few_steps():
    c = jnp.array([0.3, 2.0, 7.5])

    def fn(t):  # g(t) = exp(-t) - c, strictly decreasing, root -log c
        return jnp.exp(-t) - c, -jnp.exp(-t)

    t = solve_decreasing(fn, jnp.zeros(3), -10.0, 10.0, num_iter=12)
    np.testing.assert_allclose(t, -np.log(np.asarray(c)), rtol=0, atol=1e-12)
    # no sign change in the bracket: the endpoint
    t_end = solve_decreasing(fn, jnp.zeros(3), 5.0, 10.0, num_iter=8)
    np.testing.assert_allclose(t_end, [5.0, 5.0, 5.0])
