"""Correctness checks for hand-derived inference: conditional consistency, Geweke, SBC.

All three take a model written in the zoo's convention (``model(X=None, **model_kwargs)``: the
first argument is the data, ``None`` draws it from the prior predictive) and a kernel built by
:class:`~latentzoo.inference.gibbs.ConjugateGibbs` (any MCMCKernel whose ``sample`` reads the data
from ``model_args`` works).

- :func:`check_conditional` (cheap, deterministic): for two values a, b of a block, the change in
  the hand-derived conditional's log density must equal the change in the model's joint log
  density (they differ by a constant in the block). Catches a wrong conditional without sampling.
- :func:`geweke_test` (Geweke 2004): the "successive-conditional" chain that alternates a kernel
  step with a fresh draw of the data given the parameters has the prior as its stationary
  marginal, exactly when the kernel leaves the posterior invariant. Means of test functions
  (and of their squares) under that chain are compared with independent prior draws; z-scores use
  the chain's effective sample size.
- :func:`check_one_step_invariance` (cheap, exact null): joint draws (theta, X) from the model,
  one step of an update or move on each; the pairs (theta, X) and (theta', X) have the same law
  exactly when the step leaves p(theta | X) invariant, so paired differences of test functions
  have mean 0. Independent pairs and paired differences give it far more power per draw than a
  Geweke chain, and it sees a whole move at once (every pair of a shear in turn).
- :func:`sbc` (Talts et al. 2018): draw the truth from the prior, data given the truth, posterior
  draws given the data; the rank of the truth among the draws is uniform for a correct sampler.
  Ranks are binned and tested with a chi-square test per test function.

Geweke's test and SBC are defined in :mod:`latentzoo.inference.calibration` (with their forms
that run a correct kernel and its control from one compiled program) and re-exported here.

Everything runs under ``jit`` with ``lax.scan`` / ``lax.map``, so hundreds of simulations take
seconds on small problems. Thresholds are Bonferroni-corrected over the test functions; tests that
use them also keep a deliberately wrong update that must fail.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.diagnostics import effective_sample_size
from numpyro.infer.util import log_density

from latentzoo.inference.calibration import (
    SBC_COMPILER_OPTIONS,
    batch_divisor,
    evaluate_test_functions,
    label_test_functions,
    GewekeResult,
    SBCResult,
    bonferroni_z,
    geweke_test,
    geweke_tests,
    sbc,
    sbc_runs,
    simulate,
)
from latentzoo.inference.gibbs import read_model
from latentzoo.inference.updates import GibbsUpdate, Move

__all__ = [
    "simulate",
    "check_conditional",
    "check_conditionals",
    "check_likelihood_invariance",
    "check_move_on_orbit",
    "OrbitResult",
    "check_one_step_invariance",
    "InvarianceResult",
    "log_likelihood",
    "geweke_test",
    "sbc",
    "geweke_tests",
    "sbc_runs",
    "SBC_COMPILER_OPTIONS",
    "GewekeResult",
    "SBCResult",
]

# --------------------------------------------------------------------- conditional check
def check_conditional(
    model,
    update: GibbsUpdate,
    model_kwargs,
    rng_key,
    *,
    num_pairs: int = 3,
    data_site="X",
    priors_list=None,
) -> float:
    """Largest ``|Δlog q - Δlog p|`` over ``num_pairs`` random pairs of block values.

    For each pair, the data and the non-block sites are a prior-predictive draw; value ``a`` of
    the block is the prior draw, ``b`` a draw from the update's conditional. Returns the largest
    absolute disagreement relative to ``1 + |Δ log p|``; a right conditional gives round-off.

    ``priors_list``: several ``priors`` dicts of the same structure (e.g. random hyperparameters);
    each is checked on ``num_pairs`` pairs. They are passed to one compiled function as
    arguments (NumPyro distributions are pytrees), so the check compiles once.
    """
    return check_conditionals(model, [update], model_kwargs, rng_key, num_pairs=num_pairs,
                              data_site=data_site, priors_list=priors_list)[update.name]


def _stacked_priors(model_kwargs, priors_list):
    """(model_kwargs without ``priors``, the prior settings stacked leaf by leaf, their number):
    several settings of one structure become one argument of one compiled program."""
    static = {k: v for k, v in model_kwargs.items() if k != "priors"}
    if priors_list is None:
        priors_list = [model_kwargs.get("priors")]
    stacked = jax.tree_util.tree_map(lambda *xs: jnp.stack([jnp.asarray(x) for x in xs]), *priors_list)
    return static, stacked, len(priors_list)


def check_conditionals(
    model,
    updates,
    model_kwargs,
    rng_key,
    *,
    num_pairs: int = 3,
    data_site="X",
    priors_list=None,
) -> dict[str, float]:
    """:func:`check_conditional` for several updates in one compiled program (the prior-predictive
    draws they share are compiled apart, once per design: see ``_simulated_pairs``): ``{update name:
    largest disagreement}``. Every update is checked on the same simulated pairs (one simulation,
    one model read and one ``log p(a)`` per pair, shared), which keeps the program, and its
    compile time, near one model evaluation per update instead of three; for one update the
    numbers equal :func:`check_conditional`'s."""
    updates = list(updates)
    missing = [u.name for u in updates if u.conditional is None]
    if missing:
        raise ValueError(f"update {missing[0]!r} has no closed-form conditional to check.")
    static, stacked, n_priors = _stacked_priors(model_kwargs, priors_list)
    a, X, draw_keys = _simulated_pairs(model, static, stacked, n_priors, rng_key, num_pairs, data_site)

    def disagreements(a, X, k_draw, priors):
        kw = {**static, "priors": priors}
        fns, obs, _ = read_model(model, a, (X,), kw)
        log_p_a = log_density(model, (X,), kw, a)[0]
        out = []
        for update in updates:
            cond = update.conditional(a, obs, fns)
            keys = jax.random.split(k_draw, len(update.sites))
            b = {**a, **{s: cond[s].sample(k) for s, k in zip(update.sites, keys)}}
            d_cond = sum(
                cond[s].log_prob(a[s]).sum() - cond[s].log_prob(b[s]).sum() for s in update.sites
            )
            d_joint = log_p_a - log_density(model, (X,), kw, b)[0]
            out.append(jnp.abs(d_cond - d_joint) / (1.0 + jnp.abs(d_joint)))
        return jnp.stack(out)

    def one_prior(args):
        a, X, k_draw, priors = args
        return jnp.max(jax.lax.map(lambda p: disagreements(*p, priors), (a, X, k_draw)), axis=0)

    worst = np.asarray(jnp.max(jax.jit(lambda a: jax.lax.map(one_prior, a))((a, X, draw_keys, stacked)), axis=0))
    return {u.name: float(w) for u, w in zip(updates, worst)}


def _simulated_pairs(model, static, stacked, n_priors, rng_key, num_pairs, data_site):
    """Prior-predictive draws for the conditional and likelihood checks, ``num_pairs`` per prior
    setting: (values, data, the keys left for the check's own draws), each with leading axes
    (settings, pairs). A program of its own, with the settings as arguments, so that every check
    of one design (each test's correct update and its control, the update checks' settings)
    compiles the model's samplers once: the persistent compilation cache returns it to the next
    check of the same shapes. Fused into each check, it was about half of each check's compile
    time (the rank SVM's: 3 s of 6)."""

    def pairs(args):
        key, priors = args
        kw = {**static, "priors": priors}

        def one(k):
            k_sim, k_rest = jax.random.split(k)
            values, X = simulate(model, kw, k_sim, data_site)
            return values, X, k_rest

        return jax.lax.map(one, jax.random.split(key, num_pairs))

    keys = jax.random.split(rng_key, n_priors)
    return jax.jit(lambda a: jax.lax.map(pairs, a))((keys, stacked))


# ------------------------------------------------------------------------------ moves
def log_likelihood(model, values, X, model_kwargs, data_site: str = "X") -> jax.Array:
    """log p(X | values): the observed sites' log density at these latent values."""
    priors, _, _ = read_model(model, values, (X,), model_kwargs)
    if isinstance(data_site, str):
        return priors[data_site].log_prob(X).sum()
    return sum(priors[n].log_prob(X[n]).sum() for n in data_site)


def check_likelihood_invariance(
    model, move: Move, model_kwargs, rng_key, *, num_pairs: int = 3, data_site: str = "X",
    priors_list=None,
) -> float:
    """Largest relative change of log p(X | latents) made by one step of ``move``.

    Interweaving moves (FA's shift, scale and shear) travel along groups that leave the
    likelihood unchanged (z Wᵀ + mu is invariant); a right move gives round-off, a move whose
    group action is wrong (a swapped index, a wrong sign) changes the likelihood by O(1).
    ``priors_list``: several prior settings (``model_kwargs["priors"]`` alternatives of one
    structure) checked in the same compiled program, as in :func:`check_conditionals`: their
    hyperparameters are arguments of the program, not constants of one program per setting.
    """
    static, stacked, n_priors = _stacked_priors(model_kwargs, priors_list)

    values, X, move_keys = _simulated_pairs(model, static, stacked, n_priors, rng_key, num_pairs, data_site)

    def change(values, X, k_move, priors):
        kw = {**static, "priors": priors}
        fns, obs, _ = read_model(model, values, (X,), kw)
        moved = {**values, **move.sample(k_move, values, obs, fns)}
        before = log_likelihood(model, values, X, kw, data_site)
        after = log_likelihood(model, moved, X, kw, data_site)
        return jnp.abs(after - before) / (1.0 + jnp.abs(before))

    def one_prior(args):
        values, X, k_move, priors = args
        return jnp.max(jax.lax.map(lambda p: change(*p, priors), (values, X, k_move)))

    return float(jnp.max(jax.jit(lambda a: jax.lax.map(one_prior, a))((values, X, move_keys, stacked))))


class OrbitResult(NamedTuple):
    # chain against the exact target: (2,) for the means of t and t^2, or, on a periodic orbit,
    # (4,) for those of cos t, sin t, cos 2t and sin 2t
    z_scores: np.ndarray
    threshold: float
    passed: bool
    exact_moments: np.ndarray
    chain_moments: np.ndarray


def check_move_on_orbit(
    model,
    move: Move,
    model_kwargs,
    rng_key,
    *,
    num_steps: int = 20000,
    half_width: float = 6.0,
    num_grid: int = 6001,
    alpha: float = 0.01,
    data_site: str = "X",
    periodic: bool = False,
) -> OrbitResult:
    """Run ``move`` alone from one prior draw and compare the law of its orbit coordinate ``t``
    with the exact target the move claims to leave invariant.

    The target is ``p(orbit(v0, t), X) * exp(orbit_log_jacobian(v0, t))``, evaluated from the
    model's joint density on a grid of ``t`` (one orbit: the move's ``t`` must have one
    coordinate, e.g. FA with K = 1), so its mean and second moment are exact up to quadrature.
    The chain's moments are compared with z-scores that use the chain's effective sample size,
    Bonferroni-corrected at familywise level ``alpha``. A move that samples the wrong law on its
    orbit (an MH step without its accept step, a wrong Jacobian) fails; a right one passes.

    ``periodic``: the orbit is a circle and ``t`` an angle in (-pi, pi] (a rotation); the grid
    then covers one turn (``half_width`` is not used) and the moments compared are those of
    cos t, sin t, cos 2t and sin 2t.
    """
    if move.orbit is None or move.coordinate is None:
        raise ValueError(f"move {move.name!r} declares no orbit to check it on.")
    jac = move.orbit_log_jacobian or (lambda v, t: 0.0)
    k_sim, k_run = jax.random.split(rng_key)
    v0, X = simulate(model, model_kwargs, k_sim, data_site)
    t_shape = jax.eval_shape(lambda: move.coordinate(v0, v0)).shape
    if int(np.prod(t_shape)) != 1:
        raise ValueError(f"check_move_on_orbit needs a one-dimensional orbit, got t of shape {t_shape}.")

    def log_target(t):
        tt = jnp.reshape(t, t_shape)
        v = {**v0, **move.orbit(v0, tt)}
        return log_density(model, (X,), model_kwargs, v)[0] + jac(v0, tt)

    if periodic:  # one turn, the end left out (it is the start)
        grid = jnp.linspace(-jnp.pi, jnp.pi, num_grid + 1)[:-1]
    else:
        grid = jnp.linspace(-half_width, half_width, num_grid)
    lp = jax.jit(jax.vmap(log_target))(grid)
    w = np.exp(np.asarray(lp - jnp.max(lp)))
    w /= w.sum()
    if not periodic and (w[0] > 1e-10 or w[-1] > 1e-10):
        raise ValueError("the orbit's target has mass at the grid's ends; widen half_width.")

    def stats(t):
        if periodic:
            return jnp.stack([jnp.cos(t), jnp.sin(t), jnp.cos(2 * t), jnp.sin(2 * t)])
        return jnp.stack([t, t * t])

    exact = np.sum(w[:, None] * np.asarray(jax.vmap(stats)(grid)), 0)

    @jax.jit
    def run(key):
        def body(values, k):
            priors, obs, _ = read_model(model, values, (X,), model_kwargs)
            values = {**values, **move.sample(k, values, obs, priors)}
            return values, stats(jnp.reshape(move.coordinate(v0, values), ()))

        return jax.lax.scan(body, v0, jax.random.split(key, num_steps))[1]

    G = np.asarray(run(k_run))
    ess = np.clip(np.asarray(effective_sample_size(G[None])), 1.0, len(G))
    se = np.sqrt(G.var(0) / ess)
    z = (G.mean(0) - exact) / se
    threshold = bonferroni_z(alpha, len(exact))
    return OrbitResult(z, threshold, bool(np.max(np.abs(z)) < threshold), exact, G.mean(0))


class InvarianceResult(NamedTuple):
    labels: list[str]  # the test functions, then their squares
    z_scores: np.ndarray  # mean paired difference over its standard error, one per label
    threshold: float  # Bonferroni over the labels, familywise level alpha
    passed: bool


def check_one_step_invariance(
    model,
    update,
    model_kwargs,
    test_functions,
    rng_key,
    *,
    num_draws: int = 40000,
    alpha: float = 0.01,
    data_site: str = "X",
    compiler_options: dict | None = None,
) -> InvarianceResult:
    """One step of ``update`` (a :class:`GibbsUpdate` or :class:`Move`) from exact posterior draws.

    ``num_draws`` independent joint draws (theta, X) from the model are each moved once,
    theta' = step(theta, X). If the step leaves p(theta | X) invariant, (theta', X) is again a
    joint draw, so E f(theta') = E f(theta) for every test function f: the paired differences
    f(theta') - f(theta) (and of f squared) have mean 0, and their z-scores are N(0, 1) under
    the null. Their variance is small where the step moves little, so the check is sharp where a
    Geweke chain, which dilutes a move among the other updates, is not. A move whose parts are
    each exact alone but are chained wrongly (a shear's pairs sharing one noise draw: z 57 on
    FA at K = 3) fails here. The draws run in one program compiled with ``compiler_options``
    (``None``: :data:`SBC_COMPILER_OPTIONS`, as for SBC: it runs long enough for optimised code
    to pay for its compile).
    """
    values0, X0 = simulate(model, model_kwargs, rng_key, data_site)
    labels = label_test_functions(test_functions, values0, X0)

    def one(key):
        k_sim, k_step = jax.random.split(key)
        values, X = simulate(model, model_kwargs, k_sim, data_site)
        priors, obs, _ = read_model(model, values, (X,), model_kwargs)
        moved = {**values, **update.sample(k_step, values, obs, priors)}
        return (evaluate_test_functions(test_functions, values, X),
                evaluate_test_functions(test_functions, moved, X))

    keys = jax.random.split(jax.random.fold_in(rng_key, 1), num_draws)
    program = jax.jit(lambda ks: jax.lax.map(one, ks, batch_size=batch_divisor(num_draws, 4000)),
                      compiler_options=SBC_COMPILER_OPTIONS if compiler_options is None else compiler_options)
    before, after = program(keys)
    before, after = np.asarray(before), np.asarray(after)
    # a test function the step never changes has d = 0 throughout: its z is 0, not 0 / 0
    d = np.concatenate([after - before, after**2 - before**2], axis=1)
    sd = d.std(0)
    z = d.mean(0) / np.where(sd > 0, sd, np.inf) * np.sqrt(num_draws)
    threshold = bonferroni_z(alpha, z.size)
    return InvarianceResult(labels + [f"{l}^2" for l in labels], z, threshold,
                            bool(np.max(np.abs(z)) < threshold))
