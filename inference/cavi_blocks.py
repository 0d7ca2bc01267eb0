r"""Block tables for closed-form coordinate ascent, matched against the model like Gibbs tables.

A :class:`CAVIBlock` is one coordinate update of a CAVI or (variational) EM sweep: the latent
sites whose q-factors (or point estimates) it writes, the distribution families its derivation is
exact for (``requires``, the likelihood site included, as for
:class:`~latentzoo.inference.updates.GibbsUpdate`), the guide params it writes, and the update.
:func:`coordinate_ascent` turns an ordered table into a
:class:`~latentzoo.inference.cavi.CoordinateAscent` recipe for the
:class:`~latentzoo.inference.cavi.CAVI` driver. On every call it traces the model on the data it
is given (:func:`plan_blocks`) and checks each block's ``requires`` against the model's sites:

- every block applies: a sweep is the table's closed-form updates, in order, and the objective is
  the table's analytic one;
- a block lost its closed form because a user changed the prior family of a site (say
  ``priors={"W": dist.Laplace(0.0, 1.0)}``), and the table has a guide and an objective split
  into terms: the block's params are fitted by NumPyro SVI steps on the guide (only that block's
  params move, the others are held fixed) and the changed site's expected log prior becomes a
  Monte Carlo term of the objective. The recipe warns once, naming the block and the site
  (:class:`ClosedFormFallbackWarning`, a :class:`~latentzoo.inference.gibbs.ConjugacyFallbackWarning`
  as the Gibbs builder's). Without a guide (or a split objective) one ValueError names the site
  and the block;
- a likelihood (observed) site of another family always raises: every block depends on it.

**Why the other blocks stay exact.** Under mean field the optimal factor of block j is
:math:`\log q_j^* = \mathbb E_{-j}[\log p(X, \theta)] + \text{const}`; the prior of another site
only adds a constant, so a closed-form update whose ``requires`` still hold remains the exact
maximiser of the ELBO in its block. Only the blocks that require or write the changed site lose
their closed form, and only that site's term of the ELBO changes.

**The objective with a fallback.** ``objective`` returns ``{term: scalar}``; the term keyed by a
latent site's name must be :math:`\mathbb E_q[\log p(\text{site})]` and nothing else. For a
changed site it is replaced by :math:`\frac1S\sum_s \log p(\theta_s)` over reparameterised draws
of the guide. The objective the driver reports uses one fixed set of ``eval_particles`` draws, so
it is a deterministic function of the params; the closed-form blocks do not touch the changed
site's params, so they still never lower it. The SVI steps use fresh draws every step (unbiased
gradients of the ELBO), and their result is kept only when it raises the reported objective, so
the driver's monotonicity check holds on this path too. (This assumes, as in the zoo's models,
that the changed site's prior depends on hyperparameters only; a prior that depends on another
site's draws couples that site's closed-form block to the Monte Carlo term, and the driver's
check would report a decrease.)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
from numpyro import handlers
from numpyro.infer import SVI
from numpyro.infer.elbo import ELBO
from numpyro.optim import Adam

from .cavi import CoordinateAscent
from .gibbs import ConjugacyFallbackWarning, read_model
from .gibbs_plan import warn_at_caller
from .updates import family_of

__all__ = [
    "CAVIBlock",
    "CAVIPlan",
    "SVIFallback",
    "ClosedFormFallbackWarning",
    "coordinate_ascent",
    "plan_blocks",
    "expected_log_prior",
]


class ClosedFormFallbackWarning(ConjugacyFallbackWarning):
    """A CAVI/EM block lost its closed form; its params are fitted by SVI steps instead."""


class CAVIBlock(NamedTuple):
    """One coordinate update of a closed-form sweep.

    Attributes:
        name: readable name used in warnings and errors, e.g. ``"q(W)"``.
        sites: the latent sites whose q-factors or point estimates the block writes.
        requires: site -> tuple of distribution classes the derivation is exact for; list the
            written sites' priors *and* the likelihood sites it relies on.
        update: ``(params, *args, context) -> params``: ``args`` are the model's positional
            arguments (the data), ``context`` what the table's ``read_priors`` returns (for FA
            the hyperparameters read from the model).
        params: the guide params the block writes (what SVI fits when the block lost its
            closed form).
    """

    name: str
    sites: tuple[str, ...]
    requires: Mapping[str, tuple[type, ...]]
    update: Callable[..., dict]
    params: tuple[str, ...] = ()


class SVIFallback(NamedTuple):
    """Settings of the SVI steps that stand in for a block without its closed form."""

    num_steps: int = 25  # Adam steps per sweep
    step_size: float = 0.02
    num_particles: int = 8  # fresh guide draws per step for the changed sites' prior terms
    eval_particles: int = 64  # fixed draws for the objective the driver reports


class CAVIPlan(NamedTuple):
    """Which blocks keep their closed form on this model, decided from its trace.

    Attributes:
        blocks: the table, in sweep order.
        exact: for each block, whether its closed-form update applies.
        changed: ``(site, family it has, families wanted, block name)`` for each latent site whose
            prior family differs from what a block requires.
    """

    blocks: tuple[CAVIBlock, ...]
    exact: tuple[bool, ...]
    changed: tuple[tuple[str, str, str, str], ...]

    @property
    def lost(self) -> tuple[CAVIBlock, ...]:
        return tuple(b for b, ok in zip(self.blocks, self.exact) if not ok)

    @property
    def changed_sites(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c[0] for c in self.changed))

    def __repr__(self) -> str:
        rows = []
        for b, ok in zip(self.blocks, self.exact):
            why = [f"site {s!r} has a {have} prior, the update is derived for {want}"
                   for s, have, want, name in self.changed if name == b.name or s in b.sites]
            how = "closed form" if ok else \
                f"SVI steps on {', '.join(b.params) or '(no params)'}: {'; '.join(dict.fromkeys(why))}"
            rows.append((b.name, ", ".join(b.sites), how))
        w0 = max((len(r[0]) for r in rows), default=0)
        w1 = max((len(r[1]) for r in rows), default=0)
        lines = [f"  {a.ljust(w0)}  {c.ljust(w1)}  {h}".rstrip() for a, c, h in rows]
        return "CAVIPlan (sweep order)\n" + "\n".join(lines)

    __str__ = __repr__


def _accepted_kwargs(fn, kwargs: dict) -> dict:
    """The keyword arguments ``fn`` accepts (all of them when it takes ``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return dict(kwargs)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(kwargs)
    return {k: v for k, v in kwargs.items() if k in params}


def _site_families(model, args, model_kwargs) -> dict[str, tuple[type, bool]]:
    """site -> (family, observed) of every sample site, read off an abstract trace of the model
    (``jax.eval_shape``: nothing is sampled or computed, and it works inside jit)."""
    out = {}

    def read(*a):
        _, _, tr = read_model(model, {}, a, model_kwargs)
        for n, s in tr.items():
            if s["type"] == "sample":
                out[n] = (family_of(s["fn"]), bool(s["is_observed"]))
        return jnp.zeros(())

    jax.eval_shape(read, *args)
    return out


def plan_blocks(model, blocks: Sequence[CAVIBlock], *args, **kwargs) -> CAVIPlan:
    """Match a block table against ``model(*args, **kwargs)`` (keywords the model does not take
    are dropped). Raises one ValueError sentence for a site the model lacks, a latent site no
    block writes, or a likelihood site of another family than a block needs."""
    sample = _site_families(model, args, _accepted_kwargs(model, kwargs))
    blocks = tuple(blocks)
    changed = []
    for b in blocks:
        for site in (*b.sites, *b.requires):
            if site not in sample:
                raise ValueError(
                    f"The model has no sample site {site!r}, which block {b.name!r} needs."
                )
        for site, families in b.requires.items():
            family, observed = sample[site]
            if issubclass(family, tuple(families)):
                continue
            have = family.__name__
            want = "/".join(f.__name__ for f in families)
            if observed:
                raise ValueError(
                    f"The likelihood site {site!r} is {have} but block {b.name!r} is derived for "
                    f"{want}, so the closed-form updates do not apply to this model."
                )
            changed.append((site, have, want, b.name))
    written = {s for b in blocks for s in b.sites}
    for site, (_, observed) in sample.items():
        if not observed and site not in written:
            names = ", ".join(repr(b.name) for b in blocks)
            raise ValueError(
                f"The model's latent site {site!r} is written by no block of the table ({names})."
            )
    # A block is exact when its requires hold and it writes no changed site (q*(site) depends on
    # the site's prior even when the block does not list it).
    lost = {c[3] for c in changed}
    changed_sites = {c[0] for c in changed}
    exact = tuple(b.name not in lost and not set(b.sites) & changed_sites for b in blocks)
    return CAVIPlan(blocks, exact, tuple(changed))


def expected_log_prior(model, guide, params, sites, rng_key, num_particles, args, kwargs) -> dict:
    """``{site: mean_s log p(theta_s)}``: the model's prior of each site at ``num_particles``
    reparameterised draws of the guide at ``params`` (all latent sites drawn, so a prior that
    depends on other sites is evaluated at their draws too)."""
    mkw, gkw = _accepted_kwargs(model, kwargs), _accepted_kwargs(guide, kwargs)

    def one(key):
        seeded = handlers.seed(handlers.substitute(guide, data=params), key)
        gtr = handlers.trace(seeded).get_trace(*args, **gkw)
        values = {
            n: s["value"] for n, s in gtr.items() if s["type"] == "sample" and not s["is_observed"]
        }
        for s in sites:
            if not gtr[s]["fn"].has_rsample:
                raise ValueError(
                    f"The guide's factor of site {s!r} ({type(gtr[s]['fn']).__name__}) cannot be "
                    "reparameterised, so the Monte Carlo prior term of that site has no gradient."
                )
        priors, _, _ = read_model(model, values, args, mkw)
        return jnp.stack([jnp.sum(priors[s].log_prob(values[s])) for s in sites])

    draws = jax.vmap(one)(jax.random.split(rng_key, num_particles))
    return dict(zip(sites, draws.mean(0)))


class _BlockELBO(ELBO):
    """The negated objective of one fallback block as an SVI loss: the table's closed-form terms
    plus Monte Carlo terms for the changed sites, with fresh draws from SVI's key every step."""

    def __init__(self, value_fn):
        super().__init__(num_particles=1)
        self._value_fn = value_fn

    def loss(self, rng_key, param_map, model, guide, *args, **kwargs):
        return -self._value_fn(param_map, rng_key)


def _total(terms) -> jax.Array:
    return sum(terms.values()) if isinstance(terms, Mapping) else terms


def coordinate_ascent(
    model,
    blocks: Sequence[CAVIBlock],
    init: Callable[..., dict],
    objective: Callable,
    read_priors: Callable | None = None,
    *,
    guide=None,
    validate: Callable | None = None,
    fallback: SVIFallback | None = SVIFallback(),
) -> CoordinateAscent:
    """A :class:`~latentzoo.inference.cavi.CoordinateAscent` recipe from an ordered block table.

    Args:
        model: the NumPyro model; traced on the data on every call to check the table
            (:func:`plan_blocks`).
        blocks: the :class:`CAVIBlock` table, in sweep order.
        init: ``(rng_key, *args, context, **kwargs) -> params``; ``kwargs`` are the driver's
            (the model's own ``priors`` among them, so do not call the context ``priors``).
        objective: ``(params, *args, context) -> scalar`` or ``{term: scalar}`` (summed); the
            split form, with each latent site's expected log prior under the site's name, is what
            lets a block fall back to SVI.
        read_priors: ``(model, *args, **kwargs) -> context``, what the blocks and the objective
            read besides the params (the model's hyperparameters, say); re-read on every call, so
            an edited hyperparameter changes the updates. None: the context is ``None``.
        guide: the NumPyro guide of the params; None means a block that lost its closed form
            raises instead of falling back.
        validate: ``(*args, **kwargs) -> args``, run on the data by ``init`` only.
        fallback: the SVI settings (None: raise instead of falling back).

    The recipe's ``update`` takes a keyword ``rng_key`` (the driver passes a fresh one each
    sweep) for the SVI steps; closed-form sweeps do not use it.
    """
    blocks = tuple(blocks)
    warned: set[tuple[str, ...]] = set()

    def prepare(args, kwargs):
        plan = plan_blocks(model, blocks, *args, **kwargs)
        if plan.lost:
            _check_fallback(plan)
            names = tuple(b.name for b in plan.lost)
            if names not in warned:
                warned.add(names)
                warn_at_caller(_fallback_message(plan), ClosedFormFallbackWarning)
        context = read_priors(model, *args, **kwargs) if read_priors is not None else None
        return plan, context

    def _check_fallback(plan):
        site, have, want, name = plan.changed[0]
        if guide is None or fallback is None:
            raise ValueError(
                f"Site {site!r} has a {have} prior but block {name!r} is exact only for {want}, "
                "and this table has no SVI fallback; sample this model by MCMC instead."
            )
        for b in plan.lost:
            if not b.params:
                raise ValueError(
                    f"Block {b.name!r} lost its closed form (site {site!r} is {have}) but declares "
                    "no guide params to fit by SVI instead."
                )

    def value(params, args, kwargs, plan, context, key, num):
        terms = objective(params, *args, context)
        if not plan.lost:
            return _total(terms)
        changed = plan.changed_sites
        missing = [s for s in changed if not isinstance(terms, Mapping) or s not in terms]
        if missing:
            owner = next(c[3] for c in plan.changed if c[0] == missing[0])
            raise ValueError(
                f"Block {owner!r} lost its closed form for site {missing[0]!r}, but the table's "
                "objective does not give that site's prior term separately, so it cannot fall "
                "back to SVI."
            )
        rest = sum(v for k, v in terms.items() if k not in changed)
        mc = expected_log_prior(model, guide, params, changed, key, num, args, kwargs)
        return rest + sum(mc.values())

    def eval_value(params, args, kwargs, plan, context):
        if not plan.lost:
            return _total(objective(params, *args, context))
        key = jax.random.PRNGKey(0)  # one fixed set of draws: a deterministic objective
        return value(params, args, kwargs, plan, context, key, fallback.eval_particles)

    def svi_block(params, block, args, kwargs, plan, context, key):
        mkw = _accepted_kwargs(model, kwargs)
        frozen = {k: v for k, v in params.items() if k not in block.params}
        block_guide = handlers.block(handlers.substitute(guide, data=frozen), hide=list(frozen))

        def block_value(p, k):
            return value({**frozen, **p}, args, kwargs, plan, context, k, fallback.num_particles)

        svi = SVI(model, block_guide, Adam(fallback.step_size), _BlockELBO(block_value))
        state = svi.init(key, *args, init_params={k: params[k] for k in block.params}, **mkw)
        state = jax.lax.fori_loop(
            0, fallback.num_steps, lambda _, s: svi.stable_update(s, *args, **mkw)[0], state
        )
        new = {**params, **svi.get_params(state)}
        both = jax.tree.map(lambda a, b: jnp.stack([a, b]), params, new)  # one copy of the graph
        old_v, new_v = jax.vmap(lambda p: eval_value(p, args, kwargs, plan, context))(both)
        keep = jnp.isfinite(new_v) & (new_v >= old_v)
        for k in block.params:
            keep = keep & jnp.all(jnp.isfinite(new[k]))
        return {**params, **{k: jnp.where(keep, new[k], params[k]) for k in block.params}}

    def _init(rng_key, *args, **kwargs):
        if validate is not None:
            args = tuple(validate(*args, **kwargs))
        _, context = prepare(args, kwargs)
        return init(rng_key, *args, context, **kwargs)

    def update(params, *args, rng_key=None, **kwargs):
        plan, context = prepare(args, kwargs)
        keys = jax.random.split(jax.random.PRNGKey(0) if rng_key is None else rng_key, len(blocks))
        for block, ok, key in zip(plan.blocks, plan.exact, keys):
            if ok:
                params = block.update(params, *args, context)
            else:
                params = svi_block(params, block, args, kwargs, plan, context, key)
        return params

    def elbo(params, *args, **kwargs):
        plan, context = prepare(args, kwargs)
        return eval_value(params, args, kwargs, plan, context)

    return CoordinateAscent(_init, update, elbo)


def _fallback_message(plan: CAVIPlan) -> str:
    parts = []
    for b in plan.lost:
        why = [f"site {s!r} has a {have} prior, the update is derived for {want}"
               for s, have, want, name in plan.changed if name == b.name or s in b.sites]
        parts.append(
            f"Block {b.name!r} has no closed form for this model ({'; '.join(dict.fromkeys(why))}): "
            f"its params {', '.join(b.params)} are fitted by NumPyro SVI steps on the guide with "
            "the other params held fixed."
        )
    sites = ", ".join(plan.changed_sites)
    return " ".join(parts) + (
        f" E_q[log p({sites})] in the ELBO is a Monte Carlo estimate; the other blocks keep their "
        "closed-form updates."
    )
