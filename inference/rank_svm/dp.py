r"""Blocked (truncated stick-breaking) Gibbs updates of the DP mixture of local linear classifiers
(Ishwaran & James 2001), the NL variants of :mod:`latentzoo.models.rank_factor_svm`.

With :math:`z_n \sim \mathcal N(\mu_{t(n)}, \psi_{t(n)}^{-1}I_K)`, :math:`\mu_t \sim \mathcal
N(m_0, s_0^2 I)`, :math:`\psi_t \sim \mathrm{Ga}(a_\psi, b_\psi)`, :math:`\nu_t \sim
\mathrm{Beta}(1, \alpha)`, :math:`\alpha \sim \mathrm{Ga}(a_\alpha, b_\alpha)`, and the label
hinge of component t(n):

- :math:`(t(n), \lambda^c_n)` are drawn jointly: t(n) from its conditional with :math:`\lambda^c_n`
  integrated out, then :math:`\lambda^c_n` given it. :math:`\int \mathcal N(o; u - \lambda,
  \lambda)\,r e^{-r\lambda}\,d\lambda = (1+2r)^{-1/2}e^{-c - |c|\sqrt{1+2r}}`, c = o - u (at
  r = 0 the hinge :math:`e^{-2\max(0, c)}`), so
  :math:`p(t(n) = t\mid\cdot) \propto q_t\,\mathcal N(z_n; \mu_t, \psi_t^{-1}I)\,
  e^{-c_{nt} - |c_{nt}|\sqrt{1+2r}}` with :math:`c_{nt} = o_n - y_n\beta_t^\top z_n`. The
  supplement's :math:`p(t(n) = t) \propto q_t\mathcal N(z_n; \mu_t, \psi_t^{-1}I)` leaves out the
  classifier: component t's hinge depends on t. On a tempered copy (margin site at inverse
  temperature β_T) the hinge term is :func:`~latentzoo.inference.rank_svm.hinge.hinge_log_marginal`
  at β_T and λ^c_n's draw GIG(β_T + 2r, β_T c², 1 - β_T/2); the other blocks read no likelihood.
- :math:`\nu_t \mid \cdot \sim \mathrm{Beta}(1 + N_t, \alpha + N_{>t})`,
  :math:`\alpha \mid \cdot \sim \mathrm{Ga}(a_\alpha + T - 1, b_\alpha - \sum_{t<T}\log(1-\nu_t))`
  (supplement: right).
- :math:`\mu_t \mid \cdot`: precision :math:`1/s_0^2 + N_t\psi_t`, mean
  :math:`(m_0/s_0^2 + \psi_t\sum_{t(n)=t}z_n)/(1/s_0^2 + N_t\psi_t)` (supplement: right at
  :math:`m_0 = 0, s_0 = 1`).
- :math:`\psi_t \mid \cdot \sim \mathrm{Ga}(a_\psi + K N_t/2,\ b_\psi + \tfrac12\sum_{t(n)=t}
  \lVert z_n - \mu_t\rVert^2)`. The supplement's :math:`\mathrm{Ga}(\psi_s + K/2, \psi_r +
  \tfrac12\sum_k\mu_{t,k}^2)` treats ψ as μ's precision, which the model does not say, and
  leaves the z terms out.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpyro.distributions as dist

from latentzoo.inference.rank_svm.hinge import hinge_lam_draw, hinge_log_marginal, lam_rate
from latentzoo.inference.tempering import temperature
from latentzoo.inference.updates import GibbsUpdate, unwrap

__all__ = ["t_lam_update", "nu_update", "alpha_update", "mu_update", "psi_update", "dp_updates",
           "t_logits"]

NORMAL, GAMMA, BETA = (dist.Normal,), (dist.Gamma,), (dist.Beta,)
CATEGORICAL = (dist.CategoricalProbs, dist.CategoricalLogits)


def t_logits(values, obs, priors):
    """(N, T) log p(t(n) = t | z, β, μ, ψ, q) with λ^c integrated out, and the hinge residuals
    c (N, T) = o_n - y_n β_tᵀ z_n."""
    z, mu, psi, beta = values["z"], values["mu"], values["psi"], values["beta"]
    y = obs["y"]  # the labels: the model's data table
    K = z.shape[1]
    logq = jnp.log(unwrap(priors["t"]).probs)  # (T,) or (N, T)
    sq = jnp.sum((z[:, None, :] - mu[None]) ** 2, -1)  # (N, T)
    log_z = 0.5 * K * jnp.log(psi)[None] - 0.5 * psi[None] * sq
    c = obs["svm_margin"][:, None] - y[:, None] * (z @ beta.T)
    hinge = hinge_log_marginal(c, lam_rate(priors["lam_svm"]), temperature(priors["svm_margin"]))
    return logq + log_z + hinge, c


def t_lam_update() -> GibbsUpdate:
    """(t, λ^c) | z, β, μ, ψ, ν: t(n) with λ^c_n integrated out, then λ^c_n | t(n)."""

    def draw(key, values, obs, priors):
        k_t, k_lam = jax.random.split(key)
        logits, c = t_logits(values, obs, priors)
        t = jax.random.categorical(k_t, logits, axis=-1)
        c_t = jnp.take_along_axis(c, t[:, None], 1)[:, 0]
        return {"t": t, "lam_svm": hinge_lam_draw(k_lam, c_t, lam_rate(priors["lam_svm"]),
                                                  temperature(priors["svm_margin"]))}

    requires = {"t": CATEGORICAL, "z": NORMAL, "lam_svm": (dist.ImproperUniform, dist.Exponential),
                "svm_margin": NORMAL}
    return GibbsUpdate("t, lam_svm | z, beta, mu, psi, nu", ("t", "lam_svm"), requires, draw=draw,
                       tempered=True)


def _counts(t, T):
    return jnp.zeros(T).at[t].add(1.0)


def nu_update() -> GibbsUpdate:
    """Stick proportions ν (T-1,) | t, α (the prior's first shape is 1, as the model fixes it)."""

    def conditional(values, obs, priors):
        nu = values["nu"]
        base = unwrap(priors["nu"])
        n = _counts(values["t"], nu.shape[0] + 1)
        above = jnp.cumsum(n[::-1])[::-1][1:]  # N_{>t} for t = 1..T-1
        return {"nu": dist.Beta(jnp.broadcast_to(base.concentration1, nu.shape) + n[:-1],
                                jnp.broadcast_to(base.concentration0, nu.shape) + above)}

    return GibbsUpdate("nu | t, alpha", ("nu",), {"nu": BETA, "t": CATEGORICAL}, conditional, tempered=True)


def alpha_update() -> GibbsUpdate:
    """DP concentration α | ν."""

    def conditional(values, obs, priors):
        base = unwrap(priors["alpha"])
        nu = values["nu"]
        return {"alpha": dist.Gamma(base.concentration + nu.shape[0],
                                    base.rate - jnp.sum(jnp.log1p(-nu)))}

    return GibbsUpdate("alpha | nu", ("alpha",), {"alpha": GAMMA, "nu": BETA}, conditional, tempered=True)


def mu_update() -> GibbsUpdate:
    """Component means μ (T, K) | z, t, ψ."""

    def conditional(values, obs, priors):
        mu, z, t, psi = values["mu"], values["z"], values["t"], values["psi"]
        T = mu.shape[0]
        base = unwrap(priors["mu"])
        prec0 = jnp.broadcast_to(1.0 / base.scale**2, mu.shape)
        P = prec0 + (_counts(t, T) * psi)[:, None]
        h = jnp.broadcast_to(base.loc, mu.shape) * prec0 + psi[:, None] * jax.ops.segment_sum(z, t, num_segments=T)
        return {"mu": dist.Normal(h / P, 1.0 / jnp.sqrt(P))}

    return GibbsUpdate("mu | z, t, psi", ("mu",), {"mu": NORMAL, "z": NORMAL}, conditional, tempered=True)


def psi_update() -> GibbsUpdate:
    """Component precisions ψ (T,) | z, t, μ."""

    def conditional(values, obs, priors):
        psi, z, t, mu = values["psi"], values["z"], values["t"], values["mu"]
        T, K = mu.shape
        base = unwrap(priors["psi"])
        sq = jax.ops.segment_sum(jnp.sum((z - mu[t]) ** 2, -1), t, num_segments=T)
        return {"psi": dist.Gamma(jnp.broadcast_to(base.concentration, psi.shape) + 0.5 * K * _counts(t, T),
                                  jnp.broadcast_to(base.rate, psi.shape) + 0.5 * sq)}

    return GibbsUpdate("psi | z, t, mu", ("psi",), {"psi": GAMMA, "z": NORMAL}, conditional, tempered=True)


def dp_updates() -> list[GibbsUpdate]:
    """The DP mixture's parameter blocks (t and λ^c come from :func:`t_lam_update`). They read
    no likelihood, so they are the same on a tempered copy."""
    return [nu_update(), alpha_update(), mu_update(), psi_update()]
