r"""The closed-form coordinate updates of the rank-SVM CAVI (:mod:`latentzoo.inference.rank_svm.vb`).

Each function returns the params with one factor (or a set of factors independent given the
rest) replaced by its exact maximiser of the ELBO given all other factors; labels (V4)...(V10)
refer to ``docs/models/rank_factor_svm_vb.md``. ``params`` is the guide's dict
(:func:`~latentzoo.inference.rank_svm.vb.rank_svm_guide`), ``data`` the model's observed sites, ``y``
the labels, ``pairs`` the rank pairs (R) and ``st`` the :class:`~.vb_moments.Setup`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from latentzoo.inference.conjugate import beta_log_moments, gamma_moments
from latentzoo.inference.gaussian import gaussian_block
from latentzoo.inference.rank_svm.vb_moments import (
    Setup,
    cluster_sq_dist,
    gaussian_moments,
    gig_moments,
    rank_pair_moments,
    responsibilities,
    scores,
    stick_log_weights,
)

__all__ = [
    "Block",
    "BLOCKS",
    "update_lam",
    "update_tau",
    "update_z",
    "update_A",
    "update_beta",
    "update_xi",
    "update_eta",
    "update_global",
    "update_global_rate",
    "update_tpb",
    "update_t",
    "update_nu",
    "update_alpha",
    "update_mu",
    "update_psi",
    "update_dp",
]


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


_SIDES = {  # coefficient, variance, rate, global scale, its rate; prior keys of r and s
    "a": ("A", "xi_a", "eta_a", "Phi_a", "Phi_tilde_a", "r_a", "s_a"),
    "beta": ("beta", "b_beta", "e_beta", "Phi_beta", "Phi_tilde_beta", "r_beta", "s_beta"),
}


def update_xi(params, st: Setup, side: str) -> dict:
    """(V9) q(ξ) = GIG(2⟨η⟩, ⟨a²⟩, r − ½) (ξ_a, or b for β)."""
    coef, var, rate, _, _, r, _ = _SIDES[side]
    _, _, _, sq = gaussian_moments(params[f"{coef}_loc"], params[f"{coef}_scale_tril"])
    E_eta, _ = gamma_moments(params[f"{rate}_concentration"], params[f"{rate}_rate"])
    return {**params, f"{var}_gig_a": 2.0 * E_eta, f"{var}_gig_b": sq}


def update_eta(params, st: Setup, side: str) -> dict:
    """(V9) q(η) = Ga(r + s, ⟨ξ⟩ + ⟨Φ⟩) (η_a with Φ_k per column, or e with one Φ)."""
    _, var, rate, glob, _, r, s = _SIDES[side]
    r, s = st.priors[r], st.priors[s]
    E_xi, _, _, _ = gig_moments(params[f"{var}_gig_a"], params[f"{var}_gig_b"], r - 0.5)
    E_g, _ = gamma_moments(params[f"{glob}_concentration"], params[f"{glob}_rate"])
    return {**params, f"{rate}_concentration": jnp.full(E_xi.shape, r + s),
            f"{rate}_rate": E_xi + (E_g[None, :] if side == "a" else E_g)}


def update_global(params, st: Setup, side: str, supplement: bool = False) -> dict:
    """(V9) q(Φ) = Ga(c + n s, ⟨Φ̃⟩ + Σ⟨η⟩): every η below Φ has prior Ga(s, Φ), so the shape
    gains s and the rate ⟨η⟩ per η (n = D per column Φ_k of A; n = T K for the one Φ of β).
    ``supplement=True``: the supplement's ½Σ⟨η⟩ in the rate, and its shapes ½ + D s_a (A) and
    ½ + ½ s_β (β, VB section)."""
    _, _, rate, glob, glob_rate, _, s = _SIDES[side]
    c, s = st.priors["Phi_shape"], st.priors[s]
    E_eta, _ = gamma_moments(params[f"{rate}_concentration"], params[f"{rate}_rate"])
    E_gr, _ = gamma_moments(params[f"{glob_rate}_concentration"], params[f"{glob_rate}_rate"])
    sum_eta = E_eta.sum(0) if side == "a" else E_eta.sum()
    count = E_eta.shape[0] if side == "a" else E_eta.size
    shape, rate_ = c + count * s, E_gr + sum_eta
    if supplement:
        shape, rate_ = (0.5 + count * s if side == "a" else 0.5 + 0.5 * s), E_gr + 0.5 * sum_eta
    return {**params, f"{glob}_concentration": jnp.full(jnp.shape(sum_eta), shape), f"{glob}_rate": rate_}


def update_global_rate(params, st: Setup, side: str, supplement: bool = False) -> dict:
    """(V9) q(Φ̃) = Ga(c₀ + n c, d₀ + Σ⟨Φ⟩), n = K global scales (A) or 1 (β).
    ``supplement=True``: its shape 1 (right only for one global scale)."""
    _, _, _, glob, glob_rate, _, _ = _SIDES[side]
    pr = st.priors
    E_g, _ = gamma_moments(params[f"{glob}_concentration"], params[f"{glob}_rate"])
    n = st.K if side == "a" else 1
    shape = 1.0 if supplement else pr["Phi_tilde_shape"] + n * pr["Phi_shape"]
    return {**params, f"{glob_rate}_concentration": jnp.asarray(shape),
            f"{glob_rate}_rate": pr["Phi_tilde_rate"] + E_g.sum()}


def update_tpb(params, st: Setup, side: str) -> dict:
    """(V9) one shrinkage hierarchy, leaves first: ξ, η, Φ, Φ̃ (``side`` "a" or "beta")."""
    for block in (update_xi, update_eta, update_global, update_global_rate):
        params = block(params, st, side)
    return params


def update_t(params, data, y, pairs, st: Setup) -> dict:
    """(V10) q(t_n) ∝ exp{E log q_t + K/2 E log ψ_t − ½E[ψ_t] E‖z_n − μ_t‖² − ½ w_n E[c_nt²]
    − E[c_nt]}: the stick weight, the cluster density and component t's classifier hinge."""
    E_psi, Elog_psi = gamma_moments(params["psi_concentration"], params["psi_rate"])
    sc = scores(params, data, y, pairs, st)
    w = _hinge_weight(params["lam_svm_gig_a"], params["lam_svm_gig_b"])
    logit = (stick_log_weights(params["nu_concentration1"], params["nu_concentration0"])[None]
             + 0.5 * st.K * Elog_psi - 0.5 * E_psi * cluster_sq_dist(params)
             - 0.5 * w[:, None] * sc.svm_Ec2 - sc.svm_Ec)
    return {**params, "t_probs": jax.nn.softmax(logit, axis=1)}


def update_nu(params, st: Setup) -> dict:
    """(V10) q(ν_t) = Beta(1 + N_t, ⟨α⟩ + Σ_{j>t} N_j), t < T, N_t = Σ_n φ_nt."""
    Nt = params["t_probs"].sum(0)
    E_al, _ = gamma_moments(params["alpha_concentration"], params["alpha_rate"])
    later = jnp.cumsum(Nt[::-1])[::-1][1:]  # Σ_{j>t} N_j for t = 1..T-1
    return {**params, "nu_concentration1": 1.0 + Nt[:-1], "nu_concentration0": E_al + later}


def update_alpha(params, st: Setup) -> dict:
    """(V10) q(α) = Ga(α_s + T − 1, α_r − Σ_t E log(1 − ν_t))."""
    _, Elog1m = beta_log_moments(params["nu_concentration1"], params["nu_concentration0"])
    return {**params, "alpha_concentration": jnp.asarray(st.priors["alpha_shape"] + st.T - 1.0),
            "alpha_rate": st.priors["alpha_rate"] - Elog1m.sum()}


def update_mu(params, st: Setup) -> dict:
    """(V10) q(μ_t) = N(⟨ψ_t⟩ Σ_n φ_nt ⟨z_n⟩ / π_t, 1/π_t I), π_t = 1/s² + ⟨ψ_t⟩ N_t."""
    phi = params["t_probs"]
    E_psi, _ = gamma_moments(params["psi_concentration"], params["psi_rate"])
    prec = 1.0 / st.priors["mu_scale"] ** 2 + E_psi * phi.sum(0)
    return {**params, "mu_loc": (E_psi[:, None] * (phi.T @ params["z_loc"])) / prec[:, None],
            "mu_scale": 1.0 / jnp.sqrt(prec)}


def update_psi(params, st: Setup, supplement: bool = False) -> dict:
    """(V10) q(ψ_t) = Ga(ψ_s + K N_t/2, ψ_r + ½ Σ_n φ_nt E‖z_n − μ_t‖²): the z_n of component t
    are its observations. ``supplement=True``: the supplement's Ga(ψ_s + K/2, ψ_r + ½‖μ_t‖²),
    which treats ψ_t as μ_t's precision and omits the z terms."""
    pr = st.priors
    phi = params["t_probs"]
    if supplement:
        return {**params, "psi_concentration": jnp.full(st.T, pr["psi_shape"] + 0.5 * st.K),
                "psi_rate": pr["psi_rate"] + 0.5 * jnp.sum(params["mu_loc"] ** 2, 1)}
    return {**params, "psi_concentration": pr["psi_shape"] + 0.5 * st.K * phi.sum(0),
            "psi_rate": pr["psi_rate"] + 0.5 * jnp.sum(phi * cluster_sq_dist(params), 0)}


def update_dp(params, data, y, pairs, st: Setup) -> dict:
    """(V10) the DP mixture's factors in turn: q(t), q(ν), q(α), q(μ), q(ψ)."""
    params = update_t(params, data, y, pairs, st)
    for block in (update_nu, update_alpha, update_mu, update_psi):
        params = block(params, st)
    return params


class Block(NamedTuple):
    """One coordinate update of the sweep, for tests and users who want single updates:
    ``update(params, data, y, pairs, st)``, the guide params it writes, and the variants it
    belongs to (``"G"``/``"R"`` and ``"L"``/``"NL"`` letters of the variant name)."""

    name: str
    update: Callable[..., dict]
    params: tuple[str, ...]
    variants: tuple[str, ...] = ("G-L", "R-L", "G-NL", "R-NL")


def _gamma_params(site):
    return (f"{site}_concentration", f"{site}_rate")


def _tpb_blocks(side):
    coef, var, rate, glob, glob_rate = _SIDES[side][:5]
    return [
        Block(f"q({var})", lambda p, d, y, pr, st: update_xi(p, st, side), (f"{var}_gig_a", f"{var}_gig_b")),
        Block(f"q({rate})", lambda p, d, y, pr, st: update_eta(p, st, side), _gamma_params(rate)),
        Block(f"q({glob})", lambda p, d, y, pr, st: update_global(p, st, side), _gamma_params(glob)),
        Block(f"q({glob_rate})", lambda p, d, y, pr, st: update_global_rate(p, st, side),
              _gamma_params(glob_rate)),
    ]


_R, _G, _NL = ("R-L", "R-NL"), ("G-L", "G-NL"), ("G-NL", "R-NL")
BLOCKS: tuple[Block, ...] = (
    Block("q(lam_rank)", lambda p, d, y, pr, st: update_lam(p, d, y, pr, st, ("rank",)),
          ("lam_rank_gig_a", "lam_rank_gig_b"), _R),
    Block("q(lam_svm)", lambda p, d, y, pr, st: update_lam(p, d, y, pr, st, ("svm",)),
          ("lam_svm_gig_a", "lam_svm_gig_b")),
    Block("q(tau)", update_tau, _gamma_params("tau"), _G),
    Block("q(z)", update_z, ("z_loc", "z_scale_tril")),
    Block("q(A)", update_A, ("A_loc", "A_scale_tril")),
    *_tpb_blocks("a"),
    Block("q(beta)", update_beta, ("beta_loc", "beta_scale_tril")),
    *_tpb_blocks("beta"),
    Block("q(t)", update_t, ("t_probs",), _NL),
    Block("q(nu)", lambda p, d, y, pr, st: update_nu(p, st), ("nu_concentration1", "nu_concentration0"), _NL),
    Block("q(alpha)", lambda p, d, y, pr, st: update_alpha(p, st), _gamma_params("alpha"), _NL),
    Block("q(mu)", lambda p, d, y, pr, st: update_mu(p, st), ("mu_loc", "mu_scale"), _NL),
    Block("q(psi)", lambda p, d, y, pr, st: update_psi(p, st), _gamma_params("psi"), _NL),
)
"""Every coordinate update, one factor (or a set of factors independent given the rest) each.
:func:`~latentzoo.inference.rank_svm.vb.rank_svm_sweep` applies them in this order, with λ
refreshed before the blocks that read it."""
