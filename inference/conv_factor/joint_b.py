r"""The joint :math:`(b_{nk}, W_{nk})` birth/death move of convolutional factor analysis: an exact
Metropolis-Hastings step that switches an element on together with a fitted map, or off
together with a map from the prior (derivation also in ``docs/models/conv_factor.md``).

Why: the supplement's eq. 5 draws :math:`b_{nk}` with its map fixed. An element that is off has
its map drawn from the prior, which rarely explains the image, so it almost never switches on;
one that is on has a fitted map and rarely switches off. b and pi then mix slowly and the
beta-Bernoulli prior's pruning is not seen in practice.

**Target.** With everything but :math:`(b_{nk}, W_{nk})` fixed and :math:`R^{(-k)}_n` the residual
without element k (it depends on neither), the joint conditional of one image's pair is

.. math::

    p(b, W \mid -) \propto \pi_k^b (1-\pi_k)^{1-b}\, p(W\mid\alpha_{nk})\,
    \exp\!\big(-\tfrac{\gamma_n}2 \lVert R^{(-k)}_n - b\,W * d_k\rVert^2\big).

**Proposal.** :math:`q(W' \mid R^{(-k)}_n, d_k, \gamma_n, \alpha_{nk}, m_{nk})`: the exact
colour-class scan of :mod:`.shifts` run with :math:`b = 1`, from maps at 0 and residual
:math:`R^{(-k)}_n` (:func:`.shifts.scan_from_zero`); q is the product over classes of the
Normal conditionals used at each (each reads only earlier classes), so it is a proper density
that depends on neither the current map nor the current switch.

- *Birth* (:math:`b = 0 \to 1`, :math:`W' \sim q`; the reverse death draws the old map from the
  prior, whose density cancels the old map's prior term):

  .. math::

      \log r(W') = \mathrm{logit}\,\pi_k - \tfrac{\gamma_n}2\big(\lVert R^{(-k)}_n - W' * d_k
      \rVert^2 - \lVert R^{(-k)}_n\rVert^2\big) + \log p(W'\mid\alpha) - \log q(W').

- *Death* (:math:`b = 1 \to 0`, new map :math:`W'' \sim p(\cdot\mid\alpha)`): acceptance
  :math:`\min(1, 1/r(W))` at the current map W, with :math:`\log q(W)` the density of the same
  scan forced through W.

Birth and death are each other's reverse, so detailed balance holds for the joint conditional
above. Images are independent given the atoms (done in parallel, one scan forces the images
that are on and draws for the others); elements follow in turn through the residual.
Cost: one colour scan per element, about as much as the W update.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from latentzoo.inference.updates import Move, unwrap
from latentzoo.models.conv_factor import reconstruct

from .terms import BERNOULLI, NORMAL, W_PRIOR, likelihood_precision, residual
from .shifts import scan_from_zero

__all__ = ["joint_b_move", "birth_log_ratio"]


def _log_prior(Wk, loc_k, prec_k):
    """log p(W_nk | alpha) summed over the map, (N,)."""
    lp = 0.5 * (jnp.log(prec_k) - jnp.log(2 * jnp.pi) - prec_k * (Wk - loc_k) ** 2)
    return jnp.sum(lp, (1, 2))


def birth_log_ratio(key, values, X, priors, k, R=None, *, drop=()):
    """log r of element k for every image (module docstring), at a fresh draw W' ~ q for the
    images with b_nk = 0 and at the current map for those with b_nk = 1.

    Returns (log r (N,), maps (N, H', W'), R_k - maps * d_k, R_k). ``drop`` names terms to leave
    out ("log_q", "log_prior"): wrong moves kept as the tests' controls.
    """
    W, d = values["W"], values["d"]
    b = jnp.asarray(values["b"], W.dtype)
    N, K = b.shape
    R = residual(values, X) if R is None else R
    loc, prec = W_PRIOR(priors, W.shape)
    gamma = likelihood_precision(values, priors, N)
    p = jnp.broadcast_to(unwrap(priors["b"]).probs, (N, K))[:, k]
    bk, Wk = b[:, k], W[:, k]
    R_k = R + reconstruct((bk[:, None, None] * Wk)[:, None], d[k][None])
    maps, log_q, R_new = scan_from_zero(key, Wk, R_k, bk > 0, d[k], gamma, loc[:, k], prec[:, k])
    llr = -0.5 * gamma * (jnp.sum(R_new**2, (1, 2, 3)) - jnp.sum(R_k**2, (1, 2, 3)))
    log_r = jnp.log(p) - jnp.log1p(-p) + llr
    if "log_prior" not in drop:
        log_r = log_r + _log_prior(maps, loc[:, k], prec[:, k])
    if "log_q" not in drop:
        log_r = log_r - log_q
    return log_r, maps, R_new, R_k


def _step(drop=()):
    def step(key, values, obs, priors):
        X = obs["X"]
        W0 = values["W"]
        b0 = jnp.asarray(values["b"], X.dtype)
        loc, prec = W_PRIOR(priors, W0.shape)

        def element(k, carry):
            b, W, R = carry
            kq, kp, ku = jax.random.split(jax.random.fold_in(key, k), 3)
            vals = {**values, "b": b, "W": W}
            log_r, maps, R_new, R_k = birth_log_ratio(kq, vals, X, priors, k, R, drop=drop)
            on = b[:, k] > 0
            log_a = jnp.where(on, -log_r, log_r)  # death: the reverse of a birth to the current W
            flip = jnp.log(jax.random.uniform(ku, on.shape, X.dtype)) < log_a
            fresh = loc[:, k] + jax.random.normal(kp, maps.shape, X.dtype) / jnp.sqrt(prec[:, k])
            now_on = on ^ flip
            Wk = jnp.where((flip & on)[:, None, None], fresh,
                           jnp.where((flip & ~on)[:, None, None], maps, W[:, k]))
            R = jnp.where(now_on[:, None, None, None], R_new, R_k)  # maps == W[:, k] where on
            return b.at[:, k].set(now_on.astype(X.dtype)), W.at[:, k].set(Wk), R

        b, W, _ = jax.lax.fori_loop(0, b0.shape[1], element,
                                    (b0, W0, residual({**values, "b": b0}, X)))
        return {"b": b.astype(jnp.result_type(values["b"])), "W": W}

    return step


def joint_b_move(*, drop=()) -> Move:
    """The joint (b_nk, W_nk) birth/death MH move (module docstring); ``drop`` as in
    :func:`birth_log_ratio`, for the tests' controls only."""
    name = "(b, W) jointly (birth/death MH, images in parallel, elements in turn)"
    if drop:
        name += f" without {', '.join(drop)} (wrong)"
    return Move(name, ("b", "W"), {"b": BERNOULLI, "W": NORMAL, "X": NORMAL}, _step(tuple(drop)),
                preserves_likelihood=False, tempered=True)
