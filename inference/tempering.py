r"""Tempered likelihoods: the path of distributions annealed importance sampling walks.

For a model with latents :math:`z` (parameters fixed) and data :math:`x`, the tempered target at
inverse temperature :math:`\beta \in [0, 1]` is the *unnormalised* density

.. math::

    f_\beta(z) = p(z)\, p(x \mid z)^\beta ,

with :math:`f_0` the prior and :math:`f_1 \propto p(z \mid x)`. :func:`temper` makes it from any
model: every observed sample site's distribution is wrapped in :class:`Tempered`, whose
``log_prob`` is :math:`\beta` times the base one. NumPyro's ``log_density``, ``potential_energy``
and the Gibbs builder's :func:`~latentzoo.inference.gibbs.read_model` then all see
:math:`f_\beta` with no other change.

A hand-derived update *honours* the temperature when it reads :func:`temperature` of the
likelihood site in its ``priors`` argument and uses it. For a Gaussian likelihood
:math:`\mathcal N(x; e(z), \Psi)` that is one substitution: :math:`p(x \mid z)^\beta` equals
:math:`\mathcal N(x; e(z), \Psi/\beta)` times a factor free of :math:`z`, so the tempered
conditional of a Gaussian latent block is the untempered one with noise precision
:math:`\beta\Psi^{-1}`. The factor depends on :math:`\Psi` (and so, in a mixture with
per-component noise, on the label): an update that draws a label must keep it.
``check_conditional`` on ``temper(model, beta)`` tests an update's tempered conditional against
the tempered joint density, exactly as at :math:`\beta = 1`.

Nothing here adds a normalising constant of :math:`f_\beta`: AIS needs the same unnormalised
:math:`f_\beta` for the weights and the transitions, and a :math:`z`-free constant
:math:`C(\beta)` in the weights (the tensor-analysers supplement's eqs. 18-20) would multiply the
estimate by :math:`e^{C(\beta_K) - C(\beta_0)}`, which is infinite at :math:`\beta_0 = 0`.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpyro.distributions as dist
from numpyro.primitives import Messenger

__all__ = ["Tempered", "temper", "temperature"]


class Tempered(dist.Distribution):
    """``base`` with its log density multiplied by ``beta``: log_prob(x) = beta * base.log_prob(x).

    Not normalised for beta != 1 (it is a factor of the annealing path, not a distribution one
    samples from); ``sample`` draws from ``base`` so prior-predictive code keeps working.
    Shapes are those of ``base``; ``beta`` is a scalar (may be traced).
    """

    pytree_data_fields = ("base_dist", "beta")

    def __init__(self, base_dist: dist.Distribution, beta, *, validate_args=None):
        self.base_dist = base_dist
        self.beta = jnp.asarray(beta)
        super().__init__(base_dist.batch_shape, base_dist.event_shape, validate_args=validate_args)

    @property
    def support(self):
        return self.base_dist.support

    def sample(self, key, sample_shape=()):
        return self.base_dist.sample(key, sample_shape)

    def log_prob(self, value):
        return self.beta * self.base_dist.log_prob(value)


class _TemperObserved(Messenger):
    def __init__(self, fn, beta, sites):
        self.beta = beta
        self.sites = sites
        super().__init__(fn)

    def process_message(self, msg):
        if (
            msg["type"] == "sample"
            and msg["is_observed"]
            and (self.sites is None or msg["name"] in self.sites)
        ):
            msg["fn"] = Tempered(msg["fn"], self.beta)


def temper(model, beta, sites=None):
    """``model`` with every observed sample site (or only those named in ``sites``) tempered by
    ``beta``: its log density becomes :math:`\\log p(z) + \\beta \\log p(x \\mid z)`.

    Args:
        model: a NumPyro program.
        beta: inverse temperature, a scalar in [0, 1] (a traced value is fine).
        sites: names of the observed sites to temper; None tempers all of them.
    """
    return _TemperObserved(model, beta, None if sites is None else tuple(sites))


def temperature(d: dist.Distribution):
    """The inverse temperature of a likelihood site's distribution as the model traced it: the
    ``beta`` of a :class:`Tempered` wrapper, or 1.0 for an untempered site."""
    beta = 1.0
    while True:
        if isinstance(d, Tempered):
            beta = beta * d.beta
            d = d.base_dist
        elif isinstance(d, (dist.Independent, dist.ExpandedDistribution, dist.MaskedDistribution)):
            d = d.base_dist
        else:
            return beta
