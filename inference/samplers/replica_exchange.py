r"""Replica exchange (parallel tempering) over a tempered Gibbs table, as a NumPyro ``MCMCKernel``.

A ladder of inverse temperatures :math:`1 = \beta_1 > \beta_2 > \dots > \beta_M > 0` carries one
copy of the latents per rung. Copy :math:`m` targets the tempered posterior

.. math::

    \pi_m(\theta) \propto p(\theta)\, p(x \mid \theta)^{\beta_m}

(:func:`latentzoo.inference.tempering.temper`: the prior untempered, every observed site's log
density times :math:`\beta_m`), so the joint target of the M copies is :math:`\prod_m
\pi_m(\theta_m)`, whose first marginal is the posterior. One step of the kernel is

1. **a sweep of every copy at its own temperature**: the same hand-derived table the plain
   Gibbs kernel runs, each update reading :math:`\beta_m` from the likelihood site
   (``GibbsUpdate.tempered``); vectorised over the ladder with ``jax.vmap``;
2. **swaps of adjacent copies**: for a pair :math:`(m, m+1)` the proposal exchanges
   :math:`\theta_m` and :math:`\theta_{m+1}`. With :math:`\ell(\theta) = \log p(x \mid \theta)`
   the priors cancel and the Metropolis-Hastings ratio is

   .. math::

       \log r_m = (\beta_m - \beta_{m+1})\,\bigl(\ell(\theta_{m+1}) - \ell(\theta_m)\bigr),

   accepted with probability :math:`\min(1, r_m)` (:func:`swap_log_ratio`). Pairs whose lower
   index has the step's parity are proposed together (the *deterministic even-odd* scheme of
   Syed, Bouchard-Côté, Deligiannidis & Doucet, JRSS-B 2022, "Non-reversible parallel
   tempering"): they are disjoint, so each is an independent MH step on two coordinates and the
   product leaves :math:`\prod_m \pi_m` invariant; alternating the parity lets a copy travel the
   whole ladder in M steps instead of a random walk's :math:`M^2`.

Only the first copy is returned as ``state.z``, so ``MCMC.get_samples()``, ArviZ and the
diagnostics see a posterior chain as from any other kernel. ``swap_accept_prob`` (M - 1,) holds
every adjacent pair's :math:`\min(1, r_m)` at each step (computed for all pairs, applied to half
of them): ask ``MCMC(..., ).run(..., extra_fields=("swap_accept_prob",))`` for the per-pair swap
rates.

**The ladder adapts during warm-up only.** Its ends stay (1 and :math:`\beta_M`); the inner rungs
move so that every pair rejects equally often: with :math:`\Lambda(\beta)` the cumulative mean
rejection rate up the ladder (piecewise linear between rungs), the new rungs are
:math:`\Lambda^{-1}(k\,\Lambda(1)/(M-1))` (:func:`adapt_ladder`; Syed et al. 2022, §5.1). The
rates are collected over rounds of doubling length that end at half the warm-up; the second half
of the warm-up runs on the final ladder, so the draws come from a fixed kernel.

Bad input is one sentence: a ladder of one rung, a temperature outside (0, 1], a ladder that does
not start at 1 or does not decrease, and a table with an update that does not read the
likelihood's temperature or that leaves a site to a generic kernel.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.infer.mcmc import MCMCKernel
from numpyro.util import is_prng_key

from ..gibbs import (
    ConjugateGibbs,
    init_vectorized,
    observed_log_likelihood,
    potential_energy,
    quiet_if_drawn_from_prior,
    start_values,
    sweep_values,
)
from ..gibbs_plan import make_plan
from ..tempering import temper
from ..updates import GibbsUpdate, Move

__all__ = [
    "ReplicaExchange",
    "ReplicaExchangeState",
    "adapt_ladder",
    "geometric_ladder",
    "observed_log_likelihood",
    "swap_log_ratio",
    "swap_step",
]

MIN_ADAPT_ROUND = 16
"""Steps in the shortest round of ladder adaptation; a warm-up shorter than two of them keeps the
ladder it was given."""


class ReplicaExchangeState(NamedTuple):
    """State of :class:`ReplicaExchange` (M rungs).

    - **z**: the first copy's values (inverse temperature 1): the posterior chain.
    - **replicas**: every copy's values, each array with a leading axis of length M.
    - **betas**: (M,) the ladder, ``betas[0] = 1``, strictly decreasing.
    - **log_lik**: (M,) :math:`\\log p(x \\mid \\theta_m)` of each copy (untempered).
    - **swap_accept_prob**: (M - 1,) :math:`\\min(1, r_m)` of each adjacent pair this step.
    - **rejection_sum**, **round_steps**: the current adaptation round's summed rejection
      rates (M - 1,) and its length.
    - **step**: steps taken since ``init`` (int32).
    - **rng_key**, **potential_energy** (-log p(z, x) of the first copy), **diverging**
      (always False), as for every kernel of the zoo.
    """

    z: dict
    replicas: dict
    betas: jax.Array
    log_lik: jax.Array
    swap_accept_prob: jax.Array
    rejection_sum: jax.Array
    round_steps: jax.Array
    step: jax.Array
    rng_key: jax.Array
    potential_energy: jax.Array
    diverging: jax.Array


# ------------------------------------------------------------------ pure pieces of one step
def geometric_ladder(num_replicas: int, min_beta: float) -> np.ndarray:
    """(M,) inverse temperatures from 1 down to ``min_beta``, evenly spaced in log."""
    _check_ladder_size(num_replicas)
    if not (isinstance(min_beta, (int, float)) and 0.0 < float(min_beta) < 1.0):
        raise ValueError(f"min_beta, the hottest rung's inverse temperature, must lie in (0, 1), got {min_beta!r}.")
    return float(min_beta) ** (np.arange(num_replicas) / (num_replicas - 1))


def swap_log_ratio(betas, log_lik):
    r"""(M - 1,) log MH ratio of exchanging copies m and m + 1:
    :math:`(\beta_m - \beta_{m+1})(\ell_{m+1} - \ell_m)`."""
    return (betas[:-1] - betas[1:]) * (log_lik[1:] - log_lik[:-1])


def swap_step(key, replicas, log_lik, betas, parity, log_ratio: Callable = swap_log_ratio):
    """Propose exchanging each adjacent pair (m, m + 1) with ``m % 2 == parity`` (disjoint
    pairs, decided independently). Returns ``(replicas, log_lik, accept_prob)`` after the
    swaps, ``accept_prob`` (M - 1,) being every pair's min(1, r_m) before them."""
    M = log_lik.shape[0]
    log_r = log_ratio(betas, log_lik)
    accept_prob = jnp.exp(jnp.minimum(log_r, 0.0))
    pairs = jnp.arange(M - 1)
    u = jax.random.uniform(key, (M - 1,))
    swap = (pairs % 2 == parity) & (jnp.log(u) < log_r)
    # copy m takes m + 1's state where pair m swaps, m + 1 takes m's: disjoint pairs, one gather
    down = jnp.concatenate([swap, jnp.zeros(1, bool)])
    up = jnp.concatenate([jnp.zeros(1, bool), swap])
    source = jnp.arange(M) + down.astype(jnp.int32) - up.astype(jnp.int32)
    replicas = jax.tree_util.tree_map(lambda a: a[source], replicas)
    return replicas, log_lik[source], accept_prob


def adapt_ladder(betas, rejection):
    r"""The ladder whose adjacent pairs reject equally often, by Syed et al. (2022), §5.1.

    ``betas`` (M,) decreasing from 1, ``rejection`` (M - 1,) each pair's mean rejection rate.
    :math:`\Lambda` accumulates the rates from the hottest rung up (a small floor keeps it
    strictly increasing, so a pair that never rejects still holds a rung); the new rungs are its
    inverse at M evenly spaced levels, by linear interpolation. The ends do not move."""
    ascending = betas[::-1]
    rates = jnp.clip(rejection[::-1], 0.0, 1.0) + 1e-3
    cum = jnp.concatenate([jnp.zeros(1), jnp.cumsum(rates)])
    levels = jnp.linspace(0.0, cum[-1], betas.shape[0])
    new = jnp.interp(levels, cum, ascending)
    new = new.at[0].set(ascending[0]).at[-1].set(ascending[-1])
    return new[::-1]


def _check_ladder_size(num_replicas):
    if not isinstance(num_replicas, (int, np.integer)) or isinstance(num_replicas, bool) or num_replicas < 2:
        raise ValueError(
            f"Replica exchange needs a ladder of at least 2 temperatures, got num_replicas={num_replicas!r}."
        )


def _check_betas(betas) -> np.ndarray:
    b = np.asarray(betas, dtype=float)
    if b.ndim != 1 or b.size < 2:
        raise ValueError(f"Replica exchange needs a ladder of at least 2 temperatures, got betas of shape {b.shape}.")
    if not np.all(np.isfinite(b)) or np.any(b <= 0.0) or np.any(b > 1.0):
        raise ValueError(f"Every inverse temperature must lie in (0, 1]; the ladder is {b.tolist()}.")
    if b[0] != 1.0 or np.any(np.diff(b) >= 0.0):
        raise ValueError(f"The ladder must start at 1 and strictly decrease; it is {b.tolist()}.")
    return b


def adaptation_ends(num_warmup: int) -> np.ndarray:
    """The steps (1-based) at which adaptation rounds end: rounds of doubling length, the last
    ending at half the warm-up, the first at least :data:`MIN_ADAPT_ROUND` steps; empty when the
    warm-up is too short."""
    ends, end = [], int(num_warmup) // 2
    while end >= MIN_ADAPT_ROUND:
        ends.append(end)
        end //= 2
    return np.asarray(sorted(ends), dtype=np.int32)


# ----------------------------------------------------------------------------- the kernel
class ReplicaExchange(MCMCKernel):
    """Replica exchange over a tempered Gibbs table (see the module docstring for the maths).

    Args:
        model: a NumPyro model, called as ``model(*model_args, **model_kwargs)``.
        updates: its Gibbs table; every update the plan uses must honour the likelihood's
            temperature (``tempered=True``) and cover every latent site (no generic fallback).
        num_replicas: M, the ladder's length (with ``min_beta``, a geometric ladder).
        min_beta: the hottest rung's inverse temperature, in (0, 1).
        betas: an explicit ladder instead, (M,) from 1 strictly decreasing.
        adapt: move the inner rungs during warm-up to equalise the pairs' swap rates.
        tempered_sites: the observed sites to temper (default: all).

    Example::

        kernel = ReplicaExchange(partial(tensor_analyzer, d=(2, 2)), ta_updates((2, 2)),
                                 num_replicas=6, min_beta=0.05)
        mcmc = MCMC(kernel, num_warmup=500, num_samples=1000, num_chains=4)
        mcmc.run(jax.random.PRNGKey(0), X, extra_fields=("swap_accept_prob",))
        mcmc.get_extra_fields()["swap_accept_prob"].mean(0)   # (M - 1,) per pair
    """

    sample_field = "z"
    default_fields = ("z", "potential_energy", "diverging")
    swap_log_ratio = staticmethod(swap_log_ratio)

    def __init__(self, model, updates: Sequence[GibbsUpdate | Move], *, num_replicas: int = 8,
                 min_beta: float = 0.01, betas=None, adapt: bool = True, tempered_sites=None):
        self._model = model
        self._updates = tuple(updates)
        self._betas = geometric_ladder(num_replicas, min_beta) if betas is None else _check_betas(betas)
        self._adapt = bool(adapt)
        self._sites = None if tempered_sites is None else tuple(tempered_sites)
        self._plan = None
        self._ends = np.zeros(0, np.int32)
        self._vectorized = False
        self._sample_fn = None

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_sample_fn"] = None  # a bound method: the copy initialises afresh
        return state

    @property
    def model(self):
        return self._model

    @property
    def betas(self) -> np.ndarray:
        """The ladder the kernel starts from, (M,)."""
        return self._betas.copy()

    def _make_plan(self, model_args, model_kwargs):
        plan = make_plan(self._model, self._updates, model_args, model_kwargs)
        if plan.fallback:
            raise ValueError(
                f"Replica exchange needs a hand-derived update for every latent site; "
                f"{sorted(plan.fallback)} would fall back to a generic kernel."
            )
        untempered = [u.name for u in plan.updates if not u.tempered]
        if untempered:
            raise ValueError(
                f"The updates {untempered} do not read the likelihood's temperature (tempered=False), "
                "so this table has no tempered form for replica exchange."
            )
        return plan

    def init(self, rng_key, num_warmup, init_params, model_args, model_kwargs):
        model_kwargs = {} if model_kwargs is None else dict(model_kwargs)
        self._plan = self._make_plan(model_args, model_kwargs)
        self._ends = adaptation_ends(num_warmup) if self._adapt else np.zeros(0, np.int32)
        # NumPyro initialises again, on every run() that continues from a state (each checkpoint
        # segment), a kernel whose ``_sample_fn`` is None: mark this one initialised, as
        # ConjugateGibbs does, so a segment does not trace the model and plan the table again
        self._sample_fn = self._sample_one
        if not is_prng_key(rng_key):  # chain_method="vectorized": a batch of keys
            self._vectorized = True
            return init_vectorized(lambda k, p: self._init_one(k, p, model_args, model_kwargs),
                                   rng_key, init_params)
        self._vectorized = False
        return self._init_one(rng_key, init_params, model_args, model_kwargs)

    def _init_one(self, rng_key, init_params, model_args, model_kwargs):
        key_init, rng_key = jax.random.split(rng_key)
        z = start_values(self._model, key_init, model_args, model_kwargs, init_params)
        M = self._betas.shape[0]
        replicas = jax.tree_util.tree_map(lambda a: jnp.broadcast_to(a, (M, *jnp.shape(a))), z)
        with quiet_if_drawn_from_prior(init_params):
            ll = observed_log_likelihood(self._model, z, model_args, model_kwargs, self._sites)
            energy = potential_energy(self._model, z, model_args, model_kwargs)
        betas = jnp.asarray(self._betas)
        return ReplicaExchangeState(
            z, replicas, betas, jnp.full(M, ll), jnp.ones(M - 1), jnp.zeros(M - 1),
            jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32), rng_key, energy, jnp.zeros((), bool),
        )

    def _sample_one(self, state, model_args, model_kwargs):
        model_kwargs = {} if model_kwargs is None else model_kwargs
        rng_key, k_sweep, k_swap = jax.random.split(state.rng_key, 3)
        M = state.betas.shape[0]

        def one_sweep(z, beta, key):  # the values only: no copy's tempered density is needed
            updates = self._plan.updates  # keys split as sweep splits them
            return sweep_values(temper(self._model, beta, self._sites), updates, z,
                                jax.random.split(key, len(updates) + 1)[1:], model_args, model_kwargs)

        replicas = jax.vmap(one_sweep)(state.replicas, state.betas, jax.random.split(k_sweep, M))
        log_lik = jax.vmap(
            lambda z: observed_log_likelihood(self._model, z, model_args, model_kwargs, self._sites)
        )(replicas)
        replicas, log_lik, accept = swap_step(k_swap, replicas, log_lik, state.betas, state.step % 2,
                                              self.swap_log_ratio)
        step = state.step + 1
        rejection_sum = state.rejection_sum + (1.0 - accept)
        round_steps = state.round_steps + 1
        betas = state.betas
        if self._ends.size:
            at_end = jnp.any(step == jnp.asarray(self._ends))
            betas = jnp.where(at_end, adapt_ladder(betas, rejection_sum / round_steps), betas)
            rejection_sum = jnp.where(at_end, jnp.zeros_like(rejection_sum), rejection_sum)
            round_steps = jnp.where(at_end, jnp.zeros_like(round_steps), round_steps)
        z = jax.tree_util.tree_map(lambda a: a[0], replicas)
        pe = potential_energy(self._model, z, model_args, model_kwargs)
        return ReplicaExchangeState(z, replicas, betas, log_lik, accept, rejection_sum, round_steps,
                                    step, rng_key, pe, jnp.zeros((), bool))

    def sample(self, state, model_args, model_kwargs):
        if self._plan is None:
            raise RuntimeError("call init before sample")
        if self._vectorized:
            return jax.vmap(lambda s: self._sample_one(s, model_args, model_kwargs))(state)
        return self._sample_one(state, model_args, model_kwargs)

    def postprocess_fn(self, model_args, model_kwargs):
        return ConjugateGibbs(self._model, self._updates).postprocess_fn(model_args, model_kwargs)

    def get_constrain_fn(self, model_args, model_kwargs):
        return lambda z: z

    def get_diagnostics_str(self, state) -> str:
        accept = np.asarray(state.swap_accept_prob)
        if accept.ndim > 1:
            accept = accept.mean(0)
        return f"swap rate min {accept.min():.2f} over {accept.size} pairs"

