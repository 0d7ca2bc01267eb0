r"""Hand-derived Gibbs updates for the Bayesian CVQ (:mod:`latentzoo.models.cvq`).

Notation: X (N, D), s (N, K) binary, W (D, K), pi (K,), tau = 1/sigma^2, residual
:math:`R = X - S W^\top`. Each conditional collects the terms of the joint density
:math:`\prod_n \mathcal N(x_n; W s_n, \tau^{-1} I)\,\mathrm{Bern}(s_n;\pi)\,p(W)p(\pi)p(\tau)` that
involve the block:

- ``s_n | W, pi, tau`` (rows independent): :math:`p(s_n\mid\cdot) \propto \exp(-\tfrac\tau2
  \lVert x_n - W s_n\rVert^2 + \sum_k s_{nk}\log\pi_k + (1-s_{nk})\log(1-\pi_k))` over the 2^K
  states. For K <= 12 it is drawn exactly from the enumerated table; for larger K the draw is a
  systematic scan of the single-site conditionals
  :math:`s_{nk}\mid s_{n,-k} \sim \mathrm{Bern}(g(\tau w_k^\top(x_n - \sum_{j\ne k}s_{nj}w_j) -
  \tfrac\tau2 w_k^\top w_k + \mathrm{logit}\,\pi_k))` (the lecture's E-step argument with samples
  in place of means), which leaves the block conditional invariant.
- ``w_d | s, tau`` (rows independent): :math:`\mathcal N(P^{-1}b_d, P^{-1})`, :math:`P =
  \mathrm{diag}(1/s_W^2) + \tau S^\top S`, :math:`b_d = m_W/s_W^2 + \tau S^\top x_{\cdot d}`.
- ``pi_k | s``: :math:`\mathrm{Beta}(a + \sum_n s_{nk},\ b + N - \sum_n s_{nk})`.
- ``tau | s, W``: :math:`\mathrm{Gamma}(a + ND/2,\ b + \tfrac12\lVert R\rVert_F^2)`.

Every update also samples the tempered posterior :math:`p(s, W, \pi, \tau)\, p(X \mid s, W,
\tau)^\beta` (:mod:`latentzoo.inference.tempering`; replica exchange, AIS), reading
:math:`\beta` from the likelihood site: :math:`\mathcal N(x; Ws, \tau^{-1}I)^\beta` is
:math:`\tau^{\beta D/2}\exp(-\tfrac{\beta\tau}2\lVert x - Ws\rVert^2)` up to a constant, so
``s`` and ``W`` see the noise precision :math:`\beta\tau` and ``tau``'s update becomes
:math:`\mathrm{Gamma}(a + \beta ND/2,\ b + \tfrac\beta2\lVert R\rVert_F^2)`; ``pi`` does not
read the likelihood.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpyro.distributions as dist


from latentzoo.inference.binary_draw import ENUM_MAX_K, draw_binary_block
from latentzoo.inference.enumerate import EnumeratedBinary, all_states
from latentzoo.inference.conjugate import beta_bernoulli_update, gamma_precision_posterior
from latentzoo.inference.gaussian import gaussian_draw, mvn_from_precision
from latentzoo.inference.tempering import temperature
from latentzoo.inference.updates import GibbsUpdate, prior_params, unwrap

from .em import sources_from_rows
from .moves import source_move
from .split_merge import split_merge_move

__all__ = ["cvq_updates", "s_update", "W_update", "pi_update", "tau_update", "init_from_data",
           "ENUM_MAX_K"]

NORMAL, GAMMA, BETA = (dist.Normal,), (dist.Gamma,), (dist.Beta,)
BERNOULLI = (dist.BernoulliProbs, dist.BernoulliLogits)  # dist.Bernoulli is a factory, not a class


def _s_prior_probs(priors, shape):
    return jnp.broadcast_to(unwrap(priors["s"]).probs, shape)  # BernoulliLogits has .probs too


def _s_logits(values, obs, priors):
    """(N, 2^K) log p(x_n, s) up to a constant in s, and the states (the likelihood tempered)."""
    X, W, tau = obs["X"], values["W"], temperature(priors["X"]) * values["tau"]
    N, K = values["s"].shape
    states = all_states(K, X.dtype)
    p = _s_prior_probs(priors, (N, K))
    M = states @ W.T  # (S, D)
    quad = -2.0 * X @ M.T + (M * M).sum(1)[None, :]
    lp = jnp.log(p) @ states.T + jnp.log1p(-p) @ (1.0 - states).T
    return -0.5 * tau * quad + lp, states


def s_conditional(values, obs, priors):
    return {"s": EnumeratedBinary(*_s_logits(values, obs, priors))}


def s_draw(key, values, obs, priors):
    X, W, tau = obs["X"], values["W"], temperature(priors["X"]) * values["tau"]
    s0 = jnp.asarray(values["s"], X.dtype)
    N, K = s0.shape
    p = _s_prior_probs(priors, (N, K))
    logit = jnp.log(p) - jnp.log1p(-p)
    G = (W * W).sum(0)

    def column(R, s, k):  # R = X - s Wᵀ; R_k leaves source k out
        w = W[:, k]
        R_k = R + s[:, k][:, None] * w[None, :]
        odds = tau * (R_k @ w) - 0.5 * tau * G[k] + logit[:, k]
        return odds, lambda new: R_k - new[:, None] * w[None, :]

    s = draw_binary_block(key, s0, lambda: s_conditional(values, obs, priors)["s"], column,
                          lambda: X - s0 @ W.T, max_K=ENUM_MAX_K)
    return {"s": s.astype(values["s"].dtype)}


def _W_natural(values, obs, priors):
    X, s = obs["X"], jnp.asarray(values["s"], obs["X"].dtype)
    tau = temperature(priors["X"]) * values["tau"]
    D, K = values["W"].shape
    loc0, scale0 = prior_params(priors["W"], (D, K), "loc", "scale")
    prec0 = 1.0 / scale0**2
    P = tau * (s.T @ s)[None] + prec0[:, :, None] * jnp.eye(K)  # (D, K, K)
    b = tau * (X.T @ s) + loc0 * prec0  # (D, K)
    return P, b


def _tau_conditional(values, obs, priors):
    X, s, W = obs["X"], values["s"], values["W"]
    N, D = X.shape
    a0, b0 = prior_params(priors["tau"], (), "concentration", "rate")
    r = X - s @ W.T
    beta = temperature(priors["X"])
    return {"tau": gamma_precision_posterior(a0, b0, beta * N * D, beta * (r * r).sum())}


def s_update() -> GibbsUpdate:
    return GibbsUpdate(
        "s | W, pi, tau", ("s",), {"s": BERNOULLI, "X": NORMAL}, s_conditional, s_draw, tempered=True
    )


def W_update() -> GibbsUpdate:
    return GibbsUpdate(
        "W | s, tau (rows)",
        ("W",),
        {"W": NORMAL, "X": NORMAL},
        lambda v, o, p: {"W": mvn_from_precision(*_W_natural(v, o, p))},
        lambda k, v, o, p: {"W": gaussian_draw(k, *_W_natural(v, o, p))},
        tempered=True,
    )


def pi_update() -> GibbsUpdate:
    return beta_bernoulli_update("pi", "s")._replace(tempered=True)  # reads no likelihood


def tau_update() -> GibbsUpdate:
    return GibbsUpdate("tau | s, W", ("tau",), {"tau": GAMMA, "X": NORMAL}, _tau_conditional, tempered=True)


def cvq_updates(*, with_source_move: bool = True, with_split_merge: bool | None = None) -> list:
    """The CVQ update table in sweep order: s, W, the collapsed source move
    (:func:`latentzoo.inference.cvq.moves.source_move`, which switches sources on and off), the
    split-merge move (:func:`latentzoo.inference.cvq.split_merge.split_merge_move`, which splits a
    source that holds two images into a free one, and merges two sources), pi, tau.
    ``with_source_move=False``: the conditionals alone;
    ``with_split_merge`` (default: as ``with_source_move``) adds or leaves out the split-merge
    move on its own."""
    if with_split_merge is None:
        with_split_merge = with_source_move
    table = [s_update(), W_update(), pi_update(), tau_update()]
    moves = ([source_move()] if with_source_move else []) + ([split_merge_move()] if with_split_merge else [])
    table[2:2] = moves
    return table


# ------------------------------------------------------------------------------ start
def init_from_data(key, X, *, K: int) -> dict:
    """A data-driven starting state (pass as ``init_params``; vmap over keys for several chains).

    W's columns are K distinct data rows, halved (the start of the point fits,
    :mod:`latentzoo.inference.cvq.em`: a source is a positive part of the images), plus noise at
    a tenth of the data's scale; ``pi = 1/2``; ``tau`` the inverse mean square of the data; ``s``
    all off, so that the sweep's first update (``s | W, pi, tau``) switches on the sources each
    row's image holds. Why: from NumPyro's default start (uniform on (-2, 2) in every entry of W)
    each source's image is far larger than [0, 1]-scaled data, so the first sweep switches every
    source off, ``pi`` falls to about 1/N, and three of four chains on scikit-learn's digits
    (500 x 64, scaled to [0, 1]) stayed there, every source off (sigma 0.488), while the fourth
    found the sources. Each key picks other rows: the chains start apart.
    Shapes: X (N, D) -> pi (K,), W (D, K), tau (), s (N, K).
    """
    N, D = X.shape
    if not 1 <= K <= N:
        raise ValueError(f"The number of sources K must be between 1 and N = {N}, got {K}.")
    W = sources_from_rows(key, X, K)
    scale = jnp.sqrt(jnp.mean(X * X)) + jnp.finfo(X.dtype).tiny
    return {
        "pi": jnp.full((K,), 0.5, X.dtype),
        "W": W,
        "tau": 1.0 / scale**2,
        "s": jnp.zeros((N, K), X.dtype),
    }
