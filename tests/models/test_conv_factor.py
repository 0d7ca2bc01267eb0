"""The one-layer convolutional FA model: its convolutions, its log density against a direct NumPy
computation, its shapes and its refusals."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest
from numpyro.infer import Predictive, log_likelihood
from numpyro.infer.util import log_density
from scipy import stats

from latentzoo.models.conv_factor import (
    as_channels_first,
    conv_factor,
    correlate,
    default_cfa_data,
    default_priors,
    reconstruct,
)

PRIORS = {"pi": dist.Beta(0.7, 2.5), "gamma": dist.Gamma(3.0, 1.5),
          "alpha": dist.Gamma(2.0, 0.7), "beta": dist.Gamma(4.0, 3.0)}


def _full_conv_numpy(W, d):
    """sum_k W_nk * d_k by placing a copy of the atom at every position (the definition)."""
    N, K, Hp, Wp = W.shape
    _, C, h, w = d.shape
    out = np.zeros((N, C, Hp + h - 1, Wp + w - 1))
    for n in range(N):
        for k in range(K):
            for i in range(Hp):
                for j in range(Wp):
                    out[n, :, i:i + h, j:j + w] += W[n, k, i, j] * d[k]
    return out


def test_reconstruct_is_the_full_convolution_and_correlate_its_adjoint():
    rng = np.random.default_rng(0)
    W, d = rng.normal(size=(3, 2, 4, 5)), rng.normal(size=(2, 3, 3, 2))
    Y = np.asarray(reconstruct(W, d))
    np.testing.assert_allclose(Y, _full_conv_numpy(W, d), atol=1e-12)
    R = rng.normal(size=Y.shape)
    C = np.asarray(correlate(R, d))
    assert C.shape == W.shape
    np.testing.assert_allclose((C * W).sum(), (R * Y).sum(), rtol=1e-12)  # <R, A W> = <A'R, W>


def _gamma_logpdf(x, shape, rate):
    return stats.gamma.logpdf(x, shape, scale=1.0 / rate)


def test_log_density_matches_a_direct_numpy_computation():
    kw = dict(K=3, atom_shape=(2, 3), N=4, image_shape=(2, 5, 6), priors=PRIORS)
    v = {k: np.asarray(a) for k, a in
         Predictive(conv_factor, num_samples=1)(jax.random.PRNGKey(3), **kw).items()}
    v = {k: a[0] for k, a in v.items()}
    X = v.pop("X")
    latent = {k: v[k] for k in ("pi", "b", "W", "alpha", "d", "beta", "gamma")}
    got = float(log_density(conv_factor, (jnp.asarray(X),), kw, latent)[0])

    lp = stats.beta.logpdf(v["pi"], 0.7, 2.5).sum()
    lp += stats.bernoulli.logpmf(v["b"], v["pi"][None]).sum()
    lp += _gamma_logpdf(v["beta"], 4.0, 3.0).sum() + _gamma_logpdf(v["alpha"], 2.0, 0.7).sum()
    lp += _gamma_logpdf(v["gamma"], 3.0, 1.5).sum()
    lp += stats.norm.logpdf(v["d"], 0.0, 1.0 / np.sqrt(v["beta"])).sum()
    lp += stats.norm.logpdf(v["W"], 0.0, 1.0 / np.sqrt(v["alpha"])).sum()
    mean = _full_conv_numpy(v["b"][:, :, None, None] * v["W"], v["d"])
    lp += stats.norm.logpdf(X, mean, 1.0 / np.sqrt(v["gamma"])[:, None, None, None]).sum()
    np.testing.assert_allclose(got, lp, rtol=1e-10)

    # the per-image log-likelihood the registry stores comes from gamma and the residual norm
    per_image = np.asarray(log_likelihood(conv_factor, {k: jnp.asarray(a)[None] for k, a in latent.items()},
                                          jnp.asarray(X), **kw)["X"][0])
    P = X[0].size
    r = np.sqrt(((X - mean) ** 2).sum((1, 2, 3)))
    np.testing.assert_allclose(per_image, 0.5 * P * np.log(v["gamma"] / (2 * np.pi))
                               - 0.5 * v["gamma"] * r**2, rtol=1e-10)


def test_prior_predictive_shapes_and_deterministic_summaries():
    kw = dict(K=2, atom_shape=(3, 3), N=5, image_shape=(3, 7, 6), priors=PRIORS)
    s = Predictive(conv_factor, num_samples=2)(jax.random.PRNGKey(0), **kw)
    assert s["X"].shape == (2, 5, 3, 7, 6)
    assert s["W"].shape == s["alpha"].shape == (2, 5, 2, 5, 4)
    assert s["d"].shape == s["beta"].shape == (2, 2, 3, 3, 3)
    assert s["b"].shape == (2, 5, 2) and s["gamma"].shape == (2, 5) and s["pi"].shape == (2, 2)
    assert s["recon_norm"].shape == s["resid_norm"].shape == (2, 5)
    np.testing.assert_array_equal(s["num_active"], np.asarray(s["b"]).any(1).sum(-1))


def test_default_priors_are_the_papers():
    p = default_priors(8)
    assert float(p["pi"].concentration1) == pytest.approx(1 / 8)
    assert float(p["gamma"].concentration) == 1e-6 and float(p["alpha"].rate) == 1e-3


def test_image_layouts_and_default_data():
    assert as_channels_first(np.zeros((4, 6, 5))).shape == (4, 1, 6, 5)
    X = np.arange(4 * 6 * 5 * 3.0).reshape(4, 6, 5, 3)
    Y = as_channels_first(X)
    assert Y.shape == (4, 3, 6, 5) and Y[1, 2, 3, 4] == X[1, 3, 4, 2]
    D = default_cfa_data(0)
    assert D.shape == (40, 8, 8) and 0.0 <= D.min() and D.max() <= 1.0


def test_refusals_are_one_sentence():
    with pytest.raises(ValueError, match="either images X or both"):
        conv_factor(K=2)
    with pytest.raises(ValueError, match="do not fit"):
        Predictive(conv_factor, num_samples=1)(jax.random.PRNGKey(0), K=2, atom_shape=(6, 2),
                                                N=2, image_shape=(1, 5, 5))
    with pytest.raises(ValueError, match=r"\(N, C, H, W\)"):
        conv_factor(jnp.zeros((3, 5, 5)), K=2)
