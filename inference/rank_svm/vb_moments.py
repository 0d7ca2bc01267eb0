r"""Moments and the analytic ELBO of the mean-field family of :mod:`latentzoo.inference.rank_svm.vb`.

The derivations are in ``docs/models/rank_factor_svm_vb.md``; equation labels (V1)... refer there.
Gamma is (shape, rate); GIG(a, b, p) has density :math:`\propto x^{p-1}e^{-(ax + b/x)/2}`.

- :func:`gig_moments`: :math:`E[x], E[1/x], E[\log x]` and the entropy of a GIG factor, from
  :math:`E[x^r] = (b/a)^{r/2} K_{p+r}(\sqrt{ab})/K_p(\sqrt{ab})` (V3). With
  :math:`p = r_a - \tfrac12`, :math:`E[\xi^{-1}] = \sqrt{2\langle\eta\rangle/\langle a^2\rangle}\,
  K_{r_a-3/2}/K_{r_a-1/2}`; the supplement has the ratio upside down.
- :func:`hinge_terms`: a Polson–Scott hinge's λ factor. Its optimal q is GIG(1 + 2ρ, E[c²], ½)
  (ρ the λ prior's rate, 0 for the flat measure), for which everything is elementary:
  :math:`E[1/\lambda] = \sqrt{a/b}`, :math:`E[\lambda] = \sqrt{b/a} + 1/a`,
  :math:`\log Z = \tfrac12\log 2\pi - \tfrac12\log a - \sqrt{ab}` (V4).
- :func:`scores`: :math:`E[c], E[c^2]` of every hinge's margin c = margin − score (V5).
- :func:`elbo_terms`: the ELBO as named terms (V7).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.scipy.special import digamma, gammaln

from latentzoo.inference.bessel import log_bessel_kve
from latentzoo.inference.conjugate import (
    beta_log_moments,
    gamma_entropy,
    gamma_expected_log_prior,
    gamma_moments,
)
from latentzoo.inference.gaussian import LOG_2PI, cov_from_tril, gaussian_entropy

__all__ = [
    "Setup",
    "setup",
    "gig_moments",
    "hinge_terms",
    "gaussian_moments",
    "Scores",
    "scores",
    "stick_log_weights",
    "elbo_terms",
]

_LOG2 = math.log(2.0)


class Setup(NamedTuple):
    """Static description of one fit: the variant's flags, sizes and the merged priors."""

    gaussian: bool
    mixture: bool
    N: int
    D: int
    K: int
    T: int  # components (1 for the L variants)
    P: int  # rank pairs (0 for G)
    priors: dict


def setup(data, *, y, K, variant, pairs=None, D=None, T=5, priors=None, marginal=False) -> Setup:
    """:class:`Setup` from the model's own arguments (those of
    :func:`latentzoo.models.rank_factor_svm.rank_factor_svm`)."""
    from latentzoo.models.rank_factor_svm import VARIANTS, default_priors

    if variant not in VARIANTS:
        raise ValueError(f"Unknown variant {variant!r}; choose one of {', '.join(VARIANTS)}.")
    if marginal:
        raise ValueError("Variational Bayes needs the augmented model (marginal=False).")
    gaussian, mixture = variant.startswith("G"), variant.endswith("NL")
    N = int(jnp.shape(y)[0])
    if gaussian:
        D = int(data["X"].shape[1]) if D is None else int(D)
        P = 0
    else:
        if pairs is None:
            raise ValueError("The R variants need the rank pairs (see rank_pairs).")
        D = int(pairs.feature.max()) + 1 if D is None else int(D)
        P = int(pairs.feature.shape[0])
    if mixture and T < 2:
        raise ValueError(f"The NL variants need T >= 2 components, got {T}.")
    return Setup(gaussian, mixture, N, D, int(K), int(T) if mixture else 1, P,
                 {**default_priors(), **(priors or {})})


# --------------------------------------------------------------------------- GIG factors
def gig_moments(a, b, p):
    r"""``(E[x], E[1/x], E[log x], entropy)`` of GIG(a, b, p), a, b > 0, elementwise (V3).

    :math:`\omega = \sqrt{ab}`; ratios of :math:`e^\omega K_\nu(\omega)` (no loss of digits to the
    common :math:`e^{-\omega}`); :math:`E[\log x] = \tfrac12\log(b/a) + \partial_p\log K_p(\omega)`
    by forward-mode differentiation in the order; the entropy is
    :math:`-\log C - (p-1)E[\log x] + \tfrac12(aE[x] + bE[1/x])` with
    :math:`\log C = \tfrac p2\log(a/b) - \log 2 - \log K_p(\omega)`.
    """
    a, b, p = jnp.broadcast_arrays(*(jnp.asarray(v, jnp.float64) for v in (a, b, p)))
    omega = jnp.sqrt(a * b)
    # the orders p, p + 1, p - 1 in one call (one copy of the quadrature's bisections in the
    # compiled program, not three), differentiated in the first order only
    orders = jnp.stack([p, p + 1.0, p - 1.0])
    logs, dlogs = jax.jvp(lambda q: log_bessel_kve(q, omega), (orders,),
                          (jnp.stack([jnp.ones_like(p), jnp.zeros_like(p), jnp.zeros_like(p)]),))
    l0, l_up, l_down, dl = logs[0], logs[1], logs[2], dlogs[0]
    half = 0.5 * (jnp.log(b) - jnp.log(a))
    mean = jnp.exp(half + l_up - l0)
    mean_inv = jnp.exp(-half + l_down - l0)
    mean_log = half + dl
    log_c = -p * half - _LOG2 - (l0 - omega)
    entropy = -log_c - (p - 1.0) * mean_log + 0.5 * (a * mean + b * mean_inv)
    return mean, mean_inv, mean_log, entropy


def hinge_terms(a, b, Ec, Ec2, rate):
    r"""One Polson–Scott hinge per element, q(λ) = GIG(a, b, ½) (V4): returns
    ``(E[1/λ], value)`` where ``value`` is the hinge's whole contribution to the ELBO:
    E[log N(margin; score − λ, λ)] + E[log p(λ)] + H[q(λ)].

    The E[log λ] terms of the Normal (−½) and of the entropy (+½, from p − 1 = −½) cancel, so

    .. math:: -\tfrac12 E[\lambda^{-1}](E[c^2] - b) - E[c] + (\tfrac a2 - \tfrac12 - \rho)E[\lambda]
              + \log\rho - \tfrac12\log a - \sqrt{ab},

    (ρ = ``rate``; the :math:`\log\rho` term only for the Exp(ρ) prior, ``rate=None`` is the flat
    measure, ρ = 0). At the optimum b = E[c²], a = 1 + 2ρ it is
    :math:`-E[c] - \sqrt{(1 + 2\rho)E[c^2]} + \log\rho - \tfrac12\log(1 + 2\rho)`; for the flat
    measure :math:`-E[c] - \sqrt{E[c^2]} \le E[-2\max(0, c)]` (Jensen), the hinge it bounds.
    """
    rho = 0.0 if rate is None else rate
    inv = jnp.sqrt(a / b)
    mean = jnp.sqrt(b / a) + 1.0 / a
    value = (-0.5 * inv * (Ec2 - b) - Ec + (0.5 * a - 0.5 - rho) * mean - 0.5 * jnp.log(a)
             - jnp.sqrt(a * b))
    if rate is not None:
        value = value + jnp.log(rate)
    return inv, value


# ---------------------------------------------------------------------- Gaussian factors
def gaussian_moments(loc, tril):
    """``(mean, covariance, second moment E[x xᵀ], diag of the second moment)`` of rows
    N(loc, tril trilᵀ); loc (..., K), tril (..., K, K)."""
    S = cov_from_tril(tril)
    E2 = S + loc[..., :, None] * loc[..., None, :]
    return loc, S, E2, jnp.diagonal(E2, axis1=-2, axis2=-1)


class Scores(NamedTuple):
    """Margin moments of every hinge (V5). ``rank_*`` (P,) for the pairs (empty for G);
    ``svm_*`` (N, T): c_nt = svm_margin_n − y_n β_tᵀ z_n for each component t."""

    rank_Ec: jax.Array
    rank_Ec2: jax.Array
    svm_Ec: jax.Array
    svm_Ec2: jax.Array


def rank_pair_moments(params, pairs):
    """(E[z_hi − z_lo] (P, K), E[(z_hi − z_lo)(z_hi − z_lo)ᵀ] (P, K, K)) under q(z) (hi ≠ lo,
    so the two rows are independent)."""
    m, S, _, _ = gaussian_moments(params["z_loc"], params["z_scale_tril"])
    dm = m[pairs.hi] - m[pairs.lo]
    return dm, dm[:, :, None] * dm[:, None, :] + S[pairs.hi] + S[pairs.lo]


def scores(params, data, y, pairs, st: Setup) -> Scores:
    """:class:`Scores` at ``params``: E[s] = E[a_f]ᵀ E[δ], E[s²] = tr(E[a aᵀ] E[δ δᵀ]) for a pair
    (δ = z_hi − z_lo), E[u] = E[β_t]ᵀ E[z_n], E[u²] = tr(E[β βᵀ] E[z zᵀ]) for the SVM."""
    if st.gaussian:
        rank_Ec = rank_Ec2 = jnp.zeros(0)
    else:
        A_m, _, A_E2, _ = gaussian_moments(params["A_loc"], params["A_scale_tril"])
        dm, Edd = rank_pair_moments(params, pairs)
        Es = jnp.sum(A_m[pairs.feature] * dm, -1)
        Es2 = jnp.einsum("pkl,pkl->p", A_E2[pairs.feature], Edd)
        eps = data["rank_margin"]
        rank_Ec, rank_Ec2 = eps - Es, eps**2 - 2.0 * eps * Es + Es2
    z_m, _, z_E2, _ = gaussian_moments(params["z_loc"], params["z_scale_tril"])
    B_m, _, B_E2, _ = gaussian_moments(params["beta_loc"], params["beta_scale_tril"])
    Eu = z_m @ B_m.T  # (N, T)
    Eu2 = jnp.einsum("tkl,nkl->nt", B_E2, z_E2)
    one = data["svm_margin"][:, None]
    yy = y[:, None]
    return Scores(rank_Ec, rank_Ec2, one - yy * Eu, one**2 - 2.0 * one * yy * Eu + yy**2 * Eu2)


def responsibilities(params, st: Setup):
    """q(t_n = t) (N, T): ``t_probs`` for NL, a column of ones for L."""
    return params["t_probs"] if st.mixture else jnp.ones((st.N, 1))


def stick_log_weights(c1, c0):
    r""":math:`E[\log q_t]` (T,) under q(ν_t) = Beta(c1_t, c0_t) (T − 1,), with ν_T = 1:
    :math:`E\log\nu_t + \sum_{l<t} E\log(1-\nu_l)` (V6)."""
    Elog, Elog1m = beta_log_moments(c1, c0)
    Elog = jnp.concatenate([Elog, jnp.zeros(1)])
    before = jnp.concatenate([jnp.zeros(1), jnp.cumsum(Elog1m)])
    return Elog + before


def cluster_sq_dist(params):
    r""":math:`E\lVert z_n - \mu_t\rVert^2` (N, T) = ‖m_n − m_t‖² + tr S_n + K v_t."""
    z_m, z_S, _, _ = gaussian_moments(params["z_loc"], params["z_scale_tril"])
    mu, v = params["mu_loc"], params["mu_scale"] ** 2
    K = z_m.shape[1]
    d = jnp.sum((z_m[:, None, :] - mu[None]) ** 2, -1)
    return d + jnp.trace(z_S, axis1=-2, axis2=-1)[:, None] + K * v[None]


# -------------------------------------------------------------------------------- ELBO
def _gamma_site(params, name, shape0, E_rate, Elog_rate):
    """E[log Ga(x; shape0, rate)] + H[q(x)] for a Gamma factor ``name``, the rate random."""
    a, b = params[f"{name}_concentration"], params[f"{name}_rate"]
    E, Elog = gamma_moments(a, b)
    return jnp.sum(shape0 * Elog_rate - gammaln(shape0) + (shape0 - 1.0) * Elog - E_rate * E
                   + gamma_entropy(a, b))


def _tpb_terms(params, st: Setup, coef: str, var: str, rate: str, glob: str, glob_rate: str,
               r, s, glob_shape):
    """ELBO terms of one shrinkage hierarchy: coefficients' prior N(0, ξ) (without their
    entropy), ξ, η, Φ, Φ̃ (each with its entropy)."""
    pr = st.priors
    _, _, _, sq = gaussian_moments(params[f"{coef}_loc"], params[f"{coef}_scale_tril"])
    p = r - 0.5
    E_xi, Einv_xi, Elog_xi, H_xi = gig_moments(params[f"{var}_gig_a"], params[f"{var}_gig_b"], p)
    E_eta, Elog_eta = gamma_moments(params[f"{rate}_concentration"], params[f"{rate}_rate"])
    E_g, Elog_g = gamma_moments(params[f"{glob}_concentration"], params[f"{glob}_rate"])
    E_gr, Elog_gr = gamma_moments(params[f"{glob_rate}_concentration"], params[f"{glob_rate}_rate"])
    if coef == "beta":  # one global scale for every coefficient
        E_g_b, Elog_g_b = E_g, Elog_g
    else:  # Φ_k per column
        E_g_b, Elog_g_b = E_g[None, :], Elog_g[None, :]
    return {
        coef: jnp.sum(-0.5 * LOG_2PI - 0.5 * Elog_xi - 0.5 * sq * Einv_xi),
        var: jnp.sum(r * Elog_eta - gammaln(r) + (r - 1.0) * Elog_xi - E_eta * E_xi + H_xi),
        rate: _gamma_site(params, rate, s, E_g_b, Elog_g_b),
        glob: _gamma_site(params, glob, glob_shape, E_gr, Elog_gr),
        glob_rate: jnp.sum(gamma_expected_log_prior(pr["Phi_tilde_shape"], pr["Phi_tilde_rate"], E_gr, Elog_gr)
                           + gamma_entropy(params[f"{glob_rate}_concentration"], params[f"{glob_rate}_rate"])),
    }


def elbo_terms(params, data, y, pairs, st: Setup) -> dict:
    """The analytic ELBO (V7) as ``{term: scalar}``; the terms sum to the ELBO.

    Keys: the latent sites' expected log priors with their factors' entropies (``"A"``,
    ``"beta"``, ``"z"``, ``"mu"`` include their Gaussian entropies; the hierarchies' ``"xi_a"``,
    ``"eta_a"``, ..., ``"Phi_tilde_beta"``; NL ``"alpha"``, ``"nu"``, ``"psi"``, ``"t"``; G
    ``"tau"``), the likelihoods ``"X"`` (G) or ``"rank"`` (R, λ's included) and ``"svm"`` (λ's
    included).
    """
    pr = st.priors
    out = {}
    out.update(_tpb_terms(params, st, "A", "xi_a", "eta_a", "Phi_a", "Phi_tilde_a",
                          pr["r_a"], pr["s_a"], pr["Phi_shape"]))
    out.update(_tpb_terms(params, st, "beta", "b_beta", "e_beta", "Phi_beta", "Phi_tilde_beta",
                          pr["r_beta"], pr["s_beta"], pr["Phi_shape"]))
    out["A"] = out["A"] + gaussian_entropy(params["A_scale_tril"])
    out["beta"] = out["beta"] + gaussian_entropy(params["beta_scale_tril"])

    z_m, z_S, z_E2, _ = gaussian_moments(params["z_loc"], params["z_scale_tril"])
    K = st.K
    H_z = gaussian_entropy(params["z_scale_tril"])
    phi = responsibilities(params, st)
    if st.mixture:
        E_psi, Elog_psi = gamma_moments(params["psi_concentration"], params["psi_rate"])
        E_al, Elog_al = gamma_moments(params["alpha_concentration"], params["alpha_rate"])
        c1, c0 = params["nu_concentration1"], params["nu_concentration0"]
        _, Elog1m = beta_log_moments(c1, c0)
        dist2 = cluster_sq_dist(params)
        out["z"] = jnp.sum(phi * (0.5 * K * (Elog_psi - LOG_2PI) - 0.5 * E_psi * dist2)) + H_z
        out["t"] = jnp.sum(phi * stick_log_weights(c1, c0)) - jnp.sum(jnp.where(phi > 0, phi * jnp.log(phi), 0.0))
        out["nu"] = jnp.sum(Elog_al + (E_al - 1.0) * Elog1m + _beta_entropy(c1, c0))
        out["alpha"] = (gamma_expected_log_prior(pr["alpha_shape"], pr["alpha_rate"], E_al, Elog_al)
                        + gamma_entropy(params["alpha_concentration"], params["alpha_rate"]))
        s2 = pr["mu_scale"] ** 2
        v = params["mu_scale"] ** 2
        out["mu"] = (jnp.sum(-0.5 * jnp.log(2.0 * jnp.pi * s2) - 0.5 * (params["mu_loc"] ** 2 + v[:, None]) / s2)
                     + jnp.sum(0.5 * K * (1.0 + LOG_2PI + jnp.log(v))))
        out["psi"] = jnp.sum(gamma_expected_log_prior(pr["psi_shape"], pr["psi_rate"], E_psi, Elog_psi)
                             + gamma_entropy(params["psi_concentration"], params["psi_rate"]))
    else:
        out["z"] = jnp.sum(-0.5 * K * LOG_2PI - 0.5 * jnp.trace(z_E2, axis1=-2, axis2=-1)) + H_z

    sc = scores(params, data, y, pairs, st)
    if st.gaussian:
        X = data["X"]
        A_m, _, A_E2, _ = gaussian_moments(params["A_loc"], params["A_scale_tril"])
        E_tau, Elog_tau = gamma_moments(params["tau_concentration"], params["tau_rate"])
        R = (jnp.sum(X**2, 0) - 2.0 * jnp.sum(X * (z_m @ A_m.T), 0)
             + jnp.einsum("dkl,kl->d", A_E2, z_E2.sum(0)))
        out["X"] = jnp.sum(0.5 * st.N * (Elog_tau - LOG_2PI) - 0.5 * E_tau * R)
        out["tau"] = jnp.sum(gamma_expected_log_prior(pr["tau_shape"], pr["tau_rate"], E_tau, Elog_tau)
                             + gamma_entropy(params["tau_concentration"], params["tau_rate"]))
    else:
        _, val = hinge_terms(params["lam_rank_gig_a"], params["lam_rank_gig_b"], sc.rank_Ec,
                             sc.rank_Ec2, pr["lam_rate"])
        out["rank"] = jnp.sum(val)
    _, val = hinge_terms(params["lam_svm_gig_a"], params["lam_svm_gig_b"], jnp.sum(phi * sc.svm_Ec, 1),
                         jnp.sum(phi * sc.svm_Ec2, 1), pr["lam_rate"])
    out["svm"] = jnp.sum(val)
    return out


def _beta_entropy(a, b):
    # log B(a, b) from gammaln: jax.scipy.special.betaln is off by ~4e-7 (and its gradient by
    # ~1e-7) at moderate arguments, enough to make an exact coordinate update look suboptimal.
    return (gammaln(a) + gammaln(b) - gammaln(a + b) - (a - 1.0) * digamma(a) - (b - 1.0) * digamma(b)
            + (a + b - 2.0) * digamma(a + b))
