r"""Relabelling moves for the DP mixture of the rank SVM's NL variants (truncated stick-breaking,
:mod:`latentzoo.inference.rank_svm.dp`).

The blocked Gibbs sampler updates the labels t(n) and the sticks ν one at a time given each
other, and the stick-breaking prior is not exchangeable in the labels: q_1 is stochastically
larger than q_2 and so on. A chain whose components hold their rows in another order than the
prior favours must move ν and the labels together, which one-at-a-time draws do slowly
(Porteous et al. 2006; Papaspiliopoulos & Roberts 2008). Two Metropolis-Hastings moves, after
Hastie, Liverani & Richardson (2015, moves 1 and 3 of their section 3), with the ratios derived
here for the truncated prior (ν_T = 1). Not in the paper.

Each move swaps two components j and l: their parameters (β_t, b_t, e_t of the classifier's
shrinkage, μ_t, ψ_t) and their rows (t(n) = j ↔ t(n) = l). Every component's parameters have the
same prior and enter the likelihood only through the rows they hold, so the likelihood and those
priors are unchanged; only the stick-breaking terms can change.

**Swap labels, keep the weights** (any j ≠ l, one pair drawn uniformly). The weights q stay, so
:math:`\prod_n q_{t(n)}` becomes :math:`\prod_n q_{t'(n)}`, and with the counts
:math:`n_t = \#\{n: t(n) = t\}` the log ratio is

.. math:: \log r = (n_j - n_l)\,(\log q_l - \log q_j).

**Swap adjacent labels with their weights** (j, j + 1 in turn). The new sticks give component j
the weight q_{j+1} and component j + 1 the weight q_j, and leave every other weight and the mass
left after j + 1 as they were. With a = ν_j, b = ν_{j+1} (j + 1 < T):

.. math:: \nu'_j = b(1 - a), \qquad \nu'_{j+1} = a / (1 - b(1 - a)).

The map is its own inverse, :math:`(1 - \nu'_j)(1 - \nu'_{j+1}) = (1 - a)(1 - b)`, so the
Beta(1, α) prior's terms are unchanged, and :math:`\prod_n q_{t(n)}` is unchanged (the weights
travel with the rows). What remains is the Jacobian,
:math:`\lvert\partial(\nu'_j, \nu'_{j+1}) / \partial(a, b)\rvert = (1 - a) / (1 - \nu'_j)`:

.. math:: \log r = \log(1 - a) - \log(1 - b(1 - a)).

For the last pair (j = T - 1, whose component T has no stick of its own: q_T = the mass left),
ν'_{T-1} = 1 - ν_{T-1}, with Jacobian 1, and the prior's term gives
:math:`\log r = (\alpha - 1)\,(\log \nu_{T-1} - \log(1 - \nu_{T-1}))`.

Each proposal is accepted with probability min(1, r); a deterministic involution with its
Jacobian in the ratio keeps the posterior invariant (Green 1995). The tests check each ratio
against the model's own log density and Jacobian (``tests/inference/test_rank_svm_relabel.py``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpyro.distributions as dist

from latentzoo.inference.updates import Move
from latentzoo.models.rank_factor_svm import stick_weights

__all__ = ["COMPONENT_SITES", "swap_components", "label_swap", "stick_swap", "relabel_move"]

NORMAL, GAMMA, BETA = (dist.Normal,), (dist.Gamma,), (dist.Beta,)
CATEGORICAL = (dist.CategoricalProbs, dist.CategoricalLogits)
# the sites indexed by component (leading axis T): the classifier, its shrinkage, the mixture's
# Gaussians
COMPONENT_SITES = ("beta", "b_beta", "e_beta", "mu", "psi")


def swap_components(values, j, l):
    """``values`` with components j and l exchanged: the component sites' rows and the labels."""
    T = values["beta"].shape[0]
    perm = jnp.arange(T).at[j].set(l).at[l].set(j)
    out = {s: values[s][perm] for s in COMPONENT_SITES}
    out["t"] = perm[values["t"]]
    return out


def label_swap(values, j, l):
    """(proposal, log r) of swapping the labels of j and l with the weights kept."""
    T = values["beta"].shape[0]
    n = jnp.bincount(values["t"], length=T)
    logq = jnp.log(stick_weights(values["nu"]))
    dn = n[j] - n[l]
    log_r = jnp.where(dn == 0, 0.0, dn * (logq[l] - logq[j]))
    return swap_components(values, j, l), log_r


def stick_swap(values, j):
    """(proposal, log r) of swapping components j and j + 1 with their weights (0-based j < T - 1)."""
    nu, alpha = values["nu"], values["alpha"]
    last = nu.shape[0] - 1  # the last stick: its pair's second component has none
    a = nu[j]
    b = nu[jnp.minimum(j + 1, last)]
    new_j = jnp.where(j == last, 1.0 - a, b * (1.0 - a))
    new_next = a / (1.0 - new_j)
    log_r = jnp.where(j == last, (alpha - 1.0) * (jnp.log(a) - jnp.log1p(-a)),
                      jnp.log1p(-a) - jnp.log1p(-new_j))
    nu_new = nu.at[j].set(new_j)
    nu_new = jnp.where(j == last, nu_new, nu_new.at[jnp.minimum(j + 1, last)].set(new_next))
    return {**swap_components(values, j, j + 1), "nu": nu_new}, log_r


def _accept(key, log_r, proposal, current):
    """The proposal where log u < log r, else the current values. A NaN ratio (two components of
    weight 0, a state of density 0) compares false: rejected."""
    ok = jnp.log(jax.random.uniform(key)) < log_r
    return {s: jnp.where(ok, proposal[s], current[s]) for s in current}


def relabel_move() -> Move:
    """One label swap of a uniformly drawn pair, then the adjacent swaps with weights for
    j = 1, ..., T - 1 in turn (T MH steps, each O(N + T K))."""
    sites = COMPONENT_SITES + ("t", "nu")

    def step(key, values, obs, priors):
        current = {s: values[s] for s in sites}
        T = current["beta"].shape[0]
        if T < 2:
            return current
        k_j, k_l, k_first, k_adj = jax.random.split(key, 4)
        j = jax.random.randint(k_j, (), 0, T)
        l = (j + jax.random.randint(k_l, (), 1, T)) % T  # another component, uniformly
        proposal, log_r = label_swap({**current, "alpha": values["alpha"]}, j, l)
        current = _accept(k_first, log_r, {**current, **proposal}, current)

        def adjacent(state, inputs):
            jj, key = inputs
            proposal, log_r = stick_swap({**state, "alpha": values["alpha"]}, jj)
            return _accept(key, log_r, {**state, **proposal}, state), None

        current, _ = jax.lax.scan(adjacent, current, (jnp.arange(T - 1), jax.random.split(k_adj, T - 1)))
        return current

    requires = {"beta": NORMAL, "b_beta": GAMMA, "e_beta": GAMMA, "mu": NORMAL, "psi": GAMMA,
                "t": CATEGORICAL, "nu": BETA, "alpha": GAMMA}
    # a discrete orbit (the component permutations): no continuous orbit to check; the likelihood
    # invariance check and the ratio tests apply
    # a permutation of the components keeps the likelihood: exact at every temperature
    return Move("DP relabelling (label swaps, adjacent swaps with weights)", sites, requires, step,
                tempered=True)
