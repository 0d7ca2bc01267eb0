"""Registry entry: convolutional factor analysis, one layer (Chen, Polatkan, Sapiro, Blei, Dunson
& Carin). Data: an image stack, (N, H, W) greyscale or (N, H, W, C). Methods: the exact block
Gibbs sampler (``gibbs``) and batch CAVI (``vb``, a point fit). ``--atom A`` sets the atoms'
size (A x A). Gibbs only: ``--pool P`` adds the paper's P x P max-pooling after each map's draw
and ``--w_update parallel`` its all-shifts-at-once update (both outside the model: the draws
are then not from the posterior); ``--joint_b off`` leaves out the joint (b, W) birth/death
move (the paper's sampler), and ``--element_move on`` adds the element birth/death move."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from latentzoo import runs
from latentzoo.data import IMAGE_STACK
from latentzoo.models.conv_factor import as_channels_first, conv_factor, default_cfa_data, reconstruct
from latentzoo.registry import Family, FamilyChecks, Method, Option, register

__all__ = ["CFA", "CFA_TEST_FUNCTIONS", "CFA_CHECK_PRIORS", "cfa_random_priors", "image_stack",
           "channels_first", "from_channels_first", "cfa_predict"]

# Per-image maps, their precisions and the element switches grow with N·K·H·W: they stay out of
# the result files (never collected); the atoms and usages are kept (their size is K·C·h·w), and
# the identified summaries (deterministic sites of the model) say what the fit found.
DROP = ("W", "alpha", "b")


def image_stack(data, cfg) -> np.ndarray:
    """The stack as the model takes it, (N, C, H, W). A 4-D stack's layout is never guessed:
    ``--layout NHWC|NCHW`` says it, and without it only a stack that is plainly channels-last
    (at most 4 channels last, a longer second axis: (N, 32, 32, 3)) is read; any other shape is
    refused with one sentence asking for ``--layout``. K is bounded before anything compiles."""
    X, _ = channels_first(data, cfg.options.get("layout"))
    values = int(np.prod(X.shape[1:]))
    if cfg.K < 1 or cfg.K > values:
        raise ValueError(f"--K must be between 1 and {values} (the values in one image, "
                         f"{X.shape[1]} x {X.shape[2]} x {X.shape[3]}), got {cfg.K}.")
    return X


def channels_first(data, layout=None):
    """``(X (N, C, H, W) float64, layout)``: a stack (N, H, W) or (N, H, W, C) / (N, C, H, W) as
    the model takes it, and the layout it was read in ("NHW", "NHWC" or "NCHW"; see
    :func:`image_stack` for when a 4-D stack needs ``layout``)."""
    X = np.asarray(data, dtype=np.float64)
    if X.ndim == 4:
        if layout is None:
            if not X.shape[-1] <= 4 < X.shape[1]:
                raise ValueError(
                    f"The image stack's shape {X.shape} does not say where its channels are: "
                    "pass --layout NHWC for (images, height, width, channels) or --layout NCHW "
                    "for (images, channels, height, width).")
            layout = "NHWC"
        return (as_channels_first(X) if layout == "NHWC" else X), layout
    return as_channels_first(X), "NHW"


def from_channels_first(X, layout: str) -> np.ndarray:
    """The inverse of :func:`channels_first` for the layout it returned."""
    X = np.asarray(X)
    if layout == "NHW":
        return X[:, 0]
    return np.moveaxis(X, 1, -1) if layout == "NHWC" else X


PREDICT_DRAWS = 4  # posterior draws of the dictionary a prediction averages over
PREDICT_SWEEPS = (60, 30)  # burn-in and kept sweeps per draw


def cfa_predict(draws, X_new, run, *, layout=None):
    """Restore new images with a run's dictionary: for up to :data:`PREDICT_DRAWS` evenly spaced
    posterior draws of the atoms d and element probabilities pi,
    :func:`latentzoo.inference.conv_factor.restore_with_atoms` draws the new images' maps,
    switches and noise precisions (the fit's exact updates, d and pi held) and averages the
    clean image over its kept sweeps; missing (NaN) pixels are imputed each sweep (inpainting).
    Returns ``{"image": (N, ...) the posterior mean clean images in the input's layout,
    "noise_sd": (1, P, N) each draw's posterior mean noise sd, "missing": (N,) NaN pixels
    per image}``. ``layout``: a 4-D stack's axes (NHWC / NCHW), else the run's own or the
    plain channels-last rule."""
    import json

    from latentzoo import arviz_adapter as azx
    from latentzoo.inference.conv_factor import restore_with_atoms

    post = run.posterior
    if "d" not in post or "pi" not in post:
        raise ValueError("This convolutional FA run stored no atoms d and usages pi, so it "
                         "cannot restore new images.")
    options = json.loads(azx.posterior_attrs(run).get("latentzoo_options", "{}"))
    X, layout = channels_first(X_new, layout or options.get("layout"))
    d_all = np.asarray(post["d"]).reshape(-1, *post["d"].shape[2:])
    pi_all = np.asarray(post["pi"]).reshape(d_all.shape[0], -1)
    if X.shape[1] != d_all.shape[2]:
        raise ValueError(f"The new images have {X.shape[1]} channel(s); the run was fitted on "
                         f"{d_all.shape[2]}.")
    if np.isinf(X).any():
        raise ValueError("The new images hold infinite values; use NaN for a missing pixel.")
    observed = np.isfinite(X)
    pick = np.unique(np.linspace(0, d_all.shape[0] - 1, min(PREDICT_DRAWS, d_all.shape[0]))
                     .round().astype(int))
    burn_in, kept = PREDICT_SWEEPS
    restored = [restore_with_atoms(np.where(observed, X, 0.0), observed, d=d_all[i], pi=pi_all[i],
                                   burn_in=burn_in, draws=kept, seed=int(i))
                for i in pick]
    image = np.mean([r.image for r in restored], 0)  # the clean image, observed pixels too
    return {"image": from_channels_first(image, layout),
            "noise_sd": np.stack([r.noise_sd for r in restored])[None],
            "missing": (~observed).sum((1, 2, 3))}


def _options(cfg, shape):
    atom = int(cfg.options.get("atom", 3))
    pool = int(cfg.options.get("pool", 0))
    H, Wd = shape[-2:]
    if atom < 1 or atom > min(H, Wd):
        raise ValueError(f"--atom must be between 1 and the images' smaller side {min(H, Wd)}, "
                         f"got {atom}.")
    if pool < 0:
        raise ValueError(f"--pool must be 0 (off) or a pooling region's side, got {pool}.")
    joint_b = cfg.options.get("joint_b", "on") == "on"
    element_move = cfg.options.get("element_move", "off") == "on"
    return atom, pool, cfg.options.get("w_update", "exact"), joint_b, element_move


def _start(X, K, atom, chains, seed):
    """Each chain's start: gamma_n = 1 / var(X_n) (the noise holds all the signal), maps at 0
    and every element on (the first W draw then fits the data), random atoms of unit norm."""
    N, C = X.shape[:2]
    key = jax.random.PRNGKey(seed + 1)

    def one(k):
        d = jax.random.normal(k, (K, C, atom, atom))
        d = d / jnp.sqrt(jnp.sum(d**2, (1, 2, 3), keepdims=True))
        Hp, Wp = X.shape[2] - atom + 1, X.shape[3] - atom + 1
        return {"pi": jnp.full((K,), 0.5), "b": jnp.ones((N, K)), "W": jnp.zeros((N, K, Hp, Wp)),
                "alpha": jnp.ones((N, K, Hp, Wp)), "d": d, "beta": jnp.ones_like(d),
                "gamma": 1.0 / jnp.maximum(jnp.var(X, axis=(1, 2, 3)), 1e-8)}

    if chains == 1:
        return one(key)
    return jax.vmap(one)(jax.random.split(key, chains))


def _pointwise_loglik(post, P):
    """log p(X_n | ...) per draw from the stored gamma and residual norms: (chains, draws, N)."""
    g = np.asarray(post["gamma"])
    r = np.asarray(post["resid_norm"])
    return 0.5 * P * (np.log(g) - np.log(2 * np.pi)) - 0.5 * g * r**2


def _run_gibbs(data, cfg):
    from latentzoo.inference.conv_factor import cfa_updates
    from latentzoo.inference.gibbs import ConjugateGibbs

    X = image_stack(data, cfg)
    atom, pool, w_update, joint_b, element_move = _options(cfg, X.shape)
    if cfg.quick:
        cfg = cfg._replace(samples=min(cfg.samples, 50), warmup=min(cfg.warmup, 50))
    table = cfa_updates(w_update=w_update, pool=pool > 0, pool_size=max(pool, 1), joint_b=joint_b,
                        element_move=element_move)
    model = partial(conv_factor, K=cfg.K, atom_shape=(atom, atom))  # shapes bound (MCMC traces args)
    mcmc = runs.run_mcmc(ConjugateGibbs(model, table), cfg, jnp.asarray(X),
                         init_params=_start(jnp.asarray(X), cfg.K, atom, cfg.chains, cfg.seed),
                         extra_fields=tuple(f"~z.{s}" for s in DROP))
    post = mcmc.get_samples(group_by_chain=True)
    ll = _pointwise_loglik(post, int(np.prod(X.shape[1:])))
    return runs.mcmc_idata(mcmc, log_likelihood={"X": ll}, drop=DROP)


def _run_vb(data, cfg):
    """Batch CAVI (:func:`~latentzoo.inference.conv_factor.vb.fit_vb`): a point fit whose stored
    estimates are the posterior means of the atoms, usages and noise precisions and the
    identified summaries (the per-image maps stay out, as for the sampler)."""
    from latentzoo.inference.conv_factor.vb import fit_vb, reconstruction

    X = image_stack(data, cfg)
    atom, pool, w_update, _, element_move = _options(cfg, X.shape)
    if pool or w_update != "exact":
        raise ValueError("--pool and --w_update parallel belong to the gibbs method; vb is exact "
                         "coordinate ascent.")
    if element_move:
        raise ValueError("--element_move belongs to the gibbs method (a Metropolis-Hastings move); "
                         "vb has no moves.")
    sweeps, restarts = runs.point_sizes(cfg, sweeps=200, quick_sweeps=20)
    fit = fit_vb(X, K=cfg.K, atom_shape=(atom, atom), num_steps=sweeps, seed=cfg.seed,
                 restarts=restarts, progress_bar=cfg.progress)
    p = {k: np.asarray(v) for k, v in fit.params.items()}
    X_hat = np.asarray(reconstruction(fit.params))
    resid = np.sqrt(np.sum((X - X_hat) ** 2, axis=(1, 2, 3)))
    recon = np.sqrt(np.sum(X_hat**2, axis=(1, 2, 3)))
    gamma = p["gamma_concentration"] / p["gamma_rate"]
    estimates = {
        "d": p["d_loc"], "beta": p["beta_concentration"] / p["beta_rate"],
        "pi": p["pi_concentration1"] / (p["pi_concentration1"] + p["pi_concentration0"]),
        "usage": p["b_probs"].mean(0), "gamma": gamma,
        "num_active": np.sum(np.any(p["b_probs"] > 0.5, axis=0)),
        "recon_norm": recon, "resid_norm": resid,
    }
    ll = _pointwise_loglik({"gamma": gamma, "resid_norm": resid}, int(np.prod(X.shape[1:])))
    return runs.point_idata(estimates, -np.asarray(fit.losses), observed={"X": X},
                            log_likelihood={"X": ll})


# ------------------------------------------------------------------------------- checks
def _recon_energy(v):
    mean = reconstruct(v["b"][:, :, None, None] * v["W"], v["d"])
    return jnp.sum(mean**2, (1, 2, 3))


# Summaries invariant to relabelling the elements (and to the model's other symmetry, a sign
# flip of W_nk with d_k): noise precisions, the fraction of elements on, the reconstruction's
# energy per image, the total atom energy, mean map energy, mean precisions, pi's sum, and a
# cross-moment (gamma_0 with image 0's reconstruction).
CFA_TEST_FUNCTIONS = {
    "gamma": lambda v: v["gamma"],
    "active": lambda v: jnp.mean(v["b"]),
    "recon": _recon_energy,
    "atoms": lambda v: jnp.sum(v["d"] ** 2),
    "maps": lambda v: jnp.mean(v["W"] ** 2),
    "alpha": lambda v: jnp.mean(v["alpha"]),
    "beta": lambda v: jnp.mean(v["beta"]),
    "pi_sum": lambda v: jnp.sum(v["pi"]),
    "gamma_recon0": lambda v: v["gamma"][0] * _recon_energy(v)[0],
}


def cfa_check_priors():
    """Non-default priors for the checks: the paper's vague Gamma(1e-6, 1e-6) noise precision
    draws exact zeros (infinite noise) and its Ga(1, 1e-3) precisions give maps and atoms with
    heavy tails whose second moments a Geweke test cannot estimate."""
    import numpyro.distributions as dist

    return {"pi": dist.Beta(2.0, 2.0), "gamma": dist.Gamma(5.0, 2.0),
            "alpha": dist.Gamma(6.0, 4.0), "beta": dist.Gamma(6.0, 3.0)}


CFA_CHECK_PRIORS = cfa_check_priors()


def cfa_random_priors(rng):
    import numpyro.distributions as dist

    return {
        "pi": dist.Beta(rng.uniform(0.3, 5.0), rng.uniform(0.3, 5.0)),
        "gamma": dist.Gamma(rng.uniform(0.5, 6.0), rng.uniform(0.2, 4.0)),
        "alpha": dist.Gamma(rng.uniform(0.5, 6.0), rng.uniform(0.2, 4.0)),
        "beta": dist.Gamma(rng.uniform(0.5, 6.0), rng.uniform(0.2, 4.0)),
    }


def _cfa_table():
    from latentzoo.inference.conv_factor import cfa_updates

    return cfa_updates()


CFA_CHECKS = FamilyChecks(
    model_kwargs=dict(K=2, atom_shape=(2, 2), N=3, image_shape=(1, 5, 5), priors=CFA_CHECK_PRIORS),
    gibbs_table=_cfa_table,
    test_functions=CFA_TEST_FUNCTIONS,
    broken_site="gamma",
    random_priors=cfa_random_priors,
    # With b drawn only with its map fixed (eq. 5, joint_b off) b and pi mix slowly: at 100
    # sweeps of warm-up pi's sum failed SBC at the conformance seed (p = 3e-4) and needed 300.
    # The joint (b, W) birth/death move of the default table passes at 100.
    informative_model_kwargs=dict(K=2, atom_shape=(2, 2), N=3, image_shape=(1, 6, 6),
                                  priors=CFA_CHECK_PRIORS),
    informative_warmup=100,
    sized_model_kwargs=lambda N, D: dict(K=2, atom_shape=(2, 2), N=N, image_shape=(3, D, D + 1),
                                         priors=CFA_CHECK_PRIORS),
    # three channels on non-square images; one image, one element, 1 x 1 atoms
    edge_model_kwargs=(dict(K=2, atom_shape=(2, 2), N=3, image_shape=(3, 4, 5), priors=CFA_CHECK_PRIORS),
                       dict(K=1, atom_shape=(1, 1), N=1, image_shape=(1, 2, 3), priors=CFA_CHECK_PRIORS)),
)

CFA = register(
    Family(
        name="cfa",
        title="Convolutional factor analysis (one layer)",
        paper="Chen, Polatkan, Sapiro, Blei, Dunson & Carin (ICML 2011; TPAMI 2013)",
        model=conv_factor,
        data_kind=IMAGE_STACK,
        default_data=lambda seed: default_cfa_data(seed),
        methods=(Method("gibbs", _run_gibbs), Method("vb", _run_vb, kind="point")),
        identified=("num_active", "gamma", "recon_norm", "resid_norm"),
        trace_sites=("num_active",),
        posterior_predictive=None,
        predict=cfa_predict,
        default_K=8,
        docs="models/conv_factor.md",
        checks=CFA_CHECKS,
        options=(
            Option("atom", "side of the square atoms (pixels)", default=3, type=int),
            Option("layout", "axes of a 4-D image stack: NHWC (channels last) or NCHW; needed "
                   "unless the stack is plainly channels-last", choices=("NHWC", "NCHW")),
            Option("pool", "max-pool each map over PxP regions after its draw (the paper's "
                   "heuristic, outside the model); 0: off, the exact sampler", default=0, type=int),
            Option("w_update", "maps drawn by colour classes of non-overlapping shifts (exact) or "
                   "all shifts at once (the paper's eqs. 6-7, not exact)",
                   choices=("exact", "parallel"), default="exact"),
            Option("joint_b", "the exact birth/death move of (b_nk, W_nk) after b's update, so "
                   "that elements switch on and off (off: the paper's sampler)",
                   choices=("on", "off"), default="on"),
            Option("element_move", "the exact element birth/death move: an unused element is "
                   "born in one image with an atom cut from its residual, or one used by a "
                   "single image retired", choices=("on", "off"), default="off"),
        ),
    )
)
