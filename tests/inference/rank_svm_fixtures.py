"""Small designs, non-default hyperparameters and identified test functions for the rank SVM's
Geweke, SBC and conditional checks."""

from functools import partial

import jax.numpy as jnp
import numpy as np

from latentzoo.inference.rank_svm import rank_svm_updates
from latentzoo.models.rank_factor_svm import RankPairs, rank_factor_svm, rank_pairs

# Non-default values of every hyperparameter the updates read. The augmentation gets a proper
# Exp(0.8) prior so that the program is generative (the paper's flat measure has no prior
# predictive); the updates are exact for both. Shapes above the horseshoe's 1/2 keep the
# scales' tails light enough for the Geweke z-scores' second moments.
PRIORS = {
    "epsilon": 0.7, "r_a": 1.7, "s_a": 2.3, "r_beta": 2.1, "s_beta": 1.6, "Phi_shape": 1.8,
    "Phi_tilde_shape": 2.5, "Phi_tilde_rate": 1.4, "tau_shape": 3.0, "tau_rate": 1.3,
    "psi_shape": 4.0, "psi_rate": 2.5, "alpha_shape": 2.0, "alpha_rate": 1.5, "mu_scale": 0.8,
    "lam_rate": 0.8,
}


def design(variant, N=6, D=3, K=2, T=3, seed=0, ties=True, priors=PRIORS):
    """(model, kwargs, data sites) for a fixed design: labels and, for R, pairs from random data
    with a tied column (so the grouped-ties pairing is exercised)."""
    rng = np.random.default_rng(seed)
    y = np.where(np.arange(N) % 2 == 0, 1.0, -1.0)
    kw = dict(y=jnp.asarray(y), K=K, variant=variant, T=T, priors=priors)
    if variant.startswith("G"):
        kw["D"] = D
        sites = ("X", "svm_margin")
    else:
        X = rng.normal(size=(N, D))
        if ties:
            X[:, -1] = rng.integers(0, 3, N)
        kw["pairs"] = rank_pairs(X)
        sites = ("rank_margin", "svm_margin")
    return partial(rank_factor_svm, **{k: v for k, v in kw.items() if k in ("y", "variant", "pairs")}), \
        {k: v for k, v in kw.items() if k not in ("y", "variant", "pairs")}, sites


def table(variant, model_kw_source):
    """The variant's table for the design of ``model_kw_source`` (a ``design`` result)."""
    # it reads the design's labels and pairs from the model; the opt-in classifier-scale move is
    # in, so the Geweke and SBC runs of the table check it too
    return rank_svm_updates(variant, classifier_scale=True)


def duplicated(pairs: RankPairs, own_only: bool) -> RankPairs:
    """Every pair twice (the supplement's product over n of L_i(w_n | w_{-n}) counts each
    adjacent pair as n's upper and its neighbour's lower factor). ``own_only`` keeps, in each
    sample's incidence, only the copy the sample owns (copy 1 where it is ``hi``, copy 2 where
    it is ``lo``): the supplement's z_n update, which leaves out the factors of its neighbours."""
    P = pairs.num_pairs
    feature, lo, hi = (np.concatenate([a, a]) for a in (pairs.feature, pairs.lo, pairs.hi))
    N = pairs.incidence.shape[0]
    inc, role = [[] for _ in range(N)], [[] for _ in range(N)]
    for p in range(2 * P):
        for n, r in ((hi[p], 1.0), (lo[p], -1.0)):
            owned = (p < P and r > 0) or (p >= P and r < 0)
            if owned or not own_only:
                inc[n].append(p)
                role[n].append(r)
    L = max(len(i) for i in inc)
    incidence = np.array([i + [0] * (L - len(i)) for i in inc], np.int32)
    roles = np.array([r + [0.0] * (L - len(r)) for r in role])
    return RankPairs(feature.astype(np.int32), lo.astype(np.int32), hi.astype(np.int32), incidence, roles)


def _bounded(x):
    return jnp.tanh(x)


def geweke_functions(variant):
    """Functions of the latents invariant to the model's sign flips (A_k, z_k, beta_k) -> -(.)
    and, for NL, to relabelling the components; bounded or logged so their moments exist."""
    f = {
        "w": lambda v: _bounded(v["z"] @ v["A"].T).ravel(),
        "A2": lambda v: jnp.mean(v["A"] ** 2 / (1.0 + v["A"] ** 2)),
        "z2": lambda v: jnp.mean(v["z"] ** 2 / (1.0 + v["z"] ** 2)),
        "log_xi_a": lambda v: jnp.mean(jnp.log(v["xi_a"])),
        "log_eta_a": lambda v: jnp.mean(jnp.log(v["eta_a"])),
        "log_Phi_a": lambda v: jnp.log(v["Phi_a"]),
        "log_Phi_tilde_a": lambda v: jnp.log(v["Phi_tilde_a"]),
        "log_b_beta": lambda v: jnp.mean(jnp.log(v["b_beta"])),
        "log_e_beta": lambda v: jnp.mean(jnp.log(v["e_beta"])),
        "log_Phi_beta": lambda v: jnp.log(v["Phi_beta"]),
        "log_Phi_tilde_beta": lambda v: jnp.log(v["Phi_tilde_beta"]),
        "log_lam_svm": lambda v: jnp.log(v["lam_svm"]),
    }
    if variant.endswith("NL"):
        f["u"] = lambda v: _bounded(jnp.sum(v["beta"][v["t"]] * v["z"], -1))
        f["same"] = lambda v: (v["t"][0] == v["t"][1]).astype(float) + (v["t"][2] == v["t"][3])
        f["log_psi_t"] = lambda v: jnp.log(v["psi"][v["t"]])
        f["mu_t"] = lambda v: jnp.sum(_bounded(v["mu"][v["t"]] * v["z"]), -1)
        f["log_alpha"] = lambda v: jnp.log(v["alpha"])
        f["beta2"] = lambda v: jnp.mean(v["beta"] ** 2 / (1.0 + v["beta"] ** 2))
    else:
        f["u"] = lambda v: _bounded(v["z"] @ v["beta"][0])
        f["beta2"] = lambda v: v["beta"][0] ** 2 / (1.0 + v["beta"][0] ** 2)
    if variant.startswith("G"):
        f["log_tau"] = lambda v: jnp.log(v["tau"])
    else:
        f["log_lam_rank"] = lambda v: jnp.mean(jnp.log(v["lam_rank"]))
    return f
