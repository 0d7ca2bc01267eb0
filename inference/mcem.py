r"""Monte Carlo EM over any model with a Gibbs table, with the interface of ``numpyro.infer.SVI``.

EM maximises :math:`\log p(X \mid \theta)` by alternating an E-step, the posterior
:math:`p(z \mid X, \theta)` of the latents, and an M-step,
:math:`\theta \leftarrow \arg\max_\theta \mathbb E_{p(z \mid X, \theta_{\text{old}})}[\log p(X, z
\mid \theta)]`. Where the posterior has no closed form (tensor analyzers: the groups of factors
multiply), Monte Carlo EM replaces the expectation by an average over posterior draws
(Wei & Tanner, 1990):

.. math::

    \hat Q(\theta) = \frac1S \sum_{s=1}^S \log p(X, z^{(s)} \mid \theta),
    \qquad z^{(s)} \sim p(z \mid X, \theta_{\text{old}}).

:class:`MCEM` builds both halves from parts the zoo already has:

- **E-step**: sweeps of the model's hand-derived Gibbs updates (the table a
  :class:`~latentzoo.inference.gibbs.ConjugateGibbs` kernel is built from), restricted to the
  updates that write only latent sites, with the parameters held fixed as values of their sites.
  Each sweep is :func:`latentzoo.inference.gibbs.sweep`, so an update reads the parameters exactly
  as it reads them in the fully Bayesian sampler. The chains are *persistent*: each E-step starts
  from where the previous one stopped. The posterior moves little between consecutive M-steps,
  so the chains need no fresh burn-in (the first E-step's, run by :meth:`MCEM.init`, is the only
  one by default).
- **M-step**: a user function ``m_step(samples, X, params) -> params``, in the zoo a closed form
  of the samples' moments (e.g. :func:`latentzoo.inference.ta.mcem.ta_m_step`).

**Sample-size schedule.** With a fixed number of draws S the iterates do not converge: they
settle into a cloud whose width shrinks like :math:`1/\sqrt S`. Letting S grow removes it
(Booth & Hobert, 1999). The default, :func:`doubling_schedule`, doubles S every so many
iterations up to a cap, so it takes few distinct values; the E-step is compiled once per value
(S is a static shape), so the schedule costs a handful of compilations.

**Interface.** ``init(rng_key, X, params, **model_kwargs) -> MCEMState``,
``update(state, X, **model_kwargs) -> (state, stats)`` (one E-step and one M-step), and
``run(rng_key, num_iterations, X, params, ...) -> MCEMResult`` with a progress bar and the
log-likelihood (from ``loglik_fn``, when given) at checkpoints. Monte Carlo EM does not increase
the log-likelihood at every iteration (the draws are noisy), so, unlike
:class:`~latentzoo.inference.cavi.CAVI`, the driver does not check monotonicity.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.handlers import seed, substitute, trace
from numpyro.infer.gibbs import latent_sample_sites
from tqdm.auto import tqdm

from .gibbs import SweepState, sweep
from .gibbs_plan import make_plan
from .updates import GibbsUpdate, Move

__all__ = ["MCEM", "MCEMState", "MCEMResult", "doubling_schedule"]


class MCEMState(NamedTuple):
    """State of a Monte Carlo EM run.

    - **params**: the current parameter values, site name -> array in the site's shape.
    - **latents**: the persistent chains, latent site name -> (num_chains, *site shape).
    - **iteration**: the number of completed EM iterations (M-steps).
    - **rng_key**: key for the next E-step.
    """

    params: dict[str, jax.Array]
    latents: dict[str, jax.Array]
    iteration: int
    rng_key: jax.Array


class MCEMResult(NamedTuple):
    r"""What :meth:`MCEM.run` returns.

    - **params**: the final parameters.
    - **state**: the final :class:`MCEMState` (pass it as ``init_state`` to continue).
    - **loglik_trace**: ``((iteration, log-likelihood), ...)`` at the checkpoints, iteration 0
      being the starting parameters; empty without a ``loglik_fn``.
    - **num_samples**: (num_iterations,) the draws per chain each E-step collected.
    - **log_joint**: (num_iterations,) the E-step's average of
      :math:`\log p(X, z^{(s)}, \theta_{\text{old}})` over its draws (the model's log density at
      the parameters the draws were made under): a noisy, cheap progress measure that needs no
      ``loglik_fn``.
    """

    params: dict[str, jax.Array]
    state: MCEMState
    loglik_trace: tuple[tuple[int, float], ...]
    num_samples: np.ndarray
    log_joint: np.ndarray


def doubling_schedule(initial: int = 1, every: int = 10, maximum: int = 64) -> Callable[[int], int]:
    """S(t) = min(maximum, initial * 2^(t // every)) draws per chain at iteration t (0-based).

    Few distinct values (1 + log2(maximum / initial)), so few compilations of the E-step.
    """
    for name, v in (("initial", initial), ("every", every), ("maximum", maximum)):
        if not _is_int(v) or v < 1:
            raise ValueError(f"doubling_schedule's {name} must be a positive integer, got {v!r}.")
    if maximum < initial:
        raise ValueError(f"doubling_schedule's maximum ({maximum}) is below its initial ({initial}).")

    def schedule(iteration: int) -> int:
        return int(min(maximum, initial * 2 ** min(iteration // every, 62)))

    return schedule


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _check_count(name: str, v, minimum: int) -> int:
    if not _is_int(v) or v < minimum:
        what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(f"{name} must be {what}, got {v!r}.")
    return int(v)


class MCEM:
    """Monte Carlo EM driver: Gibbs E-step (persistent chains), closed-form M-step.

    Args:
        model: the NumPyro model, called as ``model(X, **model_kwargs)``.
        updates: its Gibbs table (:class:`~latentzoo.inference.updates.GibbsUpdate` and
            :class:`~latentzoo.inference.updates.Move` records). The E-step uses, in table order,
            the applicable updates whose ``sites`` all lie in ``latent_sites`` (the first update
            that claims a site owns it, as in :class:`~latentzoo.inference.gibbs.ConjugateGibbs`);
            every latent site must be written by one of them.
        m_step: ``m_step(samples, X, params) -> params``: ``samples`` maps each latent site to
            its draws stacked over chains and draws, (num_samples * num_chains, *site shape);
            it returns new values for every entry of ``params``. It runs inside ``jax.jit``
            unless ``jit_m_step=False``.
        latent_sites: the sites the E-step samples; every other latent site of the model is a
            parameter and must be given in ``params``.
        num_chains: persistent chains, run side by side (``vmap``).
        sweeps_per_sample: sweeps between two kept draws.
        burn_in: sweeps run by :meth:`init`, under the starting parameters, before the first
            E-step keeps anything (the chains start from the prior).
        discard: sweeps dropped at the start of every E-step (0: the persistent chains carry on).
        sample_schedule: ``iteration -> draws per chain`` (iteration 0-based); default
            :func:`doubling_schedule`.
        loglik_fn: optional ``loglik_fn(params, X) -> scalar``, log p(X | params), evaluated by
            :meth:`run` at its checkpoints.
        jit_m_step: compile the M-step with ``jax.jit`` (it must then be a JAX function).

    Example::

        mcem = MCEM(factor_analysis, [z_update()], fa_m_step, latent_sites=("z",))
        result = mcem.run(jax.random.PRNGKey(0), 100, X, params, K=3)
    """

    def __init__(
        self,
        model,
        updates: Sequence[GibbsUpdate | Move],
        m_step: Callable,
        *,
        latent_sites: Sequence[str],
        num_chains: int = 1,
        sweeps_per_sample: int = 1,
        burn_in: int = 20,
        discard: int = 0,
        sample_schedule: Callable[[int], int] | None = None,
        loglik_fn: Callable | None = None,
        jit_m_step: bool = True,
    ):
        if not callable(model):
            raise ValueError("model must be a NumPyro model (a callable).")
        if not callable(m_step):
            raise ValueError("m_step must be a callable m_step(samples, X, params) -> params.")
        if isinstance(latent_sites, str):
            latent_sites = (latent_sites,)
        latent_sites = tuple(latent_sites)
        if not latent_sites or not all(isinstance(s, str) for s in latent_sites):
            raise ValueError("latent_sites must name at least one latent site of the model.")
        updates = tuple(updates)
        if not all(isinstance(u, (GibbsUpdate, Move)) for u in updates):
            raise ValueError("updates must be GibbsUpdate or Move records (a Gibbs table).")
        if sample_schedule is not None and not callable(sample_schedule):
            raise ValueError("sample_schedule must be a callable iteration -> draws per chain.")
        if loglik_fn is not None and not callable(loglik_fn):
            raise ValueError("loglik_fn must be a callable loglik_fn(params, X) -> scalar.")
        self.model = model
        self.updates = updates
        self.m_step = m_step
        self.latent_sites = latent_sites
        self.num_chains = _check_count("num_chains", num_chains, 1)
        self.sweeps_per_sample = _check_count("sweeps_per_sample", sweeps_per_sample, 1)
        self.burn_in = _check_count("burn_in", burn_in, 0)
        self.discard = _check_count("discard", discard, 0)
        self.sample_schedule = sample_schedule or doubling_schedule()
        self.loglik_fn = loglik_fn
        self.jit_m_step = bool(jit_m_step)
        self._compiled: dict[Any, _Compiled] = {}

    # -- building blocks ------------------------------------------------------------------
    def e_step_updates(self, X, **model_kwargs) -> tuple[GibbsUpdate | Move, ...]:
        """The updates the E-step sweeps on this data, in order."""
        return self._compiled_for(X, model_kwargs).updates

    def _compiled_for(self, X, model_kwargs) -> _Compiled:
        X = jnp.asarray(X)
        key = (X.shape, str(X.dtype), tuple(sorted((k, repr(v)) for k, v in model_kwargs.items())))
        if key not in self._compiled:
            self._compiled[key] = _Compiled(self, X, dict(model_kwargs))
        return self._compiled[key]

    # -- SVI-like interface ---------------------------------------------------------------
    def init(self, rng_key, X, params, **model_kwargs) -> MCEMState:
        """Chains drawn from the prior of the latents given ``params``, then ``burn_in`` sweeps.

        ``params`` must give every latent site of the model outside ``latent_sites``, each in its
        site's shape.
        """
        c = self._compiled_for(X, model_kwargs)
        params = c.check_params(params)
        rng_key, k_prior, k_burn = jax.random.split(rng_key, 3)
        latents = c.prior_draw(params, jax.random.split(k_prior, self.num_chains), jnp.asarray(X))
        if self.burn_in:
            latents = c.burn(params, latents, k_burn, jnp.asarray(X), self.burn_in)
        return MCEMState(params, latents, 0, rng_key)

    def get_params(self, state: MCEMState) -> dict:
        return state.params

    def num_samples(self, iteration: int) -> int:
        """Draws per chain the E-step of this iteration (0-based) collects."""
        S = self.sample_schedule(iteration)
        if not _is_int(S) or S < 1:
            raise ValueError(
                f"sample_schedule({iteration}) must return a positive integer number of draws, got {S!r}."
            )
        return int(S)

    def update(self, state: MCEMState, X, **model_kwargs) -> tuple[MCEMState, dict]:
        """One EM iteration: an E-step of ``sample_schedule(state.iteration)`` draws per chain
        from the persistent chains, then the M-step on their stacked draws.

        Returns the new state and ``stats``: ``num_samples`` (draws per chain) and ``log_joint``
        (the draws' average log p(X, z, params) at the parameters they were drawn under).
        """
        c = self._compiled_for(X, model_kwargs)
        S = self.num_samples(state.iteration)
        rng_key, key = jax.random.split(state.rng_key)
        params, latents, log_joint = c.step(state.params, state.latents, key, jnp.asarray(X), S)
        c.check_m_step_output(state.params, params)
        new = MCEMState(params, latents, state.iteration + 1, rng_key)
        return new, {"num_samples": S, "log_joint": log_joint}

    def evaluate(self, state: MCEMState, X) -> float:
        """log p(X | params) from ``loglik_fn``."""
        if self.loglik_fn is None:
            raise ValueError("evaluate needs a loglik_fn; pass one to MCEM(...).")
        return float(self.loglik_fn(state.params, X))

    def run(
        self,
        rng_key,
        num_iterations: int,
        X,
        params=None,
        *,
        checkpoints: int | Iterable[int] = 10,
        progress_bar: bool = True,
        init_state: MCEMState | None = None,
        **model_kwargs,
    ) -> MCEMResult:
        """Run ``num_iterations`` EM iterations from ``params`` (or from ``init_state``).

        ``checkpoints``: every how many iterations ``loglik_fn`` is evaluated (an int), or the
        iterations at which it is (an iterable; 0 is the start); the start and the end are always
        included. Ignored without a ``loglik_fn``.
        """
        num_iterations = _check_count("num_iterations", num_iterations, 1)
        if init_state is None:
            if params is None:
                raise ValueError("run needs starting params (or an init_state).")
            state = self.init(rng_key, X, params, **model_kwargs)
        else:
            state = init_state
        start = state.iteration
        marks = self._checkpoints(checkpoints, start, num_iterations)
        trace_: list[tuple[int, float]] = []
        if self.loglik_fn is not None and start in marks:
            trace_.append((start, self.evaluate(state, X)))
        sizes, joints = [], []
        bar = tqdm(range(num_iterations), disable=not progress_bar, desc="MCEM")
        for _ in bar:
            state, stats = self.update(state, X, **model_kwargs)
            sizes.append(stats["num_samples"])
            joints.append(float(stats["log_joint"]))
            if not np.isfinite(joints[-1]):
                raise FloatingPointError(
                    f"The log density became {joints[-1]} at iteration {state.iteration}."
                )
            if self.loglik_fn is not None and state.iteration in marks:
                trace_.append((state.iteration, self.evaluate(state, X)))
            if progress_bar:
                post = {"S": sizes[-1], "log_joint": f"{joints[-1]:.6g}"}
                if trace_:
                    post["loglik"] = f"{trace_[-1][1]:.6g}"
                bar.set_postfix(post)
        bar.close()
        return MCEMResult(state.params, state, tuple(trace_), np.asarray(sizes), np.asarray(joints))

    @staticmethod
    def _checkpoints(checkpoints, start: int, num_iterations: int) -> set[int]:
        end = start + num_iterations
        if _is_int(checkpoints):
            every = _check_count("checkpoints", checkpoints, 1)
            marks = set(range(start, end + 1, every))
        else:
            try:
                marks = {int(v) for v in checkpoints}
            except (TypeError, ValueError):
                raise ValueError(
                    "checkpoints must be an integer (every how many iterations) or iterations."
                ) from None
        return marks | {start, end}


class _Compiled:
    """The E-step and M-step of one :class:`MCEM` on data of one shape and one set of model
    arguments: the update plan, the site shapes, and the jitted functions (one compilation per
    distinct sample size, which jit's cache keys on the static ``num_samples``)."""

    def __init__(self, mcem: MCEM, X, model_kwargs):
        self.mcem = mcem
        self.model_args = (X,)
        self.model_kwargs = model_kwargs
        model = mcem.model
        found = {}

        def structure(X):
            tr = trace(seed(model, jax.random.PRNGKey(0))).get_trace(X, **model_kwargs)
            found["latent"] = latent_sample_sites(tr)
            found["shapes"] = {n: jnp.shape(tr[n]["value"]) for n in found["latent"]}
            found["plan"] = make_plan(model, mcem.updates, (X,), model_kwargs)

        # Abstract evaluation: the plan needs only the sites' names, shapes and families, and
        # tracing the model eagerly would compile every one of its operations on its own
        # (seconds for a tensor analyzer).
        jax.eval_shape(structure, X)
        latent, plan = found["latent"], found["plan"]
        unknown = [s for s in mcem.latent_sites if s not in latent]
        if unknown:
            raise ValueError(f"latent_sites {unknown} are not latent sample sites of the model.")
        self.shapes = found["shapes"]
        self.param_sites = tuple(s for s in latent if s not in mcem.latent_sites)
        wanted = set(mcem.latent_sites)
        self.updates = tuple(u for u in plan.updates if set(u.sites) <= wanted)
        covered = {s for u in self.updates if isinstance(u, GibbsUpdate) for s in u.sites}
        missing = [s for s in mcem.latent_sites if s not in covered]
        if missing:
            raise ValueError(
                f"No applicable update in the table samples the latent sites {missing} alone; "
                "the E-step needs one for every latent site."
            )
        self._jit_e_step = jax.jit(self._e_step, static_argnames=("num_samples",))
        self._m_step = jax.jit(mcem.m_step) if mcem.jit_m_step else mcem.m_step
        self.prior_draw = jax.jit(self._prior_draw)

    # -- checks ---------------------------------------------------------------------------
    def check_params(self, params) -> dict:
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
                    f"params[{name!r}] has shape {value.shape}; the model's site has {self.shapes[name]}."
                )
            out[name] = value
        return out

    def check_m_step_output(self, old, new) -> None:
        if not isinstance(new, dict) or set(new) != set(old):
            got = sorted(new) if isinstance(new, dict) else type(new).__name__
            raise ValueError(f"m_step must return new values for {sorted(old)}, got {got}.")
        for k, v in new.items():
            if jnp.shape(v) != jnp.shape(old[k]):
                raise ValueError(
                    f"m_step returned {k!r} with shape {jnp.shape(v)}; it has {jnp.shape(old[k])}."
                )

    # -- pure functions (jitted above) ---------------------------------------------------
    def _prior_draw(self, params, keys, X):
        """Latents from their prior given ``params``: one draw per chain key."""
        model, kwargs = self.mcem.model, self.model_kwargs

        def one(key):
            tr = trace(substitute(seed(model, key), data=params)).get_trace(X, **kwargs)
            return {s: tr[s]["value"] for s in self.mcem.latent_sites}

        return jax.vmap(one)(keys)

    def _sweep(self, params, latents, key, X):
        state = SweepState({**params, **latents}, key, jnp.zeros(()), jnp.zeros((), bool))
        out = sweep(self.mcem.model, self.updates, state, (X,), self.model_kwargs)
        return {s: out.z[s] for s in self.mcem.latent_sites}, -out.potential_energy

    def _e_step(self, params, latents, key, X, num_discard, num_samples: int):
        """``num_discard`` sweeps (a traced count: burn-in and every E-step share one
        compilation), then ``num_samples`` draws per chain, each after ``sweeps_per_sample``
        sweeps. Returns the chains' last state, the draws (S, num_chains, ...) and the draws'
        mean log joint."""
        thin = self.mcem.sweeps_per_sample

        def chain(lat, k):
            k_discard, k_draw = jax.random.split(k)

            def discard(i, lat):
                return self._sweep(params, lat, jax.random.fold_in(k_discard, i), X)[0]

            lat = jax.lax.fori_loop(0, num_discard, discard, lat)

            def draw(lat, k):
                def one(carry, kk):
                    return self._sweep(params, carry[0], kk, X), None

                (lat, lj), _ = jax.lax.scan(one, (lat, jnp.zeros(())), jax.random.split(k, thin))
                return lat, (lat, lj)

            return jax.lax.scan(draw, lat, jax.random.split(k_draw, num_samples))

        latents, (draws, log_joint) = jax.vmap(chain)(
            latents, jax.random.split(key, self.mcem.num_chains)
        )
        samples = {s: v.reshape(-1, *v.shape[2:]) for s, v in draws.items()}
        return latents, samples, jnp.mean(log_joint)

    def burn(self, params, latents, key, X, num_sweeps: int):
        """``num_sweeps`` sweeps of every chain before the first E-step; it runs the E-step's
        compiled program (whose draws it drops), so it costs no compilation of its own."""
        S0 = self.mcem.num_samples(0)
        return self._jit_e_step(params, latents, key, X, num_sweeps, num_samples=S0)[0]

    def step(self, params, latents, key, X, num_samples: int):
        """One EM iteration: new params, the chains' last state, the draws' mean log joint."""
        latents, samples, log_joint = self._jit_e_step(
            params, latents, key, X, self.mcem.discard, num_samples=num_samples
        )
        return self._m_step(samples, X, params), latents, log_joint
