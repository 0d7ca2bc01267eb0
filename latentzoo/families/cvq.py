"""Registry entry: the cooperative vector quantizer (Hauskrecht lecture after Lu, Hauskrecht &
Day 2002). Methods: mean-field variational EM (``vb``), exact EM by enumerating the 2^K source
states (``em``, K <= 16), and the hand-derived Gibbs sampler (``gibbs``)."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from latentzoo import runs
from latentzoo.data import MATRIX
from latentzoo.models.cvq import cvq, default_cvq_data
from latentzoo.registry import Family, FamilyChecks, Method, register

__all__ = ["CVQ", "cvq_predict"]


def _loglik(X, W, pi, sigma):
    """Pointwise marginal log-likelihood log p(x_n | W, pi, sigma) (s summed out exactly) of
    draws (chains, draws, ...) -> (chains, draws, N), a few draws at a time; None for K > 12."""
    from latentzoo.inference.cvq import cvq_exact_loglik

    return runs.enumerated_loglik(partial(cvq_exact_loglik, per_row=True), X, np.shape(W)[-1],
                                  W, pi, sigma)


def _run_point(X, cfg, *, method):
    from latentzoo.inference.cvq import fit_cvq

    if method == "em" and cfg.K > 16:
        raise ValueError(f"Exact EM enumerates 2^K states and is limited to K <= 16, got K = {cfg.K}.")
    sweeps, restarts = runs.point_sizes(cfg, restarts=5)
    fit = fit_cvq(X, cfg.K, method=method, num_steps=sweeps, seed=cfg.seed, restarts=restarts,
                  progress_bar=cfg.progress)
    p = fit.params
    sigma = np.asarray(p["sigma_loc"])
    ll = _loglik(X, *(np.asarray(p[k])[None, None] for k in ("W_loc", "pi_loc", "sigma_loc")))
    W, pi = np.asarray(p["W_loc"]), np.asarray(p["pi_loc"])
    invariant = {"pi_sorted": np.sort(pi), "source_norms": np.sort(np.sqrt((W * W).sum(0)))}
    return runs.guide_point_idata(fit, X, extra={"tau": 1.0 / sigma**2, **invariant},
                                  log_likelihood=None if ll is None else {"X": ll[0, 0]})


def _run_gibbs(X, cfg):
    from latentzoo.inference.cvq import cvq_updates, init_from_data
    from latentzoo.inference.gibbs import ConjugateGibbs

    cfg = cfg._replace(samples=min(cfg.samples, 50), warmup=min(cfg.warmup, 50)) if cfg.quick else cfg
    Xj = jnp.asarray(X)
    # each chain from other data rows as its sources (init_from_data says why)
    keys = jax.random.split(jax.random.PRNGKey(cfg.seed + 1), cfg.chains)
    init = jax.vmap(lambda k: init_from_data(k, Xj, K=cfg.K))(keys)
    if cfg.chains == 1:
        init = jax.tree_util.tree_map(lambda a: a[0], init)
    # K fixes shapes: bound into the model, since MCMC traces the model's arguments
    mcmc = runs.run_mcmc(ConjugateGibbs(partial(cvq, K=cfg.K), cvq_updates()), cfg, Xj,
                         init_params=init)
    post = mcmc.get_samples(group_by_chain=True)
    # NumPyro's own log-likelihood is p(x_n | s_n, ...), conditional on the dropped sources
    ll = _loglik(X, post["W"], post["pi"], 1.0 / np.sqrt(np.asarray(post["tau"])))
    # (None would mean NumPyro's own: conditional on s, and every draw's (N, D) at once)
    return runs.mcmc_idata(mcmc, drop=("s",), log_likelihood=False if ll is None else {"X": ll})


def cvq_posterior_predictive(idata, rng_seed=0, max_draws=200):
    """x_rep = s W^T + sigma eps with s ~ Bernoulli(pi): {"X": (1, S, N, D)}."""
    post = idata.posterior
    W = np.asarray(post["W"]).reshape(-1, *post["W"].shape[-2:])
    pi = np.asarray(post["pi"]).reshape(W.shape[0], -1)
    sigma = np.asarray(post["sigma"]).reshape(-1)
    N = idata.observed_data["X"].shape[0]
    rng = np.random.default_rng(rng_seed)
    pick = runs.pick_draws(rng, W.shape[0], max_draws)
    s = rng.random((len(pick), N, pi.shape[-1])) < pi[pick][:, None, :]
    x = s @ np.swapaxes(W[pick], -1, -2) + sigma[pick][:, None, None] * rng.normal(size=(len(pick), N, W.shape[1]))
    return {"X": x[None]}


def _cvq_table():
    from latentzoo.inference.cvq import cvq_updates

    return cvq_updates()


def _cvq_vb_check():
    from latentzoo.inference.cavi import CAVI
    from latentzoo.inference.cvq import cvq_guide, cvq_vem

    X = np.asarray(default_cvq_data(1)[0][:60])
    return CAVI(cvq, cvq_guide, cvq_vem()), X, dict(K=4)


def _cvq_random_priors(rng):
    import numpyro.distributions as dist

    return {
        "W": dist.Normal(rng.uniform(-1.0, 1.0), rng.uniform(0.3, 3.0)),
        "pi": dist.Beta(rng.uniform(0.3, 5.0), rng.uniform(0.3, 5.0)),
        "tau": dist.Gamma(rng.uniform(0.3, 6.0), rng.uniform(0.2, 4.0)),
    }


CVQ_CHECKS = FamilyChecks(
    model_kwargs=dict(N=10, D=4, K=2),
    gibbs_table=_cvq_table,
    # Summaries invariant to permuting the sources: s through the active fraction and the
    # reconstruction s Wᵀ, with cross-moments (tau * active, recon01).
    test_functions={
        "tau": lambda v: v["tau"],
        "pi_sum": lambda v: jnp.sum(v["pi"]),
        "gram_trace": lambda v: jnp.sum(v["W"] ** 2),
        "active": lambda v: jnp.mean(v["s"]),
        "recon": lambda v: jnp.mean((v["s"] @ v["W"].T) ** 2, 0),
        "recon01": lambda v: jnp.mean((v["s"] @ v["W"][0]) * (v["s"] @ v["W"][1])),
    },
    broken_site="tau",
    vb=_cvq_vb_check,
    random_priors=_cvq_random_priors,
    informative_model_kwargs=dict(N=60, D=4, K=2),
    # with the collapsed source move a chain from a prior start also visits source-off states
    # early; 50 sweeps left gram_trace at p = 0.001 (seed 12), 100 give p >= 0.03 (the move
    # itself is checked exactly in tests/inference/test_cvq_moves.py)
    informative_warmup=100,
    sized_model_kwargs=lambda N, D: dict(N=N, D=D, K=2),
    edge_model_kwargs=(dict(N=1, D=1, K=1),),
)

def cvq_predict(idata, X_new, run=None):
    """New complete rows under each stored draw: ``log_lik`` (chains, draws, M) and the sources'
    posterior ``source_prob`` (chains, draws, M, K), the sources summed out over their 2^K states
    (:func:`~latentzoo.inference.cvq.em.cvq_exact_rows`) up to K = 12, the mean-field lower bound
    above (:func:`~latentzoo.inference.cvq.em.cvq_mean_field_rows`)."""
    from latentzoo.inference.cvq.em import cvq_exact_rows, cvq_mean_field_rows
    from latentzoo.predict import binary_source_scores

    return binary_source_scores(
        idata, X_new, ("W", "pi", "sigma"), cvq_exact_rows, cvq_mean_field_rows, family="cvq",
        K=int(idata.posterior["W"].shape[-1]))


CVQ = register(
    Family(
        name="cvq",
        title="Cooperative vector quantizer",
        paper="Hauskrecht lecture after Lu, Hauskrecht & Day (2002)",
        model=cvq,
        data_kind=MATRIX,
        default_data=lambda seed: default_cvq_data(seed)[0],
        methods=(
            Method("vb", lambda X, cfg: _run_point(X, cfg, method="vb"), kind="point",
                   ignores_priors=("pi", "W", "tau")),  # maximum likelihood, as in the lecture
            Method("em", lambda X, cfg: _run_point(X, cfg, method="em"), kind="point",
                   ignores_priors=("pi", "W", "tau")),
            Method("gibbs", _run_gibbs, distributed=True),
        ),
        # the sources are exchangeable: chains label them differently, so the summary compares
        # sorted probabilities and image norms, never pi or W entry by entry
        identified=("sigma", "pi_sorted", "source_norms"),
        trace_sites=("sigma", "pi_sorted"),
        posterior_predictive=cvq_posterior_predictive,
        predict=cvq_predict,
        default_K=8,
        docs="models/cvq.md",
        checks=CVQ_CHECKS,
    )
)
