r"""A scale move for the rank SVM's factors: the likelihood sees only w = A zᵀ and u = βᵀ z, so
for each factor k the group action z_k → c z_k (with the NL means μ_k → c μ_k), A_k → A_k / c,
β_k → β_k / c (c > 0) leaves every hinge and Gaussian term unchanged. Gibbs alone moves the
split of scale between A and z slowly (as in factor analysis), and the shrinkage hierarchy of A
with it; this move draws c exactly.

Drawing c from :math:`\pi(c) \propto p(g_c(x))\,|J_c|` with respect to the Haar measure dc/c
leaves p invariant (Liu & Sabatti 2000). With the model's zero-mean Normal priors on A
(variances ξ), β (variances b), μ (scale s_0) and z (mean m_n = 0 or μ_{t(n)}, scale s_n),
:math:`|J_c| = c^{n_\uparrow - n_\downarrow}` (:math:`n_\uparrow` = N, plus T for NL;
:math:`n_\downarrow` = D + T) and with g = c²:

.. math::

    \pi(g) \propto g^{(n_\uparrow - n_\downarrow)/2 - 1}\exp\{-(g S_\uparrow + S_\downarrow/g)/2\}
    = \mathrm{GIG}\bigl(S_\uparrow, S_\downarrow, (n_\uparrow - n_\downarrow)/2\bigr),

:math:`S_\uparrow = \sum_n (z_{nk} - m_{nk})^2/s_{nk}^2 + \sum_t \mu_{tk}^2/s_0^2`,
:math:`S_\downarrow = \sum_i A_{ik}^2/\xi_{ik} + \sum_t \beta_{tk}^2/b_{tk}`. The K factors move
independently.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpyro.distributions as dist

from latentzoo.inference.gig import GeneralizedInverseGaussian
from latentzoo.inference.updates import Move, unwrap

__all__ = ["scale_move", "hierarchy_scale_move"]

NORMAL = (dist.Normal,)


def scale_move(*, mixture: bool) -> Move:
    """The factor-scale move (one exact GIG draw per factor); ``mixture`` for the NL variants."""
    up = ("z", "mu") if mixture else ("z",)

    def _sums(values, priors):
        zp = unwrap(priors["z"])
        s_up = jnp.sum(((values["z"] - zp.loc) / zp.scale) ** 2, 0)
        n_up = values["z"].shape[0]
        if mixture:
            s_up = s_up + jnp.sum((values["mu"] / unwrap(priors["mu"]).scale) ** 2, 0)
            n_up += values["mu"].shape[0]
        s_down = (jnp.sum(values["A"] ** 2 / unwrap(priors["A"]).scale ** 2, 0)
                  + jnp.sum(values["beta"] ** 2 / unwrap(priors["beta"]).scale ** 2, 0))
        n_down = values["A"].shape[0] + values["beta"].shape[0]
        return s_up, s_down, 0.5 * (n_up - n_down)

    def act(values, c):
        out = {s: values[s] * c for s in up}
        out.update(A=values["A"] / c, beta=values["beta"] / c)
        return out

    def step(key, values, obs, priors):
        s_up, s_down, p = _sums(values, priors)
        g = GeneralizedInverseGaussian(s_up, s_down, jnp.full(s_up.shape, p)).sample(key)
        return act(values, jnp.sqrt(g))

    def orbit(values, t):
        return {**values, **act(values, jnp.exp(t))}

    def orbit_log_jacobian(values, t):
        n_up = values["z"].shape[0] + (values["mu"].shape[0] if mixture else 0)
        n_down = values["A"].shape[0] + values["beta"].shape[0]
        return jnp.sum((n_up - n_down) * t)  # t = log c per factor; Haar measure dt

    def coordinate(reference, values):
        return jnp.log(values["z"][0] / reference["z"][0])

    requires = {"z": NORMAL, "A": NORMAL, "beta": NORMAL, **({"mu": NORMAL} if mixture else {})}
    # the likelihood sees only A zᵀ and βᵀ z, which the action keeps: exact at every temperature
    return Move("factor scales (z, A, beta)", up + ("A", "beta"), requires, step,
                orbit, orbit_log_jacobian, coordinate, tempered=True)


def hierarchy_scale_move(coef: str, variance: str, rate: str, scale: str, scale_rate: str) -> Move:
    r"""Rescale one shrinkage hierarchy at once, the coefficients fixed: ξ → cξ, η → η/c,
    Φ → cΦ, Φ̃ → Φ̃/c (names as :func:`~latentzoo.inference.rank_svm.shrinkage.tpb_updates`).

    Every product ηξ, ΦΦ̃·(...) in the Gamma densities is unchanged, so with t = log c the
    target along the orbit (Haar measure, Jacobian :math:`c^{n_\xi - n_\eta + n_\Phi - 1}`,
    :math:`n_\xi = n_\eta`) reduces to
    :math:`\log\pi(c) = -(n_\xi/2 + c_0)\log c - (Q/2 + d_0\tilde\Phi)/c`, with
    :math:`Q = \sum (v - m)^2/\xi` and :math:`\tilde\Phi \sim \mathrm{Ga}(c_0, d_0)`: so
    :math:`1/c \sim \mathrm{Ga}(n_\xi/2 + c_0,\ Q/2 + d_0\tilde\Phi)`, drawn exactly. The
    Gibbs updates move the global scale only through one level at a time, which mixes slowly
    when few coefficients inform it (β has K of them)."""

    def act(values, c):
        return {variance: values[variance] * c, rate: values[rate] / c,
                scale: values[scale] * c, scale_rate: values[scale_rate] / c}

    def step(key, values, obs, priors):
        m = unwrap(priors[coef]).loc
        top = unwrap(priors[scale_rate])
        Q = jnp.sum((values[coef] - m) ** 2 / values[variance])
        n = values[variance].size
        g = dist.Gamma(0.5 * n + top.concentration, 0.5 * Q + top.rate * values[scale_rate]).sample(key)
        return act(values, 1.0 / g)

    def orbit(values, t):
        return {**values, **act(values, jnp.exp(t[0]))}

    def orbit_log_jacobian(values, t):
        n = values[variance].size - values[rate].size + values[scale].size - 1
        return n * t[0]

    def coordinate(reference, values):
        return jnp.log(values[variance].ravel()[:1] / reference[variance].ravel()[:1])

    gamma = (dist.Gamma,)
    requires = {coef: NORMAL, variance: gamma, rate: gamma, scale: gamma, scale_rate: gamma}
    return Move(f"hierarchy scale ({variance}, {rate}, {scale}, {scale_rate})",
                (variance, rate, scale, scale_rate), requires, step, orbit, orbit_log_jacobian,
                coordinate, tempered=True)  # prior sites only: exact at every temperature
