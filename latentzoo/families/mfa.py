"""Registry entry: the mixture of factor analyzers (Ghahramani & Hinton 1996; the baseline of
Tang et al., Tensor Analyzers). Method: the hand-derived blocked Gibbs sampler (``gibbs``), with
the labels drawn with the factors integrated out, started from k-means++ seeds per chain.

Identified quantities: the shared noise precisions ``psi`` and the mixture's summaries that no
relabelling changes (:func:`mixture_summaries`: weights sorted, component variances sorted, the
mixture's mean and total variance), which the summary lists. Component-level sites (``pi``,
``mu``, ``cov``) are identified only up to a permutation of the components (label switching), so
they are stored but their R-hat across chains is not a convergence verdict.

Stored per draw: ``pi``, ``mu``, ``W``, ``psi``, and ``cov`` (J, D, D) only for
D <= ``runs.MAX_STORED_COV_DIM``; never the per-row ``z`` and ``c``, which are not even collected,
so nothing of size D^2 or N x K is kept per draw. The draws are thinned while sampling to stay
within ``runs.MAX_STORED_BYTES``. The stored log-likelihood is the marginal one, with the labels
and factors integrated out: log sum_j pi_j N(x_n; mu_j, W_j W_jᵀ + diag(1/psi)) per row (each
component by the Woodbury identity, in chunks of draws)."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from latentzoo import arviz_adapter as azx
from latentzoo import runs
from latentzoo.data import MATRIX
from latentzoo.models.factor_analysis import marginal_log_likelihood
from latentzoo.models.mfa import default_mfa_data, mfa
from latentzoo.registry import Family, FamilyChecks, Method, register

__all__ = ["MFA", "DEFAULT_J", "mfa_marginal_log_likelihood", "mixture_summaries", "mfa_predict"]

DEFAULT_J = 2


def mfa_marginal_log_likelihood(X, pi, W, mu, psi):
    """Pointwise log p(x_n | pi, W, mu, psi) = log sum_j pi_j N(x_n; mu_j, W_j W_jᵀ + diag(1/psi)).
    X (N, D), pi (J,), W (J, D, K), mu (J, D), psi (D,) -> (N,)."""
    per_component = marginal_log_likelihood(X, W, mu, jnp.broadcast_to(psi, mu.shape), per_row=True)
    return jax.scipy.special.logsumexp(jnp.log(pi)[:, None] + per_component, axis=0)


def _run_gibbs(X, cfg):
    from latentzoo.inference.gibbs import ConjugateGibbs
    from latentzoo.inference.mfa import init_from_data, mfa_updates

    J = cfg.J or DEFAULT_J
    if J < 1 or J > X.shape[0]:
        raise ValueError(f"The number of components J must be between 1 and N = {X.shape[0]}, got {J}.")
    Xj = jnp.asarray(X)
    keys = jax.random.split(jax.random.PRNGKey(cfg.seed + 1), cfg.chains)
    init = jax.vmap(lambda k: init_from_data(k, Xj, J=J, K=cfg.K))(keys)
    if cfg.chains == 1:
        init = jax.tree_util.tree_map(lambda a: a[0], init)
    model = partial(mfa, K=cfg.K, J=J)
    N, D = X.shape
    skip = ("z", "c") if D <= runs.MAX_STORED_COV_DIM else ("z", "c", "cov")
    per_draw = 8 * (J + J * D * (cfg.K + 1) + D + (J * D * D if D <= runs.MAX_STORED_COV_DIM else 0) + N + 2)
    mcmc = runs.run_mcmc(ConjugateGibbs(model, mfa_updates()), cfg, Xj, init_params=init,
                         extra_fields=tuple(f"~z.{s}" for s in skip),
                         thinning=runs.storage_thinning(cfg.chains, cfg.samples, per_draw))
    post = mcmc.get_samples(group_by_chain=True)
    ll = runs.map_draws(mfa_marginal_log_likelihood, post["pi"], post["W"], post["mu"], post["psi"],
                        shared=(Xj,), bytes_per_draw=4 * 8 * J * N * D)
    idata = runs.mcmc_idata(mcmc, log_likelihood={"X": ll})
    return azx.add_posterior_vars(idata, mixture_summaries(post["pi"], post["W"], post["mu"], post["psi"]))


def _mfa_row_predictive(X, pi, W, mu, psi):
    """One draw: (log p(x_{n,O}) (N,), E[x_n | x_{n,O}] (N, D), p(c_n = j | x_{n,O}) (N, J),
    E[z_n | c_n = j, x_{n,O}] (N, J, K)) of the mixture, each component by
    :func:`~latentzoo.inference.fa.predict.masked_log_predictive`, weighted by its
    responsibility given the row's observed entries."""
    from latentzoo.inference.fa.predict import masked_log_predictive

    lp, completed, z = jax.vmap(partial(masked_log_predictive, with_latent_mean=True),
                                in_axes=(None, 0, 0, None))(X, W, mu, psi)
    joint = jnp.log(pi / pi.sum())[:, None] + lp  # (J, N)
    total = jax.scipy.special.logsumexp(joint, axis=0)
    resp = jnp.exp(joint - total)  # (J, N)
    return total, jnp.einsum("jn,jnd->nd", resp, completed), resp.T, jnp.swapaxes(z, 0, 1)


def mfa_predict(idata, X_new, run=None):
    """New rows under each stored draw: ``log_lik`` (chains, draws, M) of each row's observed
    entries under the mixture, ``X_completed`` (chains, draws, M, D) with missing entries at the
    mixture's conditional mean, and ``latents``: ``{"c": p(c_n = j | x_n) (chains, draws, M, J),
    "z": E[z_n | c_n = j, x_n] (chains, draws, M, J, K)}``."""
    from latentzoo.predict import per_draw

    ll, completed, resp, z = per_draw(_mfa_row_predictive, idata, X_new, ("pi", "W", "mu", "psi"))
    return {"log_lik": ll, "X_completed": completed, "latents": {"c": resp, "z": z}}


def mixture_summaries(pi, W, mu, psi) -> dict:
    """Summaries of the mixture that no relabelling of the components changes, so their R-hat is
    a convergence verdict (the per-component sites' is not): from draws pi (..., J),
    W (..., J, D, K), mu (..., J, D), psi (..., D) ->

    - ``weights_sorted`` (..., J): the weights, largest first;
    - ``component_variance_sorted`` (..., J): each component's total variance
      tr(W_j W_jᵀ) + Σ_d 1/psi_d, largest first (each sorted on its own: the two orders need not
      agree, and no weight tie can swap a component's numbers);
    - ``mixture_mean`` (..., D): Σ_j pi_j mu_j;
    - ``mixture_total_variance`` (...): the trace of the mixture's covariance,
      Σ_j pi_j (tr(W_j W_jᵀ) + ‖mu_j - m‖²) + Σ_d 1/psi_d."""
    pi, W, mu, psi = (np.asarray(a) for a in (pi, W, mu, psi))
    pi = pi / pi.sum(-1, keepdims=True)
    noise = (1.0 / psi).sum(-1)
    loading = (W ** 2).sum((-1, -2))  # tr(W_j W_jᵀ), (..., J)
    m = np.einsum("...j,...jd->...d", pi, mu)
    spread = ((mu - m[..., None, :]) ** 2).sum(-1)
    return {
        "weights_sorted": -np.sort(-pi, axis=-1),
        "component_variance_sorted": -np.sort(-(loading + noise[..., None]), axis=-1),
        "mixture_mean": m,
        "mixture_total_variance": (pi * (loading + spread)).sum(-1) + noise,
    }


def mfa_posterior_predictive(idata, rng_seed=0, max_draws=200):
    """x_rep: a component c ~ pi, then x ~ N(mu_c, W_c W_cᵀ + diag(1/psi)): {"X": (1, S, N, D)}."""
    post = idata.posterior
    pi = np.asarray(post["pi"]).reshape(-1, post["pi"].shape[-1])
    mu = np.asarray(post["mu"]).reshape(pi.shape[0], *post["mu"].shape[-2:])
    W = np.asarray(post["W"]).reshape(pi.shape[0], *post["W"].shape[-3:])
    psi = np.asarray(post["psi"]).reshape(pi.shape[0], -1)
    N = idata.observed_data["X"].shape[0]
    rng = np.random.default_rng(rng_seed)
    out = []
    for i in runs.pick_draws(rng, pi.shape[0], max_draws):
        c = rng.choice(pi.shape[1], size=N, p=pi[i] / pi[i].sum())
        z = rng.normal(size=(N, W.shape[-1]))
        eps = rng.normal(size=(N, mu.shape[-1])) / np.sqrt(psi[i])
        out.append(mu[i][c] + np.einsum("ndk,nk->nd", W[i][c], z) + eps)
    return {"X": np.stack(out)[None]}


def _mfa_table():
    from latentzoo.inference.mfa import mfa_updates

    return mfa_updates()


def _tight_mu():
    import numpyro.distributions as dist

    return dist.Normal(0.0, 1.0)  # a short Geweke chain cannot cross the default N(0, 10^2)


def _mfa_random_priors(rng):
    import numpyro.distributions as dist

    return {
        "pi": rng.uniform(0.3, 4.0),
        "W": dist.Normal(rng.uniform(-1.0, 1.0), rng.uniform(0.3, 3.0)),
        "mu": dist.Normal(rng.uniform(-2.0, 2.0), rng.uniform(0.3, 3.0)),
        "psi": dist.Gamma(rng.uniform(0.3, 6.0), rng.uniform(0.2, 4.0)),
    }


MFA_CHECKS = FamilyChecks(
    model_kwargs=dict(N=10, D=3, K=1, J=2, priors={"mu": _tight_mu()}),
    gibbs_table=_mfa_table,
    # Summaries invariant to relabelling the components (and to the sign of W_j, z): c through
    # the fraction of row pairs that share a component, z through z^2.
    test_functions={
        "psi": lambda v: v["psi"],
        "psi01": lambda v: v["psi"][0] * v["psi"][1],
        "pi_sq": lambda v: jnp.sum(v["pi"] ** 2),
        "co_cluster": lambda v: jnp.mean(v["c"][:, None] == v["c"][None, :]),
        "z_sq": lambda v: jnp.mean(v["z"] ** 2),
        "mu_spread": lambda v: jnp.sum((v["mu"] - v["mu"].mean(0)) ** 2),
    },
    broken_site="psi",
    random_priors=_mfa_random_priors,
    informative_model_kwargs=dict(N=60, D=3, K=1, J=2, priors={"mu": _tight_mu()}),
    sized_model_kwargs=lambda N, D: dict(N=N, D=D, K=1, J=2, priors={"mu": _tight_mu()}),
    # one row: at least one component has none
    edge_model_kwargs=(dict(N=1, D=1, K=1, J=2, priors={"mu": _tight_mu()}),),
    # one component, one factor: the shift and scale moves each travel a one-dimensional orbit
    orbit_model_kwargs=dict(N=3, D=6, K=1, J=1),
)

MFA = register(
    Family(
        name="mfa",
        title="Mixture of factor analyzers",
        paper="Ghahramani & Hinton (1996); baseline of Tang et al., Tensor Analyzers",
        model=mfa,
        data_kind=MATRIX,
        default_data=lambda seed: default_mfa_data(seed),
        methods=(Method("gibbs", _run_gibbs, distributed=True),),
        identified=("psi", "weights_sorted", "component_variance_sorted", "mixture_mean",
                    "mixture_total_variance"),
        trace_sites=("psi", "weights_sorted"),
        posterior_predictive=mfa_posterior_predictive,
        predict=mfa_predict,
        default_K=1,
        docs="models/mfa.md",
        checks=MFA_CHECKS,
    )
)
