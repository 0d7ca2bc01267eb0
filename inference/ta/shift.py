r"""Shift interweaving for a two-group tensor analyzer: move one group of every row by a common
vector and compensate in the parameters, along a direction that leaves the likelihood unchanged.

Why: the data fix :math:`W y_n + T_{(1)} u_n + \mu` but not how it splits between the groups'
location and :math:`\mu`. Alternating Gibbs moves :math:`\mu` and the groups' common offset only
through each other, one small step a sweep: on standardised breast-cancer data (D = 30) four
chains of a TA{30,2,2} still disagreed on :math:`\mu` by 5 within-chain standard deviations
after 1300 sweeps. The factor-analysis table has the same direction and the same cure (the FA
shift move, :mod:`latentzoo.inference.fa.gibbs`).

The group (J = 2; :math:`j` the shifted group, :math:`o` the other; per component k of a mixture,
acting on the rows with :math:`c_n = k`), for :math:`a \in \mathbb R^{d_j}`:

.. math::
   z_{nj} \to z_{nj} + a,\quad \mu_k \to \mu_k - W_{k,[j]} a,\quad
   W_{k,[o]} \to W_{k,[o]} - A_k(a),\quad A_k(a)_{db} = \textstyle\sum_{a'} T_{k,d,a',b}\, a_{a'}

(:math:`T` with mode :math:`j` first among the group modes). The mean is unchanged:
:math:`W_{[j]} a` moves into :math:`\mu`, and the new cross term :math:`T (a \otimes z_o) = A(a)
z_o` into the other group's loadings. The action is a translation (Jacobian 1), and with the
zoo's Normal priors on :math:`z, \mu, W` the log target in :math:`a` is quadratic, so :math:`a` is
drawn exactly: precision :math:`\sum_{n \in k} S_z^{-1} + W_{[j]}^\top \Lambda_\mu W_{[j]} +
\sum_{d, b} \lambda_{W, db}\, T_{d,:,b} T_{d,:,b}^\top` and linear term
:math:`\sum_{n \in k} S_z^{-1}(m_z - z_{nj}) + W_{[j]}^\top \Lambda_\mu (\mu - m_\mu) +
\sum_{d,b} \lambda_{W,db}\, T_{d,:,b} (W_{[o],db} - m_{W,db})` (the :math:`\Lambda` the prior
precisions). With three or more groups the shifted cross terms are multilinear in the other
groups and no parameter absorbs them, so the move is for J = 2 only.
"""

from __future__ import annotations

import jax.numpy as jnp

from latentzoo.inference.gaussian import gaussian_draw
from latentzoo.inference.updates import Move, prior_params

from .gibbs import NORMAL, components

__all__ = ["shift_move"]


def _blocks(values, j):
    """Column ranges of group j and of the other group in W, and T with group j's mode first:
    (C, D, d_j, d_o)."""
    d = (values["z_1"].shape[-1], values["z_2"].shape[-1])
    own = slice(0, d[0]) if j == 0 else slice(d[0], d[0] + d[1])
    other = slice(d[0], d[0] + d[1]) if j == 0 else slice(0, d[0])
    _, T, _, _, _ = components(values)
    Tj = T if j == 0 else jnp.swapaxes(T, -1, -2)
    return own, other, Tj


def _prior(priors, name, shape, mixture):
    return prior_params(priors[name], shape if mixture else shape[1:], "loc", "scale")


def shift_natural(values, priors, j: int):
    """Precision (C, d_j, d_j) and linear term (C, d_j) of each component's shift a_k."""
    W, T, mu, _, c = components(values)
    mixture = "c" in values
    name = f"z_{j + 1}"
    z = values[name]
    C, D = mu.shape
    own, other, Tj = _blocks(values, j)
    m_z, s_z = prior_params(priors[name], z.shape, "loc", "scale")
    m_mu, s_mu = _prior(priors, "mu", (C, D), mixture)
    m_W, s_W = _prior(priors, "W", W.shape, mixture)
    m_mu, s_mu = m_mu.reshape(C, D), s_mu.reshape(C, D)
    m_W, s_W = m_W.reshape(W.shape), s_W.reshape(W.shape)
    onehot = (c[:, None] == jnp.arange(C)[None, :]).astype(z.dtype)  # (N, C)
    # the rows' own priors: sum over the component's rows of S_z^{-1} and S_z^{-1} (m_z - z)
    P_z = jnp.einsum("nc,na->ca", onehot, 1.0 / s_z**2)
    b_z = jnp.einsum("nc,na->ca", onehot, (m_z - z) / s_z**2)
    Wj = W[:, :, own]  # (C, D, d_j)
    lam_mu = 1.0 / s_mu**2
    P_mu = jnp.einsum("cda,cd,cdb->cab", Wj, lam_mu, Wj)
    b_mu = jnp.einsum("cda,cd->ca", Wj, lam_mu * (mu - m_mu))
    lam_W = 1.0 / s_W[:, :, other] ** 2  # (C, D, d_o)
    P_T = jnp.einsum("cdab,cdb,cdeb->cae", Tj, lam_W, Tj)
    b_T = jnp.einsum("cdab,cdb->ca", Tj, lam_W * (W[:, :, other] - m_W[:, :, other]))
    eye = jnp.eye(z.shape[-1])
    return P_mu + P_T + P_z[:, :, None] * eye, b_z + b_mu + b_T


def _apply(values, j, a):
    """The group's action with one shift per component, a (C, d_j)."""
    W, T, mu, _, c = components(values)
    name = f"z_{j + 1}"
    own, other, Tj = _blocks(values, j)
    z = values[name] + a[c]
    mu = mu - jnp.einsum("cda,ca->cd", W[:, :, own], a)
    W = W.at[:, :, other].add(-jnp.einsum("cdab,ca->cdb", Tj, a))
    if "c" not in values:
        W, mu = W[0], mu[0]
    return {name: z, "W": W, "mu": mu}


def _step(j):
    def step(key, values, obs, priors):
        P, b = shift_natural(values, priors, j)
        return _apply(values, j, gaussian_draw(key, P, b))

    return step


def _orbit(j):
    def orbit(values, t):
        C = values["mu"].shape[0] if "c" in values else 1
        return _apply(values, j, jnp.reshape(t, (C, -1)))

    return orbit


def _coordinate(j):
    def coordinate(reference, values):
        # every row of a component moves by that component's a: row 0's change is the shift
        # of its component (the orbit checks use C = 1, so it is the whole orbit coordinate)
        name = f"z_{j + 1}"
        return jnp.reshape(values[name][0] - reference[name][0], (-1,))

    return coordinate


def shift_move(j: int) -> Move:
    """The shift interweaving move for group ``j`` (0-based) of a two-group TA or MTA."""
    if j not in (0, 1):
        raise ValueError(f"the shift move is defined for the two groups of a TA (j = 0 or 1), got {j}.")
    name = f"z_{j + 1}"
    return Move(
        f"shift interweaving ({name} + a, mu - W_[{j + 1}] a, W_[other] - T a)",
        (name, "W", "mu"),
        {name: NORMAL, "W": NORMAL, "mu": NORMAL, "X": NORMAL},
        _step(j),
        orbit=_orbit(j),
        coordinate=_coordinate(j),
        tempered=True,
    )
