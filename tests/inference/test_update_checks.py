"""Deterministic checks of every hand-derived update and move, for every registered family with a
Gibbs table, at random non-default hyperparameters (non-zero means, unequal scales, shapes far
from 1): a family gets them by registering (``FamilyChecks.random_priors``).

- every ``GibbsUpdate`` with a closed-form conditional: Δ log q = Δ log p(joint) between two
  values of its block (round-off for a right conditional; a dropped prior-mean term, a wrong
  factor or sign gives O(0.1) or more at these hyperparameters);
- every ``Move`` that declares ``preserves_likelihood``: the likelihood is unchanged by one step
  (interweaving moves travel along groups that leave z Wᵀ + mu, hence p(X | ...), invariant; a
  swapped index breaks that by O(1)); MH moves that change the fit (TA's partially collapsed
  draw) are left to the Geweke/SBC tests of their family;
- every move that declares its orbit: run alone on a one-dimensional orbit, the law of its
  coordinate matches the exact target computed from the joint (an MH step that always accepts
  gives z-scores of 6-20 at these sizes, against a threshold of 2.8).
"""

import jax
import numpy as np
import pytest

from latentzoo.inference.checks import (
    check_conditionals,
    check_likelihood_invariance,
    check_move_on_orbit,
)
from latentzoo.inference.updates import GibbsUpdate, Move
from latentzoo.registry import families

FAMILIES = [f for f in families().values() if f.checks and f.checks.gibbs_table]
SEEDS = (0, 1, 2)


def _cases(kind):
    out = []
    for f in FAMILIES:
        for u in f.checks.gibbs_table():
            if isinstance(u, kind) and (kind is Move or u.conditional is not None):
                out.append(pytest.param(f, u, id=f"{f.name}:{u.name.split()[0]}"))
    return out


def _kwargs(family, seed):
    kw = dict(family.checks.model_kwargs)
    if family.checks.random_priors is not None:
        kw["priors"] = family.checks.random_priors(np.random.default_rng(seed))
    return kw


def test_every_family_with_a_table_declares_random_priors():
    assert [f.name for f in FAMILIES if f.checks.random_priors is None] == []


def _with_conditionals(family):
    return [u for u in family.checks.gibbs_table()
            if isinstance(u, GibbsUpdate) and u.conditional is not None]


TABLES = [pytest.param(f, id=f.name) for f in FAMILIES if _with_conditionals(f)]


@pytest.mark.parametrize("family", TABLES)
def test_every_conditional_matches_joint_at_random_hyperparameters(family):
    """All of a family's conditionals in one compiled program (check_conditionals: one simulation
    shared by the updates); a wrong one shows O(1e-2) or more against round-off here."""
    priors = [_kwargs(family, seed)["priors"] for seed in SEEDS]
    errs = check_conditionals(family.model, _with_conditionals(family), family.checks.model_kwargs,
                              jax.random.PRNGKey(0), priors_list=priors,
                              data_site=family.checks.data_sites)
    assert max(errs.values()) < 1e-8, {k: v for k, v in errs.items() if v >= 1e-8}


INVARIANT_MOVES = [c for c in _cases(Move) if c.values[1].preserves_likelihood]


@pytest.mark.parametrize("family, move", INVARIANT_MOVES)
def test_move_leaves_the_likelihood_unchanged(family, move):
    """Every seed's random hyperparameters in one compiled program (they are its arguments)."""
    priors = [_kwargs(family, seed).get("priors") for seed in SEEDS]
    change = check_likelihood_invariance(
        family.model, move, family.checks.model_kwargs, jax.random.PRNGKey(0),
        data_site=family.checks.data_sites, priors_list=priors,
    )
    assert change < 1e-10, (move.name, change)


ORBIT_CASES = [c for c in _cases(Move) if c.values[1].orbit is not None]


@pytest.mark.parametrize("family, move", ORBIT_CASES)
@pytest.mark.parametrize("seed", (0, 1))
def test_move_samples_the_exact_target_on_its_orbit(family, move, seed):
    kw = dict(family.checks.orbit_model_kwargs)
    result = check_move_on_orbit(family.model, move, kw, jax.random.PRNGKey(seed),
                                 data_site=family.checks.data_sites)
    assert result.passed, (result.z_scores, result.exact_moments, result.chain_moments)


# Every axis at its edge (FamilyChecks.edge_model_kwargs): one row, one column, K = 1, a mixture
# component with no rows; images with three channels, non-square, and a single 1 x 1 atom. A count
# over the wrong axes (cfa's noise precision Gamma shape counting H·W pixels instead of C·H·W
# values) agrees with the joint on one-channel square images and fails here (measured: error O(1)
# against 1e-8); so does a sum that drops a size-1 axis by squeezing it.
EDGE_CASES = [pytest.param(f, i, id=f"{f.name}@edge{i}")
              for f in FAMILIES if _with_conditionals(f) for i in range(len(f.checks.edge_model_kwargs))]


def test_every_family_with_a_table_declares_edge_shapes():
    assert [f.name for f in FAMILIES if not f.checks.edge_model_kwargs] == []


@pytest.mark.parametrize("family, edge", EDGE_CASES)
def test_every_conditional_matches_joint_at_the_edge_shapes(family, edge):
    kw = family.checks.edge_model_kwargs[edge]
    priors = [{**kw.get("priors", {}), **_kwargs(family, 0)["priors"]}]
    errs = check_conditionals(family.model, _with_conditionals(family), kw, jax.random.PRNGKey(3),
                              priors_list=priors, data_site=family.checks.data_sites)
    assert max(errs.values()) < 1e-8, {k: v for k, v in errs.items() if v >= 1e-8}
