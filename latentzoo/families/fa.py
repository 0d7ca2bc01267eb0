"""Registry entry: Bayesian factor analysis (thesis ch. 2-4).

Methods: hand-derived Gibbs and NUTS (draws), mean-field CAVI (draws from q), MAP-EM (point),
and the streaming online EM / SGA of thesis ch. 4 (point, O(DK) memory, reads the file in
chunks). The identified quantities are ``mu``, ``psi``, ``cov`` = W Wᵀ + diag(1/psi) and
``factor_variance`` (the eigenvalues of Wᵀ W): ``W`` itself is identified only up to rotation,
so it is stored (the posterior predictive needs it) but never summarised.

What a run stores per draw (:func:`stored_sites`): ``W``, ``mu``, ``psi``, ``factor_variance``,
and ``cov`` only for D <= ``COV_SITE_MAX_DIM`` (100; above that its D^2 entries per draw would
dwarf everything else, so the model does not even record it); never the N x K factors ``z``.
The stored log-likelihood is the marginal one, log N(x_n; mu, cov) per row, with the factors
integrated out (pointwise, as LOO / WAIC expect), computed by the Woodbury identity in chunks of
draws. Draws are thinned while sampling so that all of this stays within
``runs.MAX_STORED_BYTES`` (at least ``runs.MIN_STORED_DRAWS`` per chain).
"""

from __future__ import annotations

import os
import sys
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from latentzoo import runs
from latentzoo.data import MATRIX, iter_matrix_chunks
from latentzoo.inference.validation import check_scale
from latentzoo.models.factor_analysis import (
    COV_SITE_MAX_DIM,
    default_fa_data,
    factor_analysis,
    factor_variances,
    marginal_log_likelihood,
)
from latentzoo.registry import Family, FamilyChecks, Method, register

__all__ = ["FA", "fa_posterior_predictive", "fa_predict", "stored_sites", "stored_bytes_per_draw"]


def stored_sites(D: int, K: int) -> dict[str, tuple[int, ...]]:
    """What an FA run stores per draw, site -> shape: ``W``, ``mu``, ``psi``,
    ``factor_variance``, and ``cov`` when D <= ``COV_SITE_MAX_DIM``."""
    sites = {"W": (D, K), "mu": (D,), "psi": (D,), "factor_variance": (K,)}
    if D <= COV_SITE_MAX_DIM:
        sites["cov"] = (D, D)
    return sites


def stored_bytes_per_draw(N: int, D: int, K: int) -> int:
    """Bytes per stored draw: the sites of :func:`stored_sites`, the N pointwise log-likelihood
    terms and two sample statistics, all float64."""
    return 8 * (sum(int(np.prod(s)) for s in stored_sites(D, K).values()) + N + 2)


def _derived(W, psi) -> dict:
    """The model's deterministic sites for draws W (..., D, K), psi (..., D) (no D x D above
    ``COV_SITE_MAX_DIM``)."""
    W, psi = np.asarray(W), np.asarray(psi)
    out = {"factor_variance": np.asarray(factor_variances(jnp.asarray(W)))}
    if W.shape[-2] <= COV_SITE_MAX_DIM:
        diag = np.zeros(psi.shape + psi.shape[-1:])
        idx = np.arange(psi.shape[-1])
        diag[..., idx, idx] = 1.0 / psi
        out["cov"] = W @ np.swapaxes(W, -1, -2) + diag
    return out


def _loglik(X, W, mu, psi):
    """Pointwise marginal log-likelihood of draws (chains, draws, ...) -> (chains, draws, N), a
    bounded number of draws at a time (each holds a few N x D temporaries)."""
    N, D = X.shape
    return runs.map_draws(partial(marginal_log_likelihood, per_row=True), W, mu, psi,
                          shared=(jnp.asarray(X),), bytes_per_draw=4 * 8 * N * D)


def _run_mcmc(X, cfg, *, gibbs: bool):
    from numpyro.infer import NUTS

    from latentzoo.inference.fa import fa_updates
    from latentzoo.inference.gibbs import ConjugateGibbs

    # K fixes shapes, so it is bound into the model rather than passed as a (traced) argument.
    model = partial(factor_analysis, K=cfg.K)
    kernel = ConjugateGibbs(model, fa_updates()) if gibbs else NUTS(model, target_accept_prob=0.9)
    N, D = X.shape
    thin = runs.storage_thinning(cfg.chains, cfg.samples, stored_bytes_per_draw(N, D, cfg.K))
    # the N x K factors are rotation-ambiguous and as large as the data: never collected
    mcmc = runs.run_mcmc(kernel, cfg, jnp.asarray(X), extra_fields=("~z.z",), thinning=thin)
    post = mcmc.get_samples(group_by_chain=True)
    ll = _loglik(X, post["W"], post["mu"], post["psi"])
    return runs.mcmc_idata(mcmc, log_likelihood={"X": ll})


def _run_vb(X, cfg):
    from numpyro.infer import Predictive

    from latentzoo import arviz_adapter as azx
    from latentzoo.inference.fa import fit_fa_variational

    fit = fit_fa_variational(X, cfg.K, method="vb", seed=cfg.seed, progress_bar=cfg.progress,
                             num_steps=cfg.sweeps or 1000)
    N, D = X.shape
    # iid draws from q: as many as the storage allows (all of them at small D)
    S = cfg.samples // runs.storage_thinning(1, cfg.samples, stored_bytes_per_draw(N, D, cfg.K))
    # draws of the guide alone: the model would be traced per draw for nothing
    draws = Predictive(fit.guide, params=fit.params, num_samples=S, return_sites=["W", "mu", "psi"])(
        jax.random.PRNGKey(cfg.seed + 1), jnp.asarray(X), K=cfg.K
    )
    post = {k: np.asarray(v)[None] for k, v in draws.items()}
    post.update(_derived(post["W"], post["psi"]))
    ll = _loglik(X, post["W"], post["mu"], post["psi"])
    return azx.from_draws(
        post, observed_data={"X": np.asarray(X)}, log_likelihood={"X": ll},
        sample_stats={"elbo": np.full((1, S), -float(fit.losses[-1]))},
    )


def _point(X, W, mu, psi, objective):
    W, mu, psi = (np.asarray(a, dtype=float) for a in (W, mu, psi))
    ll = np.asarray(marginal_log_likelihood(jnp.asarray(X), W, mu, psi, per_row=True))
    return runs.point_idata(
        {"W": W, "mu": mu, "psi": psi, **_derived(W, psi)}, objective,
        observed={"X": np.asarray(X)}, log_likelihood={"X": ll},
    )


def _run_em(X, cfg):
    from latentzoo.inference.fa import fit_fa_variational

    fit = fit_fa_variational(X, cfg.K, method="em", seed=cfg.seed, progress_bar=cfg.progress,
                             num_steps=cfg.sweeps or 1000)
    p = fit.params
    return _point(X, p["W_loc"], p["mu_loc"], p["psi_loc"], -np.asarray(fit.losses))


# ------------------------------------------------------------------------------ streaming
STREAM_D, STREAM_K = 50, 5


def _default_stream(cfg):
    """Default data: a fixed FA model (D=50, K=5, seed 12345) sampled chunk by chunk."""
    rng = np.random.default_rng(12345)
    n_total = 2000 if cfg.quick else 20000
    F = 0.6 * rng.standard_normal((STREAM_D, STREAM_K))
    psi = rng.uniform(0.5, 1.5, size=STREAM_D)
    c = rng.standard_normal(STREAM_D)
    for lo in range(0, n_total, cfg.chunk_size):
        n = min(cfg.chunk_size, n_total - lo)
        yield rng.standard_normal((n, STREAM_K)) @ F.T + c + rng.standard_normal((n, STREAM_D)) * np.sqrt(psi)


def _column_moments(chunks):
    """Column means and standard deviations in one streaming pass (Chan et al. merge), in units
    of a power of two that follows the largest |value| seen, so that squares of data on any
    finite scale (1e200, say) neither overflow nor underflow."""
    n, mean, m2, unit = 0, None, None, None
    for chunk in chunks:
        k = chunk.shape[0]
        top = float(max(chunk.max(), -chunk.min()))
        if top > 0 and (unit is None or top > unit):
            new = 2.0 ** np.ceil(np.log2(top))
            if unit is not None:  # earlier moments into the new unit (exact: powers of two)
                mean, m2 = mean * (unit / new), m2 * (unit / new) ** 2
            unit = new
        chunk = chunk / (unit or 1.0)
        cm = chunk.mean(0)
        cm2 = ((chunk - cm) ** 2).sum(0)
        if mean is None:
            n, mean, m2 = k, cm, cm2
        else:
            delta = cm - mean
            tot = n + k
            mean = mean + delta * k / tot
            m2 = m2 + cm2 + delta**2 * n * k / tot
            n = tot
    if n < 2:
        raise ValueError(f"At least 2 rows are needed to fit a factor analysis model, got {n}.")
    sd = np.sqrt(m2 / n) * (unit or 1.0)
    mean = mean * (unit or 1.0)
    if np.any(sd == 0):
        raise ValueError(
            f"--standardize needs every column to vary; column {int(np.argmin(sd))} is constant."
        )
    return mean, sd


def _run_online(_, cfg, *, variant: str):
    from tqdm.auto import tqdm

    from latentzoo.inference.fa import OnlineFactorAnalysis

    def chunks():
        if cfg.data_path is None:
            return _default_stream(cfg)
        return iter_matrix_chunks(cfg.data_path, cfg.chunk_size)

    shift, scale = (0.0, 1.0)
    if cfg.standardize:
        shift, scale = _column_moments(chunks())
    model = OnlineFactorAnalysis(cfg.K, method=variant, random_state=cfg.seed)
    n_rows, objective, last = 0, [], None
    if cfg.progress:  # the first batch compiles the step: the bar stands at 0 until then
        print("compiling the streaming step for these sizes on the first batch; its progress bar "
              "follows", file=sys.stderr, flush=True)
    bar = tqdm(unit="rows", desc=f"online FA ({variant})", disable=not cfg.progress)
    try:
        for chunk in chunks():
            if n_rows == 0 and cfg.K >= chunk.shape[1]:
                raise ValueError(
                    f"K={cfg.K} must be smaller than the number of columns D={chunk.shape[1]}."
                )
            if not cfg.standardize:  # (standardised chunks are on a safe scale by construction)
                check_scale(chunk, os.path.basename(cfg.data_path or "the default data"))
            chunk = (chunk - shift) / scale
            model.partial_fit(chunk)
            n_rows += chunk.shape[0]
            last = chunk
            objective.append(float(model.score(chunk)))  # average log-likelihood of the chunk
            bar.update(chunk.shape[0])
    finally:
        bar.close()
    if n_rows < 2:
        raise ValueError(f"At least 2 rows are needed to fit a factor analysis model, got {n_rows}.")
    W = model.components_.T
    psi_var = model.noise_variance_
    mu = model.mean_
    estimates = {"W": W, "mu": mu, "psi": 1.0 / psi_var}
    estimates.update(_derived(W, estimates["psi"]))
    # The data is not held in memory; observed_data keeps the last chunk (for checks), and the
    # objective is the running average log-likelihood of each chunk under the model before it.
    return runs.point_idata(estimates, objective, observed={"X_last_chunk": last})


def fa_posterior_predictive(idata, rng_seed=0, max_draws=200):
    """Replicated data sets x_rep ~ N(mu, W Wᵀ + diag(1/psi)) for a subset of posterior draws:
    {"X": (1, S, N, D)}. S is at most ``max_draws``, and fewer (but at least 20) where S replicated
    data sets would pass 128 MB (at 72 x 7129, 32 of them)."""
    post = idata.posterior
    D = post["mu"].shape[-1]
    mu = np.asarray(post["mu"]).reshape(-1, D)
    W = np.asarray(post["W"]).reshape(mu.shape[0], D, -1)
    psi = np.asarray(post["psi"]).reshape(-1, D)
    N = idata.observed_data["X"].shape[0]
    rng = np.random.default_rng(rng_seed)
    pick = runs.pick_draws(rng, len(mu), min(max_draws, max(20, 2**27 // (8 * N * D))))
    z = rng.normal(size=(len(pick), N, W.shape[-1]))
    eps = rng.normal(size=(len(pick), N, D)) / np.sqrt(psi[pick])[:, None, :]
    return {"X": (mu[pick][:, None, :] + z @ np.swapaxes(W[pick], -1, -2) + eps)[None]}


def fa_predict(idata, X_new, run=None):
    """New rows under each stored draw (:func:`latentzoo.inference.fa.predict.masked_log_predictive`):
    ``log_lik`` (chains, draws, M) of each row's observed entries, ``X_completed``
    (chains, draws, M, D), its missing entries at their conditional mean, and ``latents``:
    ``{"z": E[z_n | x_{n,O}, draw] (chains, draws, M, K)}``."""
    from functools import partial

    from latentzoo.inference.fa.predict import masked_log_predictive
    from latentzoo.predict import per_draw

    ll, completed, z = per_draw(partial(masked_log_predictive, with_latent_mean=True), idata, X_new,
                                ("W", "mu", "psi"))
    return {"log_lik": ll, "X_completed": completed, "latents": {"z": z}}


def _fa_vb_check():
    import numpyro.distributions as dist

    from latentzoo.inference.cavi import CAVI
    from latentzoo.inference.fa import fa_cavi

    X = default_fa_data(1, N=40, D=5, K=2)
    vb = fa_cavi()
    # non-default hyperparameters: a non-zero prior mean on W and a tight mu prior
    kwargs = dict(K=2, priors={"W": dist.Normal(0.5, 2.0), "mu": dist.Normal(1.0, 0.5)})
    return CAVI(factor_analysis, vb.guide, vb.algorithm), X, kwargs


def _fa_table():
    from latentzoo.inference.fa import fa_updates

    return fa_updates()


def _fa_small():
    import numpyro.distributions as dist

    # mu's prior tightened from N(0, 10^2): under the diffuse prior a short Geweke chain moves mu
    # by ~1/sqrt(N) per step across a range of 10 and mixes too slowly for a short run.
    return dict(N=12, D=4, K=2, priors={"mu": dist.Normal(0.0, 1.0)})


def _fa_random_priors(rng):
    import numpyro.distributions as dist

    return {
        "W": dist.Normal(rng.uniform(-1.0, 1.0), rng.uniform(0.3, 3.0)),
        "z": dist.Normal(rng.uniform(-1.0, 1.0), rng.uniform(0.5, 2.0)),
        "mu": dist.Normal(rng.uniform(-2.0, 2.0), rng.uniform(0.3, 3.0)),
        "psi": dist.Gamma(rng.uniform(0.3, 6.0), rng.uniform(0.2, 4.0)),
    }


def _fa_informative():
    import numpyro.distributions as dist

    return dict(N=100, D=4, K=1, priors={"mu": dist.Normal(0.0, 1.0)})


FA_CHECKS = FamilyChecks(
    model_kwargs=_fa_small(),
    gibbs_table=_fa_table,
    # Identified summaries of every latent site (W only through W Wᵀ, z through the signal
    # z Wᵀ, both rotation-invariant) with a cross-moment per block (psi0 psi1, cov01, signal01).
    test_functions={
        "psi": lambda v: v["psi"],
        "psi01": lambda v: v["psi"][0] * v["psi"][1],
        "cov_diag": lambda v: jnp.sum(v["W"] ** 2, -1) + 1.0 / v["psi"],
        "cov01": lambda v: v["W"][0] @ v["W"][1],
        "signal": lambda v: jnp.mean((v["z"] @ v["W"].T) ** 2, 0),
        "signal01": lambda v: jnp.mean((v["z"] @ v["W"][0]) * (v["z"] @ v["W"][1])),
    },
    broken_site="psi",
    vb=_fa_vb_check,
    random_priors=_fa_random_priors,
    # K = 1: the scale move's orbit is one-dimensional; N < D skews its target (Jacobian c^(D-N))
    orbit_model_kwargs=dict(N=3, D=6, K=1),
    sized_model_kwargs=lambda N, D: {**_fa_small(), "N": N, "D": D},
    edge_model_kwargs=({**_fa_small(), "N": 1, "D": 1, "K": 1},),
    informative_model_kwargs=_fa_informative(),
)

FA = register(
    Family(
        name="fa",
        title="Bayesian factor analysis",
        paper="Brownlie, MSc thesis (2021) ch. 2-4",
        model=factor_analysis,
        data_kind=MATRIX,
        default_data=lambda seed: default_fa_data(seed),
        methods=(
            Method("gibbs", partial(_run_mcmc, gibbs=True), distributed=True),
            Method("nuts", partial(_run_mcmc, gibbs=False)),
            Method("vb", _run_vb),
            Method("em", _run_em, kind="point"),
            Method("online-em", partial(_run_online, variant="em"), kind="point", streaming=True),
            Method("online-sga", partial(_run_online, variant="sga"), kind="point", streaming=True),
        ),
        identified=("mu", "psi", "cov", "factor_variance"),
        trace_sites=("psi", "mu"),
        posterior_predictive=fa_posterior_predictive,
        predict=fa_predict,
        default_K=3,
        docs="models/fa.md",
        checks=FA_CHECKS,
    )
)
