"""What every convolutional FA update reads: the residual, the coefficients' prior at the current
precisions, and the site families the updates declare. Shared by the Gibbs table
(:mod:`latentzoo.inference.conv_factor.gibbs`) and the joint move
(:mod:`latentzoo.inference.conv_factor.joint_b`), which builds on the same terms."""

from __future__ import annotations

import numpyro.distributions as dist

from latentzoo.inference.updates import prior_params
from latentzoo.models.conv_factor import reconstruct

__all__ = ["NORMAL", "GAMMA", "BERNOULLI", "residual", "W_PRIOR"]

NORMAL, GAMMA = (dist.Normal,), (dist.Gamma,)
BERNOULLI = (dist.BernoulliProbs, dist.BernoulliLogits)


def residual(values, X):
    """R = X - sum_k b_nk W_nk * d_k, (N, C, H, W)."""
    bW = values["b"][:, :, None, None] * values["W"]
    return X - reconstruct(bW, values["d"])


def W_PRIOR(priors, shape):
    """(loc, precision) of the coefficients' prior at the current alpha, read from the model."""
    loc, scale = prior_params(priors["W"], shape, "loc", "scale")
    return loc, 1.0 / scale**2
