"""Geweke's joint-distribution test and simulation-based calibration (SBC) of an MCMC kernel.

- :func:`geweke_test` (Geweke 2004): the "successive-conditional" chain that alternates a kernel
  step with a fresh draw of the data given the parameters has the prior as its stationary
  marginal, exactly when the kernel leaves the posterior invariant. Means of test functions
  (and of their squares) under that chain are compared with independent prior draws; z-scores use
  the chain's effective sample size.
- :func:`sbc` (Talts et al. 2018): draw the truth from the prior, data given the truth, posterior
  draws given the data; the rank of the truth among the draws is uniform for a correct sampler.
  Ranks are binned and tested with a chi-square test per test function.

Both take a model in the zoo's convention (``model(X=None, **model_kwargs)``) and a kernel built
by :class:`~latentzoo.inference.gibbs.ConjugateGibbs` (any MCMCKernel whose ``sample`` reads the
data from ``model_args``). Thresholds are Bonferroni-corrected over the test functions.

A correct kernel and its deliberately wrong control (a draw scaled by 0.8, a shape off by N/2)
usually differ in one number. :func:`geweke_tests` and :func:`sbc_runs` take ``kernel_of``, a
function from a scalar *knob* to a kernel, and run it at several knob values from one compiled
program: the knob is a traced argument, so the control costs a run, not a second compilation
(the compilation is most of a check's time on CPU). Also re-exported by
:mod:`latentzoo.inference.checks`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import gammaincc, ndtri
from numpyro.diagnostics import effective_sample_size
from numpyro.handlers import condition, seed, trace

__all__ = [
    "simulate",
    "evaluate_test_functions",
    "of_data",
    "label_test_functions",
    "batch_divisor",
    "bonferroni_z",
    "geweke_test",
    "geweke_tests",
    "sbc",
    "sbc_runs",
    "SBC_COMPILER_OPTIONS",
    "GewekeResult",
    "SBCResult",
]


def simulate(model, model_kwargs, rng_key, data_site: str = "X", values=None):
    """One draw from the prior predictive: ``(latent values, data)``.

    With ``values`` given, only the data are drawn, from p(X | values). ``data_site`` is one
    observed site (the data is its array) or a tuple of them (the data is a dict by name, which
    the model takes as its first argument).
    """
    m = model if values is None else condition(model, data=values)
    tr = trace(seed(m, rng_key)).get_trace(None, **model_kwargs)
    sites = (data_site,) if isinstance(data_site, str) else tuple(data_site)
    latent = {
        n: s["value"]
        for n, s in tr.items()
        if s["type"] == "sample" and n not in sites and not s.get("is_observed", False)
    }
    if values is not None:
        latent = dict(values)
    if isinstance(data_site, str):
        return latent, tr[data_site]["value"]
    return latent, {n: tr[n]["value"] for n in sites}


def batch_divisor(n: int, at_most: int) -> int:
    """Largest batch size <= at_most dividing n (a remainder batch would compile a second loop)."""
    return max(b for b in range(1, min(n, at_most) + 1) if n % b == 0)


def of_data(f: Callable[[dict, jax.Array], jax.Array]) -> Callable:
    """Mark ``f(values, X)`` as a test function of the parameters *and* the data they go with.

    In SBC, ``X`` is the simulation's data set, the same for the truth and every draw (ranks of
    a data-dependent quantity such as log p(X | theta) are uniform too, Modrák et al. 2023); in
    Geweke's test, the data drawn with the values. Such functions see how tightly a kernel ties
    the parameters to the data, which functions of the parameters alone can miss: a kernel that
    mixes in draws from a wider distribution (replica exchange with a wrong swap ratio) keeps the
    parameters' marginal near the prior."""
    f.uses_data = True
    return f


def _call(f, values, X):
    return f(values, X) if getattr(f, "uses_data", False) else f(values)


def evaluate_test_functions(test_functions: Mapping[str, Callable[[dict], jax.Array]], values,
                            X=None) -> jax.Array:
    """The test functions at ``values`` (those marked :func:`of_data` also at ``X``), raveled
    and concatenated: (F,)."""
    return jnp.concatenate([jnp.ravel(_call(f, values, X)) for f in test_functions.values()])


def label_test_functions(test_functions: Mapping[str, Callable[[dict], jax.Array]], values,
                         X=None) -> list[str]:
    labels = []
    for name, f in test_functions.items():
        n = int(np.size(jax.eval_shape(lambda v, x: _call(f, v, x), values, X)))
        labels += [name] if n == 1 else [f"{name}[{i}]" for i in range(n)]
    return labels


# ------------------------------------------------------------------------------- Geweke
class GewekeResult(NamedTuple):
    labels: list[str]
    z_scores: np.ndarray
    threshold: float
    max_abs_z: float
    passed: bool
    prior_mean: np.ndarray
    chain_mean: np.ndarray


def bonferroni_z(alpha: float, num_tests: int) -> float:
    return float(-ndtri(alpha / (2.0 * num_tests)))


def geweke_test(
    model,
    kernel,
    model_kwargs,
    test_functions,
    rng_key,
    *,
    num_steps: int = 20000,
    num_prior: int = 20480,
    sweeps_per_step: int = 1,
    alpha: float = 0.01,
    data_site: str = "X",
) -> GewekeResult:
    """Geweke's joint-distribution test of ``kernel`` against ``model``.

    The null is "the kernel leaves p(theta | X) invariant"; ``passed`` is False when any z-score
    of the first or second moments of a test function exceeds the Bonferroni threshold for
    familywise level ``alpha``.
    """
    return geweke_tests(model, lambda _: kernel, [0.0], model_kwargs, test_functions, rng_key,
                        num_steps=num_steps, num_prior=num_prior, sweeps_per_step=sweeps_per_step,
                        alpha=alpha, data_site=data_site)[0]


def geweke_tests(
    model,
    kernel_of: Callable[[jax.Array], object],
    knobs: Sequence[float],
    model_kwargs,
    test_functions,
    rng_key,
    *,
    num_steps: int = 20000,
    num_prior: int = 20480,
    sweeps_per_step: int = 1,
    alpha: float = 0.01,
    data_site: str = "X",
) -> list[GewekeResult]:
    """:func:`geweke_test` of ``kernel_of(knob)`` for each of ``knobs`` (one result each), from
    one compiled chain program: ``kernel_of`` is called while tracing, with the knob a traced
    float64 scalar. Every run uses the same keys (the prior draws are shared)."""
    k_prior, k_init, k_chain = jax.random.split(rng_key, 3)

    def prior_g(key):
        values, X = simulate(model, model_kwargs, key, data_site)
        return evaluate_test_functions(test_functions, values, X)

    G_prior = np.asarray(jax.jit(lambda ks: jax.lax.map(prior_g, ks, batch_size=batch_divisor(num_prior, 256)))(
        jax.random.split(k_prior, num_prior)))
    values0, X0 = simulate(model, model_kwargs, k_init, data_site)
    labels = label_test_functions(test_functions, values0, X0)

    @jax.jit
    def run(knob, values0, X0, key):
        kernel = kernel_of(knob)
        state = kernel.init(k_init, 0, values0, (X0,), model_kwargs)

        def body(carry, k):
            state, X = carry
            for _ in range(sweeps_per_step):
                state = kernel.sample(state, (X,), model_kwargs)
            values = kernel.get_constrain_fn((X,), model_kwargs)(state.z)
            _, X = simulate(model, model_kwargs, k, data_site, values=values)
            return (state, X), evaluate_test_functions(test_functions, values, X)

        return jax.lax.scan(body, (state, X0), jax.random.split(key, num_steps))[1]

    results = []
    for knob in knobs:
        G_chain = run(jnp.asarray(knob, jnp.float64), values0, X0, k_chain)
        # The chain starts at a joint draw (values0, X0), so it is in equilibrium from the start
        # when the kernel is right; a short burn-in still guards kernels that re-initialise blocks.
        results.append(_geweke_result(labels, G_prior, np.asarray(G_chain)[num_steps // 20 :], alpha))
    return results


def _geweke_result(labels, G_prior, G_chain, alpha) -> GewekeResult:
    z = []
    for f_prior, f_chain in ((G_prior, G_chain), (G_prior**2, G_chain**2)):
        ess = np.asarray(effective_sample_size(f_chain[None]))
        ess = np.clip(ess, 1.0, len(f_chain))
        se2 = f_prior.var(0) / len(f_prior) + f_chain.var(0) / ess
        z.append((f_chain.mean(0) - f_prior.mean(0)) / np.sqrt(se2))
    z = np.concatenate(z)
    threshold = bonferroni_z(alpha, z.size)
    max_abs_z = float(np.max(np.abs(z)))
    return GewekeResult(labels + [f"{l}^2" for l in labels], z, threshold, max_abs_z,
                        bool(max_abs_z < threshold), G_prior.mean(0), G_chain.mean(0))


# ---------------------------------------------------------------------------------- SBC
class SBCResult(NamedTuple):
    labels: list[str]
    ranks: np.ndarray  # (num_simulations, F), values in 0..num_draws
    p_values: np.ndarray  # (F,) chi-square test of uniform ranks
    threshold: float
    passed: bool


def _chi2_pvalues(ranks: np.ndarray, num_draws: int, num_bins: int) -> np.ndarray:
    S = ranks.shape[0]
    bins = np.minimum((ranks * num_bins) // (num_draws + 1), num_bins - 1)
    counts = np.stack([(bins == b).sum(0) for b in range(num_bins)])  # (B, F)
    expected = S / num_bins
    chi2 = ((counts - expected) ** 2 / expected).sum(0)
    return np.asarray(gammaincc((num_bins - 1) / 2.0, chi2 / 2.0))


SBC_COMPILER_OPTIONS = {"xla_backend_optimization_level": 2}
"""XLA options :func:`sbc` compiles with by default: LLVM's optimisation at its usual level."""


def sbc(
    model,
    kernel,
    model_kwargs,
    test_functions,
    rng_key,
    *,
    num_simulations: int = 200,
    num_warmup: int = 100,
    num_draws: int = 99,
    thin: int = 5,
    num_bins: int = 10,
    alpha: float = 0.01,
    batch_size: int = 8,
    data_site: str = "X",
    compiler_options: dict | None = None,
) -> SBCResult:
    """Simulation-based calibration of ``kernel`` on ``model``.

    ``num_draws + 1`` should be a multiple of ``num_bins``. Ties (discrete test functions) are
    broken at random. ``passed`` is False when any test function's chi-square p-value is below
    ``alpha / F``. Each simulation starts its chain at an independent draw from the prior.

    ``compiler_options`` are XLA's options for the one compiled SBC program (``jax.jit``'s
    argument); ``None`` means :data:`SBC_COMPILER_OPTIONS`, LLVM's optimisation on. The program
    runs ``num_simulations x (num_warmup + num_draws x thin)`` sweeps, so it is run-bound, and it
    stays optimised in a process that compiles everything else at
    ``--xla_backend_optimization_level=0`` (the test suite does, for its many short programs).
    Measured on 2 cores, 100 simulations of the informative configurations at level 0 against
    level 2: TA 54 s against 26, convolutional FA 64 against 24, rank SVM 49 against 37
    (compilation included). Pass ``{}`` to keep the process's own settings.
    """
    return sbc_runs(model, lambda _: kernel, [0.0], model_kwargs, test_functions, rng_key,
                    num_simulations=num_simulations, num_warmup=num_warmup, num_draws=num_draws,
                    thin=thin, num_bins=num_bins, alpha=alpha, batch_size=batch_size,
                    data_site=data_site, compiler_options=compiler_options)[0]


def sbc_runs(
    model,
    kernel_of: Callable[[jax.Array], object],
    knobs: Sequence[float],
    model_kwargs,
    test_functions,
    rng_key,
    *,
    num_simulations: int | Sequence[int] = 200,
    num_warmup: int = 100,
    num_draws: int = 99,
    thin: int = 5,
    num_bins: int = 10,
    alpha: float = 0.01,
    batch_size: int = 8,
    data_site: str = "X",
    compiler_options: dict | None = None,
) -> list[SBCResult]:
    """:func:`sbc` of ``kernel_of(knob)`` for each of ``knobs`` (one result each), from one
    compiled program: ``kernel_of`` is called while tracing, with the knob a traced float64
    scalar. ``num_simulations`` is one count for every run or one per knob; the program runs
    ``batch_size`` simulations at a time, so runs of different counts share it too (each count
    a multiple of the batch size, or the batch shrinks to a common divisor)."""
    if compiler_options is None:
        compiler_options = SBC_COMPILER_OPTIONS
    counts = [num_simulations] * len(knobs) if np.ndim(num_simulations) == 0 else list(num_simulations)
    if len(counts) != len(knobs):
        raise ValueError(f"num_simulations gives {len(counts)} counts for {len(knobs)} knobs.")
    values0, X0 = simulate(model, model_kwargs, rng_key, data_site)
    labels = label_test_functions(test_functions, values0, X0)

    def one(kernel, key):
        k_sim, k_init, k_run, k_tie = jax.random.split(key, 4)
        # The truth and the chain's start are two prior draws from one vmapped call, so the
        # model's samplers appear once in the compiled program (kernel.init would otherwise draw
        # its own start with a second copy of them).
        drawn, Xs = jax.vmap(lambda k: simulate(model, model_kwargs, k, data_site))(
            jnp.stack([k_sim, k_init]))
        truth, start = (jax.tree_util.tree_map(lambda a, i=i: a[i], drawn) for i in (0, 1))
        X = jax.tree_util.tree_map(lambda a: a[0], Xs)
        state = kernel.init(k_run, num_warmup, start, (X,), model_kwargs)

        # One scan over every sweep, warm-up and thinning included, so the sweep appears once in
        # the compiled program (a warm-up scan and a draw scan would each inline it): the test
        # functions are evaluated after every sweep and those of the kept sweeps selected.
        def step(state, _):
            state = kernel.sample(state, (X,), model_kwargs)
            values = kernel.get_constrain_fn((X,), model_kwargs)(state.z)
            return state, evaluate_test_functions(test_functions, values, X)

        G_all = jax.lax.scan(step, state, None, length=num_warmup + num_draws * thin)[1]
        G = G_all[num_warmup + thin - 1 :: thin]  # (L, F): after every thin-th post-warm-up sweep
        g_true = evaluate_test_functions(test_functions, truth, X)
        below = (G < g_true).sum(0)
        ties = (G == g_true).sum(0)
        u = jax.random.uniform(k_tie, g_true.shape)
        return below + jnp.floor(u * (ties + 1)).astype(below.dtype)

    batch = batch_divisor(int(np.gcd.reduce(counts)), batch_size)

    def block(knob, ks):  # (batch,) keys -> (batch, F) ranks
        kernel = kernel_of(knob)
        return jax.vmap(lambda k: one(kernel, k))(ks)

    # one program over a batch of simulations, called once per batch: every run, whatever its
    # count, calls the same compiled program
    program = jax.jit(block, compiler_options=compiler_options)
    results = []
    all_keys = jax.random.split(rng_key, max(counts))
    for knob, count in zip(knobs, counts):
        knob = jnp.asarray(knob, jnp.float64)
        ranks = np.concatenate([np.asarray(program(knob, all_keys[i : i + batch]))
                                for i in range(0, count, batch)])
        p = _chi2_pvalues(ranks, num_draws, num_bins)
        threshold = alpha / p.size
        results.append(SBCResult(labels, ranks, p, threshold, bool(np.min(p) > threshold)))
    return results
