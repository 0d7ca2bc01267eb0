r"""The element birth/death move of convolutional factor analysis: an exact Metropolis-Hastings
step that brings an unused dictionary element to life in one image, with a new atom cut from
that image's residual, or retires an element used by one image only (derivation also in
``docs/models/conv_factor.md``, "Element birth/death move"; not in the paper).

Why: an element no image uses has its atom :math:`d_k` drawn from the prior, :math:`\pi_k` from
Beta(a, b + N) (near 0) and its maps from the prior. The image-level joint (b, W) move
(:mod:`.joint_b`) proposes to switch it on with a map fitted to that random atom and odds
:math:`\pi_k/(1-\pi_k)`, so it almost never comes back: the number of elements in use is then
decided by the start, not by the data.

**Target.** Everything of element k that a birth creates: :math:`\pi_k`, its atom and precisions
:math:`(d_k, \beta_k)`, and in the chosen image n the switch, map and map precisions
:math:`(b_{nk}, W_{nk}, \alpha_{nk})`; the rest fixed, :math:`R^{(-k)}_n` the residual without
element k. The move acts on two sets of states: *dead* (no image uses k, m = 0) and *single* (one
image uses it, m = 1). Other images' maps and precisions (off in both) are left alone.

**Birth** (from a dead state): pick image n uniformly; propose

- :math:`d' \sim q_d(\cdot\mid R^{(-k)}_n)`, a mixture over the map positions i of
  :math:`\mathcal N(s\,u_i, \tau^2 I)`, :math:`u_i` the residual's patch at i scaled to unit norm
  (all channels), s the root-mean-square norm of the other elements' atoms in use (1 if none),
  :math:`\tau = s/(4\sqrt{Chw})`;
- :math:`\beta' \sim p(\beta\mid d')`, the Gamma conditional :math:`\mathrm{Ga}(g + 1/2, h +
  (d' - m)^2/2)`;
- :math:`W'_{n} \sim q_W`, the exact colour-class scan of :func:`.shifts.scan_from_zero` with b = 1
  and a proposal precision :math:`\alpha_q = \gamma_n\lVert d'\rVert^2/10` for every coefficient
  (not the current :math:`\alpha_{nk}`, which the move replaces); then :math:`\alpha'_n \sim
  p(\alpha\mid W'_n)`, :math:`\mathrm{Ga}(e + 1/2, f + (w' - m)^2/2)`;
- :math:`\pi'_k \sim \mathrm{Beta}(a + 1, b + N - 1)`, its conditional given one image on.

**Death** (from a single state, image n the one on): draw :math:`(\beta, d)`, :math:`(\alpha_n,
W_n)` from their priors, :math:`\pi_k \sim \mathrm{Beta}(a, b + N)` (its conditional given none
on), and set :math:`b_{nk} = 0`.

Birth and death are each other's reverse. In the ratio, each drawn precision's conditional
turns the prior of its Normal into the Normal-Gamma marginal, a Student t
(:func:`log_student`): with :math:`t(\cdot)` those marginals summed over the entries,

.. math::

    \log A_{\rm birth} = \log t(d') - \log q_d(d') + \log t(W'_n) - \log q_W(W'_n)
    - \tfrac{\gamma_n}2\big(\lVert R^{(-k)}_n - W'_n * d'\rVert^2 - \lVert R^{(-k)}_n\rVert^2\big)
    + \log\frac{a}{b + N - 1} + \log N,

where :math:`a/(b + N - 1) = B(a + 1, b + N - 1)/B(a, b + N)` is what is left of the Beta prior
and the two :math:`\pi` proposals, and :math:`\log N` is the reverse's choice (one image is on)
over the forward's (1 of N). A death is accepted with probability :math:`\min(1,
1/A_{\rm birth})` at the current state, with :math:`q_d` and :math:`q_W` evaluated at the current
atom and map (the scan forced through it). Elements in turn, each through the residual; one image
per element per sweep. Cost: one single-image colour scan per element.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpyro.distributions as dist
from jax.scipy.special import gammaln, logsumexp

from latentzoo.inference.gamma_draws import gamma_draw
from latentzoo.inference.updates import Move, prior_params

from latentzoo.models.conv_factor import reconstruct

from .shifts import scan_from_zero
from .terms import BERNOULLI, GAMMA, NORMAL, likelihood_precision, residual

__all__ = ["element_move", "element_birth_log_ratio", "log_student", "atom_proposal_log_density"]

# tau = s / (TAU_FRACTION * sqrt(C h w)): the atom proposal's spread around a residual patch
TAU_FRACTION = 4.0
# alpha_q = gamma ||d||^2 / MAP_PROPOSAL_SHRINK: the map proposal's (weak) prior precision
MAP_PROPOSAL_SHRINK = 10.0


def log_student(x, loc, shape, rate):
    """log of the Normal-Gamma marginal: x ~ N(loc, 1/lam), lam ~ Ga(shape, rate) (a Student t
    with 2 shape degrees of freedom), elementwise."""
    return (shape * jnp.log(rate) + gammaln(shape + 0.5) - gammaln(shape)
            - 0.5 * jnp.log(2 * jnp.pi) - (shape + 0.5) * jnp.log(rate + 0.5 * (x - loc) ** 2))


def _patches(Rn, h, w):
    """Every (C, h, w) patch of one image (C, H, W) at the map positions: (H' W', C, h, w)."""
    C, H, Wd = Rn.shape
    Hp, Wp = H - h + 1, Wd - w + 1
    rows = jnp.arange(Hp)[:, None, None, None] + jnp.arange(h)[None, None, :, None]
    cols = jnp.arange(Wp)[None, :, None, None] + jnp.arange(w)[None, None, None, :]
    P = Rn[:, rows, cols]  # (C, H', W', h, w)
    return jnp.moveaxis(P, 0, 2).reshape(Hp * Wp, C, h, w)


def _proposal_spread(scale, D):
    """tau: the atom proposal's standard deviation per entry, for atoms of D entries."""
    return scale / (TAU_FRACTION * jnp.sqrt(D))


def _proposal_centres(Rn, h, w, scale):
    """(H' W', C, h, w): each patch scaled to norm ``scale`` (a patch of zeros stays at 0)."""
    P = _patches(Rn, h, w)
    norms = jnp.sqrt(jnp.sum(P * P, (1, 2, 3), keepdims=True))
    return scale * P / jnp.where(norms > 0, norms, 1.0)


def atom_proposal_log_density(dk, Rn, scale):
    """log q_d(dk | Rn): the mixture, with equal weights over the map positions, of
    N(scale u_i, tau^2 I) (module docstring); dk (C, h, w), Rn (C, H, W)."""
    C, h, w = dk.shape
    D = C * h * w
    tau = _proposal_spread(scale, D)
    centres = _proposal_centres(Rn, h, w, scale)
    sq = jnp.sum((dk[None] - centres) ** 2, (1, 2, 3))
    return (logsumexp(-0.5 * sq / tau**2) - jnp.log(centres.shape[0])
            - 0.5 * D * jnp.log(2 * jnp.pi * tau**2))


def _atom_scale(d, b, k):
    """Root-mean-square norm of the atoms of the other elements in use (1 if there are none)."""
    K = d.shape[0]
    used = jnp.any(b > 0, axis=0) & (jnp.arange(K) != k)
    sq = jnp.sum(d * d, (1, 2, 3))
    n = jnp.sum(used)
    return jnp.where(n > 0, jnp.sqrt(jnp.sum(jnp.where(used, sq, 0.0)) / jnp.maximum(n, 1)), 1.0)


def _hyper(priors, values):
    """Prior parameters the move reads, broadcast to the sites' shapes."""
    K = values["d"].shape[0]
    a, b0 = prior_params(priors["pi"], (K,), "concentration1", "concentration0")
    g, h = prior_params(priors["beta"], values["d"].shape, "concentration", "rate")
    d_loc, = prior_params(priors["d"], values["d"].shape, "loc")
    e, f = prior_params(priors["alpha"], values["W"].shape, "concentration", "rate")
    W_loc, = prior_params(priors["W"], values["W"].shape, "loc")
    return a, b0, g, h, d_loc, e, f, W_loc


def element_birth_log_ratio(key, dk, Wn, Rn, gamma_n, scale, hyper_k, N, *, force, drop=()):
    r"""log A_birth of element k in image n (module docstring).

    ``force`` False (a birth): dk is the proposed atom and the map is drawn by the scan; True (the
    reverse of a death): dk and Wn are the current atom and map, and the scan is forced through
    Wn. ``force`` may be traced (one scan serves both). Returns (log A, map (H', W'), the
    image's residual after the map is added (C, H, W)).
    ``drop`` names terms to leave out ("log_n", "atom_prior", "log_q_atom", "map_prior", "pi"):
    wrong moves kept as the tests' controls. It may also map those names to weights that
    multiply their terms (1 keeps a term, 0 drops it; traced values allowed), so that the right
    move and its controls run from one compiled program.

    Args: dk (C, h, w); Wn (H', W'); Rn (C, H, W) the residual without element k; gamma_n scalar;
    hyper_k: (a_k, b0_k, g_k, h_k, d_loc_k, e_nk, f_nk, W_loc_nk) for this element and image.
    """
    a, b0, g, h, d_loc, e, f, W_loc = hyper_k
    prec_q = jnp.full(Wn.shape, gamma_n * jnp.sum(dk * dk) / MAP_PROPOSAL_SHRINK)
    maps, log_q_map, R_new = scan_from_zero(key, Wn[None], Rn[None], jnp.reshape(force, (1,)), dk,
                                            gamma_n[None], W_loc[None], prec_q[None])
    maps, R_new = maps[0], R_new[0]
    log_a = -0.5 * gamma_n * (jnp.sum(R_new**2) - jnp.sum(Rn**2)) - log_q_map[0]
    terms = {"map_prior": lambda: jnp.sum(log_student(maps, W_loc, e, f)),
             "atom_prior": lambda: jnp.sum(log_student(dk, d_loc, g, h)),
             "log_q_atom": lambda: -atom_proposal_log_density(dk, Rn, scale),
             "pi": lambda: jnp.log(a) - jnp.log(b0 + N - 1),
             "log_n": lambda: jnp.log(N)}
    for name, term in terms.items():
        if isinstance(drop, Mapping):
            log_a = log_a + drop.get(name, 1.0) * term()
        elif name not in drop:
            log_a = log_a + term()
    return log_a, maps, R_new


def _step(drop=()):
    def step(key, values, obs, priors):
        X = obs["X"]
        b0_ = jnp.asarray(values["b"], X.dtype)
        N, K = b0_.shape
        C, h, w = values["d"].shape[1:]
        hyper = _hyper(priors, values)
        gamma = likelihood_precision(values, priors, N)
        R0 = residual({**values, "b": b0_}, X)

        def element(k, carry):
            pi, beta, d, alpha, W, b, R = carry
            keys = jax.random.split(jax.random.fold_in(key, k), 10)
            bk = b[:, k]
            m = jnp.sum(bk)
            dead, single = m == 0, m == 1
            n = jnp.where(dead, jax.random.randint(keys[0], (), 0, N), jnp.argmax(bk))
            # one reading of the priors, for the ratio and the draws alike
            hyper_k = tuple(x[k] for x in hyper[:5]) + tuple(x[n, k] for x in hyper[5:])
            a_k, b0_k, g_k, h_k, d_loc_k, e_nk, f_nk, W_loc_nk = hyper_k
            Rn = R[n] + bk[n] * reconstruct(W[n, k][None, None], d[k][None])[0]  # without k
            scale = _atom_scale(d, b, k)
            # a proposed atom: a patch of the image's residual, scaled, plus noise
            D = C * h * w
            centres = _proposal_centres(Rn, h, w, scale)
            i = jax.random.randint(keys[1], (), 0, centres.shape[0])
            tau = _proposal_spread(scale, D)
            d_new = centres[i] + tau * jax.random.normal(keys[2], (C, h, w), X.dtype)
            # one scan: a birth's draw at the proposed atom, or a death's reverse forced through
            # the current atom and map
            log_a, maps, R_new = element_birth_log_ratio(
                keys[3], jnp.where(single, d[k], d_new), W[n, k], Rn, gamma[n], scale, hyper_k, N,
                force=single, drop=drop)
            log_u = jnp.log(jax.random.uniform(keys[4], (), X.dtype))
            birth = dead & (log_u < log_a)
            death = single & (log_u < -log_a)
            # birth: the new atom, its precisions given it, the fitted map and its precisions
            beta_b = gamma_draw(keys[5], g_k + 0.5, h_k + 0.5 * (d_new - d_loc_k) ** 2)
            alpha_b = gamma_draw(keys[6], e_nk + 0.5, f_nk + 0.5 * (maps - W_loc_nk) ** 2)
            # death: atom, map and their precisions from the prior
            kb, kd, ka, kw = jax.random.split(keys[7], 4)
            beta_d = gamma_draw(kb, g_k, h_k)
            d_d = d_loc_k + jax.random.normal(kd, d_new.shape, X.dtype) / jnp.sqrt(beta_d)
            alpha_d = gamma_draw(ka, e_nk, f_nk)
            W_d = W_loc_nk + jax.random.normal(kw, maps.shape, X.dtype) / jnp.sqrt(alpha_d)
            pi_new = jnp.where(birth, jax.random.beta(keys[8], a_k + 1, b0_k + N - 1),
                               jax.random.beta(keys[9], a_k, b0_k + N))

            def pick(on_birth, on_death, old):
                return jnp.where(birth, on_birth, jnp.where(death, on_death, old))

            pi = pi.at[k].set(jnp.where(birth | death, pi_new, pi[k]))
            beta = beta.at[k].set(pick(beta_b, beta_d, beta[k]))
            d = d.at[k].set(pick(d_new, d_d, d[k]))
            alpha = alpha.at[n, k].set(pick(alpha_b, alpha_d, alpha[n, k]))
            W = W.at[n, k].set(pick(maps, W_d, W[n, k]))
            b = b.at[n, k].set(pick(1.0, 0.0, b[n, k]))
            R = R.at[n].set(pick(R_new, Rn, R[n]))
            return pi, beta, d, alpha, W, b, R

        start = (values["pi"], values["beta"], values["d"], values["alpha"], values["W"], b0_, R0)
        pi, beta, d, alpha, W, b, _ = jax.lax.fori_loop(0, K, element, start)
        return {"pi": pi, "beta": beta, "d": d, "alpha": alpha, "W": W,
                "b": b.astype(jnp.result_type(values["b"]))}

    return step


def element_move(*, drop=()) -> Move:
    """The element birth/death MH move (module docstring); ``drop`` as in
    :func:`element_birth_log_ratio`, for the tests' controls only."""
    name = "element birth/death (MH: an unused element born in one image, or one used once retired)"
    if isinstance(drop, Mapping):
        name += f" with weighted terms {', '.join(drop)} (a control when a weight is not 1)"
    elif drop:
        name += f" without {', '.join(drop)} (wrong)"
    return Move(name, ("pi", "beta", "d", "alpha", "W", "b"),
                {"pi": (dist.Beta,), "beta": GAMMA, "d": NORMAL, "alpha": GAMMA, "W": NORMAL,
                 "b": BERNOULLI, "X": NORMAL},
                _step(drop if isinstance(drop, Mapping) else tuple(drop)), preserves_likelihood=False, tempered=True)
