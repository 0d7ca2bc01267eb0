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

import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from tqdm.auto import tqdm

from .mcem_chains import LatentChains
from .updates import GibbsUpdate, Move

__all__ = ["MCEM", "MCEMState", "MCEMResult", "doubling_schedule"]


class MCEMState(NamedTuple):
    """State of a Monte Carlo EM run.

    - **params**: the current parameter values, site name -> array in the site's shape.
    - **latents**: the persistent chains, latent site name -> array of shape
      ``(num_chains, *site_shape)``.
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
            its draws stacked over chains and draws, ``(num_samples * num_chains, *site_shape)``;
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
        self._chains: dict[Any, LatentChains] = {}
        self._m_step = jax.jit(m_step) if self.jit_m_step else m_step

    # -- building blocks ------------------------------------------------------------------
    def chains(self, X, **model_kwargs) -> LatentChains:
        """The E-step's chains for data of this shape and these model arguments (built once)."""
        X = jnp.asarray(X)
        key = (X.shape, str(X.dtype), tuple(sorted((k, repr(v)) for k, v in model_kwargs.items())))
        if key not in self._chains:
            self._chains[key] = LatentChains(
                self.model, self.updates, self.latent_sites, X, model_kwargs,
                num_chains=self.num_chains, sweeps_per_sample=self.sweeps_per_sample,
            )
        return self._chains[key]

    def e_step_updates(self, X, **model_kwargs) -> tuple[GibbsUpdate | Move, ...]:
        """The updates the E-step sweeps on this data, in order."""
        return self.chains(X, **model_kwargs).updates

    # -- SVI-like interface ---------------------------------------------------------------
    def init(self, rng_key, X, params, **model_kwargs) -> MCEMState:
        """Chains drawn from the prior of the latents given ``params``, then ``burn_in`` sweeps.

        ``params`` must give every latent site of the model outside ``latent_sites``, each in its
        site's shape.
        """
        c = self.chains(X, **model_kwargs)
        X = jnp.asarray(X)
        params = c.check_params(params)
        rng_key, k_prior, k_burn = jax.random.split(rng_key, 3)
        latents = c.prior_draw(params, jax.random.split(k_prior, self.num_chains), X)
        if self.burn_in:
            # the first E-step's program (its draws dropped): no compilation of its own
            latents = c.run(params, latents, k_burn, X, self.burn_in, self.num_samples(0))[0]
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
        c = self.chains(X, **model_kwargs)
        X = jnp.asarray(X)
        S = self.num_samples(state.iteration)
        rng_key, key = jax.random.split(state.rng_key)
        latents, samples, log_joint = c.run(state.params, state.latents, key, X, self.discard, S)
        params = self._m_step(samples, X, state.params)
        _check_m_step_output(state.params, params)
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
        if progress_bar:  # the bar stands at 0 while XLA compiles the iteration: say so
            print("compiling the Monte Carlo EM iteration for these sizes; its progress bar follows",
                  file=sys.stderr, flush=True)
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


def _check_m_step_output(old, new) -> None:
    if not isinstance(new, dict) or set(new) != set(old):
        got = sorted(new) if isinstance(new, dict) else type(new).__name__
        raise ValueError(f"m_step must return new values for {sorted(old)}, got {got}.")
    for k, v in new.items():
        if jnp.shape(v) != jnp.shape(old[k]):
            raise ValueError(
                f"m_step returned {k!r} with shape {jnp.shape(v)}; it has {jnp.shape(old[k])}."
            )
