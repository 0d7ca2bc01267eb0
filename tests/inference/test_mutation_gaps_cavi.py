"""The CAVI driver's bookkeeping, closing gaps mutation testing found in ``inference/cavi.py``.

Survivors there changed what a user is told or where a fit is saved, never the fitted numbers, so
the fit tests could not see them: the sweep an ELBO decrease is reported at, the numbering of the
runs inside one ``checkpointing`` block, and which restart ``init_state`` starts. Toy problem as in
``test_cavi_driver.py``: mu ~ N(0, 1), x_i ~ N(mu, 1), q(mu) = N(loc, scale^2).
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

from latentzoo.inference.cavi import CAVI, CoordinateAscent, ELBODecreaseError, checkpointing

X = jnp.asarray(np.random.default_rng(0).normal(1.0, 1.0, size=20))
OPTIMUM = {"loc": X.sum() / 21, "scale": jnp.sqrt(1 / 21.0)}


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
    e_lik = -0.5 * x.shape[0] * jnp.log(2 * jnp.pi) - 0.5 * jnp.sum((x - m) ** 2 + s**2)
    e_prior = -0.5 * jnp.log(2 * jnp.pi) - 0.5 * (m**2 + s**2)
    return e_lik + e_prior + 0.5 * jnp.log(2 * jnp.pi * jnp.e * s**2)


def random_start(key, x):
    return {"loc": jax.random.normal(key, ()) * 3.0, "scale": jnp.asarray(1.0)}


def stay(params, x):  # never moves: a start's final ELBO is its own
    return params


def walk_away(params, x):  # moves loc away from the optimum by 1 each sweep: the ELBO drops
    return {"loc": params["loc"] + 1.0, "scale": params["scale"]}


def test_an_elbo_decrease_names_the_sweep_it_happened_at():
    cavi = CAVI(model, guide, CoordinateAscent(random_start, walk_away, elbo))
    with pytest.raises(ELBODecreaseError, match=r"at sweep 1 "):
        cavi.run(jax.random.PRNGKey(0), 5, X, progress_bar=False, init_params=OPTIMUM)
    warn = CAVI(model, guide, CoordinateAscent(random_start, walk_away, elbo), on_decrease="warn")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        warn.run(jax.random.PRNGKey(0), 3, X, progress_bar=False, init_params=OPTIMUM, rtol=-1.0)
    sweeps = [str(w.message).split(" at sweep ")[1].split()[0] for w in record
              if issubclass(w.category, RuntimeWarning)]
    assert sweeps == ["1", "2", "3"]


def test_each_run_in_a_checkpointing_block_saves_to_its_own_files(tmp_path):
    cavi = CAVI(model, guide, CoordinateAscent(random_start, stay, elbo))
    with checkpointing(str(tmp_path), every=1):
        cavi.run(jax.random.PRNGKey(0), 2, X, progress_bar=False, rtol=-1.0)
        cavi.run(jax.random.PRNGKey(1), 2, X, progress_bar=False, rtol=-1.0, restarts=2)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["cavi-0-0.npz", "cavi-1-0.npz", "cavi-1-1.npz"]  # call number, restart number


def test_init_state_starts_the_first_restart_only():
    cavi = CAVI(model, guide, CoordinateAscent(random_start, stay, elbo))
    key = jax.random.PRNGKey(3)
    bad = cavi.init(key, X, init_params={"loc": 40.0})  # far worse than any random start
    res = cavi.run(key, 2, X, progress_bar=False, restarts=2, init_state=bad)
    # start 1 is init_state (bad), start 2 is fresh from its own key: the fresh one wins
    second = cavi.run(jax.random.split(key, 2)[1], 2, X, progress_bar=False)
    np.testing.assert_array_equal(res.params["loc"], second.params["loc"])
    assert float(res.params["loc"]) != 40.0


def halfway(params, x):  # halves the distance to the optimum: ELBO gains shrink 4-fold a sweep
    return {k: 0.5 * (params[k] + OPTIMUM[k]) for k in params}


def test_stops_at_the_first_sweep_whose_change_is_within_rtol_of_the_elbo():
    # |ELBO| ~ 30 here, so a tolerance relative to it (rtol * |ELBO|) and one divided by it
    # (rtol / |ELBO|) stop about five sweeps apart; the stopping rule is checked on the trace.
    cavi = CAVI(model, guide, CoordinateAscent(random_start, halfway, elbo))
    rtol = 1e-6
    res = cavi.run(jax.random.PRNGKey(0), 200, X, progress_bar=False, rtol=rtol,
                   init_params={"loc": 30.0, "scale": 3.0})
    elbos = np.concatenate([[float(elbo({"loc": 30.0, "scale": 3.0}, X))], -np.asarray(res.losses)])
    within = np.abs(np.diff(elbos)) <= rtol * np.maximum(1.0, np.abs(elbos[:-1]))
    assert 5 < len(res.losses) < 200
    assert within[-1] and not within[:-1].any()
