"""Denoising and inpainting by one convolutional FA layer (:mod:`latentzoo.inference.conv_factor
.restore`): the missing-pixel draw is the likelihood's conditional, and the posterior-mean image
is closer to the clean one than the noisy input or the mean fill."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpyro.infer import Predictive

import latentzoo  # noqa: F401
from latentzoo.inference.conv_factor.restore import impute_missing, psnr, restore
from latentzoo.models.conv_factor import conv_factor, reconstruct


def _values(seed=0, N=2, K=3, C=1, H=7, atom=3):
    draw = Predictive(conv_factor, num_samples=1)(
        jax.random.PRNGKey(seed), K=K, atom_shape=(atom, atom), N=N, image_shape=(C, H, H))
    return {k: v[0] for k, v in draw.items()}


def test_missing_pixels_are_drawn_from_the_likelihood_and_observed_ones_kept():
    v = _values()
    v["gamma"] = jnp.array([4.0, 0.25])  # unequal noise levels: a swapped image index shows
    X = v["X"]
    observed = jax.random.bernoulli(jax.random.PRNGKey(1), 0.5, X.shape)
    keys = jax.random.split(jax.random.PRNGKey(2), 4000)
    draws = jax.vmap(lambda k: impute_missing(k, v, X, observed))(keys)
    assert bool(jnp.all(jnp.where(observed, draws == X, True)))
    mean = reconstruct(v["b"][:, :, None, None] * v["W"], v["d"])
    sd = (1.0 / jnp.sqrt(v["gamma"]))[:, None, None, None]
    z_mean = (draws.mean(0) - mean) / (sd / np.sqrt(len(keys)))
    ratio = draws.std(0) / sd
    miss = ~np.asarray(observed)
    # 4000 draws: |z| of a mean < 4.5 over ~50 pixels; sd within 6 %. A draw around 0 instead of
    # the reconstruction, or with sd 1/gamma or the other image's gamma, fails by far.
    assert np.max(np.abs(np.asarray(z_mean)[miss])) < 4.5
    assert np.max(np.abs(np.asarray(ratio)[miss] - 1.0)) < 0.06


def _synthetic(seed=0, N=6, H=12, per_map=5):
    """Clean images made of two bar atoms at sparse positions, plus noise of sd 0.3 (peak 2)."""
    rng = np.random.default_rng(seed)
    d = np.zeros((2, 1, 4, 4))
    d[0, 0, 1:3, :] = 1.0
    d[1, 0, :, 1:3] = 1.0
    W = np.zeros((N, 2, H - 3, H - 3))
    for n in range(N):
        for k in range(2):
            idx = rng.choice(W[n, k].size, per_map, replace=False)
            W[n, k].flat[idx] = rng.choice([-1.0, 1.0], per_map)
    clean = np.asarray(reconstruct(jnp.asarray(W), jnp.asarray(d)))
    return clean, clean + 0.3 * rng.normal(size=clean.shape)


def test_denoising_beats_the_noisy_input():
    clean, noisy = _synthetic()
    out = restore(noisy, K=4, atom_shape=(4, 4), burn_in=60, draws=40)
    gain = psnr(clean, out.image, 2.0) - psnr(clean, noisy, 2.0)
    # measured 1.7 dB; returning the noisy image (every coefficient fitting the noise) gains 0
    assert gain > 1.0, gain
    assert np.all(np.isfinite(out.image)) and np.all((0.2 < out.noise_sd) & (out.noise_sd < 0.6))


def test_inpainting_fills_missing_pixels_better_than_their_mean():
    clean, noisy = _synthetic(seed=1)
    observed = np.random.default_rng(3).random(clean.shape) < 0.85
    out = restore(np.where(observed, noisy, np.nan), observed, K=4, atom_shape=(4, 4),
                  burn_in=60, draws=40)
    miss = ~observed
    err = np.sqrt(np.mean((out.image - clean)[miss] ** 2))
    fill = np.sqrt(np.mean((noisy[observed].mean() - clean)[miss] ** 2))
    # missing pixels left at the fill (no imputation) give err == fill
    assert err < 0.75 * fill, (err, fill)


def test_restore_refuses_bad_input():
    X = np.zeros((1, 1, 6, 6))
    with pytest.raises(ValueError, match="shape"):
        restore(X, np.ones((1, 1, 5, 6), bool), K=2, atom_shape=(3, 3))
    with pytest.raises(ValueError, match="observed pixel"):
        restore(X, np.zeros_like(X, bool), K=2, atom_shape=(3, 3))
    with pytest.raises(ValueError, match="do not fit"):
        restore(X, K=2, atom_shape=(7, 7))
    with pytest.raises(ValueError, match="burn_in"):
        restore(X, K=2, atom_shape=(3, 3), draws=0)
    with pytest.raises(ValueError, match="finite"):
        restore(np.full((1, 1, 6, 6), np.nan), K=2, atom_shape=(3, 3))
