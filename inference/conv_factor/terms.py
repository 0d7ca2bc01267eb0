"""What every convolutional FA update reads: the residual, the coefficients' prior at the current
precisions, and the site families the updates declare. Shared by the Gibbs table
(:mod:`latentzoo.inference.conv_factor.gibbs`) and the joint move
(:mod:`latentzoo.inference.conv_factor.joint_b`), which builds on the same terms."""

from __future__ import annotations

import jax.numpy as jnp
import numpyro.distributions as dist

from latentzoo.inference.tempering import temperature
from latentzoo.inference.updates import prior_params
from latentzoo.models.conv_factor import reconstruct

__all__ = ["NORMAL", "GAMMA", "BERNOULLI", "residual", "W_PRIOR", "likelihood_precision"]

NORMAL, GAMMA = (dist.Normal,), (dist.Gamma,)
BERNOULLI = (dist.BernoulliProbs, dist.BernoulliLogits)


def residual(values, X):
    """R = X - sum_k b_nk W_nk * d_k, (N, C, H, W)."""
    bW = values["b"][:, :, None, None] * values["W"]
    return X - reconstruct(bW, values["d"])


def likelihood_precision(values, priors, N):
    """The noise precision the likelihood's terms carry, (N,): beta * gamma_n, with beta the
    likelihood's temperature (1 unless tempered). For the Gaussian likelihood
    N(x_n; recon_n, 1 / gamma_n), p(x_n | .)^beta is N(x_n; recon_n, 1 / (beta gamma_n)) times a
    factor that holds gamma_n alone, so every update of W, b and d (and every MH ratio over them)
    is exact on the tempered path with gamma_n replaced by beta gamma_n; gamma's own update
    reads beta separately (it holds that factor)."""
    return temperature(priors["X"]) * jnp.broadcast_to(values["gamma"], (N,))


def W_PRIOR(priors, shape):
    """(loc, precision) of the coefficients' prior at the current alpha, read from the model."""
    loc, scale = prior_params(priors["W"], shape, "loc", "scale")
    return loc, 1.0 / scale**2
