"""Registry entries: the tensor analyzer (``ta``) and the mixture of tensor analyzers (``mta``)
(Tang, Salakhutdinov & Hinton, ICML 2013). Methods: the hand-derived Gibbs sampler (``gibbs``:
alternating group draws, joint (W, T, mu) rows, Psi, the partially collapsed move; MTA's labels
drawn with z_1 integrated out), started from a data-driven point per chain; and maximum
likelihood by Monte Carlo EM (``mcem``, the paper's fitting method), whose run stores the
estimates, the log-likelihood trace and a pointwise log-likelihood (z_1 integrated out exactly,
the other groups by prior draws). Group sizes are d = (K, K) (``--K``), MTA's number
of components ``--J`` (default 2).

Identified quantities: ``Psi`` and ``mean_x`` for TA (W, T and the groups rotate); MTA's
``mean_x`` and ``Psi_mean`` (its per-component sites switch labels between chains). Stored per
draw: every parameter site, never the per-row groups or labels (thinned to stay within
``runs.MAX_STORED_BYTES``). No pointwise log-likelihood is stored: p(x_n | parameters) has no
closed form (see :mod:`latentzoo.inference.ais` for estimating it).
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from latentzoo import runs
from latentzoo.data import MATRIX
from latentzoo.models.tensor_analyzer import (
    default_ta_data,
    group_names,
    mixture_of_tensor_analyzers,
    sample_ta,
    tensor_analyzer,
)
from latentzoo.registry import Family, FamilyChecks, Method, register

__all__ = ["TA", "MTA", "DEFAULT_C", "ta_predict", "mta_predict"]

DEFAULT_C = 2


def _run_gibbs(X, cfg, *, mixture: bool):
    from latentzoo.inference.gibbs import ConjugateGibbs
    from latentzoo.inference.ta import init_from_data, mta_updates, ta_updates

    d = (cfg.K, cfg.K)
    N, D = X.shape
    C = (cfg.J or DEFAULT_C) if mixture else None
    if C is not None and not 1 <= C <= N:
        raise ValueError(f"The number of components J must be between 1 and N = {N}, got {C}.")
    cfg = cfg._replace(samples=min(cfg.samples, 100), warmup=min(cfg.warmup, 100)) if cfg.quick else cfg
    Xj = jnp.asarray(X)
    keys = jax.random.split(jax.random.PRNGKey(cfg.seed + 1), cfg.chains)
    init = jax.jit(jax.vmap(lambda k: init_from_data(k, Xj, d=d, C=C)))(keys)
    if cfg.chains == 1:
        init = jax.tree_util.tree_map(lambda a: a[0], init)
    if mixture:
        model, table = partial(mixture_of_tensor_analyzers, d=d, C=C), mta_updates(d)
        skip = ("c", *group_names(d))
    else:
        model, table = partial(tensor_analyzer, d=d), ta_updates(d)
        skip = group_names(d)
    per_draw = 8 * (C or 1) * (D * (sum(d) + math.prod(d) + 2) + 1) + 8 * 2 * D
    mcmc = runs.run_mcmc(ConjugateGibbs(model, table), cfg, Xj, init_params=init,
                         extra_fields=tuple(f"~z.{s}" for s in skip),
                         thinning=runs.storage_thinning(cfg.chains, cfg.samples, per_draw))
    return runs.mcmc_idata(mcmc, log_likelihood=False)


def _run_mcem(X, cfg, *, mixture: bool):
    """Maximum likelihood by Monte Carlo EM (:func:`latentzoo.inference.ta.mcem.fit_ta_mcem`);
    the log-likelihood trace (estimated at every 10th iteration) is the run's objective."""
    from latentzoo.inference.ta.mcem import fit_ta_mcem, log_likelihood_estimate

    d = (cfg.K, cfg.K)
    C = (cfg.J or DEFAULT_C) if mixture else 1
    if not 1 <= C <= X.shape[0]:
        raise ValueError(f"The number of components J must be between 1 and N = {X.shape[0]}, got {C}.")
    iterations, _ = runs.point_sizes(cfg, sweeps=100, quick_sweeps=10)
    # checkpoints estimate log p(X) with 1024 prior draws of z_2: cheap enough at 10^4 patches
    fit = fit_ta_mcem(X, d=d, C=C, num_iterations=iterations, seed=cfg.seed, checkpoints=10, num_draws=1024,
                      progress_bar=cfg.progress)
    params = {k: np.asarray(v) for k, v in fit.params.items()}
    y_mean = np.zeros(sum(d))
    if mixture:
        params["mean_x"] = params["pi"] @ params["mu"]
        params["Psi_mean"] = params["pi"] @ params["Psi"]
    else:
        params["mean_x"] = params["mu"] + params["W"] @ y_mean
    ll = np.asarray(log_likelihood_estimate(jnp.asarray(X), fit.params, d=d, per_row=True))
    return runs.point_idata(params, [v for _, v in fit.loglik_trace], observed={"X": np.asarray(X)},
                            log_likelihood={"X": ll})


def ta_posterior_predictive(idata, rng_seed=0, max_draws=200):
    """x_rep from each picked draw's parameters with fresh groups (and labels): {"X": (1, S, N, D)}."""
    post = idata.posterior
    names = ["W", "T", "mu", "Psi"] + (["pi"] if "pi" in post else [])
    flat = {k: np.asarray(post[k]).reshape(-1, *post[k].shape[2:]) for k in names}
    N = idata.observed_data["X"].shape[0]
    d = flat["T"].shape[2:] if "pi" not in post else flat["T"].shape[3:]
    rng = np.random.default_rng(rng_seed)
    out = []
    for i in runs.pick_draws(rng, flat["W"].shape[0], max_draws):
        params = {k: v[i] for k, v in flat.items()}
        if "pi" in params:
            params["pi"] = params["pi"] / params["pi"].sum()
        out.append(sample_ta(rng, params, N, d)[0])
    return {"X": np.stack(out)[None]}


def _random_priors(rng):
    import numpyro.distributions as dist

    return {
        "pi": rng.uniform(0.3, 4.0),
        "z": dist.Normal(rng.uniform(-0.5, 0.5), rng.uniform(0.5, 2.0)),
        "W": dist.Normal(rng.uniform(-1.0, 1.0), rng.uniform(0.3, 3.0)),
        "T": dist.Normal(rng.uniform(-1.0, 1.0), rng.uniform(0.3, 3.0)),
        "mu": dist.Normal(rng.uniform(-2.0, 2.0), rng.uniform(0.3, 3.0)),
        "Psi": dist.InverseGamma(rng.uniform(3.0, 8.0), rng.uniform(0.5, 4.0)),
    }


def _check_priors():
    import numpyro.distributions as dist

    # mu tightened from N(0, 10^2) and Psi given a finite variance: a short Geweke chain cannot
    # cross a diffuse mean, and second moments of an InvGamma(2, .) do not exist.
    return {"mu": dist.Normal(0.0, 1.0), "Psi": dist.InverseGamma(5.0, 2.0)}


def _orbit_priors():
    import numpyro.distributions as dist

    # every prior mean non-zero and every scale far from 1: the shift move's precision and
    # linear terms read all of them, and N(0, 1) would hide a dropped mean or a missing square
    return {"z": dist.Normal(0.3, 1.4), "W": dist.Normal(-0.4, 0.8), "T": dist.Normal(0.2, 1.3),
            "mu": dist.Normal(0.7, 1.5), "Psi": dist.InverseGamma(5.0, 2.0)}


def _ta_table():
    from latentzoo.inference.ta import ta_updates

    return ta_updates((2, 2))


def _mta_table():
    from latentzoo.inference.ta import mta_updates

    return mta_updates((1, 2))


TA_CHECKS = FamilyChecks(
    model_kwargs=dict(N=8, D=3, d=(2, 2), priors=_check_priors()),
    gibbs_table=_ta_table,
    test_functions={
        "Psi": lambda v: v["Psi"],
        "mean_x": lambda v: v["mean_x"] if "mean_x" in v else v["mu"],
        "W2": lambda v: jnp.sum(v["W"] ** 2),
        "T2": lambda v: jnp.sum(v["T"] ** 2),
        "z_sq": lambda v: jnp.mean(v["z_1"] ** 2) + jnp.mean(v["z_2"] ** 2),
    },
    broken_site="Psi",
    random_priors=_random_priors,
    informative_model_kwargs=dict(N=60, D=3, d=(2, 2), priors=_check_priors()),
    sized_model_kwargs=lambda N, D: dict(N=N, D=D, d=(2, 2), priors=_check_priors()),
    edge_model_kwargs=(dict(N=1, D=1, d=(1, 1), priors=_check_priors()),),
    # at 60 rows the groups and loadings trade off slowly: 50 sweeps leave ranks of mean_x and
    # sum W^2 non-uniform (p ~ 1e-3), 300 sweeps (thinning 12) give p > 0.08
    informative_warmup=300,
    # one-dimensional groups: each shift move's orbit is one coordinate
    orbit_model_kwargs=dict(N=3, D=3, d=(1, 1), priors=_orbit_priors()),
)

MTA_CHECKS = FamilyChecks(
    model_kwargs=dict(N=8, D=2, d=(1, 2), C=2, priors=_check_priors()),
    gibbs_table=_mta_table,
    # Invariant to relabelling the components and to the groups' signs.
    test_functions={
        "Psi_sum": lambda v: v["Psi"].sum(0),
        "pi_sorted": lambda v: jnp.sort(v["pi"]),
        "mu_sum": lambda v: v["mu"].sum(0),
        "T2": lambda v: jnp.sum(v["T"] ** 2),
        "same_label": lambda v: jnp.mean(v["c"][:, None] == v["c"][None, :]),
    },
    broken_site="Psi",
    random_priors=_random_priors,
    informative_model_kwargs=dict(N=60, D=2, d=(1, 2), C=2, priors=_check_priors()),
    sized_model_kwargs=lambda N, D: dict(N=N, D=D, d=(1, 2), C=2, priors=_check_priors()),
    edge_model_kwargs=(dict(N=1, D=1, d=(1, 1), C=2, priors=_check_priors()),),
    # labels move between components slowly at 60 rows: 300 sweeps (p > 0.02), not 50 (1e-7)
    informative_warmup=300,
    orbit_model_kwargs=dict(N=3, D=3, d=(1, 1), C=1, priors=_orbit_priors()),
)

PREDICT_DRAWS = 20  # posterior draws a prediction uses (evenly spaced over the chains)
AIS_CHAINS, AIS_TEMPS = 8, 200  # per row and draw: independent AIS chains, temperatures
# A missing entry's noise variance inside AIS: its likelihood term is then flat in the latents
# (precision 1e-10 against ~1-100 for an observed entry) and contributes the constant
# -1/2 log(2 pi MISSING_VARIANCE) (up to ~1e-8 nats), which is added back exactly.
MISSING_VARIANCE = 1e10


def _data_mean(model, values, x, kwargs):
    """E[x | latents, parameters] of a one-row data set: the mean of the model's X site."""
    from numpyro.handlers import seed, substitute, trace

    tr = trace(substitute(seed(model, jax.random.PRNGKey(0)), data=values)).get_trace(x, **kwargs)
    return tr["X"]["fn"].mean


def _ta_predict(draws, X_new, run, *, mixture: bool):
    """Each new row's log density under each of up to :data:`PREDICT_DRAWS` posterior draws,
    by annealed importance sampling per row (:func:`latentzoo.inference.ais.ais`, ``per_row``:
    :data:`AIS_CHAINS` chains over :data:`AIS_TEMPS` temperatures, the fit's own Gibbs table on
    the per-row latents: the groups z_j and, for MTA, the label c), with its standard error.
    The same chains, weighted by their importance weights, give each row's posterior mean of
    the latents under the draw: E[z_j | x_n] and, for MTA, p(c_n = c | x_n).

    Missing entries (NaN) are left out: with diagonal noise the density of a row's observed
    entries is the model's with those columns removed, which AIS computes in the same compiled
    program by giving the missing entries a noise variance of :data:`MISSING_VARIANCE` for that
    row (``row_params``) and adding back the constant that leaves. Each missing entry is imputed
    by its conditional mean given the row's observed entries and the draw: the AIS chains' final
    latents, weighted by their importance weights, through the model's mean of x.

    Returns ``{"log_lik", "log_lik_stderr": (chains, P, M), "draw_index": (P,), "latents":
    {"z_j": (chains, P, M, d_j), "c": (chains, P, M, C) (MTA)}}`` and, with missing entries,
    ``"X_completed"`` (chains, P, M, D)."""
    from latentzoo.inference.ais import ais
    from latentzoo.inference.ta import mta_updates, ta_updates

    post = run.posterior
    chains, num = post.sizes["chain"], post.sizes["draw"]
    index = np.unique(np.linspace(0, num - 1, max(1, min(num, PREDICT_DRAWS // chains)))
                      .round().astype(int))
    K = int(post["T"].shape[-1])
    d = (K, K)
    sites = ("W", "T", "mu", "Psi", "pi") if mixture else ("W", "T", "mu", "Psi")
    values = {k: np.asarray(post[k])[:, index] for k in sites}
    if mixture:
        model, table = mixture_of_tensor_analyzers, mta_updates(d)
        kwargs, latent = dict(d=d, C=int(values["pi"].shape[-1])), ("c", *group_names(d))
    else:
        model, table, kwargs, latent = tensor_analyzer, ta_updates(d), dict(d=d), group_names(d)
    missing = np.isnan(X_new)
    any_missing = bool(missing.any())
    X = jnp.asarray(np.where(missing, 0.0, X_new))
    M, D = X.shape
    ll = np.empty((chains, len(index), M))
    se = np.empty_like(ll)
    completed = np.empty((chains, len(index), M, D)) if any_missing else None
    C = int(values["pi"].shape[-1]) if mixture else 0
    latent_means = {name: np.empty((chains, len(index), M, size))
                    for name, size in zip(latent, (C, *d) if mixture else d)}
    mean_of = jax.jit(jax.vmap(jax.vmap(lambda v, x: _data_mean(model, v, x[None], kwargs)[0],
                                        in_axes=(0, None))))
    key = jax.random.PRNGKey(0)
    for c in range(chains):  # one compiled program: the draw's values are its arguments
        for i in range(len(index)):
            key, k = jax.random.split(key)
            params = {s: jnp.asarray(v[c, i]) for s, v in values.items()}
            row_params = None
            if any_missing:  # Psi (D,) for TA, (C, D) for MTA -> one per row
                mask = missing if not mixture else missing[:, None, :]
                row_params = {"Psi": jnp.where(mask, MISSING_VARIANCE, params["Psi"][None])}
            r = ais(model, table, X, params, kwargs, latent_sites=latent, per_row=True,
                    num_chains=AIS_CHAINS, num_temps=AIS_TEMPS, rng_key=k,
                    row_params=row_params, return_latents=True)
            ll[c, i] = np.asarray(r.log_marginal) + 0.5 * np.log(2 * np.pi * MISSING_VARIANCE) * missing.sum(1)
            se[c, i] = np.asarray(r.stderr)
            w = np.exp(np.asarray(r.log_weights) - np.asarray(r.log_weights).max(1, keepdims=True))
            w /= w.sum(1, keepdims=True)  # (M, A): each row's self-normalised weights
            for name, v in r.latents.items():
                v = np.asarray(v)[:, :, 0]  # (M, A, ...): one-row data sets
                if name == "c":
                    v = np.eye(C)[v.astype(int)]
                latent_means[name][c, i] = np.einsum("ma,ma...->m...", w, v)
            if any_missing:
                # every row's chains: its final latents (M, A, 1, ...) with the row's parameters
                per_row = {**{s: jnp.broadcast_to(p, (M, AIS_CHAINS, *p.shape)) for s, p in params.items()},
                           **r.latents}
                means = np.asarray(mean_of(per_row, X))  # (M, A, D)
                completed[c, i] = np.where(missing, np.einsum("ma,mad->md", w, means), X_new)
    out = {"log_lik": ll, "log_lik_stderr": se, "draw_index": index, "latents": latent_means}
    if any_missing:
        out["X_completed"] = completed
    return out


ta_predict = partial(_ta_predict, mixture=False)
mta_predict = partial(_ta_predict, mixture=True)

TA = register(
    Family(
        name="ta",
        title="Tensor analyzer",
        paper="Tang, Salakhutdinov & Hinton (ICML 2013)",
        model=tensor_analyzer,
        data_kind=MATRIX,
        default_data=lambda seed: default_ta_data(seed),
        methods=(Method("gibbs", partial(_run_gibbs, mixture=False), distributed=True),
                 Method("mcem", partial(_run_mcem, mixture=False), kind="point",
                        ignores_priors=("W", "T", "mu", "Psi"))),  # maximum likelihood
        identified=("Psi", "mean_x"),
        trace_sites=("Psi",),
        posterior_predictive=ta_posterior_predictive,
        predict=ta_predict,
        default_K=2,
        docs="models/tensor_analyzer.md",
        checks=TA_CHECKS,
    )
)

MTA = register(
    Family(
        name="mta",
        title="Mixture of tensor analyzers",
        paper="Tang, Salakhutdinov & Hinton (ICML 2013)",
        model=mixture_of_tensor_analyzers,
        data_kind=MATRIX,
        default_data=lambda seed: default_ta_data(seed),
        methods=(Method("gibbs", partial(_run_gibbs, mixture=True), distributed=True),
                 Method("mcem", partial(_run_mcem, mixture=True), kind="point",
                        ignores_priors=("pi", "W", "T", "mu", "Psi"))),  # maximum likelihood
        identified=("mean_x", "Psi_mean"),
        trace_sites=("Psi_mean",),
        posterior_predictive=ta_posterior_predictive,
        predict=mta_predict,
        default_K=2,
        docs="models/tensor_analyzer.md",
        checks=MTA_CHECKS,
    )
)
