"""Fitting Bayesian FA for the CLI: Gibbs, NUTS, CAVI, EM -> ArviZ InferenceData.

The log-likelihood stored for model comparison is the marginal one, log N(x_n; mu, W Wᵀ +
diag(1/psi)) per row, with the factors integrated out (pointwise, as LOO / WAIC expect).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.infer import MCMC, NUTS, Predictive

from latentzoo import arviz_adapter as azx
from latentzoo.inference.fa.gibbs import fa_updates
from latentzoo.inference.gibbs import ConjugateGibbs
from latentzoo.models.factor_analysis import factor_analysis

__all__ = ["fit_fa_mcmc", "fit_fa_point", "fa_loglik", "fa_posterior_predictive"]

SUMMARY_VARS = ["mu", "psi", "cov"]
TRACE_VARS = ["psi", "mu"]


def fa_loglik(X, W, mu, psi):
    """Pointwise marginal log-likelihood; W (..., D, K), mu/psi (..., D) -> (..., N)."""
    import numpyro.distributions as dist

    d = dist.LowRankMultivariateNormal(mu[..., None, :], W[..., None, :, :], 1.0 / psi[..., None, :])
    return d.log_prob(X)


def _chain_method(chains: int) -> str:
    return "parallel" if jax.local_device_count() >= chains > 1 else "sequential"


def fit_fa_mcmc(X, *, K, method, chains, samples, warmup, seed, progress_bar=True):
    """Gibbs (hand-derived, conjugate) or NUTS on the FA model; returns InferenceData."""
    # K fixes shapes, so it is bound into the model rather than passed as a (traced) argument.
    model = partial(factor_analysis, K=K)
    if method == "gibbs":
        kernel = ConjugateGibbs(model, fa_updates())
    else:
        kernel = NUTS(model, target_accept_prob=0.9)
    mcmc = MCMC(
        kernel,
        num_warmup=warmup,
        num_samples=samples,
        num_chains=chains,
        chain_method=_chain_method(chains),
        progress_bar=progress_bar,
        jit_model_args=True,
    )
    Xj = jnp.asarray(X)
    # The N x K factors are not stored (they are rotation-ambiguous and large).
    mcmc.run(jax.random.PRNGKey(seed), Xj, extra_fields=("~z.z",))
    post = mcmc.get_samples(group_by_chain=True)
    ll = jax.jit(jax.vmap(jax.vmap(fa_loglik, (None, 0, 0, 0)), (None, 0, 0, 0)))(
        Xj, post["W"], post["mu"], post["psi"]
    )
    return azx.from_mcmc(mcmc, log_likelihood={"X": np.asarray(ll)})


def fit_fa_point(X, *, K, method, samples, seed, progress_bar=True):
    """CAVI ("vb") or EM ("em"): draws from the fitted guide as a one-chain posterior."""
    from latentzoo.inference.fa import fit_fa_variational

    result, guide = fit_fa_variational(
        np.asarray(X), K, method=method, seed=seed, progress_bar=progress_bar
    )
    Xj = jnp.asarray(X)
    draws = Predictive(
        factor_analysis, guide=guide, params=result.params, num_samples=samples,
        return_sites=["W", "mu", "psi"],
    )(jax.random.PRNGKey(seed + 1), Xj, K=K)
    W, mu, psi = draws["W"], draws["mu"], draws["psi"]
    cov = W @ jnp.swapaxes(W, -1, -2) + jax.vmap(jnp.diag)(1.0 / psi)
    post = {k: np.asarray(v)[None] for k, v in dict(W=W, mu=mu, psi=psi, cov=cov).items()}
    ll = jax.vmap(fa_loglik, (None, 0, 0, 0))(Xj, W, mu, psi)
    stats = {"elbo": np.full((1, samples), -float(result.losses[-1]))}
    return azx.from_draws(
        post,
        observed_data={"X": np.asarray(X)},
        log_likelihood={"X": np.asarray(ll)[None]},
        sample_stats=stats,
    )


def fa_posterior_predictive(idata, rng_seed=0, max_draws=200):
    """Replicated data sets x_rep ~ N(mu, cov) for a subset of posterior draws: (1, S, N, D)."""
    post = idata.posterior
    mu = np.asarray(post["mu"]).reshape(-1, post["mu"].shape[-1])
    cov = np.asarray(post["cov"]).reshape(-1, *post["cov"].shape[-2:])
    N = idata.observed_data["X"].shape[0]
    rng = np.random.default_rng(rng_seed)
    pick = rng.choice(len(mu), size=min(max_draws, len(mu)), replace=False)
    L = np.linalg.cholesky(cov[pick])
    eps = rng.normal(size=(len(pick), N, mu.shape[-1]))
    return {"X": (mu[pick][:, None, :] + eps @ np.swapaxes(L, -1, -2))[None]}
