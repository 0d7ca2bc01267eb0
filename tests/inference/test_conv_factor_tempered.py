"""Convolutional FA's tempered table (the switches b, the maps W, the atoms d, the joint (b, W)
move and the element move on p(z) p(X | z)^beta), for replica exchange.

For the Gaussian likelihood N(x_n; recon_n, 1 / gamma_n), p(x_n | .)^beta is
N(x_n; recon_n, 1 / (beta gamma_n)) times a factor of gamma_n alone, so every update that does not
write gamma samples the same law on the tempered path as the untempered update does with
gamma_n replaced by beta gamma_n. That is checked draw for draw (same keys, the sampled values
equal to round-off) for each such update at beta = 0.35; an update that read gamma_n itself
would give the untempered draws instead, which the control shows differ. gamma's own tempered
conditional (shape c + beta P / 2, rate d + beta ||R_n||^2 / 2) is compared with the tempered joint
density by tests/test_conformance.py (every flagged update with a closed form), and replica
exchange over the table from the command line is in tests/cli/test_replicas.py."""

import jax
import numpy as np
import pytest

from latentzoo.inference.checks import simulate
from latentzoo.inference.conv_factor import cfa_updates
from latentzoo.inference.conv_factor.gibbs import b_logits
from latentzoo.inference.gibbs import read_model
from latentzoo.inference.tempering import temper
from latentzoo.models.conv_factor import conv_factor
from latentzoo.registry import families

CFA = families()["cfa"]
BETA = 0.35
# three channels on non-square images, so a precision broadcast over the wrong axis shows
KW = {**CFA.checks.model_kwargs, "image_shape": (3, 4, 5)}
UPDATES = [u for u in cfa_updates(element_move=True) if "gamma" not in u.sites]


def _inputs(beta, gamma_scale, seed):
    values, X = simulate(conv_factor, KW, jax.random.PRNGKey(seed))
    # element 0 on in image 0 alone (a death the element move can propose), element 1 off
    # everywhere (a birth)
    b = values["b"].at[:, 0].set(0).at[0, 0].set(1).at[:, 1].set(0)
    values = {**values, "b": b}
    model = conv_factor if beta == 1.0 else temper(conv_factor, beta)
    given = {**values, "gamma": values["gamma"] * gamma_scale}
    priors, obs, _ = read_model(model, given, (X,), KW)
    return given, obs, priors


def _draws(update, beta, gamma_scale, seed=0, repeats=12):
    # ``repeats`` keys: an MH move's accept step is one uniform against a ratio, so a ratio read
    # at the wrong temperature changes some of the outcomes, not necessarily the first
    given, obs, priors = _inputs(beta, gamma_scale, seed)
    keys = jax.random.split(jax.random.PRNGKey(seed + 1), repeats)
    out = jax.jit(jax.vmap(lambda key: update.sample(key, given, obs, priors)))(keys)
    return {k: np.asarray(v) for k, v in out.items()}


def _b_logits(beta, gamma_scale, seed):
    # b's draws are binary and can agree by chance; its log-odds cannot
    given, obs, priors = _inputs(beta, gamma_scale, seed)
    return np.stack([np.asarray(b_logits(given, obs["X"], priors, k)[0]) for k in range(KW["K"])])


@pytest.mark.parametrize("update", UPDATES, ids=lambda u: u.name.split(" (")[0][:24])
def test_a_tempered_update_draws_as_the_untempered_one_at_beta_times_gamma(update):
    assert update.tempered, update.name
    for seed in (0, 3):
        tempered = _draws(update, BETA, 1.0, seed)
        scaled = _draws(update, 1.0, BETA, seed)
        for site in tempered:
            np.testing.assert_allclose(tempered[site], scaled[site], rtol=1e-9, atol=1e-12, err_msg=site)
    if update.sites == ("b",):
        np.testing.assert_allclose(_b_logits(BETA, 1.0, 0), _b_logits(1.0, BETA, 0), rtol=1e-9)


def test_the_control_an_update_that_ignores_beta_draws_differently():
    # what an update that read gamma_n instead of beta gamma_n would give on the tempered path:
    # the untempered likelihood at the same gamma (W's draws, b's log-odds)
    (W_update,) = [u for u in UPDATES if u.sites == ("W",)]
    assert not np.allclose(_draws(W_update, BETA, 1.0, 3)["W"], _draws(W_update, 1.0, 1.0, 3)["W"])
    assert not np.allclose(_b_logits(BETA, 1.0, 0), _b_logits(1.0, 1.0, 0))
