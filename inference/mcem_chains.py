"""The E-step machinery of Monte Carlo EM (:mod:`latentzoo.inference.mcem`): persistent Gibbs
chains over a model's latent sites with its parameters held fixed.

:class:`LatentChains` is built once per model, update table, data shape and model arguments. It
reads the model's structure (which sites are latent, their shapes, which updates of the table
apply) by abstract evaluation, checks the parameters a user gives, draws the latents from their
prior, and runs the chains: one jitted program per number of kept draws, shared by the burn-in
(its sweep count is a traced argument).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from numpyro.handlers import seed, substitute, trace
from numpyro.infer.gibbs import latent_sample_sites

from .gibbs import SweepState, sweep
from .gibbs_plan import make_plan
from .updates import GibbsUpdate, Move

__all__ = ["LatentChains"]


class LatentChains:
    """Gibbs chains over ``latent_sites`` of ``model(X, **model_kwargs)``, parameters fixed.

    Args:
        model: the NumPyro model.
        updates: its Gibbs table; the chains sweep, in table order, the applicable updates whose
            ``sites`` all lie in ``latent_sites`` (the first that claims a site owns it, as in
            :func:`~latentzoo.inference.gibbs_plan.make_plan`).
        latent_sites: the sites the chains sample; the model's other latent sites are the
            parameters.
        X: the data (its shape and dtype are what matter here).
        model_kwargs: the model's keyword arguments.
        num_chains: chains run side by side (``vmap``).
        sweeps_per_sample: sweeps between two kept draws.

    Raises one-sentence ValueErrors for latent sites the model lacks and for latent sites no
    applicable update samples.
    """

    def __init__(self, model, updates: Sequence[GibbsUpdate | Move], latent_sites: Sequence[str],
                 X, model_kwargs: dict, *, num_chains: int = 1, sweeps_per_sample: int = 1):
        self.model = model
        self.latent_sites = tuple(latent_sites)
        self.model_kwargs = dict(model_kwargs)
        self.num_chains = num_chains
        self.sweeps_per_sample = sweeps_per_sample
        found = {}

        def structure(X):
            tr = trace(seed(model, jax.random.PRNGKey(0))).get_trace(X, **self.model_kwargs)
            found["latent"] = latent_sample_sites(tr)
            found["shapes"] = {n: jnp.shape(tr[n]["value"]) for n in found["latent"]}
            found["plan"] = make_plan(model, tuple(updates), (X,), self.model_kwargs)

        # Abstract evaluation: the plan needs only the sites' names, shapes and families, and
        # tracing the model eagerly would compile every one of its operations on its own
        # (seconds for a tensor analyzer).
        jax.eval_shape(structure, jnp.asarray(X))
        latent, plan = found["latent"], found["plan"]
        unknown = [s for s in self.latent_sites if s not in latent]
        if unknown:
            raise ValueError(f"latent_sites {unknown} are not latent sample sites of the model.")
        self.shapes = found["shapes"]
        self.param_sites = tuple(s for s in latent if s not in self.latent_sites)
        wanted = set(self.latent_sites)
        self.updates = tuple(u for u in plan.updates if set(u.sites) <= wanted)
        covered = {s for u in self.updates if isinstance(u, GibbsUpdate) for s in u.sites}
        missing = [s for s in self.latent_sites if s not in covered]
        if missing:
            raise ValueError(
                f"No applicable update in the table samples the latent sites {missing} alone; "
                "the E-step needs one for every latent site."
            )
        self._run = jax.jit(self._chains, static_argnames=("num_samples",))
        self.prior_draw = jax.jit(self._prior_draw)

    def check_params(self, params) -> dict:
        """``params`` as arrays, checked: every parameter site given, in its site's shape, and
        nothing else."""
        if not isinstance(params, dict):
            raise ValueError("params must be a dict of site name -> value.")
        missing = [s for s in self.param_sites if s not in params]
        if missing:
            raise ValueError(f"params lacks values for the model's parameter sites {missing}.")
        extra = [s for s in params if s not in self.param_sites]
        if extra:
            raise ValueError(
                f"params names {extra}, which are not parameter sites of the model "
                f"(the parameters are {list(self.param_sites)})."
            )
        out = {}
        for name in self.param_sites:
            value = jnp.asarray(params[name])
            if value.shape != self.shapes[name]:
                raise ValueError(
                    f"params[{name!r}] has shape {value.shape}; the model's site has "
                    f"{self.shapes[name]}."
                )
            out[name] = value
        return out

    def run(self, params, latents, key, X, num_discard: int, num_samples: int):
        """``num_discard`` sweeps, then ``num_samples`` draws per chain, each after
        ``sweeps_per_sample`` sweeps, from ``latents`` ({site: (num_chains, ...)}).

        Returns the chains' last state, the draws stacked over chains and draws
        ({site: (num_chains * num_samples, ...)}) and their mean log p(X, z, params).
        """
        return self._run(params, latents, key, X, num_discard, num_samples=num_samples)

    # -- pure functions (jitted in __init__) ------------------------------------------
    def _prior_draw(self, params, keys, X):
        """Latents from their prior given ``params``: one draw per chain key."""

        def one(key):
            tr = trace(substitute(seed(self.model, key), data=params)).get_trace(
                X, **self.model_kwargs)
            return {s: tr[s]["value"] for s in self.latent_sites}

        return jax.vmap(one)(keys)

    def _sweep(self, params, latents, key, X):
        state = SweepState({**params, **latents}, key, jnp.zeros(()), jnp.zeros((), bool))
        out = sweep(self.model, self.updates, state, (X,), self.model_kwargs)
        return {s: out.z[s] for s in self.latent_sites}, -out.potential_energy

    def _chains(self, params, latents, key, X, num_discard, num_samples: int):
        thin = self.sweeps_per_sample

        def chain(lat, k):
            k_discard, k_draw = jax.random.split(k)

            def discard(i, lat):
                return self._sweep(params, lat, jax.random.fold_in(k_discard, i), X)[0]

            # a traced trip count: the burn-in and every E-step share one compilation
            lat = jax.lax.fori_loop(0, num_discard, discard, lat)

            def draw(lat, k):
                def one(carry, kk):
                    return self._sweep(params, carry[0], kk, X), None

                (lat, lj), _ = jax.lax.scan(one, (lat, jnp.zeros(())), jax.random.split(k, thin))
                return lat, (lat, lj)

            return jax.lax.scan(draw, lat, jax.random.split(k_draw, num_samples))

        latents, (draws, log_joint) = jax.vmap(chain)(
            latents, jax.random.split(key, self.num_chains)
        )
        samples = {s: v.reshape(-1, *v.shape[2:]) for s, v in draws.items()}
        return latents, samples, jnp.mean(log_joint)
