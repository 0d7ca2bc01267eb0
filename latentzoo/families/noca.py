"""Registry entry: the noisy-OR component analyzer (Singliar & Hauskrecht, JMLR 2006).
Methods: variational MAP-EM with the Jaakkola-Jordan bound (``vb``), exact MAP-EM by enumerating
the 2^K source states (``em``, K <= 16), and MCMC (``gibbs``: hand-derived s | theta, theta0, pi
and pi | s updates, NUTS for theta, theta0; with ``--replicas`` the tempered table, whose theta,
theta0 | s update is slice sampling on log theta), started from an exact MAP-EM fit so that no
chain starts with its sources off."""

from __future__ import annotations

import sys
from functools import partial

import jax.numpy as jnp
import numpy as np

from latentzoo import runs
from latentzoo.data import BINARY_MATRIX
from latentzoo.models.noca import default_noca_data, noca
from latentzoo.registry import Family, FamilyChecks, Method, register

__all__ = ["NOCA", "noca_predict"]


def _run_point(X, cfg, *, method):
    from latentzoo.inference.noca import fit_noca, noca_exact_loglik

    if method == "em" and cfg.K > 16:
        raise ValueError(f"Exact EM enumerates 2^K states and is limited to K <= 16, got K = {cfg.K}.")
    sweeps, restarts = runs.point_sizes(cfg, restarts=3)
    fit = fit_noca(X, cfg.K, method=method, num_steps=sweeps, seed=cfg.seed, restarts=restarts,
                   progress_bar=cfg.progress)
    p = fit.params
    ll = None
    if cfg.K <= runs.ENUMERATED_LOGLIK_MAX_K:  # the exact log-likelihood enumerates 2^K states per row
        ll = {"X": np.asarray(noca_exact_loglik(jnp.asarray(X), p["theta_loc"], p["theta0_loc"],
                                                 p["pi_loc"], per_row=True))}
    return runs.guide_point_idata(fit, X, log_likelihood=ll)


def _map_start(X, cfg):
    """Every chain's start: an exact MAP-EM fit (variational for K > 12), s_n = its posterior
    marginals rounded. A start drawn from the prior switches the sources off for good: with
    gates drawn over all items, turning a source on costs every row more than it gains, and
    the chain stays at s = 0 (all pi near 1 / (N + 2))."""
    from latentzoo.inference.noca import fit_noca

    # with its own compile line and bar: at the defaults the start takes tens of seconds before
    # the sampler's line, and a silent stretch that long looks like a hang
    method = "em" if cfg.K <= 12 else "vb"
    if cfg.progress:
        print(f"the chains start from a MAP-{method.upper()} fit (K = {cfg.K}):", file=sys.stderr, flush=True)
    fit = fit_noca(X, cfg.K, method=method, num_steps=100, seed=cfg.seed, progress_bar=cfg.progress)
    p = fit.params
    start = {"pi": p["pi_loc"], "theta": p["theta_loc"], "theta0": p["theta0_loc"],
             "s": (p["lam"] > 0.5).astype(jnp.float64)}
    if cfg.chains > 1:
        start = {k: jnp.broadcast_to(v, (cfg.chains, *v.shape)) for k, v in start.items()}
    return start


def _run_gibbs(X, cfg):
    from latentzoo.inference.noca import noca_kernel

    # No size limit: a sweep's s update costs N 2^K D (exact table, K <= 12) or N K D (one
    # single-site scan, K > 12), and NUTS's gradient for theta, theta0 N K D.
    cfg = cfg._replace(samples=min(cfg.samples, 50), warmup=min(cfg.warmup, 50)) if cfg.quick else cfg
    # --quick also caps NUTS's trajectories for theta, theta0 at 2^4 - 1 leapfrog steps: during a
    # 50-sweep warm-up the step size is still adapting and trees of 2^10 steps made the quick run
    # take 108 s (target 60); at depth 5 it took 74 s, at depth 4 58 s (quiet, cold cache). The cap leaves NUTS exact (any depth keeps detailed balance); it
    # only shortens the moves.
    nuts = {"max_tree_depth": 4} if cfg.quick else {}
    # NUTS mixes theta, theta0 better than the slice update (on the default data, 4 chains of
    # 200 + 800: min bulk ESS 1597 in 1068 s against 246 in 413 s, 1.50 against 0.60 per
    # second), but has no tempered form; replica exchange runs the slice table.
    theta = "slice" if getattr(cfg, "replicas", 1) > 1 else "nuts"
    # K bound into the model: run_mcmc traces the model's arguments (jit_model_args). The sources
    # s (N x K a draw) are not collected: at the defaults (4 x 4000 draws of 2000 x 8) they
    # alone were 2 GB, and the run stores none of them.
    mcmc = runs.run_mcmc(noca_kernel(K=cfg.K, theta=theta, **nuts), cfg, jnp.asarray(X),
                         init_params=_map_start(X, cfg), extra_fields=("~z.s",))
    post = mcmc.get_samples(group_by_chain=True)
    # The pointwise log-likelihood with s summed out, a few draws at a time. NumPyro's own is
    # p(x_n | s_n, ...), conditional on sources the run does not keep, and evaluated for every
    # draw at once it held (draws, N, D) temporaries: the default run (16 000 draws of
    # 2000 x 64) grew to 22 GB and was killed for memory after sampling.
    ll = _loglik(X, post["theta"], post["theta0"], post["pi"])
    return runs.mcmc_idata(mcmc, drop=("s",), log_likelihood=False if ll is None else {"X": ll})


def _loglik(X, theta, theta0, pi):
    """log p(x_n | theta, theta0, pi) with s summed out exactly, of draws (chains, draws, ...) ->
    (chains, draws, N), a few draws at a time; None for K > 12."""
    from latentzoo.inference.noca import noca_exact_loglik

    return runs.enumerated_loglik(partial(noca_exact_loglik, per_row=True), X, np.shape(theta)[-2],
                                  theta, theta0, pi)


def noca_posterior_predictive(idata, rng_seed=0, max_draws=200):
    """x_rep ~ Bernoulli(1 - exp(-theta0 - s theta)) with s ~ Bernoulli(pi): {"X": (1, S, N, D)}."""
    post = idata.posterior
    theta = np.asarray(post["theta"]).reshape(-1, *post["theta"].shape[-2:])
    theta0 = np.asarray(post["theta0"]).reshape(theta.shape[0], -1)
    pi = np.asarray(post["pi"]).reshape(theta.shape[0], -1)
    N = idata.observed_data["X"].shape[0]
    rng = np.random.default_rng(rng_seed)
    pick = runs.pick_draws(rng, theta.shape[0], max_draws)
    s = (rng.random((len(pick), N, pi.shape[-1])) < pi[pick][:, None, :]).astype(float)
    p_on = -np.expm1(-(theta0[pick][:, None, :] + s @ theta[pick]))
    return {"X": (rng.random(p_on.shape) < p_on).astype(float)[None]}


def _noca_vb_check():
    import numpyro.distributions as dist

    from latentzoo.inference.cavi import CAVI
    from latentzoo.inference.noca import noca_guide, noca_vem
    from latentzoo.models.noca import NoisyOrBeta

    X = np.asarray(default_noca_data(1, N=80)[0])
    # non-default hyperparameters: every M-step's pseudo-counts are non-zero
    priors = {"pi": dist.Beta(2.0, 3.0), "theta": NoisyOrBeta(1.5, 3.0), "theta0": NoisyOrBeta(2.0, 10.0)}
    return CAVI(noca, noca_guide, noca_vem()), X, dict(K=4, num_pos=int(X.sum()), priors=priors)


def _noca_table():
    from latentzoo.inference.noca import noca_updates

    return noca_updates(theta="slice")  # the whole table hand-derived (NUTS's part is NumPyro's)


def _noca_random_priors(rng):
    import numpyro.distributions as dist

    from latentzoo.models.noca import NoisyOrBeta

    # shapes on both sides of 1 (a < 1 puts the gates' density's pole at theta = 0), rates far
    # from the defaults' 2
    return {"pi": dist.Beta(*rng.uniform(0.6, 4.0, 2)),
            "theta": NoisyOrBeta(*rng.uniform(0.6, 3.0, 2)),
            "theta0": NoisyOrBeta(rng.uniform(1.0, 3.0), rng.uniform(2.0, 9.0))}


# Test functions invariant to relabelling the sources (theta's rows, s's columns and pi permute
# together): the leak, each item's total gate strength, the active fraction and each item's
# expected firing probability over the rows.
NOCA_CHECKS = FamilyChecks(
    model_kwargs=dict(N=10, D=5, K=2),
    gibbs_table=_noca_table,
    test_functions={
        "theta0": lambda v: v["theta0"],
        "theta_sum": lambda v: jnp.sum(v["theta"], 0),
        "pi_sum": lambda v: jnp.sum(v["pi"]),
        "active": lambda v: jnp.mean(v["s"]),
        "p_on": lambda v: jnp.mean(-jnp.expm1(-(v["theta0"] + v["s"] @ v["theta"])), 0),
    },
    broken_site="theta",
    vb=_noca_vb_check,
    random_priors=_noca_random_priors,
    informative_model_kwargs=dict(N=60, D=5, K=2),
    informative_warmup=100,
    sized_model_kwargs=lambda N, D: dict(N=N, D=D, K=2),
    edge_model_kwargs=(dict(N=1, D=1, K=1),),
)

def noca_predict(idata, X_new, run=None):
    """New complete binary rows under each stored draw: ``log_lik`` (chains, draws, M) and the
    sources' posterior ``source_prob`` (chains, draws, M, K), the sources summed out over their
    2^K states (:func:`~latentzoo.inference.noca.noca_exact_rows`) up to K = 12, the
    Jaakkola-Jordan mean-field lower bound above
    (:func:`~latentzoo.inference.noca.noca_mean_field_rows`)."""
    from functools import partial

    from latentzoo.inference.noca import noca_exact_rows, noca_mean_field_rows
    from latentzoo.predict import binary_source_scores

    X_new = np.asarray(X_new)
    if not np.isin(X_new[~np.isnan(X_new)], (0.0, 1.0)).all():
        raise ValueError("The noca model scores binary rows; the new data hold values other than 0 and 1.")
    num_pos = int(np.nansum(X_new))
    return binary_source_scores(
        idata, X_new, ("theta", "theta0", "pi"), noca_exact_rows,
        partial(noca_mean_field_rows, num_pos=num_pos), family="noca",
        K=int(idata.posterior["theta"].shape[-2]))


NOCA = register(
    Family(
        name="noca",
        title="Noisy-OR component analyzer",
        paper="Singliar & Hauskrecht, JMLR (2006)",
        model=noca,
        data_kind=BINARY_MATRIX,
        default_data=lambda seed: default_noca_data(seed)[0],
        methods=(
            Method("vb", lambda X, cfg: _run_point(X, cfg, method="vb"), kind="point"),
            Method("em", lambda X, cfg: _run_point(X, cfg, method="em"), kind="point"),
            Method("gibbs", _run_gibbs, distributed=True),
        ),
        identified=("pi", "theta0", "theta"),
        trace_sites=("pi",),
        posterior_predictive=noca_posterior_predictive,
        predict=noca_predict,
        default_K=8,
        docs="models/noca.md",
        checks=NOCA_CHECKS,
    )
)
