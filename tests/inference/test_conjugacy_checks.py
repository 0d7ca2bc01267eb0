"""The conjugacy detector against the zoo's hand-written updates, and a derived update in a
Geweke test.

- FA's z, W, mu and psi updates and CVQ's pi, tau and W updates (derived by hand in
  inference/fa/gibbs.py and inference/cvq/gibbs.py) give the same conditional as the detector's
  derivation from the model's trace, at random hyperparameters and random states, and on AIS's
  tempered path; the parameters agree to 1e-8 relative (round-off; a dropped term moves them by
  O(0.1) at these settings).
- A grouped Normal model whose variance gets an InverseGamma prior (swapped from the model's
  LogNormal, which has no conjugate pair) is sampled by ConjugateGibbs with the derived
  variance update beside a hand-written update of the group means; Geweke's test passes for it and fails for a
  derived update that leaves out one of its children.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

from latentzoo.inference.calibration import of_data
from latentzoo.inference.checks import check_conditional, geweke_test, simulate
from latentzoo.inference.conjugacy import NotConjugate, detect
from latentzoo.inference.conjugate import normal_mean_posterior
from latentzoo.inference.cvq import gibbs as cvq_gibbs
from latentzoo.inference.fa import gibbs as fa_gibbs
from latentzoo.inference.gibbs import ConjugateGibbs, read_model
from latentzoo.inference.tempering import temper
from latentzoo.inference.updates import GibbsUpdate
from latentzoo.models.cvq import cvq
from latentzoo.models.factor_analysis import factor_analysis

RTOL = 1e-8


def close(a, b):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=RTOL, atol=1e-10)


def same_law(derived, hand):
    """The two conditionals have the same parameters (wrappers of the same event split aside)."""
    while isinstance(derived, dist.Independent):
        derived = derived.base_dist
    while isinstance(hand, dist.Independent):
        hand = hand.base_dist
    if isinstance(hand, dist.MultivariateNormal):
        assert isinstance(derived, dist.MultivariateNormal)
        close(derived.loc, hand.loc)
        close(derived.precision_matrix, jnp.broadcast_to(hand.precision_matrix, derived.precision_matrix.shape))
    elif isinstance(hand, dist.Normal):
        close(derived.loc, hand.loc)
        close(derived.scale, hand.scale)
    elif isinstance(hand, dist.Gamma):
        close(derived.concentration, hand.concentration)
        close(derived.rate, hand.rate)
    elif isinstance(hand, dist.Beta):
        close(derived.concentration1, hand.concentration1)
        close(derived.concentration0, hand.concentration0)
    else:  # pragma: no cover
        raise AssertionError(type(hand))


def _cross_check(model, kw, updates, rng_key, temperature=None):
    """Detect each update's site once (at one prior draw), then compare the derived and the
    hand-written conditional at three other prior draws (new data, new latents)."""
    k_detect, *k_states = jax.random.split(rng_key, 4)
    values, X = simulate(model, kw, k_detect)
    derived = {}
    for site in updates:
        result = detect(model, (X,), kw, site, values=values)
        assert not isinstance(result, NotConjugate), result
        derived[site] = result
    read = model if temperature is None else temper(model, temperature)
    # both conditionals of a site in one compiled program (distributions are pytrees), reused
    # for every state: eager evaluation would compile each primitive of the derivatives anew
    both = {site: jax.jit(lambda v, o, p, site=site, u=update: (
        derived[site].update().conditional(v, o, p)[site], u.conditional(v, o, p)[site]))
        for site, update in updates.items()}
    for k in k_states:
        values, X = simulate(model, kw, k)
        priors, obs, _ = read_model(read, values, (X,), kw)
        for site in updates:
            same_law(*both[site](values, obs, priors))
    return derived


def _fa_priors(rng):
    return {"W": dist.Normal(rng.normal(), rng.uniform(0.5, 2.0)),
            "z": dist.Normal(0.3 * rng.normal(), rng.uniform(0.6, 1.5)),
            "mu": dist.Normal(rng.normal(), rng.uniform(1.0, 3.0)),
            "psi": dist.Gamma(rng.uniform(1.0, 5.0), rng.uniform(0.5, 3.0))}


FA_UPDATES = {"z": fa_gibbs.z_update(), "W": fa_gibbs.W_update(), "mu": fa_gibbs.mu_update(),
              "psi": fa_gibbs.psi_update()}


@pytest.mark.parametrize("seed", [0, 1])
def test_fa_hand_written_updates_equal_the_derived_conditionals(seed):
    kw = dict(N=7, D=4, K=2, priors=_fa_priors(np.random.default_rng(seed)))
    derived = _cross_check(factor_analysis, kw, FA_UPDATES, jax.random.PRNGKey(seed))
    assert {s: d.pair for s, d in derived.items()} == {
        "z": "Normal–Normal (mean)", "W": "Normal–Normal (mean)", "mu": "Normal–Normal (mean)",
        "psi": "Gamma–Normal (precision)"}
    # W and z: rows independent, K x K blocks; mu and psi: independent elements
    assert (derived["W"].block, derived["z"].block, derived["mu"].block) == (1, 1, 0)


def test_fa_tempered_z_update_equals_the_derived_conditional():
    # On AIS's path p(z) p(X | z)^beta the hand-written z update reads beta from the likelihood
    # site; the derived one weighs the child's log density by the same beta.
    kw = dict(N=6, D=3, K=2, priors=_fa_priors(np.random.default_rng(5)))
    _cross_check(factor_analysis, kw, {"z": fa_gibbs.z_update()}, jax.random.PRNGKey(5), temperature=0.37)


def test_cvq_hand_written_updates_equal_the_derived_conditionals():
    rng = np.random.default_rng(3)
    priors = {"pi": dist.Beta(rng.uniform(0.5, 3.0), rng.uniform(0.5, 3.0)),
              "W": dist.Normal(rng.normal(), rng.uniform(0.5, 2.0)),
              "tau": dist.Gamma(rng.uniform(1.0, 4.0), rng.uniform(0.3, 2.0))}
    kw = dict(N=6, D=4, K=2, priors=priors)
    updates = {"pi": cvq_gibbs.pi_update(), "tau": cvq_gibbs.tau_update(), "W": cvq_gibbs.W_update()}
    derived = _cross_check(cvq, kw, updates, jax.random.PRNGKey(3))
    assert derived["pi"].pair == "Beta–Bernoulli" and derived["pi"].children == ("s",)
    assert derived["tau"].pair == "Gamma–Normal (precision)"


# -------------------------------------------------------------------------------- Geweke
def normal_model(X=None, *, J=4, n=2, priors=None):
    """Groups j = 1..J with means mu_j ~ N(0.5, 9 v) and n rows x_ij ~ N(mu_j, v): v is the
    variance of both mu and X. The model's own prior on v (LogNormal) has no conjugate pair."""
    p = {"v": dist.LogNormal(0.0, 0.5), **(priors or {})}
    v = numpyro.sample("v", p["v"])
    with numpyro.plate("J", J, dim=-1):
        mu = numpyro.sample("mu", dist.Normal(0.5, 3.0 * jnp.sqrt(v)))
    with numpyro.plate("n", n, dim=-2), numpyro.plate("J", J, dim=-1):
        numpyro.sample("X", dist.Normal(mu, jnp.sqrt(v)), obs=X)


def _mu_conditional(values, obs, priors):
    v, X = values["v"], obs["X"]
    return {"mu": normal_mean_posterior(0.5, 1.0 / (9.0 * v), X.shape[0] / v, X.sum(0) / v)}


MU_UPDATE = GibbsUpdate("mu | v, X", ("mu",), {"mu": (dist.Normal,), "X": (dist.Normal,)}, _mu_conditional)
SWAPPED = dict(priors={"v": dist.InverseGamma(6.0, 5.0)})  # finite 4th moment: v^2 is tested
# v and mu alone miss a kernel that gets their dependence wrong: (mu - 0.5)^2 / v (chi-square
# under the prior) and the residuals scaled by v see it
GEWEKE_FUNCTIONS = {
    "v": lambda v: v["v"],
    "mu0": lambda v: v["mu"][0],
    "scaled_mu": lambda v: jnp.mean((v["mu"] - 0.5) ** 2 / v["v"]),
    "scaled_resid": of_data(lambda v, X: jnp.mean((X - v["mu"]) ** 2) / v["v"]),
}


def without_child(child):
    """A deriver whose derived conditionals leave out the child ``child`` (the wrong kernel the
    Geweke test must reject)."""

    def derive(model, model_args, model_kwargs, site):
        result = detect(model, model_args, model_kwargs, site)
        if isinstance(result, NotConjugate):
            return None, result.reason
        return result.without(child).update(), result.pair

    return derive


def test_swapped_prior_is_derived_and_its_conditional_matches_the_joint():
    kernel = ConjugateGibbs(normal_model, [MU_UPDATE])
    X = jnp.asarray(np.random.default_rng(0).normal(size=(2, 4)))
    assert kernel.plan(X).site_kinds()["v"][0] == "NUTS"
    kinds = kernel.plan(X, **SWAPPED).site_kinds()
    assert kinds == {"mu": ("hand-written", "mu | v, X"),
                     "v": ("derived", "InverseGamma–Normal (variance)")}
    # Δ log q = Δ log p(joint) between two values of v: round-off for the derived conditional,
    # O(0.1) or more for one that leaves out either child
    _, X0 = simulate(normal_model, SWAPPED, jax.random.PRNGKey(0))
    update = detect(normal_model, (X0,), SWAPPED, "v").update()
    assert check_conditional(normal_model, update, SWAPPED, jax.random.PRNGKey(1)) < 1e-9
    for child in ("mu", "X"):
        wrong, _ = without_child(child)(normal_model, (X0,), SWAPPED, "v")
        assert check_conditional(normal_model, wrong, SWAPPED, jax.random.PRNGKey(1)) > 1e-2


@pytest.mark.parametrize("deriver,passes", [(True, True), (without_child("mu"), False)],
                         ids=["derived", "control-without-mu"])
def test_geweke_derived_variance_update(deriver, passes):
    # 20000 steps of (mu | v, X hand-written; v derived) against 20480 prior draws: z-scores of
    # the means of the four test functions and their squares, Bonferroni threshold 3.23 at
    # alpha = 0.01. The control's v leaves out its child mu (the factors v^-1/2
    # exp(-(mu_j - 0.5)^2 / 18 v)), which breaks the joint law of v and mu: at these seeds the
    # right kernel's largest |z| is 1.34 (v) and the control's 8.47 (scaled_mu^2; 7.07 for
    # scaled_mu), so the threshold lets the correct kernel pass and the control fail.
    # The control leaves out mu, not the data X: a v update without X draws from p(v | mu), which
    # leaves the prior invariant, and Geweke's chain (which redraws X from p(X | v, mu) every
    # step) cannot tell such a kernel from a right one; check_conditional above catches both.
    kernel = ConjugateGibbs(normal_model, [MU_UPDATE], derive=deriver)
    result = geweke_test(normal_model, kernel, SWAPPED, GEWEKE_FUNCTIONS, jax.random.PRNGKey(11))
    assert result.passed == passes, dict(zip(result.labels, np.round(result.z_scores, 2)))
