"""What every runner shares: running NumPyro's MCMC, turning draws and point estimates into
ArviZ ``InferenceData``, summarising identified quantities, and writing a run folder.

Three kinds of result (``Method.kind`` in :mod:`latentzoo.registry`):

- ``"mcmc"``: draws with chains; the summary has R-hat and ESS and the trace plot shows chains;
- ``"point"``: an EM / VB / streaming estimate; the posterior group holds one "draw", the
  objective's trace is stored in ``sample_stats`` (``objective``, one value per sweep), the
  summary lists the estimates alone and ``trace.png`` plots the objective.
"""

from __future__ import annotations

import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from latentzoo import arviz_adapter as azx
from latentzoo import arviz_plots as azp
from latentzoo.compiled_loop import one_compiled_loop

__all__ = [
    "run_mcmc",
    "run_sharded_chains",
    "replica_exchange",
    "swap_rate_warning",
    "MIN_SWAP_RATE",
    "mcmc_idata",
    "point_idata",
    "summarise",
    "write_run",
    "is_point_fit",
    "chain_method",
    "HMC_STATS",
    "MAX_STORED_COV_DIM",
    "point_sizes",
    "guide_point_idata",
    "pick_draws",
    "map_draws",
    "MAX_STORED_BYTES",
    "MIN_STORED_DRAWS",
    "storage_thinning",
    "thinning_note",
    "read_run",
    "add_stored_predictive",
    "MAX_PREDICTIVE_BYTES",
    "PREDICTIVE_REPLICATES",
]

# D x D covariance per draw grows with D^2: stored up to this D, left out (with its summary)
# above it, where the per-feature sites still describe the fit.
MAX_STORED_COV_DIM = 100

# What a run stores per draw (posterior sites and pointwise log-likelihood) grows with N and D;
# draws beyond this many bytes in all are thinned away (evenly, while sampling), but never below
# MIN_STORED_DRAWS per chain, so posterior.nc stays bounded while R-hat and ESS stay meaningful.
MAX_STORED_BYTES = 32 * 2**20
MIN_STORED_DRAWS = 50
# Trace plots show at most this many entries of each site (the first ones): a panel of 7129
# overlaid traces says nothing and took ten minutes to draw.
MAX_TRACE_ENTRIES = 20


# NumPyro's per-draw statistics of an HMC/NUTS run kept beside `diverging` (its default): ArviZ's
# from_numpyro stores them as sample_stats `energy`, `lp`, `n_steps`, `acceptance_rate` and
# `step_size`, so that az.plot_energy and az.summary of the sampler's behaviour work on the file.
HMC_STATS = ("energy", "potential_energy", "num_steps", "accept_prob", "adapt_state.step_size")


def chain_method(chains: int) -> str:
    """'parallel' when there is a device per chain (e.g. XLA_FLAGS host devices), else sequential."""
    return "parallel" if jax.local_device_count() >= chains > 1 else "sequential"


def run_mcmc(kernel, cfg, *model_args, extra_fields=(), init_params=None, thinning=1, **model_kwargs):
    """``numpyro.infer.MCMC`` with the run's chains, warm-up and draws; returns the finished MCMC.

    With ``cfg.checkpoint_dir`` set, the draws come in segments saved there after warm-up and
    each segment, and ``cfg.resume`` continues from them (:mod:`latentzoo.checkpoint`); the
    draws are those of one uninterrupted run."""
    from numpyro.infer import HMC, MCMC

    if isinstance(kernel, HMC):  # NUTS/HMC: what az.plot_energy and a divergence audit read
        extra_fields = (*extra_fields, *HMC_STATS)
    if getattr(cfg, "distributed", False):
        return run_sharded_chains(kernel, cfg, *model_args, extra_fields=extra_fields,
                                  init_params=init_params, thinning=thinning, **model_kwargs)
    if getattr(cfg, "replicas", 1) > 1:
        kernel = replica_exchange(kernel, cfg)
        extra_fields = (*extra_fields, "swap_accept_prob")
    mcmc = MCMC(
        kernel,
        num_warmup=cfg.warmup,
        num_samples=cfg.samples,
        num_chains=cfg.chains,
        thinning=thinning,  # keep every t-th draw (storage_thinning); "~z.<site>" in extra_fields drops a site
        chain_method=chain_method(cfg.chains),
        progress_bar=cfg.progress,
        jit_model_args=True,
    )
    if cfg.progress:  # the bars stand at 0 while XLA compiles: say so
        print(f"compiling the sampler for these sizes (chains {cfg.chains}, warm-up {cfg.warmup}, "
              f"draws {cfg.samples}); its progress bars follow", file=sys.stderr, flush=True)
    # one compiled sampling loop for every chain and segment (latentzoo.compiled_loop)
    with one_compiled_loop():
        if getattr(cfg, "checkpoint_dir", None):
            from latentzoo.checkpoint import run_mcmc_segments

            return run_mcmc_segments(mcmc, cfg, model_args, model_kwargs, rng_key=jax.random.PRNGKey(cfg.seed),
                                     extra_fields=extra_fields, init_params=init_params)
        mcmc.run(jax.random.PRNGKey(cfg.seed), *model_args, extra_fields=tuple(extra_fields),
                 init_params=init_params, **model_kwargs)
    return mcmc


def run_sharded_chains(kernel, cfg, *model_args, extra_fields=(), init_params=None, thinning=1,
                       **model_kwargs):
    """:func:`run_mcmc` with the rows split over every device of every process
    (``cfg.distributed``): each chain is one
    :func:`~latentzoo.inference.distributed.sharded_gibbs` run, the chains one after another,
    chain c with the key ``MCMC`` gives it (``jax.random.split(PRNGKey(cfg.seed), cfg.chains)[c]``;
    the seed's key itself for one chain) and ``init_params[c]``. The draws equal
    :func:`run_mcmc`'s to the order of the additions in the sums over rows.

    ``model_args`` are all the rows (the same on every process; a dict of arrays with the same
    rows counts as one argument, each array split alike); each process places its own
    block (:func:`~latentzoo.inference.distributed.local_rows`) on its devices. Returns an
    ``MCMC`` object (never run) holding the gathered draws, the collected ``potential_energy`` and
    ``diverging`` and the model's arguments, so that ``get_samples``, ``get_extra_fields`` and
    :func:`mcmc_idata` read it as they read a finished run. No checkpoints, no progress bars,
    no replica exchange."""
    from numpyro.infer import MCMC

    from latentzoo.inference.distributed import ShardedGibbs, gather, local_rows, row_mesh, shard_rows

    if getattr(cfg, "replicas", 1) > 1:
        raise ValueError("--replicas and --distributed cannot be combined: replica exchange does "
                         "not run row-sharded.")
    mesh = row_mesh()
    # a data argument may be a dict of arrays with the same rows (the rank SVM's observed sites)
    data = tuple(jax.tree.map(lambda a: shard_rows(local_rows(np.asarray(a)), mesh), arg) for arg in model_args)
    field = getattr(kernel, "sample_field", "z")
    stats = tuple(f for f in getattr(kernel, "default_fields", ()) if f != field)
    fields = (*stats, *extra_fields)
    # MCMC's collection: the first (samples % thinning) sweeps after warm-up are not kept
    warmup = cfg.warmup + cfg.samples % thinning
    kept = cfg.samples // thinning
    key = jax.random.PRNGKey(cfg.seed)
    keys = jax.random.split(key, cfg.chains) if cfg.chains > 1 else key[None]
    if cfg.progress:
        print(f"compiling the row-sharded sampler ({mesh.size} devices; chains {cfg.chains}, "
              f"warm-up {cfg.warmup}, draws {cfg.samples}, one chain after another)",
              file=sys.stderr, flush=True)
    chains = []
    # one sampler for every chain: its compiled programs are reused, chain after chain
    gibbs = ShardedGibbs(kernel, mesh, **model_kwargs)
    for c in range(cfg.chains):
        start = None if init_params is None or cfg.chains == 1 else \
            jax.tree.map(lambda a, c=c: np.asarray(a)[c], init_params)
        if cfg.chains == 1:
            start = init_params
        state = gibbs.init(keys[c], *data, num_warmup=warmup, init_params=start)
        draws = gibbs.run(state, *data, num_samples=kept, num_warmup=warmup, thinning=thinning,
                          extra_fields=fields)
        chains.append(gather({field: draws.samples, **(draws.extra or {})}))
    states = jax.tree.map(lambda *per_chain: np.stack(per_chain), *chains)
    mcmc = MCMC(kernel, num_warmup=cfg.warmup, num_samples=cfg.samples, num_chains=cfg.chains,
                thinning=thinning, chain_method="sequential", progress_bar=False)
    # what MCMC.run leaves behind, for get_samples / get_extra_fields / ArviZ's from_numpyro
    mcmc._args = tuple(jax.tree.map(np.asarray, arg) for arg in model_args)
    mcmc._kwargs = dict(model_kwargs)
    mcmc._states, mcmc._states_flat = states, None
    return mcmc


def replica_exchange(kernel, cfg):
    """The Gibbs ``kernel``'s model and table run as replica exchange over ``cfg.replicas``
    tempered copies down to ``cfg.min_beta`` (one sentence for any other kernel; the table's
    own refusal, at ``init``, when it has no tempered form)."""
    from latentzoo.inference.gibbs import ConjugateGibbs
    from latentzoo.inference.samplers import ReplicaExchange

    if not isinstance(kernel, ConjugateGibbs):
        raise ValueError(f"--replicas runs replica exchange over a Gibbs table, and this method "
                         f"samples with {type(kernel).__name__}; use --method gibbs.")
    return ReplicaExchange(kernel.model, kernel.updates, num_replicas=cfg.replicas, min_beta=cfg.min_beta)


MIN_SWAP_RATE = 0.05
"""Below this mean swap probability an adjacent pair of tempered copies is, for a run's length,
disconnected: a state of the hotter copy reaches the β = 1 chain about once in 20 proposals or
less, so the exchange no longer helps the chain leave a mode (rates of 0.2-0.4 are the usual aim
of a ladder)."""


def swap_rate_warning(idata, threshold: float = MIN_SWAP_RATE) -> str | None:
    """One sentence naming the adjacent pair of tempered copies with the lowest mean swap
    probability, when it is below ``threshold``, or None (also for a run without replicas).

    Reads ``sample_stats.swap_accept_prob`` (chain, draw, M - 1): pair m is copies m and m + 1,
    copy 0 being the β = 1 chain. Found on 2000 x 500 baskets (NOCA, K = 8, 4 copies down to
    β = 0.01): every pair at 0.000, a run four times the cost of plain Gibbs that exchanged
    nothing, and nothing said it."""
    stats = getattr(idata, "sample_stats", None)
    if stats is None or "swap_accept_prob" not in stats:
        return None
    rates = np.asarray(stats["swap_accept_prob"], dtype=float)
    rates = rates.reshape(-1, rates.shape[-1]).mean(0)  # (M - 1,): each pair over chains and draws
    if rates.size == 0 or not np.all(np.isfinite(rates)) or rates.min() >= threshold:
        return None
    m = int(rates.argmin())
    low = int((rates < threshold).sum())
    return (f"warning: replica exchange: tempered copies {m} and {m + 1} (copy 0 is the beta = 1 chain) "
            f"swapped with mean probability {rates[m]:.3f}, and {low} of the {rates.size} adjacent pairs "
            f"are under {threshold:g}, so the hotter copies barely reach the beta = 1 chain; run with "
            f"more --replicas or a larger --min-beta.")


def mcmc_idata(mcmc, *, log_likelihood: dict | None = None, drop=()):
    """InferenceData of a finished MCMC (NumPyro's observed data and sample stats); posterior
    sites in ``drop`` (large per-row latents, rotation-ambiguous factors) left out.
    ``log_likelihood``: pointwise values to store, None for NumPyro's own, False for none."""
    idata = azx.from_mcmc(mcmc, log_likelihood=log_likelihood)
    present = [v for v in azx.posterior_var_names(idata) if v in drop]
    idata = azx.drop_posterior_vars(idata, present) if present else idata
    # the draws per chain the sampler made (a family may cap the CLI's request, e.g. --quick),
    # for the thinning note
    if isinstance(getattr(mcmc, "num_samples", None), int):
        azx.set_posterior_attrs(idata, latentzoo_draws_per_chain=mcmc.num_samples)
    return idata


def point_idata(estimates: dict, objective, *, observed: dict, log_likelihood: dict | None = None):
    """InferenceData of a point fit: each estimate as one draw of one chain, and the objective
    (ELBO or log-likelihood, one value per sweep) as ``sample_stats.objective`` (1, 1, sweeps)."""
    post = {k: np.asarray(v)[None, None] for k, v in estimates.items()}
    obj = np.asarray(objective, dtype=float).reshape(1, 1, -1)
    ll = None if log_likelihood is None else {k: np.asarray(v)[None, None] for k, v in log_likelihood.items()}
    return azx.from_draws(post, observed_data=observed, log_likelihood=ll,
                          sample_stats={"objective": obj})


def point_sizes(cfg, *, sweeps: int = 300, restarts: int = 1, quick_sweeps: int = 30):
    """(sweeps, restarts) of a point fit: the config's when set, else the method's defaults
    (``quick_sweeps`` x 1 restart under --quick)."""
    if cfg.quick:
        return cfg.sweeps or quick_sweeps, cfg.restarts or 1
    return cfg.sweeps or sweeps, cfg.restarts or restarts


def guide_point_idata(fit, X, *, log_likelihood=None, extra=None):
    """InferenceData of a closed-form fit (:class:`~latentzoo.inference.cavi.VariationalFit`):
    the estimates are the guide's params named ``<site>_loc`` under the site's name; per-row
    variational parameters (q(s_n) and the like) are not posterior quantities and are left out."""
    estimates = {k[:-4]: np.asarray(v) for k, v in fit.params.items() if k.endswith("_loc")}
    estimates.update(extra or {})
    return point_idata(estimates, -np.asarray(fit.losses), observed={"X": np.asarray(X)},
                       log_likelihood=log_likelihood)


def pick_draws(rng, num_draws: int, max_draws: int = 200, min_replicates: int = 20):
    """Indices of the posterior draws that replicated data sets are simulated from: up to
    ``max_draws`` distinct draws, and at least ``min_replicates`` (repeating draws, as for a
    point fit's single draw) so a predictive check always has a spread to compare with."""
    if num_draws >= min_replicates:
        return rng.choice(num_draws, size=min(max_draws, num_draws), replace=False)
    return rng.choice(num_draws, size=min_replicates, replace=True)


def storage_thinning(chains: int, samples: int, bytes_per_draw: int) -> int:
    """Keep every t-th draw: the smallest t for which ``chains * (samples // t)`` draws of
    ``bytes_per_draw`` fit in :data:`MAX_STORED_BYTES`, but never fewer than
    ``min(samples, MIN_STORED_DRAWS)`` draws per chain (NumPyro keeps ``samples // t``)."""
    fit = max(1, MAX_STORED_BYTES // max(1, chains * int(bytes_per_draw)))
    t_budget = -(-samples // fit)
    t_min = max(1, samples // MIN_STORED_DRAWS)
    return int(max(1, min(t_budget, t_min)))


def map_draws(fn, *draws, shared=(), bytes_per_draw: int, budget: int = 2**26):
    """``fn(*shared, *one_draw)`` for every draw, in chunks of draws, as a NumPy array.

    ``draws`` are arrays shaped (chains, draws, ...); ``shared`` arguments (the data) are passed
    whole to every call. ``bytes_per_draw`` is the size of ``fn``'s temporaries for one draw (for
    a likelihood, a few N x D arrays): chunks hold ``budget // bytes_per_draw`` draws, so memory
    stays bounded where evaluating all draws at once would hold a (chains, draws, N, D) array.
    The last chunk is padded to the same size (one compilation). Returns (chains, draws, ...)."""
    lead = np.shape(draws[0])[:2]
    n = int(np.prod(lead))
    flat = [np.asarray(a).reshape(n, *np.shape(a)[2:]) for a in draws]
    size = int(max(1, min(n, budget // max(1, int(bytes_per_draw)))))
    batched = jax.jit(jax.vmap(fn, in_axes=(None,) * len(shared) + (0,) * len(draws)))
    out = []
    for lo in range(0, n, size):
        chunk = [a[lo : lo + size] for a in flat]
        m = chunk[0].shape[0]
        if m < size:  # repeat the last draw; its results are cut off below
            chunk = [np.concatenate([c, np.repeat(c[-1:], size - m, axis=0)]) for c in chunk]
        out.append(np.asarray(batched(*shared, *chunk))[:m])
    result = np.concatenate(out)
    return result.reshape(*lead, *result.shape[1:])


# The enumerated pointwise log-likelihood visits 2^K states per row and draw; beyond this K a
# run stores none (LOO is then unavailable, as for any model without one).
ENUMERATED_LOGLIK_MAX_K = 12


def enumerated_loglik(fn, X, K: int, *draws):
    """``fn(X, *one_draw)`` -> (N,) for every draw (chains, draws, ...), a few draws at a time:
    the binary-source families' log p(x_n | parameters) with the 2^K source states summed out
    (CVQ, NOCA). Returns (chains, draws, N), or None for K above
    :data:`ENUMERATED_LOGLIK_MAX_K`."""
    from latentzoo.inference.enumerate import chunk_size

    if K > ENUMERATED_LOGLIK_MAX_K:
        return None
    N, D = np.shape(X)
    # the temporaries: an (N, 2^K) table (or enumerate_posterior's chunk of it), and 2^K x D
    table = min(N, chunk_size(2**K, N)) * 2**K + 2**K * D + N * K
    return map_draws(fn, *draws, shared=(jnp.asarray(X),), bytes_per_draw=3 * 8 * table)


def is_point_fit(idata) -> bool:
    return idata.posterior.sizes.get("chain", 1) == 1 and idata.posterior.sizes.get("draw", 1) == 1


def summarise(idata, sites):
    """Summary table of the identified ``sites`` present in the posterior: ArviZ's summary for
    draws, the estimates alone (one column) for a point fit."""
    import pandas as pd

    names = [s for s in sites if s in idata.posterior.data_vars] or list(idata.posterior.data_vars)
    if not is_point_fit(idata):
        return azx.summary(idata, var_names=names)
    rows = {}
    for name in names:
        values = np.asarray(idata.posterior[name])[0, 0]
        if values.ndim == 0:
            rows[name] = float(values)
        else:
            for idx in np.ndindex(values.shape):
                rows[f"{name}[{', '.join(map(str, idx))}]"] = float(values[idx])
    return pd.DataFrame({"estimate": pd.Series(rows)})


def _plot_objective(idata, path, title):
    import matplotlib.pyplot as plt

    from latentzoo.results import atomic_savefig

    obj = np.asarray(idata.sample_stats["objective"]).ravel()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(np.arange(1, obj.size + 1), obj, marker="." if obj.size < 60 else None)
    ax.set_xlabel("sweep")
    ax.set_ylabel("objective (ELBO / log-likelihood)")
    ax.set_title(title)
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=90)
    plt.close(fig)


def thinning_note(idata, requested_draws: int | None) -> str | None:
    """One sentence when ``idata`` keeps fewer draws per chain than were drawn (the storage budget,
    :func:`storage_thinning`), else None."""
    if requested_draws is None or is_point_fit(idata):
        return None
    kept = int(idata.posterior.sizes.get("draw", 0))
    if kept >= requested_draws:
        return None
    return (f"posterior.nc keeps {kept} of {requested_draws} draws per chain (one in "
            f"{requested_draws // max(1, kept)}, to stay within {MAX_STORED_BYTES // 2**20} MiB); "
            "the summary's R-hat and ESS are of the kept draws")


# Replicated data sets stored in a run's posterior_predictive group: as many as fit in this many
# bytes (float32), between the two bounds.
MAX_PREDICTIVE_BYTES = 32 * 2**20
PREDICTIVE_REPLICATES = (10, 100)


def add_stored_predictive(idata, family) -> int:
    """Add a ``posterior_predictive`` group of replicated data sets (the family's
    ``posterior_predictive``, float32, (1, S, N, ...)) so plain ArviZ's ``plot_ppc`` (0.2x) and
    ``plot_ppc_dist`` (1.x) work on the saved file. S fits :data:`MAX_PREDICTIVE_BYTES` within
    :data:`PREDICTIVE_REPLICATES`; a point fit's replicates all come from its one estimate (a
    plug-in predictive, recorded in the attribute ``latentzoo_predictive``). Returns S, or 0 where
    the family has no predictive of its data, there is no observed ``X``, the draws lack a site
    it needs, or the group exists."""
    groups = azx.group_names(idata)
    if family.posterior_predictive is None or "posterior_predictive" in groups \
            or "observed_data" not in groups or "X" not in idata.observed_data:
        return 0
    per_replicate = 4 * int(np.prod(idata.observed_data["X"].shape))
    lo, hi = PREDICTIVE_REPLICATES
    num = int(min(hi, max(lo, MAX_PREDICTIVE_BYTES // max(1, per_replicate))))
    try:
        replicated = family.posterior_predictive(idata, rng_seed=0, max_draws=num)
    except KeyError:  # the draws lack a site the predictive needs (a cut-down posterior)
        return 0
    azx.add_posterior_predictive(idata, {k: np.asarray(v, dtype=np.float32) for k, v in replicated.items()})
    kind = "plug-in (the point estimate)" if is_point_fit(idata) else "posterior draws"
    azx.set_posterior_attrs(idata, latentzoo_predictive=f"{num} replicated data sets from {kind}")
    return num


def read_run(run_dir: str):
    """(InferenceData, latentzoo attributes) of ``run_dir/posterior.nc``; a ValueError sentence
    when the file is missing or unreadable."""
    path = os.path.join(run_dir, "posterior.nc")
    if not os.path.exists(path):
        raise ValueError(f"{path} does not exist; run `latentzoo run ... --out {run_dir}` first.")
    try:
        idata = azx.load(path)
        attrs = azx.posterior_attrs(idata)
    except Exception as err:
        raise ValueError(f"{path} is not a readable InferenceData file ({type(err).__name__}).") from None
    return idata, attrs


def write_run(out: str, idata, *, family, method, seconds: float, data_name: str,
              requested_draws: int | None = None) -> object:
    """Write ``posterior.nc`` (with a posterior_predictive group where the family has one:
    :func:`add_stored_predictive`), ``summary.csv`` and ``trace.png`` into ``out`` through a
    staging folder (all three appear together or none); print the summary. Returns the summary
    table.
    ``requested_draws``: draws per chain the run asked for; the count the sampler made, where
    ``idata`` records it (``latentzoo_draws_per_chain``, set by :func:`mcmc_idata`), takes its
    place. Fewer kept (storage thinning) is recorded in the attributes
    (``latentzoo_draws_per_chain``, ``latentzoo_thinning``) and printed."""
    from latentzoo.results import atomic_write_text, staged_run_dir, writing

    title = f"{family.name} / {method.name} on {data_name}"
    azx.set_posterior_attrs(
        idata, latentzoo_model=family.name, latentzoo_method=method.name, latentzoo_data=data_name,
        latentzoo_seconds=float(seconds),
    )
    add_stored_predictive(idata, family)
    if requested_draws is not None and not is_point_fit(idata):
        # the sampler's own count where the run recorded it (mcmc_idata): a family may cap the
        # command line's request (--quick)
        requested_draws = int(azx.posterior_attrs(idata).get("latentzoo_draws_per_chain", requested_draws))
    thinned = thinning_note(idata, requested_draws)
    if requested_draws is not None and not is_point_fit(idata):
        kept = int(idata.posterior.sizes.get("draw", 0))
        azx.set_posterior_attrs(idata, latentzoo_draws_per_chain=int(requested_draws),
                                latentzoo_thinning=int(requested_draws // max(1, kept)))
    table = summarise(idata, family.identified)
    # Staged inside `out` (one file system); a run replaces the files an earlier run wrote there.
    with staged_run_dir(out, role="run") as stage:
        with writing(os.path.join(out, "posterior.nc"), out):
            azx.save(idata, os.path.join(stage, "posterior.nc"))
        with writing(os.path.join(out, "summary.csv"), out):
            atomic_write_text(os.path.join(stage, "summary.csv"), table.to_csv())
        trace = os.path.join(stage, "trace.png")
        with writing(os.path.join(out, "trace.png"), out):
            if is_point_fit(idata) and "sample_stats" in azx.group_names(idata) \
                    and "objective" in idata.sample_stats.data_vars:
                _plot_objective(idata, trace, title)
            else:
                sites = [s for s in family.trace_sites if s in idata.posterior.data_vars]
                azp.plot_trace(idata, trace, var_names=sites or None, coords=_trace_coords(idata, sites))
    print_summary(table, title, seconds)
    if thinned:
        print(f"\n{thinned}")
    print(f"\nwrote {out}/posterior.nc, {out}/summary.csv, {out}/trace.png")
    return table


def _trace_coords(idata, sites):
    """Coordinates selecting the first MAX_TRACE_ENTRIES entries along each long site axis."""
    post = idata.posterior
    dims = {d for s in sites for d in post[s].dims if d not in ("chain", "draw")}
    return {d: post[d].values[:MAX_TRACE_ENTRIES] for d in sorted(dims)
            if post.sizes[d] > MAX_TRACE_ENTRIES} or None


def print_summary(table, title: str, seconds: float | None) -> None:
    import pandas as pd

    timing = "" if seconds is None else f": fitted in {seconds:.1f} s"
    print(f"{title}{timing}\n")
    with pd.option_context("display.max_rows", 40, "display.width", 120):
        print(table.head(40).to_string())
    if len(table) > 40:
        msg = f"\n... {len(table)} rows in all (summary.csv)"
        if "r_hat" in table.columns:
            msg += f"; max r_hat {table['r_hat'].max():.3f}, min ess_bulk {table['ess_bulk'].min():.0f}"
        print(msg)


def timed(fn, *args, **kwargs):
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t0
