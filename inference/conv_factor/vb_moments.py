r"""The per-image algebra of mean-field VB for one layer of convolutional FA: expected
autocorrelations, the local coordinate-ascent step (maps by colour classes, switches, in turn
over elements), the expected squared residual and the atom statistics.

Notation (:mod:`latentzoo.models.conv_factor`): one image x (C, H, W); its maps have means
``mu`` and variances ``s`` (K, H', W') under :math:`q(w_{nki}) = \mathcal N(\mu, s)`, switch
probabilities ``rho`` (K,) under :math:`q(b_{nk}) = \mathrm{Bernoulli}(\rho)`; atoms have means
``m`` (K, C, h, w) and per-channel covariances ``S`` (K, C, hw, hw) under the full Gaussian
:math:`q(d_k)`. Write :math:`\bar Y_k = \mu_k * m_k` and :math:`\bar R = x - \sum_k \rho_k\bar Y_k`.

**Expected autocorrelation of an atom** (lags :math:`\delta` in
:math:`[-(h-1), h-1]\times[-(w-1), w-1]`, stored as (2h-1, 2w-1) with lag 0 at the centre):

.. math:: G_k(\delta) = \mathbb E\langle S_i d_k, S_{i+\delta} d_k\rangle
    = \sum_{c}\sum_{p} \mathbb E[d_{kc}[p]\, d_{kc}[p + \delta]]
    = \sum_{c}\sum_{p}\big(S_{kc} + m_{kc} m_{kc}^\top\big)[p, p + \delta].

Two shifts of one atom interact through :math:`G_k(i - i')`, zero once the atoms do not overlap.

**Expected squared residual** (q factorises over b, W, d; :math:`b^2 = b`):

.. math:: \mathbb E\lVert x - \textstyle\sum_k b_k W_k * d_k\rVert^2 = \lVert\bar R\rVert^2
    + \sum_k \big[\rho_k E_k - \rho_k^2 \lVert\bar Y_k\rVert^2\big],\qquad
    E_k = \mathbb E\lVert W_k * d_k\rVert^2 = \langle G_k, A(\mu_k)\rangle + G_k(0)\textstyle\sum_i s_{ki}

with :math:`A(\mu)(\delta) = \sum_i \mu_i\mu_{i+\delta}` the map's autocorrelation and
:math:`\lVert\bar Y_k\rVert^2 = \langle G^m_k, A(\mu_k)\rangle` (G^m: G without S).

**Local step** (each line the exact maximiser of the ELBO in its block; derivation in
``docs/models/conv_factor_vb.md``). For element k, with :math:`Z_k = \bar R + \rho_k \bar Y_k`
(the residual without element k, which the element's updates leave unchanged):

- precision of every :math:`w_{ki}`: :math:`\Lambda_{ki} = \langle\gamma\rangle\rho_k G_k(0)
  + \langle\alpha_{ki}\rangle` (eq. 18's Σ, read as 1 ⊘ (…)), so :math:`s_{ki} = 1/\Lambda_{ki}`;
- mean of one colour class (positions a multiple of (h, w) apart: atoms disjoint, so the class's
  coordinates do not interact and its joint update is exact coordinate ascent):

  .. math:: \mu_{ki} = \Lambda_{ki}^{-1}\Big[\langle\gamma\rangle\rho_k\big((Z_k \star m_k)_i
      - (G_k \circ \mu_k)_i + G_k(0)\mu_{ki}\big) + \langle\alpha_{ki}\rangle w^0_{ki}\Big]

  with :math:`(G\circ\mu)_i = \sum_{i'} G(i' - i)\mu_{i'}` (one strided convolution per class).
  Eq. 18 updates all shifts at once from one residual: a Jacobi step, not coordinate ascent;
- switch: :math:`\mathrm{logit}\,\rho_k = \langle\log\pi_k\rangle - \langle\log(1-\pi_k)\rangle
  + \langle\gamma\rangle\big(\langle Z_k, \bar Y_k\rangle - \tfrac12 E_k\big)` (eq. 15's
  :math:`\zeta_1 - \zeta_2`, with :math:`E_k` carrying the variances of both W and d).

Every function here takes ONE image; callers ``jax.vmap`` them over images (which is what lets the
image axis shard across devices).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from latentzoo.models.conv_factor import correlate, reconstruct

__all__ = [
    "AtomMoments",
    "lag_index",
    "atom_moments",
    "map_autocorr",
    "toeplitz",
    "local_maps",
    "expected_sq_resid",
    "atom_stats",
]

_DIMS = ("NCHW", "OIHW", "NCHW")


class AtomMoments(NamedTuple):
    r"""What the local step reads from q(d) and q(pi).

    Attributes:
        m: atom means (K, C, h, w).
        G: expected autocorrelations (K, 2h-1, 2w-1) (module docstring).
        Gm: the same with the atoms' covariances left out, :math:`A(m_k)` (K, 2h-1, 2w-1).
        logit_pi: :math:`\langle\log\pi_k\rangle - \langle\log(1-\pi_k)\rangle` (K,).
    """

    m: jax.Array
    G: jax.Array
    Gm: jax.Array
    logit_pi: jax.Array


def lag_index(h: int, w: int):
    """Index arrays (hw, hw) into a (2h-1, 2w-1) lag grid: entry [p, q] holds the lag q - p of
    atom positions p = (u, v), q = (u', v') (flattened row-major), shifted to be >= 0."""
    u, v = np.divmod(np.arange(h * w), w)
    return u[None, :] - u[:, None] + h - 1, v[None, :] - v[:, None] + w - 1


def _lag_sum(E, h, w):
    """Sum the (..., hw, hw) entries of E over positions with equal lag: (..., 2h-1, 2w-1)."""
    iu, iv = lag_index(h, w)
    out = jnp.zeros(E.shape[:-2] + (2 * h - 1, 2 * w - 1), E.dtype)
    return out.at[..., iu, iv].add(E)


def atom_moments(d_loc, d_cov, logit_pi) -> AtomMoments:
    """:class:`AtomMoments` from q(d): means (K, C, h, w), covariances (K, C, hw, hw)."""
    K, C, h, w = d_loc.shape
    m = d_loc.reshape(K, C, h * w)
    outer = m[..., :, None] * m[..., None, :]
    Gm = _lag_sum(outer.sum(1), h, w)
    G = Gm + _lag_sum(d_cov.sum(1), h, w)
    return AtomMoments(d_loc, G, Gm, logit_pi)


def map_autocorr(mu, h: int, w: int):
    """A(mu)(delta) = sum_i mu_i mu_{i+delta} for lags up to the atom's size: mu (K, H', W') ->
    (K, 2h-1, 2w-1), one grouped convolution."""
    K = mu.shape[0]
    padded = jnp.pad(mu, ((0, 0), (h - 1, h - 1), (w - 1, w - 1)))[None]
    return jax.lax.conv_general_dilated(padded, mu[:, None], (1, 1), "VALID",
                                        dimension_numbers=_DIMS, feature_group_count=K)[0]


def toeplitz(Q, h: int, w: int):
    """The (hw, hw) matrix [p, q] -> Q(lag q - p) of a symmetric lag table Q (..., 2h-1, 2w-1)."""
    iu, iv = lag_index(h, w)
    return Q[..., iu, iv]


def _map(mu, m):
    """mu_k * m_k for one element of one image: (H', W'), (C, h, w) -> (C, H, W)."""
    return reconstruct(mu[None, None], m[None])[0]


def local_maps(x, mu, s, rho, E_alpha, E_gamma, w_loc, am: AtomMoments):
    """One coordinate-ascent pass over the elements of one image: for each k, the variances, the
    means colour class by colour class, then the switch (module docstring).

    Args:
        x: the image (C, H, W).
        mu, s: q(W)'s means and variances (K, H', W'); rho: q(b) (K,).
        E_alpha: <alpha> (K, H', W'); E_gamma: <gamma> (scalar); w_loc: W's prior mean.
        am: :class:`AtomMoments`.

    Returns:
        (mu, s, rho).
    """
    K, Hp, Wp = mu.shape
    C, h, w = am.m.shape[1:]
    M, L = -(-Hp // h), -(-Wp // w)
    G0 = am.G[:, h - 1, w - 1]
    pad = ((0, M * h - Hp), (0, L * w - Wp))

    def lattice(a, ci, cj):  # a (M h, L w) -> the class's (M, L) positions
        a5 = a.reshape(M, h, L, w)
        return jax.lax.dynamic_slice(a5, (0, ci, 0, cj), (M, 1, L, 1))[:, 0, :, 0]

    def set_lattice(a, vals, ci, cj):
        a5 = a.reshape(M, h, L, w)
        return jax.lax.dynamic_update_slice(a5, vals[:, None, :, None], (0, ci, 0, cj)).reshape(a.shape)

    rows = jnp.arange(M * h) < Hp
    cols = jnp.arange(L * w) < Wp
    valid_full = rows[:, None] & cols[None, :]
    R = x - reconstruct((rho[:, None, None] * mu)[None], am.m)[0]

    def element(k, carry):
        mu, s, rho, R = carry
        mk, Gk = am.m[k], am.G[k]
        Z = R + rho[k] * _map(mu[k], mk)
        gr = E_gamma * rho[k]
        lam = gr * G0[k] + E_alpha[k]
        c0 = correlate(Z[None], mk[None])[0, 0]
        base = jnp.pad(gr * c0 + E_alpha[k] * w_loc[k], pad)
        lam_p = jnp.pad(lam, pad, constant_values=1.0)
        kernel = Gk[None, None]

        def colour(c, mu_p):
            ci, cj = c // w, c % w
            # (G o mu) at the class's positions: a correlation with window strides (h, w)
            full = jnp.pad(mu_p, ((h - 1, h - 1), (w - 1, w - 1)))
            block = jax.lax.dynamic_slice(full, (ci, cj), (M * h + h - 1, L * w + w - 1))
            g = jax.lax.conv_general_dilated(block[None, None], kernel, (h, w), "VALID",
                                             dimension_numbers=_DIMS)[0, 0]
            cur = lattice(mu_p, ci, cj)
            new = (lattice(base, ci, cj) - gr * (g - G0[k] * cur)) / lattice(lam_p, ci, cj)
            new = jnp.where(lattice(valid_full, ci, cj), new, 0.0)
            return set_lattice(mu_p, new, ci, cj)

        mu_p = jax.lax.fori_loop(0, h * w, colour, jnp.pad(mu[k], pad))
        mu_k = mu_p[:Hp, :Wp]
        s_k = 1.0 / lam
        Y = _map(mu_k, mk)
        E_k = jnp.sum(Gk * map_autocorr(mu_k[None], h, w)[0]) + G0[k] * jnp.sum(s_k)
        logit = am.logit_pi[k] + E_gamma * (jnp.vdot(Z, Y) - 0.5 * E_k)
        r = jax.nn.sigmoid(logit)
        return mu.at[k].set(mu_k), s.at[k].set(s_k), rho.at[k].set(r), Z - r * Y

    mu, s, rho, _ = jax.lax.fori_loop(0, K, element, (mu, s, rho, R))
    return mu, s, rho


def expected_sq_resid(x, mu, s, rho, am: AtomMoments):
    """E_q ||x - sum_k b_k W_k * d_k||^2 for one image (scalar), module docstring."""
    h, w = am.m.shape[-2:]
    R = x - reconstruct((rho[:, None, None] * mu)[None], am.m)[0]
    A = map_autocorr(mu, h, w)
    E = jnp.sum(am.G * A, (1, 2)) + am.G[:, h - 1, w - 1] * jnp.sum(s, (1, 2))
    Ybar2 = jnp.sum(am.Gm * A, (1, 2))
    return jnp.sum(R * R) + jnp.sum(rho * E - rho**2 * Ybar2)


def atom_stats(Z, mu_k, s_k, weight):
    r"""One image's contribution to atom k's natural parameters: ``weight`` = <gamma> rho_k times

    - the expected map autocorrelation :math:`A(\mu_k) + \delta_0\sum_i s_{ki}` (2h-1, 2w-1), whose
      Toeplitz matrix is the precision of each channel of d_k, and
    - the correlation of the residual without element k with the map, :math:`Z_k \star \mu_k`
      (C, h, w), the linear term.

    Z (C, H, W); mu_k, s_k (H', W').
    """
    C, H, Wd = Z.shape
    Hp, Wp = mu_k.shape
    h, w = H - Hp + 1, Wd - Wp + 1
    A = map_autocorr(mu_k[None], h, w)[0]
    A = A.at[h - 1, w - 1].add(jnp.sum(s_k))
    lin = jax.lax.conv_general_dilated(Z[:, None], mu_k[None, None], (1, 1), "VALID",
                                       dimension_numbers=_DIMS)[:, 0]
    return weight * A, weight * lin
