"""The Gibbs table of each variant and a fit through NumPyro's ``MCMC``."""

from __future__ import annotations

import sys
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.infer import MCMC

from latentzoo.inference.gibbs import ConjugateGibbs
from latentzoo.inference.rank_svm.classifier_scale import classifier_scale_move
from latentzoo.inference.rank_svm.dp import dp_updates, t_lam_update
from latentzoo.inference.rank_svm.relabel import relabel_move
from latentzoo.inference.rank_svm.rotation import factor_rotation_move
from latentzoo.inference.rank_svm.gibbs import A_update, beta_update, lam_update, tau_update, z_update
from latentzoo.inference.rank_svm.moves import hierarchy_scale_move, scale_move
from latentzoo.inference.rank_svm.shrinkage import tpb_updates
from latentzoo.inference.validation import check_labelled
from latentzoo.models.rank_factor_svm import VARIANTS, observed_data, rank_factor_svm
from latentzoo.models.tables import split_tables

__all__ = ["rank_svm_updates", "fit_gibbs", "initial_values", "binary_labels", "label_classes",
           "bind_static"]


def rank_svm_updates(variant: str, *, scale: bool = True, classifier_scale: bool = False,
                     rotation: bool = False, relabel: bool | None = None) -> list:
    """The Gibbs table of ``variant``. It holds no data: the labels and (R) the rank pairs are
    read from the model's data tables at every sweep, so the compiled sweep takes them as
    arguments and one table serves every data set of the variant.

    Order of a sweep: the augmentations (with t for NL), z, A, τ (G), β, the two shrinkage
    hierarchies, then the DP mixture's ν, α, μ, ψ (NL), then (``scale``) the factor-scale move
    and the two hierarchy-scale moves of :mod:`latentzoo.inference.rank_svm.moves`, our
    additions for mixing; ``classifier_scale`` adds the classifier-scale move of
    :mod:`latentzoo.inference.rank_svm.classifier_scale` (off by default: with it the chains
    explore the heavy tail of the size of β, where ArviZ's PSIS-LOO of a short run fails; see
    docs/models/rank_factor_svm.md); ``rotation`` adds the factor-rotation move of
    :mod:`latentzoo.inference.rank_svm.rotation` (off by default, as the docs page says why);
    ``relabel`` (NL only; None: on for NL) adds the DP relabelling moves of
    :mod:`latentzoo.inference.rank_svm.relabel` (measured on G-NL's default data, 4 chains of
    500 + 1500: α's ESS 62 without them, 3428 with them, at about the same seconds).
    """
    if variant not in VARIANTS:
        raise ValueError(f"Unknown variant {variant!r}; choose one of {', '.join(VARIANTS)}.")
    gaussian, mixture = variant.startswith("G"), variant.endswith("NL")
    relabel = mixture if relabel is None else relabel
    if relabel and not mixture:
        raise ValueError(f"The relabelling moves swap the DP mixture's components; the {variant} "
                         "variant has one classifier (use an NL variant, or leave them off).")
    t_site = "t" if mixture else None
    table = [] if gaussian else [lam_update("rank")]
    table.append(t_lam_update() if mixture else lam_update("svm"))
    table += [z_update(t_site=t_site, ranked=not gaussian), A_update(ranked=not gaussian)]
    if gaussian:
        table.append(tau_update())
    table.append(beta_update(t_site=t_site))
    table += tpb_updates("A", "xi_a", "eta_a", "Phi_a", "Phi_tilde_a")
    table += tpb_updates("beta", "b_beta", "e_beta", "Phi_beta", "Phi_tilde_beta")
    if mixture:
        table += dp_updates()
    if scale:
        table.append(scale_move(mixture=mixture))
        table.append(hierarchy_scale_move("A", "xi_a", "eta_a", "Phi_a", "Phi_tilde_a"))
        table.append(hierarchy_scale_move("beta", "b_beta", "e_beta", "Phi_beta", "Phi_tilde_beta"))
    if classifier_scale:
        table.append(classifier_scale_move())
    if rotation:
        table.append(factor_rotation_move(mixture=mixture))
    if relabel:
        table.append(relabel_move())
    return table


def label_classes(y) -> np.ndarray:
    """The two label values of y, sorted (the second is the model's +1, as ``RankFactorSVC``'s
    ``classes_[1]``); ValueError naming the problem unless y has exactly two."""
    y = np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"The labels must be one value per row, got shape {y.shape}.")
    classes = np.unique(y)
    if len(classes) != 2:
        raise ValueError(f"The labels must have exactly two classes, got {len(classes)}"
                         + (f": {classes[:5].tolist()}." if len(classes) else "."))
    return classes


def binary_labels(y) -> np.ndarray:
    """Labels as -1/+1 floats from any two label values: the larger (:func:`label_classes`)
    becomes +1, so 0/1 and -1/+1 keep their meaning and 3/5 give 5 -> +1."""
    classes = label_classes(y)
    return np.where(np.asarray(y) == classes[1], 1.0, -1.0)


def initial_values(data, kwargs, seed: int = 0) -> dict:
    """A starting point: small random z, A and β, unit scales, λ = 1, one cluster per label
    sign for NL. (The flat λ measure has no draw, so a fit needs one.)"""
    rng = np.random.default_rng(seed)
    y, K = np.asarray(kwargs["y"]), kwargs["K"]
    N, D = len(y), kwargs["D"]
    variant = kwargs["variant"]
    T = kwargs.get("T", 5) if variant.endswith("NL") else 1
    v = {
        "z": 0.1 * rng.normal(size=(N, K)), "A": 0.1 * rng.normal(size=(D, K)),
        "beta": 0.1 * rng.normal(size=(T, K)),
        "xi_a": np.ones((D, K)), "eta_a": np.ones((D, K)), "Phi_a": np.ones(K), "Phi_tilde_a": 1.0,
        "b_beta": np.ones((T, K)), "e_beta": np.ones((T, K)), "Phi_beta": 1.0, "Phi_tilde_beta": 1.0,
        "lam_svm": np.ones(N),
    }
    if "rank_margin" in data:
        v["lam_rank"] = np.ones(data["rank_margin"].shape[0])
    if variant.startswith("G"):
        v["tau"] = np.ones(D)
    if variant.endswith("NL"):
        v.update(alpha=1.0, nu=np.full(T - 1, 0.5), mu=np.zeros((T, K)), psi=np.ones(T),
                 t=rng.integers(0, T, N).astype(np.int32))
    return {k: jnp.asarray(x) for k, x in v.items()}


def fit_gibbs(X, y, *, variant: str = "R-L", K: int = 5, T: int = 5, num_warmup: int = 300,
              num_samples: int = 300, num_chains: int = 1, seed: int = 0, priors=None,
              progress: bool = False, thinning: int = 1) -> MCMC:
    """Gibbs sampling of ``variant`` on features X (N, D) and labels y (N,) (two classes,
    -1/+1 or 0/1). Returns the finished :class:`numpyro.infer.MCMC`; ``get_samples()`` has
    every latent site of :func:`~latentzoo.models.rank_factor_svm.rank_factor_svm`.
    """
    X, y = check_labelled(X, y, name="the data")
    y = binary_labels(y)
    if K < 1:
        raise ValueError(f"K must be at least 1, got {K}.")
    data, kw = observed_data(X, y, variant, priors)
    kw = {**kw, "K": K, "T": T, **({"priors": priors} if priors else {})}
    model, tables = bind_static(kw)
    kernel = ConjugateGibbs(model, rank_svm_updates(variant))
    mcmc = MCMC(kernel, num_warmup=num_warmup, num_samples=num_samples, num_chains=num_chains,
                thinning=thinning, progress_bar=progress, jit_model_args=True,
                chain_method="vectorized" if num_chains > 1 else "sequential")
    init = initial_values(data, kw, seed)
    if num_chains > 1:
        inits = [initial_values(data, kw, seed + c) for c in range(num_chains)]
        init = jax.tree_util.tree_map(lambda *a: jnp.stack(a), *inits)
    if progress:  # NumPyro's bar stands at 0 while XLA compiles the sweep: say so
        print("compiling the sampler for these sizes; its progress bar follows", file=sys.stderr,
              flush=True)
    mcmc.run(jax.random.PRNGKey(seed), data, init_params=init, **tables)
    return mcmc


def bind_static(model_kwargs: dict):
    """``(model, tables)``: :func:`rank_factor_svm` with the sizes, variant and priors bound,
    and the data tables (labels ``y``, rank ``pairs``) left as keyword arguments. Pass the tables
    to ``MCMC.run(..., jit_model_args=True)`` (or any jitted function) as arguments: bound into
    the model they would be compiled in as constants, whose folding grows with N and D."""
    static, tables = split_tables(model_kwargs)
    return partial(rank_factor_svm, **static), jax.tree_util.tree_map(jnp.asarray, tables)
