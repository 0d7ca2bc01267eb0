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
  supplement's ⟨λ⁻¹⟩ = 1/abs(⟨c⟩) is a point plug-in of the Gibbs conditional (it ignores Var c), and
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
:func:`rank_svm_elbo`, :func:`fit_vb`. The single updates and their table ``BLOCKS`` are in
:mod:`latentzoo.inference.rank_svm.vb_blocks`, the moments and the ELBO's terms in
:mod:`latentzoo.inference.rank_svm.vb_moments`.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.distributions import constraints

from latentzoo.models.rank_factor_svm import VARIANTS, observed_data, rank_factor_svm
from latentzoo.inference.cavi import CAVI, CoordinateAscent, VariationalFit
from latentzoo.inference.gig import GeneralizedInverseGaussian
from latentzoo.inference.rank_svm.vb_blocks import (
    update_dp,
    update_lam,
    update_global,
    update_global_rate,
    update_tau,
    update_tpb,
    update_xi,
    update_z,
    update_A,
    update_beta,
)
from latentzoo.inference.rank_svm.vb_init import initial_params
from latentzoo.inference.rank_svm.vb_moments import Setup, elbo_terms, setup
from latentzoo.inference.validation import check_labelled

__all__ = [
    "rank_svm_guide",
    "rank_svm_vb",
    "rank_svm_sweep",
    "rank_svm_elbo",
    "rank_svm_elbo_terms",
    "fit_vb",
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


def _fill(p, data, y, pairs, st: Setup) -> dict:
    """The start's remaining factors by their coordinate updates: λ, τ, the shrinkage hierarchies
    (all but η, which would need the placeholder ξ's Bessel moments; compiled once less) and the DP
    factors."""
    p = update_lam(p, data, y, pairs, st)
    if st.gaussian:
        p = update_tau(p, data, y, pairs, st)
    for side in ("a", "beta"):
        p = update_global_rate(update_global(update_xi(p, st, side), st, side), st, side)
    if st.mixture:
        p = update_dp(p, data, y, pairs, st)
    return p


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
        # the data and tables are arguments of the compiled fill, never constants of it
        fill = jax.jit(lambda p, d, yy, pp: _fill(p, d, yy, pp, st))
        return fill(initial_params(rng_key, data, y, pairs, st), data, y, pairs)

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

    Returns :class:`~latentzoo.inference.cavi.VariationalFit` (``params``, ``losses`` = −ELBO
    after each sweep, ``guide``, ``model``). ``Predictive`` and ``Trace_ELBO`` on (``fit.model``,
    ``fit.guide``) take ``data, kw = observed_data(X, y, variant, priors)`` and
    ``(data, K=K, T=T, priors=priors, **kw)``.

    Raises one ValueError sentence for an unknown variant, labels other than −1 / +1, K not a
    positive integer, or X that is not a finite 2-D matrix with one label per row.
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
