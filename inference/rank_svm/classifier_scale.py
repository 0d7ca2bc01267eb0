r"""A move of the classifier's scale for the rank SVM: β and its whole shrinkage hierarchy
rescaled at once, with the SVM's augmentation λ^c integrated out and drawn again afterwards.

Why: on separable (or nearly separable) training labels the hinge pseudo-likelihood is flat in
the size of β once every margin is met, so the posterior of the size of β (and of the global scale Φ^(β)
that goes with it) has the horseshoe prior's heavy tail. The Gibbs updates move that size only
through λ^c (tied to the current scores) and one level of the hierarchy at a time: in the
default run the chains disagreed on the size of β by a factor 10 and ``Phi_beta`` had R-hat 1.22, ESS 13.
This move travels along that direction directly. It is our addition; the supplement has none.

The orbit (t real; n = T·K coefficients; Φ, Φ̃ scalars):
β → e^t β, ξ = ``b_beta`` → e^{2t} ξ, η = ``e_beta`` → e^{-2t} η, Φ → e^{2t} Φ,
Φ̃ → e^{-2t} Φ̃. With λ^c integrated out, the joint density along it (Liu & Sabatti 2000: the
density at the moved point times the Jacobian e^{nt} of the action, Haar measure dt) is, for
β ~ N(m, ξ), ξ ~ Ga(r, η), η ~ Ga(s, Φ), Φ ~ Ga(c, Φ̃), Φ̃ ~ Ga(c_0, d_0) (each product ηξ,
Φη, Φ̃Φ is unchanged, and the powers of e^t cancel except the top's):

.. math::

    \log\pi(t) = -\tfrac12\sum_{tk}\frac{(\beta_{tk} - m_{tk}e^{-t})^2}{\xi_{tk}}
      - 2 c_0 t - d_0\tilde\Phi e^{-2t} + \sum_n \ell\bigl(o_n - e^t y_n u_n\bigr),

with the hinge's λ-marginal :math:`\ell(\delta) = -\delta - |\delta|\sqrt{1 + 2r}`: for
:math:`\lambda \sim \mathrm{Exp}(r)`, :math:`\int r e^{-r\lambda}\mathcal N(o; yu - \lambda,
\lambda)\,d\lambda \propto \exp\{-\delta - |\delta|\sqrt{1+2r}\}` (from
:math:`\int \lambda^{-1/2}e^{-a\lambda - b/\lambda}d\lambda = \sqrt{\pi/a}\,e^{-2\sqrt{ab}}`), and
at the paper's flat measure (r = 0) :math:`-2\max(0, \delta)`, the hinge itself. On a tempered
copy (margin site at inverse temperature β_T) ℓ is the tempered marginal of
:func:`~latentzoo.inference.rank_svm.hinge.hinge_log_marginal` and λ^c's redraw its tempered
GIG; the rest of π does not read the likelihood. The rank pairs'
hinges and the features do not involve β, so they drop out.

The step: ``num_steps`` random-walk Metropolis steps on t (each leaves π invariant), then
λ^c given the moved scores from its conditional (GIG(1 + 2r, δ², 1/2), as
:func:`~latentzoo.inference.rank_svm.gibbs.lam_update`). Moving t with λ^c integrated out and
then drawing λ^c given the result is a draw of the block (t, λ^c), so the sweep's other updates
see a λ^c consistent with the new β.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpyro.distributions as dist

from latentzoo.inference.rank_svm.gibbs import LAM_PRIORS
from latentzoo.inference.rank_svm.hinge import hinge_lam_draw, hinge_log_marginal, lam_rate
from latentzoo.inference.tempering import temperature
from latentzoo.inference.updates import Move, unwrap

__all__ = ["classifier_scale_move", "classifier_scale_log_target", "hinge_log_marginal"]

SITES = ("beta", "b_beta", "e_beta", "Phi_beta", "Phi_tilde_beta")


def classifier_scale_log_target(values, obs, priors, t):
    """log π(t) - log π(0) along the orbit (module docstring), λ^c integrated out; t scalar."""
    beta, xi = values["beta"], values["b_beta"]
    m = jnp.broadcast_to(unwrap(priors["beta"]).loc, beta.shape)
    top = unwrap(priors["Phi_tilde_beta"])
    Phi_tilde = values["Phi_tilde_beta"]
    margin = obs["svm_margin"]
    score = unwrap(priors["svm_margin"]).loc + values["lam_svm"]  # y_n u_n, read off the trace
    rate = lam_rate(priors["lam_svm"])
    beta_T = temperature(priors["svm_margin"])  # 1 untempered

    def log_pi(s):
        normal = -0.5 * jnp.sum((beta - m * jnp.exp(-s)) ** 2 / xi)
        gamma_top = -2.0 * top.concentration * s - top.rate * Phi_tilde * jnp.exp(-2.0 * s)
        return normal + gamma_top + jnp.sum(hinge_log_marginal(margin - jnp.exp(s) * score, rate, beta_T))

    return log_pi(t) - log_pi(jnp.zeros_like(t))


def classifier_scale_move(num_steps: int = 4, step_size: float = 0.5) -> Move:
    """The classifier-scale move: ``num_steps`` random-walk Metropolis steps of size
    ``step_size`` on t = log(scale of β), then λ^c redrawn (module docstring)."""

    def step(key, values, obs, priors):
        k_walk, k_lam = jax.random.split(key)

        def one(state, k):  # state: (t, log π(t)), so each step evaluates the target once
            t, log_pi = state
            k_prop, k_acc = jax.random.split(k)
            proposal = t + step_size * jax.random.normal(k_prop)
            log_pi_prop = classifier_scale_log_target(values, obs, priors, proposal)
            accept = jnp.log(jax.random.uniform(k_acc)) < log_pi_prop - log_pi
            return (jnp.where(accept, proposal, t), jnp.where(accept, log_pi_prop, log_pi)), None

        (t, _), _ = jax.lax.scan(one, (jnp.zeros(()), jnp.zeros(())), jax.random.split(k_walk, num_steps))
        c = jnp.exp(t)
        score = unwrap(priors["svm_margin"]).loc + values["lam_svm"]
        delta = obs["svm_margin"] - c * score
        return {"beta": values["beta"] * c, "b_beta": values["b_beta"] * c**2,
                "e_beta": values["e_beta"] / c**2, "Phi_beta": values["Phi_beta"] * c**2,
                "Phi_tilde_beta": values["Phi_tilde_beta"] / c**2,
                "lam_svm": hinge_lam_draw(k_lam, delta, lam_rate(priors["lam_svm"]),
                                          temperature(priors["svm_margin"]))}

    gamma = (dist.Gamma,)
    requires = {"beta": (dist.Normal,), "b_beta": gamma, "e_beta": gamma, "Phi_beta": gamma,
                "Phi_tilde_beta": gamma, "lam_svm": LAM_PRIORS, "svm_margin": (dist.Normal,)}
    return Move("classifier scale (beta and its hierarchy, lam_svm)", SITES + ("lam_svm",),
                requires, step, tempered=True, preserves_likelihood=False)
