r"""A hand-derived update of NOCA's noisy-OR strengths: slice sampling of every
:math:`\theta_{kd}` and leak :math:`\theta_{0d}` in :math:`\phi = \log\theta`, vectorised over the
items d (:mod:`latentzoo.models.noca`; not in the paper, which fits NOCA by variational EM).

**Conditional.** Write the leak as source 0 that is always on: :math:`\Theta = [\theta_0;
\theta]` ((K + 1, D)) and :math:`A = [1, s]` ((N, K + 1)), so that the total inhibition is
:math:`z_{nd} = \sum_k a_{nk}\Theta_{kd}`. The likelihood is a product over (n, d) and the priors
are elementwise, so given s the entries of one row :math:`\Theta_{k\cdot}` are conditionally
independent of each other, and each depends on the rest only through
:math:`c_{nd} = z_{nd} - a_{nk}\Theta_{kd}`. Collecting the terms of the tempered joint density
:math:`p(\Theta, s, \pi)\,p(X \mid s, \Theta)^\beta` that hold :math:`t = \Theta_{kd}`:

.. math:: \log p(t \mid \cdot) = \beta \Big[\sum_{n:\,a_{nk}=1,\,x_{nd}=1} \log\big(1 - e^{-(c_{nd}
   + t)}\big) - t\, m_{kd}\Big] + \log p_{kd}(t) + \text{const}, \qquad
   m_{kd} = \sum_n a_{nk}(1 - x_{nd}),

(a finding that stayed off costs :math:`z_{nd}`, linear in t; one that is on costs
:math:`\log(1 - e^{-z_{nd}})`), with :math:`p_{kd}` the model's own prior of that entry (any
elementwise prior on t > 0; the default is :class:`~latentzoo.models.noca.NoisyOrBeta`). Nothing is
conjugate (the noisy-OR log-likelihood has no closed-form normaliser in t), so the update draws
from this density by univariate slice sampling (Neal 2003, stepping out then shrinkage) on
:math:`\phi = \log t`, whose density carries the Jacobian: :math:`g(\phi) = \log p(e^\phi \mid
\cdot) + \phi`. Each slice step leaves its univariate conditional invariant exactly, so a scan
over the rows k = 0 .. K (the leak first), each row's D entries in parallel, leaves the joint
conditional of :math:`\Theta` given s invariant. The ``GibbsUpdate`` has a draw and no
closed-form ``conditional``: it is judged by the Geweke / SBC tests and by
:func:`~latentzoo.inference.checks.check_one_step_invariance` (tests/inference/test_noca_slice.py).

**Cost.** Each evaluation of g for one row is :math:`O(N D)` (the sum over the rows that are on
and whose source is active; :math:`m_{kd}` is one product per row k); a step costs
``2 (steps - 1)`` evaluations to step out and a few to shrink (the interval halves, in
expectation, each time), so a sweep is :math:`O(N D K)` times a small constant, like NUTS's
gradient but with no trajectory and no step size to adapt. The scan over rows keeps the compiled
program flat in K.

**Temperature.** The update reads :func:`~latentzoo.inference.tempering.temperature` of the
likelihood site and multiplies the likelihood's terms by it, so it is exact on the tempered
path too (replica exchange, AIS).

**Numerics.** :math:`\log(1 - e^{-z})` is floored at z = the smallest normal float, as in the s
update (:mod:`latentzoo.inference.noca.mcmc`). A shrinkage loop that has not hit the slice after
``MAX_SHRINKS`` proposals keeps the entry where it was: by then the interval around the current
point is below the float's resolution (it halves in expectation each time), which for a
log-density that is finite at the current point does not happen in practice.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpyro.distributions as dist

from latentzoo.inference.noca.bound import log1mexp
from latentzoo.inference.tempering import temperature
from latentzoo.inference.updates import ELEMENTWISE, GibbsUpdate, elementwise_log_prob, unwrap

__all__ = ["SliceSettings", "slice_step", "theta_log_density", "theta_slice_update", "MAX_SHRINKS"]

BERNOULLI = (dist.BernoulliProbs, dist.BernoulliLogits)
MAX_SHRINKS = 100


class SliceSettings(NamedTuple):
    """Neal's stepping-out parameters on the log scale: ``width`` of the first interval (in
    :math:`\\phi = \\log\\theta`: 1.0 is a factor e) and ``steps``, the most widths the interval
    may reach (stepping out adds at most ``steps - 1``)."""

    width: float = 1.0
    steps: int = 4


def slice_step(key, phi0, log_f, settings: SliceSettings = SliceSettings()):
    """One slice-sampling step for each entry of ``phi0`` (D,), entries independent.

    ``log_f(phi) -> (D,)`` is the log density of each entry, up to a constant per entry. Stepping
    out (Neal 2003, fig. 3) with the interval's position and the split of the ``steps - 1``
    extensions drawn at random, then shrinkage towards ``phi0`` (fig. 5); every entry runs the
    same number of evaluations (an entry that is done keeps its value), so the loop is one
    ``lax.while_loop`` over the vector. Returns the new (D,) values."""
    k_y, k_pos, k_split, k_shrink = jax.random.split(key, 4)
    shape = jnp.shape(phi0)
    w = settings.width
    g0 = log_f(phi0)
    y = g0 - jax.random.exponential(k_y, shape, g0.dtype)  # log of a uniform height under f
    left = phi0 - w * jax.random.uniform(k_pos, shape, phi0.dtype)
    right = left + w
    left_budget = jnp.floor(settings.steps * jax.random.uniform(k_split, shape, phi0.dtype))
    right_budget = settings.steps - 1 - left_budget

    def step_out(i, carry):
        left, right, go_left, go_right = carry
        go_left = go_left & (i < left_budget) & (log_f(left) > y)
        go_right = go_right & (i < right_budget) & (log_f(right) > y)
        return (jnp.where(go_left, left - w, left), jnp.where(go_right, right + w, right),
                go_left, go_right)

    go = jnp.ones(shape, bool)
    left, right, _, _ = jax.lax.fori_loop(0, settings.steps - 1, step_out, (left, right, go, go))

    def unfinished(carry):
        _, _, _, done, _, count = carry
        return (~jnp.all(done)) & (count < MAX_SHRINKS)

    def shrink(carry):
        left, right, phi, done, key, count = carry
        key, sub = jax.random.split(key)
        proposal = left + jax.random.uniform(sub, shape, phi0.dtype) * (right - left)
        inside = log_f(proposal) > y
        phi = jnp.where(~done & inside, proposal, phi)
        miss = ~done & ~inside
        left = jnp.where(miss & (proposal < phi0), proposal, left)
        right = jnp.where(miss & (proposal >= phi0), proposal, right)
        return left, right, phi, done | inside, key, count + 1

    carry = (left, right, phi0, jnp.zeros(shape, bool), k_shrink, 0)
    return jax.lax.while_loop(unfinished, shrink, carry)[2]


def _log1mexp(z):
    return log1mexp(jnp.maximum(z, jnp.finfo(jnp.result_type(z)).tiny))


def theta_log_density(t, rest, active_on, off_count, beta, log_prior):
    r"""Log conditional density of one row :math:`\Theta_{k\cdot}` at ``t`` (D,), up to a
    constant: ``rest`` (N, D) is :math:`c = z - a_k \Theta_k`, ``active_on`` (N, D) the 0/1
    weights :math:`a_{nk} x_{nd}`, ``off_count`` (D,) :math:`m_{kd}`, ``beta`` the likelihood's
    temperature and ``log_prior(t) -> (D,)`` the entries' prior."""
    on = (active_on * _log1mexp(rest + t[None, :])).sum(0)
    off = jnp.where(off_count > 0, off_count * t, 0.0)  # 0 * inf would be nan
    return beta * (on - off) + log_prior(t)


def _positive_prior(d, site):
    support = unwrap(d).support
    lower = getattr(support, "lower_bound", None)
    if lower is None or jnp.ndim(lower) != 0 or float(lower) != 0.0:
        raise ValueError(
            f"The slice update of {site} works on log({site}) and needs a prior on {site} > 0; "
            f"the model's prior is {type(unwrap(d)).__name__} with support {support}.")


def _theta_draw(settings: SliceSettings, jacobian=1.0):
    # ``jacobian`` multiplies the log-Jacobian phi of theta = e^phi: 1 always, except in the
    # tests' control (0: a slice sampler on log theta that forgets it is not on theta)
    def draw(key, values, obs, priors):
        X = obs["X"]
        theta, theta0, s = values["theta"], values["theta0"], values["s"]
        _positive_prior(priors["theta"], "theta")
        _positive_prior(priors["theta0"], "theta0")
        beta = temperature(priors["X"])
        N, K = s.shape
        D = X.shape[-1]
        A = jnp.concatenate([jnp.ones((N, 1), X.dtype), jnp.asarray(s, X.dtype)], axis=1)  # (N, K+1)
        Theta = jnp.concatenate([theta0[None, :], theta], axis=0)  # (K+1, D)
        active = A.T  # (K+1, N): row k marks the rows where source k is on
        off_counts = active @ (1.0 - X)  # (K+1, D): m_kd

        def log_prior(k, t):  # the model's own prior of row k's entries (k = 0: the leak)
            src = elementwise_log_prob(priors["theta"], jnp.broadcast_to(t, (K, D)))[jnp.maximum(k - 1, 0)]
            leak = elementwise_log_prob(priors["theta0"], t)
            return jnp.where(k == 0, leak, src)

        def row(carry, inputs):
            Z, Theta = carry
            k, key = inputs
            a = active[k]  # (N,)
            rest = Z - a[:, None] * Theta[k][None, :]
            active_on = a[:, None] * X

            def log_f(phi):
                t = jnp.exp(phi)
                g = theta_log_density(t, rest, active_on, off_counts[k], beta,
                                      lambda t: log_prior(k, t)) + jacobian * phi
                return jnp.where(jnp.isnan(g), -jnp.inf, g)

            t_new = jnp.exp(slice_step(key, jnp.log(Theta[k]), log_f, settings))
            return (rest + a[:, None] * t_new[None, :], Theta.at[k].set(t_new)), None

        Z = A @ Theta
        keys = jax.random.split(key, K + 1)
        (_, Theta), _ = jax.lax.scan(row, (Z, Theta), (jnp.arange(K + 1), keys))
        return {"theta0": Theta[0], "theta": Theta[1:]}

    return draw


def theta_slice_update(settings: SliceSettings = SliceSettings(), *, jacobian: float = 1.0) -> GibbsUpdate:
    """``theta, theta0 | s, X`` by a scan of slice steps over the rows of
    :math:`[\\theta_0; \\theta]` (see the module docstring). Exact for any elementwise prior on
    positive values, on the tempered path too. ``jacobian`` multiplies the log-Jacobian of
    theta = e^phi: leave it at 1 (0 is the tests' wrong control)."""
    name = "theta, theta0 | s (slice sampling on log theta)"
    if jacobian != 1.0:
        name += f" with the Jacobian times {jacobian} (wrong)"
    return GibbsUpdate(
        name, ("theta", "theta0"),
        {"theta": ELEMENTWISE, "theta0": ELEMENTWISE, "s": BERNOULLI, "X": BERNOULLI},
        draw=_theta_draw(settings, jacobian), tempered=True,
    )
