r"""Mean-field variational Bayes (CAVI) for one layer of convolutional factor analysis
(:func:`latentzoo.models.conv_factor.conv_factor`, ``pool=False``: the model as written;
supplement eqs. 15-21, corrected; derivations in ``docs/models/conv_factor_vb.md``).

**Mean field** (:func:`cfa_guide`): :math:`q = \prod_k \mathrm{Beta}(\pi_k)\,\mathcal N(d_k)
\prod_{c,j}\mathrm{Ga}(\beta_{kcj}) \prod_n \mathrm{Ga}(\gamma_n) \prod_{n,k}
\mathrm{Bernoulli}(b_{nk}) \prod_{n,k,i}\mathcal N(w_{nki})\,\mathrm{Ga}(\alpha_{nki})`.
q(d_k) is one Gaussian per atom. Its optimum given the rest has zero covariance between channels
(the noise is white, so :math:`\lVert W * d\rVert^2` is a sum over channels), so it is stored as C
full h·w Gaussians (``d_scale_tril`` (K, C, hw, hw)): the exact coordinate-ascent step for the
atom factor. The supplement's eq. 17 is the per-coordinate (diagonal) form, updating every
coordinate from one residual: with the coordinates of an atom coupled through the maps'
autocorrelation that is not a coordinate-ascent step.

**Sweep** (:data:`CAVI_BLOCKS`, each block the exact maximiser of the ELBO given the others, so
the ELBO never decreases): q(W, b) per image (elements in turn; each element's map by colour
classes of non-overlapping shifts, then its switch; :func:`.vb_moments.local_maps`, vmapped over
images), q(alpha) = Ga(e + 1/2, f + <(w - w0)²>/2) (eq. 21), q(gamma_n) = Ga(c + P/2, d +
E‖X_n - Σ_k b W * d‖²/2) (eq. 19), q(d_k) atoms in turn (precision Σ_n <γ_n>ρ_nk Toeplitz(A(μ_nk)
+ δ₀Σ s) + diag<β>, linear term Σ_n <γ_n>ρ_nk Z_nk ⋆ μ_nk; eq. 17 corrected), q(beta) =
Ga(g + 1/2, h + <(d - d0)²>/2) (eq. 20), q(pi_k) = Beta(a + Σ_n ρ_nk, b + N - Σ_n ρ_nk) (eq. 16).

Hyperparameters are read from the model's trace on every call (:func:`read_cfa_priors`), so an
edited prior in ``models/conv_factor.py`` or ``priors={...}`` changes the updates; a changed
prior *family* makes its block fall back to SVI steps (:mod:`latentzoo.inference.cavi_blocks`).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from jax.scipy.special import betaln, digamma, xlogy
from numpyro.distributions import constraints
from numpyro.distributions.transforms import ReshapeTransform

from latentzoo.models.conv_factor import conv_factor, map_shape, reconstruct
from latentzoo.inference.cavi import CAVI, CoordinateAscent, VariationalFit
from latentzoo.inference.cavi_blocks import CAVIBlock, coordinate_ascent
from latentzoo.inference.conjugate import (
    beta_log_moments,
    gamma_entropy,
    gamma_expected_log_prior,
    gamma_moments,
)
from latentzoo.inference.gaussian import LOG_2PI, cov_from_tril, gaussian_block, gaussian_entropy
from latentzoo.inference.gibbs import read_model
from latentzoo.inference.updates import prior_params

from .vb_moments import atom_moments, atom_stats, expected_sq_resid, local_maps, toeplitz

__all__ = [
    "CFAPriors",
    "read_cfa_priors",
    "validate_cfa_images",
    "cfa_guide",
    "cfa_init",
    "cfa_elbo",
    "cfa_elbo_terms",
    "moments_of",
    "CAVI_BLOCKS",
    "cfa_cavi",
    "fit_vb",
    "reconstruction",
]

NORMAL, GAMMA, BETA = (dist.Normal,), (dist.Gamma,), (dist.Beta,)
BERNOULLI = (dist.BernoulliProbs, dist.BernoulliLogits)


# ------------------------------------------------------------------------ priors and data
class CFAPriors(NamedTuple):
    """Hyperparameters read from the model: ``pi_a, pi_b`` (K,) Beta; ``c, d`` (N,) gamma's
    shape and rate; ``e, f`` (N, K, H', W') alpha's; ``g, h`` (K, C, h, w) beta's; ``W_loc``,
    ``d_loc`` the coefficients' and atoms' prior means (0 in the paper)."""

    pi_a: jax.Array
    pi_b: jax.Array
    c: jax.Array
    d: jax.Array
    e: jax.Array
    f: jax.Array
    g: jax.Array
    h: jax.Array
    W_loc: jax.Array
    d_loc: jax.Array


def _shapes(X, K, atom_shape):
    N, C, H, Wd = X.shape
    h, w = atom_shape
    Hp, Wp = map_shape((H, Wd), (h, w))
    return N, C, h, w, Hp, Wp


def read_cfa_priors(model, X, *, K, atom_shape=(3, 3), priors=None, **_) -> CFAPriors:
    """Trace ``model(X, K=K, atom_shape=atom_shape, priors=priors)`` and read its hyperparameters
    (no family check here: each block's ``requires`` does that)."""
    N, C, h, w, Hp, Wp = _shapes(X, K, atom_shape)
    values = {"pi": jnp.full(K, 0.5), "beta": jnp.ones((K, C, h, w)), "d": jnp.zeros((K, C, h, w)),
              "gamma": jnp.ones(N), "b": jnp.zeros((N, K)), "alpha": jnp.ones((N, K, Hp, Wp)),
              "W": jnp.zeros((N, K, Hp, Wp))}
    fns, _, _ = read_model(model, values, (X,), dict(K=K, atom_shape=atom_shape, priors=priors))
    pi_a, pi_b = _hyper(fns["pi"], (K,), "concentration1", "concentration0", BETA)
    c, d = _hyper(fns["gamma"], (N,), "concentration", "rate", GAMMA)
    e, f = _hyper(fns["alpha"], (N, K, Hp, Wp), "concentration", "rate", GAMMA)
    g, hh = _hyper(fns["beta"], (K, C, h, w), "concentration", "rate", GAMMA)
    W_loc, = prior_params(fns["W"], (N, K, Hp, Wp), "loc")
    d_loc, = prior_params(fns["d"], (K, C, h, w), "loc")
    # strong float64: weak-typed start params would recompile the driver's sweep once
    return CFAPriors(*(jnp.asarray(a, jnp.float64) for a in (pi_a, pi_b, c, d, e, f, g, hh, W_loc, d_loc)))


def _hyper(fn, shape, a, b, family):
    """The two parameters of a Beta/Gamma prior; for a user's other family, moment-matched values
    that only start its factor (its block then falls back to SVI)."""
    from latentzoo.inference.updates import unwrap

    base = unwrap(fn)
    if isinstance(base, family):
        return prior_params(fn, shape, a, b)
    mean, var = jnp.broadcast_to(base.mean, shape), jnp.broadcast_to(base.variance, shape)
    if family is BETA:
        t = mean * (1 - mean) / var - 1.0
        return mean * t, (1 - mean) * t
    return mean**2 / var, mean / var


def validate_cfa_images(X, *, K, atom_shape=(3, 3), **_) -> jax.Array:
    """Images as float64 (N, C, H, W) ((N, H, W) is one channel); one-sentence ValueError for
    another shape, NaN or inf, K not a positive integer, or atoms that do not fit."""
    X = np.asarray(X, dtype=np.float64)
    if X.ndim == 3:
        X = X[:, None]
    if X.ndim != 4 or min(X.shape) < 1:
        raise ValueError(f"convolutional FA needs images shaped (N, C, H, W), got shape {X.shape}.")
    if not np.all(np.isfinite(X)):
        raise ValueError("the images contain NaN or infinite values.")
    if isinstance(K, bool) or not isinstance(K, (int, np.integer)) or K < 1:
        raise ValueError(f"K must be a positive integer, got {K!r}.")
    h, w = atom_shape
    if not (1 <= h <= X.shape[2] and 1 <= w <= X.shape[3]):
        raise ValueError(f"atoms {h}x{w} do not fit in {X.shape[2]}x{X.shape[3]} images.")
    return jnp.asarray(X)


# ------------------------------------------------------------------------------ the guide
def _gamma(name, shape):
    a = numpyro.param(f"{name}_concentration", jnp.ones(shape), constraint=constraints.positive)
    r = numpyro.param(f"{name}_rate", jnp.ones(shape), constraint=constraints.positive)
    return dist.Gamma(a, r)


def cfa_guide(X=None, *, K, atom_shape=(3, 3), N=None, image_shape=None, priors=None):
    """The mean-field guide; the model's arguments, so ``Trace_ELBO`` and ``Predictive`` take one
    set. Params: ``pi_concentration1``, ``pi_concentration0`` (K,); ``beta_concentration``,
    ``beta_rate``, ``d_loc`` (K, C, h, w), ``d_scale_tril`` (K, C, hw, hw); ``gamma_*`` (N,);
    ``b_probs`` (N, K); ``alpha_*``, ``W_loc``, ``W_scale`` (N, K, H', W')."""
    if X is not None:
        N, (C, H, Wd) = X.shape[0], X.shape[1:]
    else:
        C, H, Wd = image_shape
    h, w = atom_shape
    Hp, Wp = map_shape((H, Wd), (h, w))
    a1 = numpyro.param("pi_concentration1", jnp.ones(K), constraint=constraints.positive)
    a0 = numpyro.param("pi_concentration0", jnp.ones(K), constraint=constraints.positive)
    numpyro.sample("pi", dist.Beta(a1, a0).to_event(1))
    numpyro.sample("beta", _gamma("beta", (K, C, h, w)).to_event(4))
    d_loc = numpyro.param("d_loc", jnp.zeros((K, C, h, w)))
    tril = numpyro.param("d_scale_tril", jnp.broadcast_to(jnp.eye(h * w), (K, C, h * w, h * w)),
                         constraint=constraints.lower_cholesky)
    base = dist.MultivariateNormal(d_loc.reshape(K, C, h * w), scale_tril=tril).to_event(2)
    numpyro.sample("d", dist.TransformedDistribution(base, ReshapeTransform((K, C, h, w), (K, C, h * w))))
    with numpyro.plate("N", N, dim=-1):
        numpyro.sample("gamma", _gamma("gamma", (N,)))
        probs = numpyro.param("b_probs", jnp.full((N, K), 0.5), constraint=constraints.unit_interval)
        numpyro.sample("b", dist.Bernoulli(probs=probs).to_event(1))
        numpyro.sample("alpha", _gamma("alpha", (N, K, Hp, Wp)).to_event(3))
        loc = numpyro.param("W_loc", jnp.zeros((N, K, Hp, Wp)))
        scale = numpyro.param("W_scale", jnp.ones((N, K, Hp, Wp)), constraint=constraints.positive)
        numpyro.sample("W", dist.Normal(loc, scale).to_event(3))


# ---------------------------------------------------------------------------- moments
def moments_of(params):
    """The atom moments the local step reads (:class:`~.vb_moments.AtomMoments`)."""
    Elog_pi, Elog_1m = beta_log_moments(params["pi_concentration1"], params["pi_concentration0"])
    return atom_moments(params["d_loc"], cov_from_tril(params["d_scale_tril"]), Elog_pi - Elog_1m)


def _E(params, name):
    return gamma_moments(params[f"{name}_concentration"], params[f"{name}_rate"])


def reconstruction(params):
    """The expected reconstruction sum_k rho_nk mu_nk * m_k (N, C, H, W)."""
    bW = params["b_probs"][:, :, None, None] * params["W_loc"]
    return reconstruct(bW, params["d_loc"])


# --------------------------------------------------------------------------------- blocks
def update_Wb(params, X, pri: CFAPriors) -> dict:
    """q(W_n), q(b_n) for every image (vmapped :func:`~.vb_moments.local_maps`)."""
    am = moments_of(params)
    E_alpha, _ = _E(params, "alpha")
    E_gamma, _ = _E(params, "gamma")
    step = jax.vmap(local_maps, in_axes=(0, 0, 0, 0, 0, 0, 0, None))
    mu, s, rho = step(X, params["W_loc"], params["W_scale"] ** 2, params["b_probs"], E_alpha,
                      E_gamma, pri.W_loc, am)
    return {**params, "W_loc": mu, "W_scale": jnp.sqrt(s), "b_probs": rho}


def update_alpha(params, X, pri: CFAPriors) -> dict:
    """q(alpha_nki) = Ga(e + 1/2, f + ((mu - w0)^2 + s)/2) (eq. 21)."""
    sq = (params["W_loc"] - pri.W_loc) ** 2 + params["W_scale"] ** 2
    return {**params, "alpha_concentration": pri.e + 0.5, "alpha_rate": pri.f + 0.5 * sq}


def sq_resid(params, X):
    """E_q ||X_n - sum_k b W * d||^2 per image (N,)."""
    am = moments_of(params)
    return jax.vmap(expected_sq_resid, in_axes=(0, 0, 0, 0, None))(
        X, params["W_loc"], params["W_scale"] ** 2, params["b_probs"], am)


def update_gamma(params, X, pri: CFAPriors) -> dict:
    """q(gamma_n) = Ga(c + P/2, d + E||X_n - ...||^2 / 2) (eq. 19, P = C H W)."""
    P = X[0].size
    return {**params, "gamma_concentration": pri.c + 0.5 * P,
            "gamma_rate": pri.d + 0.5 * sq_resid(params, X)}


def update_d(params, X, pri: CFAPriors) -> dict:
    """q(d_k), atoms in turn, each a full Gaussian per channel (module docstring; eq. 17
    corrected). The residual is carried between atoms so each uses the others' new means."""
    K, C, h, w = params["d_loc"].shape
    mu, s, rho = params["W_loc"], params["W_scale"] ** 2, params["b_probs"]
    E_gamma, _ = _E(params, "gamma")
    E_beta, _ = _E(params, "beta")
    R = X - reconstruction(params)
    stats = jax.vmap(atom_stats)

    def atom(k, carry):
        loc, tril, R = carry
        Y = reconstruct(mu[:, k][:, None], loc[k][None])
        Z = R + rho[:, k][:, None, None, None] * Y
        A, lin = stats(Z, mu[:, k], s[:, k], E_gamma * rho[:, k])
        eb = E_beta[k].reshape(C, h * w)
        P = toeplitz(A.sum(0), h, w)[None] + eb[:, :, None] * jnp.eye(h * w)
        b = lin.sum(0).reshape(C, h * w) + eb * pri.d_loc[k].reshape(C, h * w)
        mean, T = gaussian_block(P, b)
        mean = mean.reshape(C, h, w)
        R = Z - rho[:, k][:, None, None, None] * reconstruct(mu[:, k][:, None], mean[None])
        return loc.at[k].set(mean), tril.at[k].set(T), R

    loc, tril, _ = jax.lax.fori_loop(0, K, atom, (params["d_loc"], params["d_scale_tril"], R))
    return {**params, "d_loc": loc, "d_scale_tril": tril}


def update_beta(params, X, pri: CFAPriors) -> dict:
    """q(beta_kj) = Ga(g + 1/2, h + ((m - d0)^2 + S_jj)/2) (eq. 20)."""
    K, C, h, w = params["d_loc"].shape
    var = jnp.diagonal(cov_from_tril(params["d_scale_tril"]), axis1=-2, axis2=-1).reshape(K, C, h, w)
    sq = (params["d_loc"] - pri.d_loc) ** 2 + var
    return {**params, "beta_concentration": pri.g + 0.5, "beta_rate": pri.h + 0.5 * sq}


def update_pi(params, X, pri: CFAPriors) -> dict:
    """q(pi_k) = Beta(a + sum_n rho_nk, b + N - sum_n rho_nk) (eq. 16)."""
    ones = params["b_probs"].sum(0)
    N = params["b_probs"].shape[0]
    return {**params, "pi_concentration1": pri.pi_a + ones, "pi_concentration0": pri.pi_b + N - ones}


CAVI_BLOCKS: tuple[CAVIBlock, ...] = (
    CAVIBlock("q(W, b)", ("W", "b"), {"W": NORMAL, "b": BERNOULLI, "X": NORMAL}, update_Wb,
              ("W_loc", "W_scale", "b_probs")),
    CAVIBlock("q(alpha)", ("alpha",), {"alpha": GAMMA, "W": NORMAL}, update_alpha,
              ("alpha_concentration", "alpha_rate")),
    CAVIBlock("q(gamma)", ("gamma",), {"gamma": GAMMA, "X": NORMAL}, update_gamma,
              ("gamma_concentration", "gamma_rate")),
    CAVIBlock("q(d)", ("d",), {"d": NORMAL, "X": NORMAL}, update_d, ("d_loc", "d_scale_tril")),
    CAVIBlock("q(beta)", ("beta",), {"beta": GAMMA, "d": NORMAL}, update_beta,
              ("beta_concentration", "beta_rate")),
    CAVIBlock("q(pi)", ("pi",), {"pi": BETA, "b": BERNOULLI}, update_pi,
              ("pi_concentration1", "pi_concentration0")),
)


# ---------------------------------------------------------------------------------- ELBO
def _beta_entropy(a, b):
    return betaln(a, b) - (a - 1) * digamma(a) - (b - 1) * digamma(b) + (a + b - 2) * digamma(a + b)


def _normal_gamma_prior(loc0, mean, var, E_prec, E_log_prec):
    """E_q log N(theta; loc0, 1/tau) with tau ~ q independent of theta, elementwise."""
    return 0.5 * (E_log_prec - LOG_2PI) - 0.5 * E_prec * ((mean - loc0) ** 2 + var)


def cfa_elbo_terms(params, X, pri: CFAPriors) -> dict:
    """The analytic ELBO as terms: ``"X"`` the expected log-likelihood, one expected log prior
    per latent site under its name, ``"entropy"`` H[q]."""
    P = X[0].size
    K, C, h, w = params["d_loc"].shape
    E_g, El_g = _E(params, "gamma")
    E_a, El_a = _E(params, "alpha")
    E_b, El_b = _E(params, "beta")
    a1, a0 = params["pi_concentration1"], params["pi_concentration0"]
    Elp, El1mp = beta_log_moments(a1, a0)
    rho = params["b_probs"]
    mu, sd = params["W_loc"], params["W_scale"]
    T = params["d_scale_tril"]
    d_var = jnp.diagonal(cov_from_tril(T), axis1=-2, axis2=-1).reshape(K, C, h, w)
    a_b = params["beta_concentration"]
    return {
        "X": jnp.sum(0.5 * P * (El_g - LOG_2PI) - 0.5 * E_g * sq_resid(params, X)),
        "pi": jnp.sum((pri.pi_a - 1) * Elp + (pri.pi_b - 1) * El1mp - betaln(pri.pi_a, pri.pi_b)),
        "b": jnp.sum(rho * Elp + (1 - rho) * El1mp),
        "W": jnp.sum(_normal_gamma_prior(pri.W_loc, mu, sd**2, E_a, El_a)),
        "alpha": jnp.sum(gamma_expected_log_prior(pri.e, pri.f, E_a, El_a)),
        "d": jnp.sum(_normal_gamma_prior(pri.d_loc, params["d_loc"], d_var, E_b, El_b)),
        "beta": jnp.sum(gamma_expected_log_prior(pri.g, pri.h, E_b, El_b)),
        "gamma": jnp.sum(gamma_expected_log_prior(pri.c, pri.d, E_g, El_g)),
        "entropy": (
            jnp.sum(_beta_entropy(a1, a0))
            - jnp.sum(xlogy(rho, rho) + xlogy(1 - rho, 1 - rho))
            + jnp.sum(0.5 * (1.0 + LOG_2PI) + jnp.log(sd))
            + gaussian_entropy(T)
            + jnp.sum(gamma_entropy(params["alpha_concentration"], params["alpha_rate"]))
            + jnp.sum(gamma_entropy(a_b, params["beta_rate"]))
            + jnp.sum(gamma_entropy(params["gamma_concentration"], params["gamma_rate"]))
        ),
    }


def cfa_elbo(params, X, pri: CFAPriors):
    """The analytic ELBO (scalar)."""
    return sum(cfa_elbo_terms(params, X, pri).values())


# ---------------------------------------------------------------------------------- start
def random_patches(key, X, K, atom_shape):
    """K atoms cut from random places of random images, scaled to unit norm (a pure-noise
    direction where a patch is constant zero): a start on the data's own structures."""
    N, C, H, Wd = X.shape
    h, w = atom_shape
    kn, ki, kj, kz = jax.random.split(key, 4)
    n = jax.random.randint(kn, (K,), 0, N)
    i = jax.random.randint(ki, (K,), 0, H - h + 1)
    j = jax.random.randint(kj, (K,), 0, Wd - w + 1)
    cut = jax.vmap(lambda n, i, j: jax.lax.dynamic_slice(X[n], (0, i, j), (C, h, w)))(n, i, j)
    cut = cut - cut.mean((1, 2, 3), keepdims=True) * (C * h * w > 1)
    cut = cut + 1e-3 * jax.random.normal(kz, cut.shape, cut.dtype)  # no zero atom
    return cut / jnp.sqrt(jnp.sum(cut**2, (1, 2, 3), keepdims=True))


def start_locals(X, K, atom_shape, pri_c, pri_e):
    """Per-image factors before any update: maps at 0 with unit variance, switches at 1/2,
    <alpha> = 1 (the prior's mean e/f = 1000 at the defaults would hold every map at 0 before
    the atoms have a chance), <gamma_n> = 10 / var(X_n) (noise a tenth of the image's variance)."""
    N, C, H, Wd = X.shape
    Hp, Wp = map_shape((H, Wd), atom_shape)
    var = jnp.maximum(X.reshape(N, -1).var(1), 1e-6 * jnp.maximum(X.var(), 1e-300))
    var = jnp.where(var > 0, var, 1.0)
    ga = pri_c + 0.5 * X[0].size
    aa = jnp.broadcast_to(pri_e + 0.5, (N, K, Hp, Wp))
    return {"W_loc": jnp.zeros((N, K, Hp, Wp)), "W_scale": jnp.ones((N, K, Hp, Wp)),
            "b_probs": jnp.full((N, K), 0.5), "alpha_concentration": aa, "alpha_rate": aa,
            "gamma_concentration": ga, "gamma_rate": 0.1 * ga * var}


def cfa_init(rng_key, X, pri: CFAPriors, *, K, atom_shape=(3, 3), **_) -> dict:
    """Start: atoms from random patches (:func:`random_patches`) with small covariances,
    <beta> = 1, q(pi) at the prior plus N/2 ones, the per-image factors of :func:`start_locals`;
    the first sweep updates the maps first."""
    N, C, H, Wd = X.shape
    h, w = atom_shape
    gb = pri.g + 0.5
    return {
        **start_locals(X, K, atom_shape, pri.c, pri.e),
        "pi_concentration1": pri.pi_a + 0.5 * N, "pi_concentration0": pri.pi_b + 0.5 * N,
        "d_loc": random_patches(rng_key, X, K, atom_shape),
        "d_scale_tril": jnp.broadcast_to(0.01 * jnp.eye(h * w), (K, C, h * w, h * w)),
        "beta_concentration": gb, "beta_rate": gb,
    }


# --------------------------------------------------------------------------------- recipe
class CFAVariational(NamedTuple):
    """The guide, the :class:`~latentzoo.inference.cavi.CoordinateAscent` recipe and its block
    table."""

    guide: object
    algorithm: CoordinateAscent
    blocks: tuple


def cfa_cavi(model=conv_factor, blocks=None) -> CFAVariational:
    """Mean-field CAVI for ``model`` (default: the zoo's one-layer convolutional FA); ``blocks``
    replaces the table (default :data:`CAVI_BLOCKS`).

    Example::

        vb = cfa_cavi()
        result = CAVI(conv_factor, vb.guide, vb.algorithm).run(key, 200, X, K=8, atom_shape=(3, 3))
    """
    blocks = tuple(CAVI_BLOCKS if blocks is None else blocks)
    algo = coordinate_ascent(model, blocks, cfa_init, cfa_elbo_terms, read_cfa_priors,
                             guide=cfa_guide, validate=lambda X, **kw: (validate_cfa_images(X, **kw),))
    return CFAVariational(cfa_guide, algo, blocks)


def fit_vb(X, *, K: int, atom_shape=(3, 3), num_steps: int = 200, seed: int = 0, priors=None,
           rtol: float = 1e-8, restarts: int = 1, progress_bar: bool = False,
           on_decrease: str = "raise") -> VariationalFit:
    """Fit one layer by CAVI on images X (N, C, H, W) ((N, H, W): one channel). Stops when the
    relative ELBO change falls below ``rtol``. Returns
    :class:`~latentzoo.inference.cavi.VariationalFit`; ``Predictive`` and ``Trace_ELBO`` on
    (``fit.model``, ``fit.guide``) take ``(X, K=K, atom_shape=atom_shape, priors=priors)``.
    """
    X = validate_cfa_images(X, K=K, atom_shape=atom_shape)
    atom_shape = tuple(int(a) for a in atom_shape)
    vb = cfa_cavi()
    driver = CAVI(conv_factor, vb.guide, vb.algorithm, on_decrease=on_decrease)
    result = driver.run(jax.random.PRNGKey(seed), num_steps, X, K=int(K), atom_shape=atom_shape,
                        priors=priors, progress_bar=progress_bar, rtol=rtol, restarts=restarts)
    return VariationalFit(result, vb.guide, conv_factor)
