r"""MCMC for the Bayesian NOCA: a hand-derived update of the sources ``s``, the conjugate ``pi``,
and NUTS for the noisy-OR strengths ``theta``, ``theta0`` (:mod:`latentzoo.models.noca`).

Notation: X (N, D) binary, s (N, K) binary, theta (K, D) >= 0, theta0 (D,) > 0, pi (K,), and the
total inhibition :math:`z_{nd} = \theta_{0d} + \sum_k s_{nk}\theta_{kd}`, so that
:math:`P(x_{nd} = 0 \mid s_n) = e^{-z_{nd}}` and

.. math:: \log p(x_{nd} \mid s_n) = x_{nd}\log(1 - e^{-z_{nd}}) - (1 - x_{nd})\, z_{nd}

(the model's ``Bernoulli(logits=noisy_or_logits(z))``: with :math:`\ell = \log(e^z - 1)`,
:math:`\log\sigma(\ell) = \log(1 - e^{-z})` and :math:`\log\sigma(-\ell) = -z`).

- ``s_n | theta, theta0, pi`` (rows independent: s_n enters only its own prior term and row n's
  likelihood). Collecting those terms of the joint density,

  .. math:: \log p(s_n \mid \cdot) = \sum_k \big[s_{nk}\log\pi_k + (1 - s_{nk})\log(1-\pi_k)\big]
     + \sum_d \big[x_{nd}\log(1 - e^{-z_{nd}}) - (1 - x_{nd}) z_{nd}\big] + \text{const},

  a table over the 2^K states. For the states b (rows of ``all_states``, (S, K)) the inhibitions
  are :math:`Z = \theta_0 + B\theta` (S, D), and the whole (N, S) table is two matrix products,
  :math:`X \log(1 - e^{-Z})^\top - (1 - X) Z^\top` plus the prior term, so no (N, S, D) array is
  formed: N S D flops and N S memory per sweep. For K <= ``ENUM_MAX_K`` (12) s_n is drawn
  exactly from the table; for larger K by one systematic scan of the single-site conditionals
  (:mod:`latentzoo.inference.binary_draw`), with log-odds

  .. math:: \ell_{nk} = \mathrm{logit}\,\pi_k + \sum_d \big[x_{nd}\big(\log(1 - e^{-z^1_{nd}}) -
     \log(1 - e^{-z^0_{nd}})\big) - (1 - x_{nd})\,\theta_{kd}\big],

  :math:`z^0 = z - s_{nk}\theta_{k\cdot}` (source k off), :math:`z^1 = z^0 + \theta_{k\cdot}`;
  each step is exact on one coordinate, so the scan leaves the block conditional invariant.
  :math:`\log(1 - e^{-z})` is ``log(-expm1(-z))`` (exact digits near z = 0), floored at
  :math:`z` = the smallest normal float: at z = 0 (no leak, no active source) a finding that is
  on costs about 708 nats instead of being impossible, and no 0 * (-inf) appears.
- ``pi_k | s``: :math:`\mathrm{Beta}(a + \sum_n s_{nk},\ b + N - \sum_n s_{nk})`, shared with CVQ
  (:func:`~latentzoo.inference.conjugate.beta_bernoulli_update`).
- ``theta``, ``theta0``: nothing is conjugate (the noisy-OR likelihood couples them to s through
  :math:`\log(1 - e^{-z})`). By default the table has no update for them, and
  :class:`~latentzoo.inference.gibbs.ConjugateGibbs` samples them with NUTS (a
  ``GenericKernelNote`` names them), composed with the two hand-derived blocks by
  ``numpyro.infer.Gibbs``; the NUTS block conditions on s, so its gradient is O(N K D).
  ``noca_updates(theta="slice")`` samples them by slice sampling instead
  (:mod:`latentzoo.inference.noca.slice`), the table's tempered form.
"""

from __future__ import annotations

from functools import partial

import jax.numpy as jnp
import numpyro.distributions as dist

from latentzoo.models.noca import noca

from latentzoo.inference.binary_draw import ENUM_MAX_K, draw_binary_block
from latentzoo.inference.conjugate import beta_bernoulli_update
from latentzoo.inference.enumerate import EnumeratedBinary, all_states
from latentzoo.inference.gibbs import ConjugateGibbs
from latentzoo.inference.noca.bound import log1mexp
from latentzoo.inference.noca.slice import SliceSettings, theta_slice_update
from latentzoo.inference.tempering import temperature
from latentzoo.inference.updates import GibbsUpdate, unwrap

__all__ = ["noca_updates", "noca_kernel", "s_update", "s_logits", "s_conditional", "s_draw", "ENUM_MAX_K"]

BERNOULLI = (dist.BernoulliProbs, dist.BernoulliLogits)  # dist.Bernoulli is a factory, not a class


def _site(name, values, obs):
    # theta, theta0 are latent in the sampler; a model conditioned on them (the checks that hold
    # them fixed) hands them over as observed values instead
    return values[name] if name in values else obs[name]


def _log1mexp(z):
    """The bound's :func:`~latentzoo.inference.noca.bound.log1mexp`, log(1 - e^-z), with z floored
    at the smallest normal float, so it is finite at z = 0."""
    return log1mexp(jnp.maximum(z, jnp.finfo(jnp.result_type(z)).tiny))


def _s_prior_logs(priors, shape):
    p = jnp.broadcast_to(unwrap(priors["s"]).probs, shape)  # BernoulliLogits has .probs too
    return jnp.log(p), jnp.log1p(-p)


def s_logits(values, obs, priors):
    """(N, 2^K) log p(x_n, s) up to a constant in s, and the states (2^K, K)."""
    X = obs["X"]
    theta, theta0 = _site("theta", values, obs), _site("theta0", values, obs)
    N, K = values["s"].shape
    states = all_states(K, X.dtype)
    log_p, log_q = _s_prior_logs(priors, (N, K))
    Z = theta0[None, :] + states @ theta  # (S, D) inhibition of every state
    lik = X @ _log1mexp(Z).T - (1.0 - X) @ Z.T  # (N, S), no (N, S, D) array
    beta = temperature(priors["X"])  # 1 unless the likelihood is tempered
    return beta * lik + log_p @ states.T + log_q @ (1.0 - states).T, states


def s_conditional(values, obs, priors):
    return {"s": EnumeratedBinary(*s_logits(values, obs, priors))}


def s_draw(key, values, obs, priors, *, max_enum_K: int = ENUM_MAX_K):
    """s (N, K) from its block conditional: exact for K <= ``max_enum_K``, else one scan."""
    X = obs["X"]
    theta, theta0 = _site("theta", values, obs), _site("theta0", values, obs)
    s0 = jnp.asarray(values["s"], X.dtype)
    log_p, log_q = _s_prior_logs(priors, s0.shape)
    logit = log_p - log_q
    beta = temperature(priors["X"])

    def column(Z, s, k):  # Z = theta0 + s theta (N, D); Z0 leaves source k off
        th = theta[k]
        Z0 = Z - s[:, k][:, None] * th[None, :]
        Z1 = Z0 + th[None, :]
        odds = logit[:, k] + beta * ((X * (_log1mexp(Z1) - _log1mexp(Z0))).sum(1) - (1.0 - X) @ th)
        return odds, lambda new: Z0 + new[:, None] * th[None, :]

    s = draw_binary_block(key, s0, lambda: s_conditional(values, obs, priors)["s"], column,
                          lambda: theta0[None, :] + s0 @ theta, max_K=max_enum_K)
    return {"s": s.astype(values["s"].dtype)}


def s_update() -> GibbsUpdate:
    return GibbsUpdate(
        "s | theta, theta0, pi", ("s",), {"s": BERNOULLI, "X": BERNOULLI}, s_conditional, s_draw,
        tempered=True,
    )


THETA_UPDATES = ("slice", "nuts")


def noca_updates(theta: str = "nuts", slice_settings: SliceSettings = SliceSettings()) -> list[GibbsUpdate]:
    """The NOCA table in sweep order: s, then pi | s. With ``theta="nuts"`` (the default) the
    table leaves theta, theta0 out, and :class:`~latentzoo.inference.gibbs.ConjugateGibbs`
    samples them with NUTS given s; it has no tempered form. ``theta="slice"`` adds theta,
    theta0 | s by slice sampling (:mod:`latentzoo.inference.noca.slice`): every update then
    honours the likelihood's temperature, so the table runs as replica exchange (and AIS). NUTS
    mixes better per second on the default data (docs/models/noca.md, "MCMC")."""
    if theta not in THETA_UPDATES:
        raise ValueError(f"theta must be one of {THETA_UPDATES}, got {theta!r}.")
    table = [s_update(), beta_bernoulli_update("pi", "s")._replace(tempered=True)]  # pi reads no likelihood
    return table + [theta_slice_update(slice_settings)] if theta == "slice" else table


def noca_kernel(K: int | None = None, theta: str = "nuts", **nuts_kwargs) -> ConjugateGibbs:
    """``ConjugateGibbs(noca, noca_updates(theta))``; NUTS settings apply to ``theta="nuts"``.
    With ``K`` the model is bound to that number of sources, so ``MCMC(...,
    jit_model_args=True)`` (which traces every model argument) does not turn the plate size into
    a traced value; run it without ``K``."""
    model = noca if K is None else partial(noca, K=K)
    return ConjugateGibbs(model, noca_updates(theta), nuts_kwargs=nuts_kwargs or None)
