"""Hand-derived updates: the records a Gibbs kernel is built from, and helpers to read priors.

An update is a pure function of ``(key, values, obs, priors)``:

- ``values``: dict of the current constrained values of every latent site;
- ``obs``: dict of the observed sites' values (the data);
- ``priors``: dict site -> the NumPyro distribution the model attaches to that site *at the
  current values* (so hyperparameters are whatever the model file says, including ones that
  depend on other latent sites).

Two kinds exist:

- :class:`GibbsUpdate` draws a block from its exact full conditional. It exposes the conditional
  as NumPyro distributions, so one object both samples and is checked against the model's joint
  density (:func:`latentzoo.inference.checks.check_conditional`).
- :class:`Move` is any other posterior-preserving step (a Metropolis-Hastings step along a
  likelihood-invariant group, a parameter-expansion move). It has no closed-form conditional and
  is validated by the Geweke test alone.

Each update lists the distribution families it is exact for (``requires``). The builder in
:mod:`latentzoo.inference.gibbs` compares them with the model's sites; a site whose prior family a
user changes loses its update and is sampled by a generic kernel instead. A move whose accept
step reads the prior's own log density is exact for any elementwise prior: it requires
:data:`ELEMENTWISE`, which matches every family with scalar events, and stays when the prior is
swapped to another such family.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpyro.distributions as dist

from .tempering import Tempered


__all__ = [
    "scale_proposal",
    "GibbsUpdate",
    "Move",
    "unwrap",
    "family_of",
    "prior_params",
    "elementwise_log_prob",
    "Elementwise",
    "ELEMENTWISE",
]

SiteValues = dict[str, jax.Array]
ConditionalFn = Callable[[SiteValues, SiteValues, Mapping[str, dist.Distribution]], dict]
SampleFn = Callable[[jax.Array, SiteValues, SiteValues, Mapping[str, dist.Distribution]], dict]


class GibbsUpdate(NamedTuple):
    """An exact draw of a block of sites from its full conditional.

    Attributes:
        name: readable name used in warnings and diagnostics, e.g. ``"psi | W, z, mu"``.
        sites: the latent sites the update writes (and owns: no other update may write them).
        requires: site -> tuple of distribution classes the derivation is exact for. List the
            written sites' priors *and* the likelihood sites it relies on.
        conditional: ``(values, obs, priors) -> {site: Distribution}``, the conditional of each
            site when the block's sites are conditionally independent; it is what is sampled and
            what :func:`~latentzoo.inference.checks.check_conditional` compares with the joint.
        draw: ``(key, values, obs, priors) -> {site: value}`` for blocks whose exact draw is
            sequential (e.g. a label from its z-marginalised conditional, then z given the
            label); used instead of ``conditional`` when given.
        tempered: True when the derivation reads the likelihood's temperature
            (:func:`~latentzoo.inference.tempering.temperature`) and is exact on the annealed
            path too; annealed importance sampling refuses updates without it.
    """

    name: str
    sites: tuple[str, ...]
    requires: Mapping[str, tuple[type, ...]]
    conditional: ConditionalFn | None = None
    draw: SampleFn | None = None
    tempered: bool = False

    def sample(self, key, values, obs, priors) -> SiteValues:
        if self.draw is not None:
            return self.draw(key, values, obs, priors)
        cond = self.conditional(values, obs, priors)
        keys = jax.random.split(key, len(self.sites))
        return {s: cond[s].sample(k) for s, k in zip(self.sites, keys)}


class Move(NamedTuple):
    """A posterior-preserving move that is not a conditional draw (MH, parameter expansion).

    Attributes:
        name: readable name.
        sites: the latent sites the move may change.
        requires: as for :class:`GibbsUpdate`.
        step: ``(key, values, obs, priors) -> {site: new value}`` for ``sites``.
        orbit: optional group action ``(values, t) -> values`` along which the move travels
            (``t`` of shape (K,), one coordinate per independent orbit, t = 0 the identity).
        orbit_log_jacobian: ``(values, t) -> scalar``, log of the Jacobian of the action with
            respect to the measure the move targets (so the move leaves
            ``p(orbit(v, t)) * exp(orbit_log_jacobian(v, t))`` invariant in ``t``).
        coordinate: ``(reference, values) -> t`` recovering ``t`` with
            ``values = orbit(reference, t)``.

    The three optional fields let :func:`~latentzoo.inference.checks.check_move_on_orbit` test an
    MH move against the exact target on a 1-D orbit, which a Geweke test on a small problem can
    miss (an MH move whose accept step is lost still nearly preserves a peaked target).
    ``tempered``: as for :class:`GibbsUpdate`.
    ``preserves_likelihood``: True for moves that travel along a group leaving p(X | ...)
    unchanged (interweaving, scale and rotation moves), which a deterministic check verifies; an
    MH move that changes the latents' fit to X (a partially collapsed draw) sets it False and is
    judged by Geweke and SBC alone.
    """

    name: str
    sites: tuple[str, ...]
    requires: Mapping[str, tuple[type, ...]]
    step: SampleFn
    orbit: Callable | None = None
    orbit_log_jacobian: Callable | None = None
    coordinate: Callable | None = None
    tempered: bool = False
    preserves_likelihood: bool = True

    def sample(self, key, values, obs, priors) -> SiteValues:
        return self.step(key, values, obs, priors)


def unwrap(d: dist.Distribution) -> dist.Distribution:
    """Strip ``Independent`` / ``ExpandedDistribution`` / ``MaskedDistribution`` wrappers, and
    the :class:`~latentzoo.inference.tempering.Tempered` wrapper of an annealed likelihood (an
    update that reads a tempered site finds its family here and its temperature with
    :func:`~latentzoo.inference.tempering.temperature`)."""
    while isinstance(
        d, (dist.Independent, dist.ExpandedDistribution, dist.MaskedDistribution, Tempered)
    ):
        d = d.base_dist
    return d


def family_of(d: dist.Distribution) -> type:
    """The class of the innermost distribution (``Normal`` for ``Normal(0, 1).expand([3])``)."""
    return type(unwrap(d))


def prior_params(d: dist.Distribution, shape, *names: str) -> tuple[jax.Array, ...]:
    """The parameters ``names`` of the innermost distribution, broadcast to ``shape``.

    Example: ``loc, scale = prior_params(priors["W"], (D, K), "loc", "scale")``.
    """
    base = unwrap(d)
    return tuple(jnp.broadcast_to(getattr(base, n), shape) for n in names)


def elementwise_log_prob(d: dist.Distribution, value: jax.Array) -> jax.Array:
    """Log density of each entry of ``value`` under a scalar-event prior (wrappers stripped).

    Used by moves that need per-element prior terms; only valid for priors whose innermost
    distribution has an empty event shape (all of the zoo's elementwise priors).
    """
    return unwrap(d).log_prob(value)


class _ElementwiseMeta(type):
    def __instancecheck__(cls, d) -> bool:
        return isinstance(d, dist.Distribution) and tuple(unwrap(d).event_shape) == ()

    def __subclasscheck__(cls, sub) -> bool:  # a class alone does not say its event shape
        return sub is cls


class Elementwise(metaclass=_ElementwiseMeta):
    """A ``requires`` family that matches any distribution whose innermost event is a scalar
    (Normal, Laplace, StudentT, ... of any batch shape): what a move needs whose acceptance
    ratio sums :func:`elementwise_log_prob` of the model's own prior."""


ELEMENTWISE = (Elementwise,)


def scale_proposal(a, b, p):
    """Mode and Laplace scale (t_mode, sigma) of ``p t - a e^{2t}/2 - b e^{-2t}/2``, the scale
    move's exact target in t = log c under zero-mean Normal priors (a = sum W^2/s_W^2, b = sum
    z^2/s_z^2, p the Jacobian's power). Both are equivariant under the move, which keeps an MH
    step that proposes from N(t_mode, sigma^2) valid for any prior. Arrays broadcast; a > 0."""
    u = (p + jnp.sqrt(p**2 + 4.0 * a * b)) / (2.0 * a)
    return 0.5 * jnp.log(u), 1.0 / jnp.sqrt(2.0 * a * u + 2.0 * b / u)
