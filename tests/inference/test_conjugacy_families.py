"""The conjugacy detector against the hand-written Gibbs updates of MFA, TA, MTA, NOCA, the rank
SVM and convolutional FA (FA's and CVQ's are in test_conjugacy_checks.py).

For every single-site update of a family's table that has a ``conditional``, the detector is
asked for the same site on the family's model (small sizes, non-default hyperparameters); where
it derives one, the two conditionals must have the same parameters (to 1e-8 relative) at three
prior draws of the state and the data. ``TWINS`` lists, per family, which sites have a derived
twin (asserted, so a detector change shows here); every other update of the table is listed in
``NO_TWIN`` with why (a multi-site block, a draw-only update, or the detector's reason), and
docs/conjugacy.md carries the same list.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest

from latentzoo.families.conv_factor import CFA_CHECK_PRIORS
from latentzoo.inference.checks import simulate
from latentzoo.inference.conjugacy import NotConjugate, detect
from latentzoo.inference.conv_factor import cfa_updates
from latentzoo.inference.gibbs import read_model
from latentzoo.inference.mfa.gibbs import mfa_updates
from latentzoo.inference.noca.mcmc import noca_updates
from latentzoo.inference.rank_svm import rank_svm_updates
from latentzoo.inference.ta.table import mta_updates, ta_updates
from latentzoo.inference.updates import GibbsUpdate
from latentzoo.models.conv_factor import conv_factor
from latentzoo.models.mfa import mfa
from latentzoo.models.noca import noca
from latentzoo.models.tensor_analyzer import mixture_of_tensor_analyzers, tensor_analyzer
from tests.inference.rank_svm_fixtures import PRIORS as RANK_PRIORS
from tests.inference.rank_svm_fixtures import design

RTOL = 1e-8

MFA_PRIORS = {"W": dist.Normal(0.2, 0.8), "z": dist.Normal(0.0, 1.0), "mu": dist.Normal(-0.4, 1.7),
              "psi": dist.Gamma(3.0, 1.5)}
TA_PRIORS = {"z": dist.Normal(0.3, 1.4), "mu": dist.Normal(0.5, 2.0), "W": dist.Normal(-0.2, 0.7),
             "T": dist.Normal(0.1, 1.3), "Psi": dist.InverseGamma(3.0, 4.0)}
NOCA_PRIORS = {"pi": dist.Beta(1.7, 2.6)}


def _families():
    rank_model, rank_kw, rank_sites = design("G-L", priors=RANK_PRIORS)
    return {
        "mfa": (mfa, dict(N=7, D=3, K=2, J=2, priors={**MFA_PRIORS, "pi": jnp.array([0.8, 1.9])}),
                mfa_updates(collapsed=False), "X"),
        "ta": (tensor_analyzer, dict(N=6, D=3, d=(2, 3), priors=TA_PRIORS), ta_updates((2, 3)), "X"),
        "mta": (mixture_of_tensor_analyzers,
                dict(N=6, D=3, d=(2, 3), C=2, priors={**TA_PRIORS, "pi": jnp.array([0.7, 2.0])}),
                mta_updates((2, 3)), "X"),
        "noca": (noca, dict(N=6, D=3, K=2, priors=NOCA_PRIORS), noca_updates(), "X"),
        "rank-svm": (rank_model, rank_kw, rank_svm_updates("G-L"), rank_sites),
        "cfa": (conv_factor, dict(K=2, atom_shape=(2, 2), N=2, image_shape=(1, 4, 4), priors=CFA_CHECK_PRIORS),
                cfa_updates(joint_b=False), "X"),
    }


# Sites whose hand-written update has a derived twin, with the detector's pair.
NN, GN, IG = "Normal–Normal (mean)", "Gamma–Normal (precision)", "InverseGamma–Normal (variance)"
TWINS = {
    "mfa": {"z": NN, "W": NN, "mu": NN, "psi": GN, "pi": "Dirichlet–Categorical"},
    "ta": {"z_1": NN, "z_2": NN, "Psi": IG},
    "mta": {"z_1": NN, "z_2": NN, "Psi": IG, "pi": "Dirichlet–Categorical"},
    "noca": {"pi": "Beta–Bernoulli"},
    "rank-svm": {"z": NN, "A": NN, "tau": GN, "beta": NN, "eta_a": "Gamma–Gamma (rate)",
                 "Phi_a": "Gamma–Gamma (rate)", "Phi_tilde_a": "Gamma–Gamma (rate)",
                 "e_beta": "Gamma–Gamma (rate)", "Phi_beta": "Gamma–Gamma (rate)",
                 "Phi_tilde_beta": "Gamma–Gamma (rate)"},
    "cfa": {"pi": "Beta–Bernoulli", "gamma": GN, "alpha": GN, "beta": GN},
}
# Single-site updates without a derived twin, with the detector's reason (docs/conjugacy.md):
NO_TWIN = {
    "mfa": {"c": "the prior of 'c' is CategoricalProbs (a discrete label: enumerated, not conjugate)"},
    "mta": {"c": "the prior of 'c' is CategoricalProbs"},
    "noca": {"s": "the prior of 's' is BernoulliProbs (noisy-OR likelihood)"},
    "rank-svm": {"lam_svm": "the prior of 'lam_svm' is Exponential (hinge augmentation, GIG conditional)",
                 "xi_a": "the precision of child 'A' is not linear in 'xi_a' (GIG conditional)",
                 "b_beta": "the precision of child 'beta' is not linear in 'b_beta'"},
}


def unwrap(d):
    while isinstance(d, dist.Independent):
        d = d.base_dist
    return d


def same_law(derived, hand):
    derived, hand = unwrap(derived), unwrap(hand)

    def close(a, b):
        np.testing.assert_allclose(np.asarray(a), np.asarray(jnp.broadcast_to(b, jnp.shape(a))), rtol=RTOL, atol=1e-10)

    names = {dist.MultivariateNormal: ("loc", "precision_matrix"), dist.Normal: ("loc", "scale"),
             dist.Gamma: ("concentration", "rate"), dist.InverseGamma: ("concentration", "rate"),
             dist.Beta: ("concentration1", "concentration0"), dist.Dirichlet: ("concentration",)}
    if isinstance(hand, dist.MultivariateNormal) and isinstance(derived, dist.Normal):
        # a K x K block the derivation found diagonal: compare as independent elements
        close(derived.loc, hand.loc)
        close(derived.scale, jnp.sqrt(jnp.diagonal(hand.covariance_matrix, axis1=-2, axis2=-1)))
        return
    kind = next(k for k in names if isinstance(hand, k))
    assert isinstance(derived, kind), (type(derived), type(hand))
    for attr in names[kind]:
        close(getattr(derived, attr), getattr(hand, attr))


def single_site_updates(table):
    return {u.sites[0]: u for u in table
            if isinstance(u, GibbsUpdate) and len(u.sites) == 1 and u.conditional is not None}


@pytest.mark.parametrize("family", list(TWINS))
def test_hand_written_updates_equal_their_derived_twins(family):
    model, kw, table, data_site = _families()[family]
    k_detect, *k_states = jax.random.split(jax.random.PRNGKey(sum(map(ord, family))), 4)
    values, X = simulate(model, kw, k_detect, data_site)
    found = {}
    for site, update in single_site_updates(table).items():
        result = detect(model, (X,), kw, site, values=values)
        if not isinstance(result, NotConjugate):
            found[site] = result
    assert {s: d.pair for s, d in found.items()} == TWINS[family]
    both = {s: jax.jit(lambda v, o, p, s=s: (found[s].update().conditional(v, o, p)[s],
                                             single_site_updates(table)[s].conditional(v, o, p)[s]))
            for s in found}
    for k in k_states:
        values, X = simulate(model, kw, k, data_site)
        priors, obs, _ = read_model(model, values, (X,), kw)
        for s in found:
            same_law(*both[s](values, obs, priors))
