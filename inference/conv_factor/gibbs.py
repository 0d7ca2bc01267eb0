r"""Hand-derived block Gibbs updates for one layer of convolutional factor analysis
(:mod:`latentzoo.models.conv_factor`; supplement eqs. 1-14, corrected; derivations in
``docs/models/conv_factor.md``).

Sweep order: W (colour classes, :mod:`.shifts`), b, the joint (b, W) move (:mod:`.joint_b`), d,
pi, gamma, alpha, beta. Every update
recomputes the residual :math:`R_n = X_n - \sum_k b_{nk} W_{nk} * d_k` from the current values
(one batched convolution) and reads its hyperparameters from the model traced at those values.

- ``W``: exact scan over elements and colour classes (:func:`.shifts.draw_maps_coloured`); with
  ``b_nk = 0`` the map is drawn from its prior. ``w_update="parallel"`` is the supplement's
  all-shifts-at-once update (eqs. 6-7, not exact); ``pool=True`` the paper's max-pooling (outside
  the model).
- ``b_nk | W, d, gamma, pi`` (eqs. 1, 5): Bernoulli with log-odds
  :math:`\mathrm{logit}\,\pi_k + \gamma_n\langle R^{(-k)}_n, Y_{nk}\rangle - \tfrac{\gamma_n}2
  \lVert Y_{nk}\rVert^2`, :math:`Y_{nk} = W_{nk} * d_k`, :math:`R^{(-k)}` the residual without
  element k; elements in turn, images in parallel.
- ``(b_nk, W_nk)`` jointly: the birth/death Metropolis-Hastings move of :mod:`.joint_b` (not in
  the paper; ``joint_b=False`` leaves it out), which switches an element on with a map fitted to
  the residual, or off with a map from the prior.
- ``d_k | -`` (eqs. 8-10, corrected): Gaussian in the atom's C·h·w entries; channels are
  conditionally independent (the noise is white across channels), each an h·w Gaussian with
  precision :math:`\sum_n \gamma_n b_{nk} A_{nk}[u - u', v - v'] + \mathrm{diag}(\beta_{kc})`
  (A the autocorrelation of W_nk) and linear term :math:`\sum_n \gamma_n b_{nk}
  (R^{(-k)}_n \star W_{nk}) + \beta m`. Drawn jointly per atom by Cholesky; atoms in turn.
- ``pi_k | b``: Beta(1/K + Σ_n b_nk, b + N - Σ_n b_nk) (eq. 11).
- ``gamma_n | -``: Gamma(c + P/2, d + ‖R_n‖²/2), P = C·H·W (eq. 12 corrected).
- ``alpha, beta``: Gamma(e + 1/2, f + (w - m)²/2), Gamma(g + 1/2, h + (d - m)²/2) (eqs. 13-14),
  drawn by :func:`latentzoo.inference.gamma_draws.gamma_draw` (exact, vectorised) from the
  parameters of the conditional the update exposes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from latentzoo.inference.conjugate import beta_bernoulli_update, gamma_precision_posterior
from latentzoo.inference.gamma_draws import gamma_draw
from latentzoo.inference.gaussian import gaussian_draw, mvn_from_precision
from latentzoo.inference.tempering import temperature
from latentzoo.inference.updates import GibbsUpdate, prior_params, unwrap
from latentzoo.models.conv_factor import reconstruct

from .element_move import element_move as element_birth_death
from .joint_b import joint_b_move
from .shifts import draw_maps_coloured, draw_maps_parallel
from .terms import BERNOULLI, GAMMA, NORMAL, W_PRIOR, likelihood_precision, residual

__all__ = [
    "cfa_updates",
    "W_update",
    "b_update",
    "d_update",
    "gamma_update",
    "alpha_update",
    "beta_update",
    "residual",
    "b_logits",
    "atom_natural",
    "atom_conditional",
    "W_PRIOR",
]

_DIMS = ("NCHW", "OIHW", "NCHW")
W_UPDATES = ("exact", "parallel")


# ------------------------------------------------------------------------------------ W
def W_update(*, w_update: str = "exact", pool: bool = False, pool_size: int = 2) -> GibbsUpdate:
    """The maps' update: the exact colour-class scan, or the paper's parallel one; optional
    max-pooling (``pool``: outside the model, see :mod:`.shifts`)."""
    if w_update not in W_UPDATES:
        raise ValueError(f"w_update must be one of {W_UPDATES}, got {w_update!r}.")
    if pool and (isinstance(pool_size, bool) or int(pool_size) < 1):
        raise ValueError(f"pool_size must be a positive integer, got {pool_size!r}.")
    fn = draw_maps_coloured if w_update == "exact" else draw_maps_parallel
    size = int(pool_size) if pool else None

    def draw(key, values, obs, priors):
        W = values["W"]
        loc, prec = W_PRIOR(priors, W.shape)
        gamma = likelihood_precision(values, priors, W.shape[0])
        b = jnp.asarray(values["b"], W.dtype)
        W_new, _ = fn(key, W, residual(values, obs["X"]), b, values["d"], gamma, loc, prec,
                      pool_size=size)
        return {"W": W_new}

    label = "colour classes" if w_update == "exact" else "all shifts at once, not exact"
    if pool:
        label += f", max-pooled {size}x{size} (outside the model)"
    return GibbsUpdate(f"W | b, d, gamma, alpha ({label})", ("W",),
                       {"W": NORMAL, "X": NORMAL}, draw=draw, tempered=True)


# ------------------------------------------------------------------------------------ b
def b_logits(values, X, priors, k, R=None):
    """Log-odds of b_nk = 1 given everything else, (N,), and Y_nk = W_nk * d_k."""
    R = residual(values, X) if R is None else R
    W, d = values["W"], values["d"]
    b = jnp.asarray(values["b"], W.dtype)
    N, K = b.shape
    p = jnp.broadcast_to(unwrap(priors["b"]).probs, (N, K))[:, k]
    Y = reconstruct(W[:, k][:, None], d[k][None])
    R_k = R + b[:, k][:, None, None, None] * Y
    gamma = likelihood_precision(values, priors, N)
    llr = gamma * (jnp.sum(R_k * Y, (1, 2, 3)) - 0.5 * jnp.sum(Y * Y, (1, 2, 3)))
    return jnp.log(p) - jnp.log1p(-p) + llr, Y, R_k


def _b_draw(key, values, obs, priors):
    X = obs["X"]
    b0 = jnp.asarray(values["b"], X.dtype)
    K = b0.shape[1]

    def element(k, carry):
        b, R = carry
        logit, Y, R_k = b_logits({**values, "b": b}, X, priors, k, R)
        u = jax.random.uniform(jax.random.fold_in(key, k), logit.shape, X.dtype)
        new = (jnp.log(u) - jnp.log1p(-u) < logit).astype(X.dtype)  # u < sigmoid(logit)
        return b.at[:, k].set(new), R_k - new[:, None, None, None] * Y

    b, _ = jax.lax.fori_loop(0, K, element, (b0, residual({**values, "b": b0}, X)))
    return {"b": b.astype(jnp.result_type(values["b"]))}


def b_update() -> GibbsUpdate:
    return GibbsUpdate("b | W, d, gamma, pi (elements in turn)", ("b",),
                       {"b": BERNOULLI, "X": NORMAL}, draw=_b_draw, tempered=True)


# ------------------------------------------------------------------------------------ d
def atom_natural(values, X, priors, k, R=None):
    """Natural parameters of atom k's conditional: precision (C, hw, hw) and linear term (C, hw),
    and the residual without element k (N, C, H, W)."""
    W, d = values["W"], values["d"]
    K, C, h, w = d.shape
    R = residual(values, X) if R is None else R
    b = jnp.asarray(values["b"], W.dtype)
    gamma = likelihood_precision(values, priors, b.shape[0])
    bWk = b[:, k][:, None, None] * W[:, k]  # (N, H', W')
    R_k = R + reconstruct(bWk[:, None], d[k][None])
    V = (gamma[:, None, None] * bWk)[None]  # (1, N, H', W'): gamma_n b_nk W_nk (b^2 = b)
    # autocorrelation sum_n gamma_n b_nk sum_i W[i + s] W[i], lags s in (-(h-1)..h-1) x (...)
    padded = jnp.pad(bWk, ((0, 0), (h - 1, h - 1), (w - 1, w - 1)))[None]
    A = jax.lax.conv_general_dilated(padded, V, (1, 1), "VALID", dimension_numbers=_DIMS)[0, 0]
    u = jnp.arange(h)[:, None] - jnp.arange(h)[None, :] + h - 1
    v = jnp.arange(w)[:, None] - jnp.arange(w)[None, :] + w - 1
    G = A[u[:, None, :, None], v[None, :, None, :]].reshape(h * w, h * w)
    lin = jax.lax.conv_general_dilated(jnp.swapaxes(R_k, 0, 1), V, (1, 1), "VALID",
                                       dimension_numbers=_DIMS)[:, 0]  # (C, h, w)
    loc, scale = prior_params(priors["d"], d.shape, "loc", "scale")
    prec0 = (1.0 / scale[k] ** 2).reshape(C, h * w)
    P = G[None] + prec0[:, :, None] * jnp.eye(h * w, dtype=G.dtype)
    return P, lin.reshape(C, h * w) + prec0 * loc[k].reshape(C, h * w), R_k


def atom_conditional(values, X, priors, k):
    """Atom k's exact conditional as a NumPyro distribution over d[k] reshaped (C, h*w)."""
    P, lin, _ = atom_natural(values, X, priors, k)
    return mvn_from_precision(P, lin)


def _d_draw(key, values, obs, priors):
    X = obs["X"]
    d0 = values["d"]
    K, C, h, w = d0.shape
    b = jnp.asarray(values["b"], X.dtype)

    def atom(k, carry):
        d, R = carry
        vals = {**values, "d": d}
        P, lin, R_k = atom_natural(vals, X, priors, k, R)
        dk = gaussian_draw(jax.random.fold_in(key, k), P, lin).reshape(C, h, w)
        bWk = b[:, k][:, None, None] * values["W"][:, k]
        return d.at[k].set(dk), R_k - reconstruct(bWk[:, None], dk[None])

    d, _ = jax.lax.fori_loop(0, K, atom, (d0, residual(values, X)))
    return {"d": d}


def d_update() -> GibbsUpdate:
    return GibbsUpdate("d | W, b, gamma, beta (atoms in turn, each jointly)", ("d",),
                       {"d": NORMAL, "X": NORMAL}, draw=_d_draw, tempered=True)


# ------------------------------------------------------------------------ precisions
def _gamma_conditional(values, obs, priors):
    X = obs["X"]
    R = residual(values, X)
    N = X.shape[0]
    c0, d0 = prior_params(priors["gamma"], (N,), "concentration", "rate")
    P = X[0].size
    beta = temperature(priors["X"])  # p(x_n | .)^beta: beta P values' worth of shape and rate
    return {"gamma": gamma_precision_posterior(c0, d0, beta * P, beta * jnp.sum(R * R, (1, 2, 3)))}


def gamma_update() -> GibbsUpdate:
    """gamma_n ~ Gamma(c + P/2, d + ||R_n||^2 / 2): eq. 12 with its shape and rate corrected."""
    return GibbsUpdate("gamma | W, b, d", ("gamma",), {"gamma": GAMMA, "X": NORMAL},
                       _gamma_conditional, tempered=True)


def _precision_update(prec_site, site):
    def conditional(values, obs, priors):
        x = values[site]
        a0, r0 = prior_params(priors[prec_site], x.shape, "concentration", "rate")
        loc, = prior_params(priors[site], x.shape, "loc")
        return {prec_site: gamma_precision_posterior(a0, r0, 1.0, (x - loc) ** 2)}

    def draw(key, values, obs, priors):
        # the conditional's own parameters, drawn by the vectorised exact sampler: one Gamma per
        # coefficient (430 000 a sweep at 4 images 64x64, K = 32) is where jax.random.gamma's
        # per-element loop cost most of a CPU sweep
        post = conditional(values, obs, priors)[prec_site]
        x = gamma_draw(key, post.concentration, post.rate)
        return {prec_site: x.astype(jnp.result_type(values[prec_site]))}

    return GibbsUpdate(f"{prec_site} | {site}", (prec_site,),
                       {prec_site: GAMMA, site: NORMAL}, conditional, draw=draw,
                       tempered=True)  # reads no likelihood


def alpha_update() -> GibbsUpdate:
    """alpha_nki ~ Gamma(e + 1/2, f + w_nki^2 / 2) (eq. 13)."""
    return _precision_update("alpha", "W")


def beta_update() -> GibbsUpdate:
    """beta_kj ~ Gamma(g + 1/2, h + d_kj^2 / 2) (eq. 14)."""
    return _precision_update("beta", "d")


def cfa_updates(*, w_update: str = "exact", pool: bool = False, pool_size: int = 2,
                joint_b: bool = True, element_move: bool = False):
    """The update table in sweep order: W, b, the joint (b, W) move, d, pi, gamma, alpha, beta.

    ``w_update="exact"`` with ``pool=False`` is the exact sampler (what the Geweke/SBC tests
    prove); ``w_update="parallel"`` (supplement eqs. 6-7) and ``pool=True`` (max-pooling) are the
    paper's options, neither a draw from the posterior. ``joint_b``: the exact birth/death MH
    move of (b_nk, W_nk) (:mod:`.joint_b`) after b's update, so that elements switch on and off;
    False gives the paper's sampler (b drawn with its map fixed only). ``element_move``: the
    exact element birth/death MH move (:mod:`.element_move`) after it, which brings an unused
    element to life in one image with an atom cut from its residual, or retires one used once.
    """
    table = [W_update(w_update=w_update, pool=pool, pool_size=pool_size), b_update()]
    if joint_b:
        table.append(joint_b_move())
    if element_move:
        table.append(element_birth_death())
    # pi | b reads no likelihood: the same on the tempered path
    return table + [d_update(), beta_bernoulli_update("pi", "b")._replace(tempered=True), gamma_update(),
                    alpha_update(), beta_update()]
