"""Mean-field CAVI for one layer of convolutional FA: the ELBO never decreases (non-default
hyperparameters, several data sets and atom shapes), each block is a stationary point of the
analytic ELBO in its own coordinates, and the analytic ELBO equals NumPyro's Monte Carlo
Trace_ELBO of (model, guide)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest
from numpyro.handlers import seed, trace
from numpyro.infer import Trace_ELBO

from latentzoo.inference.cavi import CAVI
from latentzoo.inference.conv_factor.vb import (
    cfa_cavi,
    cfa_elbo,
    fit_vb,
    read_cfa_priors,
    update_alpha,
    update_beta,
    update_d,
    update_gamma,
    update_pi,
    update_Wb,
)
from latentzoo.models.conv_factor import conv_factor

K = 3
# Every hyperparameter away from the paper's: Beta(1/K, 1) and rates of 1e-3 hide factors of the
# prior terms (a dropped "- 1" or "+ 1/2" barely moves the objective at e = 1, f = 1e-3).
PRIORS = {"pi": dist.Beta(0.7, 1.8), "gamma": dist.Gamma(2.0, 0.5),
          "alpha": dist.Gamma(1.5, 0.8), "beta": dist.Gamma(2.5, 1.3)}
# Two channels and non-square images and atoms, so that a swapped channel, row or column index in
# the lags, the colouring or the Toeplitz matrices changes the answer; one shape for every data
# seed, so the sweep compiles once.
IMAGE, ATOM = (2, 7, 6), (3, 2)
KW = dict(K=K, atom_shape=ATOM, priors=PRIORS)
SEEDS = (1, 2, 3)
SWEEPS = 40


def _images(data_seed, image_shape, atom_shape, N=4):
    tr = trace(seed(conv_factor, data_seed)).get_trace(
        None, K=K, atom_shape=atom_shape, N=N, image_shape=image_shape, priors=PRIORS)
    return tr["X"]["value"]


@functools.cache
def _driver():
    vb = cfa_cavi()
    return CAVI(conv_factor, vb.guide, vb.algorithm, on_decrease="raise")


@functools.cache
def _run(data_seed):
    X = _images(data_seed, IMAGE, ATOM)
    driver = _driver()
    init = driver.init(jax.random.PRNGKey(data_seed), X, **KW)
    # rtol=-1: no early stop; the driver raises ELBODecreaseError on any drop beyond round-off
    result = driver.run(jax.random.PRNGKey(data_seed), SWEEPS, X, progress_bar=False, rtol=-1.0, **KW)
    return X, KW, float(init.elbo), result


@pytest.mark.parametrize("data_seed", SEEDS)
def test_elbo_never_decreases(data_seed):
    X, _, start, result = _run(data_seed)
    elbo = np.concatenate([[start], -np.asarray(result.losses)])
    assert elbo.shape == (SWEEPS + 1,)
    assert np.diff(elbo).min() > -1e-9 * abs(elbo[-1])
    assert elbo[-1] - elbo[0] > 50.0  # it climbed (hundreds of nats on these problems)
    # and it explains the images: all-switches-off is a fixed point of any map update whose
    # precision has the <b> factor, and a wrong map update (colour offsets read from another class)
    # climbs into it without a single decrease; the right one keeps >= 3 of the 12 switches on
    assert int(np.sum(np.asarray(result.params["b_probs"]) > 0.5)) >= 3


# ------------------------------------------------------------- each block at its optimum
def _grad(params, X, kw):
    pri = read_cfa_priors(conv_factor, X, **kw)
    return jax.grad(lambda p: cfa_elbo(p, X, pri))(params), pri


def _iterate(block, params, X, pri, n):
    step = jax.jit(lambda p: block(p, X, pri))
    for _ in range(n):
        params = step(params)
    return params


def test_single_site_blocks_are_stationary_points():
    # q(alpha), q(gamma), q(beta), q(pi) are each exact given the rest: right after the sweep's
    # last blocks (and after re-running the first ones), the ELBO's gradient in their params is 0
    # to round-off. A wrong shape or rate (factor 2, a dropped variance) leaves O(1) gradients.
    X, kw, _, result = _run(SEEDS[0])
    pri = read_cfa_priors(conv_factor, X, **kw)
    blocks = (update_alpha, update_gamma, update_beta, update_pi)
    names = (("alpha_concentration", "alpha_rate"), ("gamma_concentration", "gamma_rate"),
             ("beta_concentration", "beta_rate"), ("pi_concentration1", "pi_concentration0"))
    grad = jax.grad(lambda p: cfa_elbo(p, X, pri))

    @jax.jit
    def grads(p):  # each block applied to the converged fit, the gradient right after it
        out = []
        for block, ns in zip(blocks, names):
            q = block(p, X, pri)
            g = grad(q)
            out += [jnp.max(jnp.abs(g[n] * q[n])) for n in ns]
        return jnp.stack(out)

    worst = np.asarray(grads(result.params))
    assert worst.max() < 1e-7, dict(zip(sum(names, ()), worst))


def test_local_and_atom_blocks_converge_to_stationary_points():
    # The maps/switches and the atoms are updated in turn (colour classes, elements, atoms), so
    # one pass is not the block's optimum; its fixed point is. Iterating one block with the rest
    # fixed must reach a point where the ELBO's gradient in that block's params vanishes: a wrong
    # coupling (the cross-shift term, a swapped lag, a missing variance) moves the fixed point.
    X, kw, _, result = _run(SEEDS[1])
    pri = read_cfa_priors(conv_factor, X, **kw)
    p = _iterate(update_Wb, result.params, X, pri, 300)
    g, _ = _grad(p, X, kw)
    assert float(jnp.max(jnp.abs(p["W_loc"]))) > 0.5  # not the trivial all-off fixed point
    for n in ("W_loc", "W_scale"):
        assert float(jnp.max(jnp.abs(g[n]))) < 1e-6, n
    # d ELBO / d rho = logit* - logit(rho): zero at the optimum; rho saturated at 0 or 1 in float64
    # has an infinite log-odds gradient from the entropy, so only interior switches are checked
    rho = p["b_probs"]
    inner = (rho > 1e-10) & (rho < 1 - 1e-10)
    assert int(inner.sum()) >= 3
    assert float(jnp.max(jnp.abs(jnp.where(inner, g["b_probs"], 0.0)))) < 1e-6
    p = _iterate(update_d, result.params, X, pri, 300)
    g, _ = _grad(p, X, kw)
    assert float(jnp.max(jnp.abs(g["d_loc"]))) < 1e-6
    lower = jnp.tril(g["d_scale_tril"])  # the upper triangle is not a parameter
    assert float(jnp.max(jnp.abs(lower))) < 1e-6


# ---------------------------------------------------------------- agreement with NumPyro
NUM_PARTICLES = 1000


def test_analytic_elbo_matches_trace_elbo():
    # E_q[log p - log q] from draws of the guide, as NumPyro computes it, against the closed form.
    # At the converged fit the Monte Carlo standard error is ~0.2 nats; a dropped variance term
    # (of W, of d or of the switch) or a wrong entropy moves the closed form by > 2 nats.
    X, kw, _, result = _run(SEEDS[0])
    p = result.params
    vb = cfa_cavi()
    pri = read_cfa_priors(conv_factor, X, **kw)
    analytic = float(cfa_elbo(p, X, pri))

    def one(key):
        return -Trace_ELBO(num_particles=1).loss(key, p, conv_factor, vb.guide, X, **kw)

    keys = jax.random.split(jax.random.PRNGKey(3), NUM_PARTICLES)
    draws = np.asarray(jax.jit(lambda ks: jax.lax.map(one, ks))(keys))
    mean, se = draws.mean(), draws.std(ddof=1) / np.sqrt(NUM_PARTICLES)
    assert se < 0.5
    assert abs(analytic - mean) < 4.0 * se, (analytic, mean, se)


def test_fit_vb_refuses_bad_input_in_one_sentence():
    with pytest.raises(ValueError, match="images shaped"):
        fit_vb(np.zeros((3, 4)), K=2)
    with pytest.raises(ValueError, match="do not fit"):
        fit_vb(np.zeros((3, 1, 4, 4)), K=2, atom_shape=(5, 5))
    with pytest.raises(ValueError, match="NaN"):
        fit_vb(np.full((3, 1, 4, 4), np.nan), K=2)
    with pytest.raises(ValueError, match="positive integer"):
        fit_vb(np.zeros((3, 1, 4, 4)), K=0)
