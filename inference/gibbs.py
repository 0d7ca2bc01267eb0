"""The conjugacy-aware Gibbs builder: hand-derived updates running inside NumPyro's ``MCMC``.

:class:`ConjugateGibbs` is a :class:`numpyro.infer.mcmc.MCMCKernel` built from a model and a table
of updates (:class:`~latentzoo.inference.updates.GibbsUpdate`,
:class:`~latentzoo.inference.updates.Move`). At ``init`` it traces the model on the data it is given
and makes a :class:`GibbsPlan`:

- each update whose ``requires`` families match the model's sites is used, in table order; the
  first update that claims a site owns it;
- a latent site that no applicable update covers is offered to the conjugacy detector
  (:mod:`latentzoo.inference.conjugacy`; ``derive=False`` turns this off): when it finds the
  site's full conditional in closed form from the model's trace (a Normal mean, a Gamma
  precision, a Beta probability, ...), that derived update samples the site, after the table's
  updates; the plan names the conjugate pair, or keeps the detector's reason for the next step;
- a latent site that no applicable update covers (because a user changed its prior family, say)
  and that the detector does not derive is sampled generically through NumPyro's composite
  :class:`numpyro.infer.Gibbs`: NUTS for continuous sites, :class:`~numpyro.infer.DiscreteGibbs`
  for discrete ones. The kernel warns once
  (:class:`ConjugacyFallbackWarning`), naming those sites and the update that no longer applies;
  sites the table has no update for by design get a :class:`GenericKernelNote` instead. Both
  point at the user's line, not NumPyro's. Inference stays correct; only speed changes;
- the moves (:class:`~latentzoo.inference.updates.Move`) whose ``requires`` hold run after each
  sweep, also on sites a NUTS block samples: a move is exact under the model's own density
  whoever samples its sites. ``print(kernel.plan(X, K=3))`` shows the plan.

When every site has an update, a sweep is one pure, jit-friendly function of
``(state, data)``: each update re-traces the model at the current values to read its priors'
hyperparameters, so editing a hyperparameter in the model file changes the draws without touching
the kernel. An update whose ``conditional`` has a ``bind_model(model, model_args, model_kwargs)``
method (a derived one, which re-traces the whole model) is bound to the sweep's model and
arguments before it runs (:func:`bind_update`). The kernel holds no data:
``MCMC.run(key, X, K=3)`` passes it, so one kernel object serves many data sets (the Geweke and
SBC checks rely on this).

Chain methods: "sequential", "parallel" and (when no fallback is needed) "vectorized".
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from numpyro.distributions.transforms import biject_to
from numpyro.infer import NUTS, DiscreteGibbs, Gibbs
from numpyro.infer.gibbs import (
    GIBBS_SITES_KWARG,
    CustomGibbsState,
    latent_sample_sites,
    prototype_trace,
    with_conditioning,
)
from numpyro.infer.hmc import HMC
from numpyro.infer.mcmc import MCMCKernel
from numpyro.infer.util import log_density
from numpyro.util import is_prng_key



from .gibbs_plan import (
    read_model,
    ConjugacyFallbackWarning,
    GenericKernelNote,
    GibbsPlan,
    fallback_warnings,
    make_plan,
    warn_at_caller,
)
from .updates import GibbsUpdate, Move

__all__ = [
    "ConjugateGibbs",
    "GibbsPlan",
    "SweepState",
    "CompositeState",
    "ConjugacyFallbackWarning",
    "GenericKernelNote",
    "make_plan",
    "read_model",
    "potential_energy",
    "start_values",
    "quiet_if_drawn_from_prior",
    "init_vectorized",
    "observed_log_likelihood",
    "sweep_values",
    "bind_update",
    "default_deriver",
]


class SweepState(NamedTuple):
    """State of the all-conjugate sampler.

    - **z**: constrained values of every latent site.
    - **rng_key**: key for the next sweep.
    - **potential_energy**: -log p(latents, data) at ``z`` (ArviZ's ``lp`` with the sign flipped).
    - **diverging**: always False; present so that sample_stats look alike for every kernel.
    """

    z: dict[str, jax.Array]
    rng_key: jax.Array
    potential_energy: jax.Array
    diverging: jax.Array


class CompositeState(NamedTuple):
    """State when some sites fall back to generic kernels.

    - **z**: the composite's values (NUTS-owned sites are unconstrained here; ``postprocess_fn``
      constrains them).
    - **inner**: the state of :class:`numpyro.infer.Gibbs`.
    - **potential_energy**: -log p(latents, data) at the constrained values.
    - **diverging**: whether the NUTS block's trajectory diverged this sweep.
    - **rng_key**: key for the next sweep (the composite's own key is replaced by it), so
      NumPyro's ``mcmc.post_warmup_state = mcmc.last_state`` then
      ``mcmc.run(mcmc.post_warmup_state.rng_key, ...)`` continues the chain as with every kernel.
    """

    z: dict[str, jax.Array]
    inner: Any
    potential_energy: jax.Array
    diverging: jax.Array
    rng_key: jax.Array


def potential_energy(model, values, model_args, model_kwargs):
    """-log p(values, data): NumPyro's potential energy at constrained values."""
    return -log_density(model, model_args, model_kwargs, values)[0]


def start_values(model, rng_key, model_args, model_kwargs, init_params) -> dict:
    """A chain's start, the constrained values of every latent site: one draw from the model's
    prior with ``init_params`` (constrained values) put in; a ValueError names sites the model
    lacks."""
    tr = prototype_trace(model, rng_key, model_args, model_kwargs)
    z = {n: tr[n]["value"] for n in latent_sample_sites(tr)}
    if init_params:
        unknown = set(init_params) - set(z)
        if unknown:
            raise ValueError(f"init_params names sites {sorted(unknown)} the model lacks.")
        z.update({k: jnp.asarray(v, dtype=jnp.result_type(z[k])) for k, v in init_params.items()})
    return z


@contextlib.contextmanager
def quiet_if_drawn_from_prior(init_params):
    """Evaluate densities at a start without NumPyro's eager "Out-of-support values" warning
    when the start was drawn from the prior (no ``init_params``): such a draw can sit on its
    support's edge (cfa's Ga(1e-6, 1e-6) noise precision draws 0.0 in float64), and it is what
    NumPyro asks a kernel for, then discards, when a run resumes from a saved state. A start the
    user gives is still checked."""
    with warnings.catch_warnings():
        if not init_params:
            warnings.filterwarnings("ignore", message="Out-of-support values", category=UserWarning)
        yield


def bind_update(update, model, model_args, model_kwargs):
    """``update`` bound to this model and these arguments when its conditional re-traces the
    model (it has ``bind_model``: a derived update); any other update unchanged."""
    bind = getattr(getattr(update, "conditional", None), "bind_model", None)
    if bind is None:
        return update
    return bind(model, model_args, model_kwargs)


def default_deriver():
    """The conjugacy detector's builder hook,
    :func:`latentzoo.inference.conjugacy.derive_site` (imported when first needed: tracing
    machinery a table that covers every site never uses)."""
    from latentzoo.inference.conjugacy import derive_site

    return derive_site


def sweep_values(model, updates, values, keys, model_args, model_kwargs) -> dict:
    """The values after one pass over the updates, update i drawn with ``keys[i]``; no density
    is evaluated at the end (:func:`sweep` adds it)."""
    values = dict(values)
    for u, k in zip(updates, keys):
        u = bind_update(u, model, model_args, model_kwargs)
        priors, obs, _ = read_model(model, values, model_args, model_kwargs)
        values.update(u.sample(k, values, obs, priors))
    return values


def sweep(model, updates, state: SweepState, model_args, model_kwargs) -> SweepState:
    """One pass over the updates, and -log p at the result. Pure: jit, vmap and scan it freely."""
    rng_key, *keys = jax.random.split(state.rng_key, len(updates) + 1)
    values = sweep_values(model, updates, state.z, keys, model_args, model_kwargs)
    pe = potential_energy(model, values, model_args, model_kwargs)
    return SweepState(values, rng_key, pe, jnp.zeros((), bool))


def observed_log_likelihood(model, values, model_args, model_kwargs, sites=None):
    r""":math:`\log p(x \mid \theta)`: the summed log densities of the model's observed sample
    sites (those in ``sites``, or all), handler scales included, at ``values``; scalar."""
    _, _, tr = read_model(model, values, model_args, model_kwargs)
    total = jnp.zeros(())
    for name, site in tr.items():
        if site["type"] != "sample" or not site["is_observed"] or name in values:
            continue
        if sites is not None and name not in sites:
            continue
        lp = site["fn"].log_prob(site["value"])
        if site.get("scale") is not None:
            lp = lp * site["scale"]
        total = total + jnp.sum(lp)
    return total


def init_vectorized(init_one, rng_keys, init_params):
    """``chain_method="vectorized"``: ``init_one(key, params)`` for a batch of keys (and of
    starting values, or None), vmapped into one batched state."""
    if init_params is None:
        return jax.vmap(lambda k: init_one(k, None))(rng_keys)
    return jax.vmap(init_one)(rng_keys, init_params)


def _deterministic_fn(model, model_args, model_kwargs):
    def fn(z):
        _, _, tr = read_model(model, z, model_args, model_kwargs)
        det = {n: s["value"] for n, s in tr.items() if s["type"] == "deterministic"}
        return {**z, **det}

    return fn


class _UpdateBlock(MCMCKernel):
    """One hand-derived update as a block of NumPyro's composite ``Gibbs``.

    Unlike ``CustomGibbs`` it is model-based, so it reads the data from the model's arguments and
    the hyperparameters from the model traced at the current values of all sites.
    """

    sample_field = "z"

    def __init__(self, model, update: GibbsUpdate):
        self._model = model
        self._update = update

    @property
    def model(self):
        return self._model

    def init(self, rng_key, num_warmup, init_params, model_args, model_kwargs):
        z = {k: jnp.asarray(v) for k, v in init_params.items()}
        return CustomGibbsState(z, rng_key)

    def sample(self, state, model_args, model_kwargs):
        model_kwargs = {} if model_kwargs is None else model_kwargs
        siblings = model_kwargs.get(GIBBS_SITES_KWARG, {})
        values = {**siblings, **state.z}
        priors, obs, _ = read_model(self._model, state.z, model_args, model_kwargs)
        obs = {k: v for k, v in obs.items() if k not in siblings}
        rng_key, key = jax.random.split(state.rng_key)
        update = bind_update(self._update, self._model, model_args, model_kwargs)
        new = update.sample(key, values, obs, priors)
        return CustomGibbsState({k: jnp.asarray(v) for k, v in new.items()}, rng_key)

    def refresh(self, state, model_args, model_kwargs):
        return state

    def wrap_model(self, wrapper):
        block = copy.copy(self)
        block._model = wrapper(self._model)
        return block

    def get_constrain_fn(self, model_args, model_kwargs):
        return lambda z: z


class ConjugateGibbs(MCMCKernel):
    """Gibbs sampler from a model and a table of hand-derived updates.

    Args:
        model: a NumPyro model, called as ``model(*model_args, **model_kwargs)``.
        updates: the update table, in sweep order (see :mod:`latentzoo.inference.updates`).
        nuts_kwargs: keyword arguments for the NUTS block used for sites without an update.
        derive: for latent sites no update covers, ask the conjugacy detector
            (:mod:`latentzoo.inference.conjugacy`) for a derived conditional before falling back
            to NUTS / DiscreteGibbs. True (default): the detector; False: never (the behaviour
            before the detector existed); or a deriver of one's own,
            ``derive(model, model_args, model_kwargs, site) -> (update | None, pair or reason)``.

    Example::

        kernel = ConjugateGibbs(factor_analysis, fa_updates())
        mcmc = MCMC(kernel, num_warmup=500, num_samples=1000, num_chains=4)
        mcmc.run(jax.random.PRNGKey(0), X, K=3)
        az.plot_trace(az.from_numpyro(mcmc), var_names=["psi"])
    """

    sample_field = "z"
    default_fields = ("z", "potential_energy", "diverging")

    def __init__(self, model, updates: Sequence[GibbsUpdate | Move], *, nuts_kwargs=None,
                 derive: bool | Callable = True):
        self._model = model
        self._updates = tuple(updates)
        self._nuts_kwargs = dict(nuts_kwargs or {})
        self._derive = derive
        self._plan: GibbsPlan | None = None
        self._composite: Gibbs | None = None
        self._vectorized = False
        self._sample_fn = None
        self._warned: set[str] = set()

    # -- introspection -------------------------------------------------------------------
    @property
    def model(self):
        return self._model

    @property
    def updates(self) -> tuple[GibbsUpdate | Move, ...]:
        return self._updates

    def _deriver(self):
        if self._derive is True:
            return default_deriver()
        return self._derive or None

    def plan(self, *model_args, **model_kwargs) -> GibbsPlan:
        """The plan this kernel would use on these model arguments (no state is changed)."""
        return make_plan(self._model, self._updates, model_args, model_kwargs,
                         derive=self._deriver())

    @property
    def last_plan(self) -> GibbsPlan | None:
        """The plan made by the last ``init``."""
        return self._plan

    # -- MCMCKernel ----------------------------------------------------------------------
    def init(self, rng_key, num_warmup, init_params, model_args, model_kwargs):
        model_kwargs = {} if model_kwargs is None else dict(model_kwargs)
        if not is_prng_key(rng_key):
            # chain_method="vectorized": a batch of keys
            plan = make_plan(self._model, self._updates, model_args, model_kwargs,
                             derive=self._deriver())
            if plan.fallback:
                raise ValueError(
                    f"chain_method='vectorized' is not available when sites {list(plan.fallback)} "
                    "are sampled by NUTS/DiscreteGibbs; use 'parallel' or 'sequential'."
                )
            self._vectorized = True
            return init_vectorized(
                lambda k, p: self._init_one(k, num_warmup, p, model_args, model_kwargs), rng_key, init_params)
        self._vectorized = False
        return self._init_one(rng_key, num_warmup, init_params, model_args, model_kwargs)

    def _init_one(self, rng_key, num_warmup, init_params, model_args, model_kwargs):
        key_plan, key_init, rng_key = jax.random.split(rng_key, 3)
        plan = make_plan(self._model, self._updates, model_args, model_kwargs, key_plan,
                         derive=self._deriver())
        self._plan = plan
        for message, category in fallback_warnings(plan):
            if message not in self._warned:
                self._warned.add(message)
                warn_at_caller(message, category)
        if plan.fallback:
            blocks = [
                (_UpdateBlock(self._model, u), list(u.sites))
                for u in plan.updates
                if isinstance(u, GibbsUpdate)
            ]
            if plan.fallback_continuous:
                blocks.append(
                    (NUTS(self._model, **self._nuts_kwargs), list(plan.fallback_continuous))
                )
            if plan.fallback_discrete:
                blocks.append((DiscreteGibbs(self._model), list(plan.fallback_discrete)))
            # The composite's NUTS block holds its sites unconstrained; users (and the checks)
            # give every site constrained, as in the all-conjugate case, and the moves act on
            # constrained values too.
            tr = prototype_trace(self._model, key_init, model_args, model_kwargs)
            self._to_nuts = {k: biject_to(tr[k]["fn"].support) for k in plan.fallback_continuous}
            if init_params:
                init_params = {
                    k: (self._to_nuts[k].inv(v) if k in self._to_nuts else v)
                    for k, v in init_params.items()
                }
            self._block_sites = tuple(tuple(sites) for _, sites in blocks)
            self._composite = Gibbs(blocks)
            self._nuts_index = len(blocks) - 1 - bool(plan.fallback_discrete)
            self._sample_fn = self._composite_step
            inner = self._composite.init(rng_key, num_warmup, init_params, model_args, model_kwargs)
            return self._wrap(inner, model_args, model_kwargs)
        self._composite = None
        z = start_values(self._model, key_init, model_args, model_kwargs, init_params)
        self._sample_fn = self._sweep
        with quiet_if_drawn_from_prior(init_params):
            pe = potential_energy(self._model, z, model_args, model_kwargs)
        return SweepState(z, rng_key, pe, jnp.zeros((), bool))

    def _wrap(self, inner, model_args, model_kwargs) -> CompositeState:
        values = self._composite.get_constrain_fn(model_args, model_kwargs)(inner.z)
        pe = potential_energy(self._model, values, model_args, model_kwargs)
        diverging = jnp.zeros((), bool)
        if self._plan.fallback_continuous:
            diverging = inner.block_states[self._nuts_index].diverging
        return CompositeState(inner.z, inner, pe, diverging, inner.rng_key)

    def _composite_step(self, state, model_args, model_kwargs):
        inner = state.inner._replace(rng_key=state.rng_key)
        inner = self._composite.sample(inner, model_args, model_kwargs)
        if self._plan.moves:
            inner = self._move(inner, model_args, {} if model_kwargs is None else model_kwargs)
        return self._wrap(inner, model_args, model_kwargs)

    def _move(self, inner, model_args, model_kwargs):
        """The plan's moves after a composite step, on constrained values; then each block gets
        its own sites back (unconstrained for NUTS) and is refreshed against the others' new
        values, as the composite itself does between blocks."""
        values = dict(self._composite.get_constrain_fn(model_args, model_kwargs)(inner.z))
        # a stream of its own: the composite discards the second half of each split of its key
        key = jax.random.fold_in(inner.rng_key, 0x6D6F7665)
        for move, k in zip(self._plan.moves, jax.random.split(key, len(self._plan.moves))):
            priors, obs, _ = read_model(self._model, values, model_args, model_kwargs)
            values.update(move.sample(k, values, obs, priors))
        states = list(inner.block_states)
        z = {}
        for i, ((kernel, _), names) in enumerate(zip(self._composite.blocks, self._block_sites)):
            field = kernel.sample_field
            own = {k: (self._to_nuts[k].inv(values[k]) if isinstance(kernel, HMC) else values[k])
                   for k in names}
            state_i = states[i]._replace(**{field: {**getattr(states[i], field), **own}})
            siblings = {k: v for k, v in values.items() if k not in names}
            states[i] = kernel.refresh(state_i, model_args, with_conditioning(model_kwargs, siblings))
            z.update({k: getattr(states[i], field)[k] for k in names})
        return inner._replace(z=z, block_states=tuple(states))

    def _sweep(self, state, model_args, model_kwargs):
        model_kwargs = {} if model_kwargs is None else model_kwargs
        return sweep(self._model, self._plan.updates, state, model_args, model_kwargs)

    def sample(self, state, model_args, model_kwargs):
        if self._sample_fn is None:
            raise RuntimeError("call init before sample")
        if self._vectorized:
            return jax.vmap(lambda s: self._sample_fn(s, model_args, model_kwargs))(state)
        return self._sample_fn(state, model_args, model_kwargs)

    def postprocess_fn(self, model_args, model_kwargs):
        model_kwargs = {} if model_kwargs is None else model_kwargs
        if self._composite is not None:
            return self._composite.postprocess_fn(model_args, model_kwargs)
        return _deterministic_fn(self._model, model_args, model_kwargs)

    def get_constrain_fn(self, model_args, model_kwargs):
        if self._composite is not None:
            return self._composite.get_constrain_fn(model_args, model_kwargs)
        return lambda z: z

    def get_diagnostics_str(self, state) -> str:
        if self._composite is not None:
            return "conjugate + generic blocks"
        return "conjugate"

    def refresh(self, state, model_args, model_kwargs):
        if self._composite is not None:
            inner = state.inner._replace(rng_key=state.rng_key)
            inner = self._composite.refresh(inner, model_args, model_kwargs)
            return self._wrap(inner, model_args, model_kwargs)
        return state

    def wrap_model(self, wrapper):
        kernel = copy.copy(self)
        kernel._model = wrapper(self._model)
        kernel._composite = None
        kernel._sample_fn = None
        kernel._plan = None
        return kernel

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_sample_fn"] = None
        return state
