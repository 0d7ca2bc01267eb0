"""The vectorised exact Gamma sampler (:mod:`latentzoo.inference.gamma_draws`).

Statistical, fixed seeds: Kolmogorov-Smirnov against ``scipy.stats.gamma`` and the first two
moments and E[log x] (which sees the lower tail the shape < 1 boost makes) at shapes 0.3,
0.500001 (convolutional FA's alpha with e = 1e-6), 1.5 and 7 and elementwise rates spanning four
orders of magnitude; the exact fallback alone (no bulk round, a buffer of a few slots so the outer
loop runs many times) at shape 1, where a candidate is rejected most often; the convolutional FA
alpha and beta updates against their own conditionals. With 100 000 draws a KS p-value below
1e-3 or a moment 5 standard errors off is a wrong sampler. Planted bugs, each caught: d = a - 1/2
(12 of the 14 tests fail), the squeeze's sign flipped (9), the boost exponent a for 1/a (5: every
test with a shape below 1), a fallback that keeps a rejected candidate (the two rounds=0 tests).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats
from scipy.special import digamma, polygamma

from latentzoo.inference.gamma_draws import gamma_draw

N = 100_000
RATES = np.array([1e-2, 0.7, 3.0, 40.0])


def _assert_gamma(x, a, rate, label=""):
    """x (n,) are Gamma(a, rate) draws (rate elementwise): KS of x * rate against Gamma(a, 1),
    mean, variance and E[log x] within 5 standard errors."""
    x = np.asarray(x, np.float64)
    assert np.all(np.isfinite(x)) and np.all(x > 0), label
    y = x * rate  # Gamma(a, 1) for a right sampler
    p = stats.kstest(y, stats.gamma(a).cdf).pvalue
    assert p > 1e-3, (label, p)
    n = y.size
    se_mean = np.sqrt(a / n)
    assert abs(y.mean() - a) < 5 * se_mean, (label, y.mean(), a)
    # var of the sample variance: (mu4 - sigma^4) / n, mu4 = 3a(a + 2) for Gamma(a, 1)
    se_var = np.sqrt((3 * a * (a + 2) - a * a) / n)
    assert abs(y.var() - a) < 5 * se_var, (label, y.var(), a)
    se_log = np.sqrt(polygamma(1, a) / n)
    assert abs(np.log(y).mean() - digamma(a)) < 5 * se_log, (label, np.log(y).mean(), digamma(a))


@pytest.mark.parametrize("a", [0.3, 0.500001, 1.5, 7.0])
def test_draws_are_gamma_at_each_shape_and_rate(a):
    rate = np.tile(RATES, N // RATES.size)
    x = np.asarray(jax.jit(lambda k: gamma_draw(k, a, rate))(jax.random.PRNGKey(11)))
    _assert_gamma(x, a, rate, f"a={a}")
    for r in RATES:  # each rate on its own: the rate divides the right draws
        sel = rate == r
        p = stats.kstest(x[sel], stats.gamma(a, scale=1.0 / r).cdf).pvalue
        # 16 of these: threshold 1e-4 (Bonferroni); seed 11 gives 7e-4 at a = 0.3, rate 40, a
        # chance low (20 other seeds at 400 000 draws there gave p from 0.04 to 0.99)
        assert p > 1e-4, (a, r, p)


def test_elementwise_shapes_in_one_call():
    """Shapes below and above 1 side by side (the boost only where a < 1), a 2-D output."""
    a = np.array([0.3, 7.0, 0.500001, 1.5])
    shape = np.tile(a, (N // 4, 1))
    rate = np.broadcast_to(np.array([2.0, 0.1, 5.0, 1.0]), shape.shape)
    x = np.asarray(gamma_draw(jax.random.PRNGKey(3), shape, rate))
    assert x.shape == shape.shape
    for j in range(4):
        _assert_gamma(x[:, j], a[j], rate[:, j], f"column {j}")


@pytest.mark.parametrize("rounds,buffer", [(0, 7), (0, 100_000), (1, 3)])
def test_fallback_alone_is_exact(rounds, buffer):
    """rounds=0: every element is drawn by the fallback loop; buffer=7 runs its outer loop
    thousands of times. Shape 1 rejects about 5 % of candidates, the most of any shape >= 1; a
    loop that kept a rejected candidate or skipped an element would fail."""
    n = 20_000 if buffer < 10 else N
    draw = jax.jit(lambda k: gamma_draw(k, jnp.ones(n), 2.0, rounds=rounds, buffer=buffer))
    x = draw(jax.random.PRNGKey(5))
    _assert_gamma(x, 1.0, 2.0, f"rounds={rounds} buffer={buffer}")


def test_several_bulk_rounds_and_float32():
    x = gamma_draw(jax.random.PRNGKey(8), jnp.full((N,), 0.500001, jnp.float32), 1.5, rounds=4)
    assert x.dtype == jnp.float32
    _assert_gamma(x, 0.500001, 1.5, "rounds=4 float32")


def test_draws_are_independent_across_elements_and_keys():
    """Neighbouring elements and two keys are uncorrelated (a reused key would correlate them)."""
    x = np.asarray(gamma_draw(jax.random.PRNGKey(0), 1.5, jnp.ones(2 * N)))
    y = np.asarray(gamma_draw(jax.random.PRNGKey(1), 1.5, jnp.ones(2 * N)))
    assert abs(np.corrcoef(x[::2], x[1::2])[0, 1]) < 5 / np.sqrt(N)
    assert abs(np.corrcoef(x, y)[0, 1]) < 5 / np.sqrt(2 * N)


def test_vmapped_over_keys_and_tiny_shapes():
    xs = jax.vmap(lambda k: gamma_draw(k, jnp.array([0.3, 7.0]), 1.0))(jax.random.split(
        jax.random.PRNGKey(2), 5000))
    _assert_gamma(xs[:, 1], 7.0, 1.0, "vmapped")
    tiny = np.asarray(gamma_draw(jax.random.PRNGKey(4), 1e-3, jnp.ones(1000)))
    assert np.all(tiny > 0)  # underflow gives the smallest normal number, never 0


def test_invalid_parameters_give_nan_and_bad_options_raise():
    x = np.asarray(gamma_draw(jax.random.PRNGKey(0), jnp.array([-1.0, 0.0, jnp.nan, 2.0, 2.0]),
                              jnp.array([1.0, 1.0, 1.0, 0.0, 1.0])))
    assert np.all(np.isnan(x[:4])) and x[4] > 0
    with pytest.raises(ValueError, match="rounds"):
        gamma_draw(jax.random.PRNGKey(0), 1.0, 1.0, rounds=-1)
    with pytest.raises(ValueError, match="buffer"):
        gamma_draw(jax.random.PRNGKey(0), 1.0, 1.0, buffer=0)


@pytest.mark.parametrize("which", ["alpha", "beta"])
def test_cfa_precision_updates_draw_their_own_conditional(which):
    """The alpha (beta) update's draw is Gamma(e + 1/2, f + w^2/2) elementwise: standardised by
    its conditional's parameters, the draws are Gamma(shape, 1)."""
    import numpyro.distributions as dist

    from latentzoo.inference.conv_factor import alpha_update, beta_update
    from latentzoo.inference.gibbs import read_model
    from latentzoo.inference.checks import simulate
    from latentzoo.models.conv_factor import conv_factor

    priors = {"pi": dist.Beta(1.0, 1.0), "gamma": dist.Gamma(2.0, 1.0),
              "alpha": dist.Gamma(2.0, 0.3), "beta": dist.Gamma(3.0, 2.0)}
    kw = dict(K=4, atom_shape=(5, 5), N=4, image_shape=(1, 40, 40), priors=priors)
    values, X = simulate(conv_factor, kw, jax.random.PRNGKey(0))
    # the conditional at the default-like e = 1e-6 (shape 0.500001) for alpha, g = 3 for beta
    kw = {**kw, "priors": {**priors, "alpha": dist.Gamma(1e-6, 0.3)}}
    fns, obs, _ = read_model(conv_factor, values, (X,), kw)
    update = alpha_update() if which == "alpha" else beta_update()
    post = update.conditional(values, obs, fns)[which]
    keys = jax.random.split(jax.random.PRNGKey(9), 5 if which == "alpha" else 1000)
    draws = jax.vmap(lambda k: update.sample(k, values, obs, fns)[which])(keys)
    a = float(np.ravel(post.concentration)[0])
    rate = np.broadcast_to(np.asarray(post.rate), draws.shape)
    _assert_gamma(np.ravel(draws), a, np.ravel(rate), which)
