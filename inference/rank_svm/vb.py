r"""Closed-form mean-field variational Bayes (CAVI) for the max-margin rank-likelihood factor SVM,
all four variants (:func:`latentzoo.models.rank_factor_svm.rank_factor_svm`; supplement section 3
for the L variants, Blei & Jordan 2005 for the DP mixture). Derivations, with labels (V1)...:
``docs/models/rank_factor_svm_vb.md``.

**Mean field** (:func:`rank_svm_guide`): full-covariance Gaussians per row for A (D rows), z (N
rows) and β (T rows); GIG(2⟨η⟩, ⟨a²⟩, r − ½) for every ξ and b; Gamma for η, Φ, Φ̃, e, τ, ψ, α;
GIG(1 + 2ρ, ⟨c²⟩, ½) for every λ (ρ the λ prior's rate, 0 for the flat measure); NL: Beta for ν,
isotropic Gaussians for μ_t, categorical for t_n.

**Updates** (:func:`rank_svm_sweep`; each is the exact maximiser of the ELBO in its block, so the
ELBO never decreases):

- λ (V4): q(λ) = GIG(1 + 2ρ, E[c²], ½), c = margin − score: so E[1/λ] = √((1 + 2ρ)/E[c²]). The
  supplement's ⟨λ⁻¹⟩ = 1/|⟨c⟩| is a point plug-in of the Gibbs conditional (it ignores Var c), and
  its λ^u line has the signs of c swapped.
- a hinge with weight w = E[1/λ] contributes −(w/2)s² + s(w·margin + 1) to the log joint in its
  score s (V5), a Gaussian pseudo-observation; so q(z_n), q(a_i), q(β_t) are Gaussians (V8).
  Rows of A are independent given z (a pair belongs to one feature): one batched solve. The z_n
  are coupled through the pairs (a pair's score involves z_hi and z_lo), so the R variants update
  them one at a time (``lax.scan``); a simultaneous update of coupled rows is not coordinate ascent.
- shrinkage (V9): ξ ~ GIG(2⟨η⟩, ⟨a²⟩, r − ½), η ~ Ga(r + s, ⟨ξ⟩ + ⟨Φ⟩),
  Φ_k ~ Ga(c + D s, ⟨Φ̃⟩ + Σ_i⟨η_ik⟩), Φ̃ ~ Ga(c₀ + K c, d₀ + Σ_k⟨Φ_k⟩); β side with one Φ:
  Ga(c + T K s_β, ⟨Φ̃⟩ + Σ⟨e⟩), Φ̃ ~ Ga(c₀ + c, d₀ + ⟨Φ⟩). (The supplement halves Σ⟨η⟩, and has
  shape 1 for Φ̃^(a) and ½ + ½s_β for Φ^(β).)
- NL (V10): q(t_n) ∝ exp(E log q_t + E log N(z_n; μ_t, ψ_t⁻¹I) + the SVM term of β_t);
  q(ν), q(α) as Blei & Jordan; q(μ_t) isotropic; q(ψ_t) = Ga(ψ_s + K N_t/2, ψ_r + ½Σ_n φ_nt
  E‖z_n − μ_t‖²) (the supplement's uses ‖μ_t‖² and no z).

Public: :func:`rank_svm_guide`, :func:`rank_svm_vb` (the recipe), :func:`rank_svm_sweep`,
:func:`rank_svm_elbo`, :func:`fit_vb`; the single blocks are exported for tests.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from jax import lax
from numpyro.distributions import constraints

from latentzoo.models.rank_factor_svm import VARIANTS, observed_data, rank_factor_svm
from latentzoo.inference.cavi import CAVI, CoordinateAscent, VariationalFit
from latentzoo.inference.conjugate import beta_log_moments, gamma_moments
from latentzoo.inference.gaussian import gaussian_block
from latentzoo.inference.gig import GeneralizedInverseGaussian
from latentzoo.inference.rank_svm.vb_init import initial_params
from latentzoo.inference.rank_svm.vb_moments import (
    Setup,
    cluster_sq_dist,
    elbo_terms,
    gaussian_moments,
    gig_moments,
    hinge_terms,
    rank_pair_moments,
    responsibilities,
    scores,
    setup,
    stick_log_weights,
)
from latentzoo.inference.validation import check_labelled

__all__ = [
    "rank_svm_guide",
    "rank_svm_vb",
    "rank_svm_sweep",
    "rank_svm_elbo",
    "rank_svm_elbo_terms",
    "fit_vb",
    "update_lam",
    "update_tau",
    "update_z",
    "update_A",
    "update_beta",
    "update_tpb",
    "update_dp",
    "RankSVMVariational",
]


# ------------------------------------------------------------------------------- guide
def _gamma(name, shape):
    a = numpyro.param(f"{name}_concentration", jnp.ones(shape), constraint=constraints.positive)
    b = numpyro.param(f"{name}_rate", jnp.ones(shape), constraint=constraints.positive)
    return numpyro.sample(name, dist.Gamma(a, b).to_event(len(shape)))


def _gig(name, shape, p):
    a = numpyro.param(f"{name}_gig_a", jnp.ones(shape), constraint=constraints.positive)
    b = numpyro.param(f"{name}_gig_b", jnp.ones(shape), constraint=constraints.positive)
    return numpyro.sample(name, GeneralizedInverseGaussian(a, b, jnp.full(shape, p)).to_event(len(shape)))


def _mvn(name, rows, K):
    loc = numpyro.param(f"{name}_loc", jnp.zeros((rows, K)))
    tril = numpyro.param(f"{name}_scale_tril", jnp.broadcast_to(jnp.eye(K), (rows, K, K)),
                         constraint=constraints.lower_cholesky)
    return numpyro.sample(name, dist.MultivariateNormal(loc, scale_tril=tril).to_event(1))


def rank_svm_guide(data=None, *, y, K, variant="R-L", pairs=None, D=None, T=5, priors=None,
                   marginal=False):
    """The mean-field guide; same arguments as the model, so ``Trace_ELBO`` and ``Predictive`` take
    (model, guide) with one set of arguments.

    Params (all ``numpyro.param``): ``A_loc`` (D, K), ``A_scale_tril`` (D, K, K); ``z_loc`` (N, K),
    ``z_scale_tril`` (N, K, K); ``beta_loc`` (T, K), ``beta_scale_tril`` (T, K, K); GIG factors
    ``<site>_gig_a``, ``<site>_gig_b`` for ``xi_a`` (D, K), ``b_beta`` (T, K), ``lam_rank`` (P,),
    ``lam_svm`` (N,) (p fixed: r − ½ for ξ and b, ½ for λ); Gamma factors
    ``<site>_concentration``, ``<site>_rate`` for ``eta_a`` (D, K), ``Phi_a`` (K,),
    ``Phi_tilde_a``, ``e_beta`` (T, K), ``Phi_beta``, ``Phi_tilde_beta`` (), ``tau`` (D,) [G],
    ``psi`` (T,), ``alpha`` () [NL]; NL also ``nu_concentration1``, ``nu_concentration0``
    (T − 1,), ``mu_loc`` (T, K), ``mu_scale`` (T,), ``t_probs`` (N, T).
    """
    st = setup(data, y=y, K=K, variant=variant, pairs=pairs, D=D, T=T, priors=priors, marginal=marginal)
    pr = st.priors
    _gamma("Phi_tilde_a", ())
    _gamma("Phi_a", (K,))
    _gamma("eta_a", (st.D, K))
    _gig("xi_a", (st.D, K), pr["r_a"] - 0.5)
    _mvn("A", st.D, K)
    _gamma("Phi_tilde_beta", ())
    _gamma("Phi_beta", ())
    _gamma("e_beta", (st.T, K))
    _gig("b_beta", (st.T, K), pr["r_beta"] - 0.5)
    _mvn("beta", st.T, K)
    if st.mixture:
        _gamma("alpha", ())
        c1 = numpyro.param("nu_concentration1", jnp.ones(st.T - 1), constraint=constraints.positive)
        c0 = numpyro.param("nu_concentration0", jnp.ones(st.T - 1), constraint=constraints.positive)
        numpyro.sample("nu", dist.Beta(c1, c0).to_event(1))
        mu_loc = numpyro.param("mu_loc", jnp.zeros((st.T, K)))
        mu_scale = numpyro.param("mu_scale", jnp.ones(st.T), constraint=constraints.positive)
        numpyro.sample("mu", dist.Normal(mu_loc, mu_scale[:, None]).to_event(2))
        _gamma("psi", (st.T,))
        probs = numpyro.param("t_probs", jnp.full((st.N, st.T), 1.0 / st.T), constraint=constraints.simplex)
        with numpyro.plate("N", st.N):
            numpyro.sample("t", dist.Categorical(probs=probs))
    _mvn("z", st.N, K)
    if st.gaussian:
        _gamma("tau", (st.D,))
    else:
        _gig("lam_rank", (st.P,), 0.5)
    _gig("lam_svm", (st.N,), 0.5)


# ------------------------------------------------------------------------------ blocks
def _hinge_weight(a, b):
    return jnp.sqrt(a / b)  # E[1/λ] under GIG(a, b, 1/2)


def update_lam(params, data, y, pairs, st: Setup, which=("rank", "svm")) -> dict:
    """(V4) q(λ) = GIG(1 + 2ρ, E[c²], ½) for the rank pairs and/or the SVM hinges."""
    rate = st.priors["lam_rate"]
    a0 = 1.0 + 2.0 * (0.0 if rate is None else rate)
    sc = scores(params, data, y, pairs, st)
    out = dict(params)
    if "rank" in which and not st.gaussian:
        out["lam_rank_gig_a"] = jnp.full(st.P, a0)
        out["lam_rank_gig_b"] = sc.rank_Ec2
    if "svm" in which:
        phi = responsibilities(params, st)
        out["lam_svm_gig_a"] = jnp.full(st.N, a0)
        out["lam_svm_gig_b"] = jnp.sum(phi * sc.svm_Ec2, 1)
    return out


def update_tau(params, data, y, pairs, st: Setup) -> dict:
    """(G) q(τ_i) = Ga(τ_s + N/2, τ_r + ½ Σ_n E[(x_ni − a_iᵀz_n)²])."""
    X = data["X"]
    A_m, _, A_E2, _ = gaussian_moments(params["A_loc"], params["A_scale_tril"])
    z_m, _, z_E2, _ = gaussian_moments(params["z_loc"], params["z_scale_tril"])
    R = jnp.sum(X**2, 0) - 2.0 * jnp.sum(X * (z_m @ A_m.T), 0) + jnp.einsum("dkl,kl->d", A_E2, z_E2.sum(0))
    return {**params, "tau_concentration": jnp.full(st.D, st.priors["tau_shape"] + 0.5 * st.N),
            "tau_rate": st.priors["tau_rate"] + 0.5 * R}


def _svm_natural(params, data, y, st: Setup):
    """The SVM hinges' pieces (V5) with w_n = E[1/λ_n], m_n the margin: for z_n, precision
    w_n y_n² Σ_t φ_nt E[β_t β_tᵀ] and linear term (w_n m_n + 1) y_n Σ_t φ_nt E[β_t]."""
    B_m, _, B_E2, _ = gaussian_moments(params["beta_loc"], params["beta_scale_tril"])
    phi = responsibilities(params, st)
    w = _hinge_weight(params["lam_svm_gig_a"], params["lam_svm_gig_b"])
    P = (w * y**2)[:, None, None] * jnp.einsum("nt,tkl->nkl", phi, B_E2)
    b = ((w * data["svm_margin"] + 1.0) * y)[:, None] * (phi @ B_m)
    return P, b


def _z_prior_natural(params, st: Setup):
    """Prior part of q(z_n): N(0, I) (L), or Σ_t φ_nt E[ψ_t] (z − μ_t)² (NL)."""
    if not st.mixture:
        return jnp.broadcast_to(jnp.eye(st.K), (st.N, st.K, st.K)), jnp.zeros((st.N, st.K))
    E_psi, _ = gamma_moments(params["psi_concentration"], params["psi_rate"])
    phi = params["t_probs"]
    prec = phi @ E_psi  # (N,)
    return prec[:, None, None] * jnp.eye(st.K), (phi * E_psi) @ params["mu_loc"]


def update_z(params, data, y, pairs, st: Setup) -> dict:
    """(V8) q(z_n) for every n. G: independent rows, one batched solve. R: the pairs couple the
    rows, so they are updated in turn (``lax.scan`` over n), each given the current means of the
    others: coordinate ascent over the N blocks."""
    P, b = _z_prior_natural(params, st)
    Ps, bs = _svm_natural(params, data, y, st)
    P, b = P + Ps, b + bs
    A_m, _, A_E2, _ = gaussian_moments(params["A_loc"], params["A_scale_tril"])
    if st.gaussian:
        E_tau, _ = gamma_moments(params["tau_concentration"], params["tau_rate"])
        P = P + jnp.einsum("d,dkl->kl", E_tau, A_E2)
        b = b + (data["X"] * E_tau) @ A_m
        m, T = gaussian_block(P, b)
        return {**params, "z_loc": m, "z_scale_tril": T}
    f, lo, hi = (jnp.asarray(v) for v in (pairs.feature, pairs.lo, pairs.hi))
    w = _hinge_weight(params["lam_rank_gig_a"], params["lam_rank_gig_b"])
    G = w[:, None, None] * A_E2[f]  # (P, K, K): each pair's w E[a aᵀ]
    lin = (w * data["rank_margin"] + 1.0)[:, None] * A_m[f]  # (P, K)
    P = P + jax.ops.segment_sum(G, hi, st.N) + jax.ops.segment_sum(G, lo, st.N)
    b = b + jax.ops.segment_sum(lin, hi, st.N) - jax.ops.segment_sum(lin, lo, st.N)
    m_new, T = gaussian_block(P, jnp.zeros_like(b))  # covariance factors; means below
    S = T @ jnp.swapaxes(T, -1, -2)
    inc, role = jnp.asarray(pairs.incidence), jnp.asarray(pairs.role)
    other = jnp.where(role > 0, lo[inc], hi[inc])  # (N, L): the partner in each of n's pairs
    weight = w[inc] * jnp.abs(role)  # 0 on padding
    feat = f[inc]

    def step(m, n):
        # n's pairs pull z_n towards its partners' current means: + Σ_l w_l E[a aᵀ] m_partner
        c = jnp.einsum("l,lkj,lj->k", weight[n], A_E2[feat[n]], m[other[n]])
        return m.at[n].set(S[n] @ (b[n] + c)), None

    m, _ = lax.scan(step, params["z_loc"], jnp.arange(st.N))
    return {**params, "z_loc": m, "z_scale_tril": T}


def update_A(params, data, y, pairs, st: Setup) -> dict:
    """(V8) q(a_i), all rows at once (independent given z): precision diag E[1/ξ_i] plus the
    likelihood's (G: E[τ_i] Σ_n E[z zᵀ]; R: Σ_{pairs of i} w_p E[δ δᵀ]), full K x K."""
    pr = st.priors
    _, Einv_xi, _, _ = gig_moments(params["xi_a_gig_a"], params["xi_a_gig_b"], pr["r_a"] - 0.5)
    P = jax.vmap(jnp.diag)(Einv_xi)
    if st.gaussian:
        z_m, _, z_E2, _ = gaussian_moments(params["z_loc"], params["z_scale_tril"])
        E_tau, _ = gamma_moments(params["tau_concentration"], params["tau_rate"])
        P = P + E_tau[:, None, None] * z_E2.sum(0)
        b = E_tau[:, None] * (data["X"].T @ z_m)
    else:
        f = jnp.asarray(pairs.feature)
        w = _hinge_weight(params["lam_rank_gig_a"], params["lam_rank_gig_b"])
        dm, Edd = rank_pair_moments(params, pairs)
        P = P + jax.ops.segment_sum(w[:, None, None] * Edd, f, st.D)
        b = jax.ops.segment_sum((w * data["rank_margin"] + 1.0)[:, None] * dm, f, st.D)
    m, T = gaussian_block(P, b)
    return {**params, "A_loc": m, "A_scale_tril": T}


def update_beta(params, data, y, pairs, st: Setup) -> dict:
    """(V8) q(β_t): precision diag E[1/b_t] + Σ_n φ_nt w_n y_n² E[z_n z_nᵀ], linear term
    Σ_n φ_nt (w_n m_n + 1) y_n E[z_n]."""
    _, Einv_b, _, _ = gig_moments(params["b_beta_gig_a"], params["b_beta_gig_b"], st.priors["r_beta"] - 0.5)
    z_m, _, z_E2, _ = gaussian_moments(params["z_loc"], params["z_scale_tril"])
    phi = responsibilities(params, st)
    w = _hinge_weight(params["lam_svm_gig_a"], params["lam_svm_gig_b"])
    P = jax.vmap(jnp.diag)(Einv_b) + jnp.einsum("nt,nkl->tkl", phi * (w * y**2)[:, None], z_E2)
    b = (phi * ((w * data["svm_margin"] + 1.0) * y)[:, None]).T @ z_m
    m, T = gaussian_block(P, b)
    return {**params, "beta_loc": m, "beta_scale_tril": T}


def update_tpb(params, st: Setup, side: str, supplement: bool = False) -> dict:
    """(V9) one shrinkage hierarchy, leaves first: ξ (GIG), η, Φ, Φ̃ (Gamma). ``side`` "a" (the
    loadings: ξ_a, η_a, Φ_a (K,)) or "beta" (b, e, one Φ_beta). ``supplement=True`` uses the
    supplement's global-scale updates instead (a stray ½ on the rate's sum, and its shapes): for
    the tests that show they are not the coordinate optimum."""
    pr = st.priors
    if side == "a":
        coef, var, rate, glob, glob_rate = "A", "xi_a", "eta_a", "Phi_a", "Phi_tilde_a"
        r, s, n_glob = pr["r_a"], pr["s_a"], st.K
    else:
        coef, var, rate, glob, glob_rate = "beta", "b_beta", "e_beta", "Phi_beta", "Phi_tilde_beta"
        r, s, n_glob = pr["r_beta"], pr["s_beta"], 1
    c, c0, d0 = pr["Phi_shape"], pr["Phi_tilde_shape"], pr["Phi_tilde_rate"]
    out = dict(params)
    _, _, _, sq = gaussian_moments(params[f"{coef}_loc"], params[f"{coef}_scale_tril"])
    E_eta, _ = gamma_moments(out[f"{rate}_concentration"], out[f"{rate}_rate"])
    out[f"{var}_gig_a"], out[f"{var}_gig_b"] = 2.0 * E_eta, sq
    E_xi, _, _, _ = gig_moments(out[f"{var}_gig_a"], out[f"{var}_gig_b"], r - 0.5)
    E_g, _ = gamma_moments(out[f"{glob}_concentration"], out[f"{glob}_rate"])
    out[f"{rate}_concentration"] = jnp.full(sq.shape, r + s)
    out[f"{rate}_rate"] = E_xi + (E_g[None, :] if side == "a" else E_g)
    E_eta, _ = gamma_moments(out[f"{rate}_concentration"], out[f"{rate}_rate"])
    E_gr, _ = gamma_moments(out[f"{glob_rate}_concentration"], out[f"{glob_rate}_rate"])
    # Φ: every η below it has prior Ga(s, Φ), so its shape gains s per η and its rate Σ η.
    sum_eta = E_eta.sum(0) if side == "a" else E_eta.sum()
    count = sq.shape[0] if side == "a" else sq.size
    shape_glob, rate_glob = c + count * s, E_gr + sum_eta
    if supplement:
        rate_glob = E_gr + 0.5 * sum_eta
        shape_glob = 0.5 + count * s if side == "a" else 0.5 + 0.5 * s
    out[f"{glob}_concentration"] = jnp.full(jnp.shape(sum_eta), shape_glob)
    out[f"{glob}_rate"] = rate_glob
    E_g, _ = gamma_moments(out[f"{glob}_concentration"], out[f"{glob}_rate"])
    out[f"{glob_rate}_concentration"] = jnp.asarray(1.0 if supplement else c0 + n_glob * c)
    out[f"{glob_rate}_rate"] = d0 + E_g.sum()
    return out


def update_dp(params, data, y, pairs, st: Setup, supplement_psi: bool = False) -> dict:
    """(V10) the DP mixture's factors in turn: q(t), q(ν), q(α), q(μ), q(ψ).
    ``supplement_psi=True`` uses the supplement's ψ update (no z terms), for the tests."""
    pr = st.priors
    K, T = st.K, st.T
    out = dict(params)
    # q(t_n): stick weights + cluster density + this component's classifier
    E_psi, Elog_psi = gamma_moments(out["psi_concentration"], out["psi_rate"])
    sc = scores(out, data, y, pairs, st)
    w = _hinge_weight(out["lam_svm_gig_a"], out["lam_svm_gig_b"])
    logit = (stick_log_weights(out["nu_concentration1"], out["nu_concentration0"])[None]
             + 0.5 * K * Elog_psi - 0.5 * E_psi * cluster_sq_dist(out)
             - 0.5 * w[:, None] * sc.svm_Ec2 - sc.svm_Ec)
    out["t_probs"] = jax.nn.softmax(logit, axis=1)
    phi = out["t_probs"]
    Nt = phi.sum(0)
    # q(ν_t) = Beta(1 + N_t, E[α] + Σ_{j>t} N_j), t < T
    E_al, _ = gamma_moments(out["alpha_concentration"], out["alpha_rate"])
    later = jnp.cumsum(Nt[::-1])[::-1][1:]  # Σ_{j>t} N_j for t = 1..T-1
    out["nu_concentration1"] = 1.0 + Nt[:-1]
    out["nu_concentration0"] = E_al + later
    # q(α) = Ga(α_s + T − 1, α_r − Σ_t E log(1 − ν_t))
    _, Elog1m = beta_log_moments(out["nu_concentration1"], out["nu_concentration0"])
    out["alpha_concentration"] = jnp.asarray(pr["alpha_shape"] + T - 1.0)
    out["alpha_rate"] = pr["alpha_rate"] - Elog1m.sum()
    # q(μ_t): isotropic, precision 1/s² + E[ψ_t] N_t
    prec = 1.0 / pr["mu_scale"] ** 2 + E_psi * Nt
    out["mu_loc"] = (E_psi[:, None] * (phi.T @ out["z_loc"])) / prec[:, None]
    out["mu_scale"] = 1.0 / jnp.sqrt(prec)
    # q(ψ_t) = Ga(ψ_s + K N_t / 2, ψ_r + ½ Σ_n φ_nt E‖z_n − μ_t‖²)
    if supplement_psi:
        out["psi_concentration"] = jnp.full(T, pr["psi_shape"] + 0.5 * K)
        out["psi_rate"] = pr["psi_rate"] + 0.5 * jnp.sum(out["mu_loc"] ** 2, 1)
    else:
        out["psi_concentration"] = pr["psi_shape"] + 0.5 * K * Nt
        out["psi_rate"] = pr["psi_rate"] + 0.5 * jnp.sum(phi * cluster_sq_dist(out), 0)
    return out


# ------------------------------------------------------------------------------ recipe
def rank_svm_sweep(params, data, y, pairs, st: Setup) -> dict:
    """One CAVI sweep. λ is refreshed before each block that reads it (cheap, and it couples
    strongly to the scores)."""
    p = update_lam(params, data, y, pairs, st)
    if st.gaussian:
        p = update_tau(p, data, y, pairs, st)
    p = update_z(p, data, y, pairs, st)
    p = update_lam(p, data, y, pairs, st, ("rank",))
    if st.gaussian:
        p = update_tau(p, data, y, pairs, st)
    p = update_A(p, data, y, pairs, st)
    p = update_tpb(p, st, "a")
    p = update_lam(p, data, y, pairs, st, ("svm",))
    p = update_beta(p, data, y, pairs, st)
    p = update_tpb(p, st, "beta")
    if st.mixture:
        p = update_lam(p, data, y, pairs, st, ("svm",))
        p = update_dp(p, data, y, pairs, st)
    return p


def rank_svm_elbo_terms(params, data, y, pairs, st: Setup) -> dict:
    """The analytic ELBO as named terms (:func:`~latentzoo.inference.rank_svm.vb_moments.elbo_terms`)."""
    return elbo_terms(params, data, y, pairs, st)


def rank_svm_elbo(params, data, y, pairs, st: Setup):
    """The analytic ELBO (a scalar)."""
    return sum(elbo_terms(params, data, y, pairs, st).values())


def _args(data, kw):
    st = setup(data, **kw)
    y = jnp.asarray(kw["y"], jnp.float64)
    return st, {k: jnp.asarray(v) for k, v in data.items()}, y, kw.get("pairs")


class RankSVMVariational(NamedTuple):
    """The guide and the :class:`~latentzoo.inference.cavi.CoordinateAscent` recipe."""

    guide: object
    algorithm: CoordinateAscent


def rank_svm_vb() -> RankSVMVariational:
    """Mean-field CAVI for :func:`~latentzoo.models.rank_factor_svm.rank_factor_svm`: the recipe's
    ``init``, ``update``, ``elbo`` take the model's own arguments ``(data, *, y, K, variant,
    pairs, D, T, priors)``, so one set of arguments serves the driver, ``Trace_ELBO`` and
    ``Predictive``.

    Example::

        data, kw = observed_data(X, y, "R-L")
        vb = rank_svm_vb()
        result = CAVI(rank_factor_svm, vb.guide, vb.algorithm).run(key, 300, data, K=5, **kw)
    """

    def init(rng_key, data, **kw):
        st, data, y, pairs = _args(data, kw)
        params = initial_params(rng_key, data, y, pairs, st)
        p = update_lam(params, data, y, pairs, st)
        if st.gaussian:
            p = update_tau(p, data, y, pairs, st)
        p = update_tpb(update_tpb(p, st, "a"), st, "beta")
        if st.mixture:
            p = update_dp(p, data, y, pairs, st)
        return p

    def update(params, data, **kw):
        st, data, y, pairs = _args(data, kw)
        return rank_svm_sweep(params, data, y, pairs, st)

    def elbo(params, data, **kw):
        st, data, y, pairs = _args(data, kw)
        return rank_svm_elbo(params, data, y, pairs, st)

    return RankSVMVariational(rank_svm_guide, CoordinateAscent(init, update, elbo))


def fit_vb(X, y, *, variant: str, K: int, T: int = 5, num_steps: int = 500, seed: int = 0,
           priors=None, restarts: int = 1, rtol: float = 1e-8, progress_bar: bool = False,
           on_decrease: str = "raise") -> VariationalFit:
    """Fit one variant by CAVI from features X (N, D) and labels y (N,) in {−1, +1}; the best of
    ``restarts`` starts by final ELBO. Stops when the relative ELBO change falls below ``rtol``.

    Returns :class:`~latentzoo.inference.cavi.VariationalFit`; its ``model_kwargs`` for
    ``Predictive`` / ``Trace_ELBO`` are :func:`latentzoo.models.rank_factor_svm.observed_data`'s.
    """
    if variant not in VARIANTS:
        raise ValueError(f"Unknown variant {variant!r}; choose one of {', '.join(VARIANTS)}.")
    X, y = check_labelled(X, y, name="the rank-SVM data")
    if not np.all(np.isin(y, (-1.0, 1.0))):
        raise ValueError("The rank-SVM labels must be -1 or +1.")
    if isinstance(K, bool) or not isinstance(K, (int, np.integer)) or K < 1:
        raise ValueError(f"K must be a positive integer, got {K!r}.")
    data, kw = observed_data(X, y, variant, priors)
    vb = rank_svm_vb()
    driver = CAVI(rank_factor_svm, vb.guide, vb.algorithm, on_decrease=on_decrease)
    result = driver.run(jax.random.PRNGKey(seed), num_steps, data, K=int(K), T=int(T), priors=priors,
                        progress_bar=progress_bar, rtol=rtol, restarts=restarts, **kw)
    return VariationalFit(result, vb.guide, rank_factor_svm)
