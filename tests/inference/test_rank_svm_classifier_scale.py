"""The rank SVM's classifier-scale move (latentzoo.inference.rank_svm.classifier_scale): its
λ-marginal hinge against quadrature, its target along the orbit against the model's own joint
density with the hinge written out (``marginal=True``), and its Metropolis steps leaving that
target invariant; each with the wrong twin that must fail. The whole table with the move in it
runs through the family's Geweke and SBC tests (test_rank_svm_gibbs.py, test_conformance.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpyro.infer.util import log_density
from scipy import integrate, stats

from latentzoo.inference.calibration import simulate
from latentzoo.inference.gibbs_plan import read_model
from latentzoo.inference.rank_svm.classifier_scale import (
    classifier_scale_log_target,
    classifier_scale_move,
    hinge_log_marginal,
)
from latentzoo.inference.updates import unwrap
from tests.inference.rank_svm_fixtures import PRIORS, design

FLAT = {**PRIORS, "lam_rate": None}  # the paper's flat λ measure: the fit's setting


@pytest.mark.parametrize("rate", [0.0, 0.8, 3.0])
def test_hinge_marginal_matches_quadrature(rate):
    """∫ h(λ) N(o; o - δ - λ, λ) dλ, h = Exp(r) (or 1 at r = 0), relative to δ = 0. A √(1 + r)
    in place of √(1 + 2r) is off by 0.3 at δ = 2, r = 0.8; here agreement is 1e-7."""
    def log_quad(delta):
        f = lambda lam: (np.exp(-rate * lam) * stats.norm.pdf(delta + lam, scale=np.sqrt(lam)))  # noqa: E731
        return np.log(integrate.quad(f, 0, np.inf, epsabs=0, epsrel=1e-11, limit=400)[0])

    deltas = np.array([-2.0, -0.7, 0.3, 1.1, 2.0])
    want = np.array([log_quad(d) for d in deltas]) - log_quad(1e-12)
    got = np.asarray(hinge_log_marginal(jnp.asarray(deltas), rate)) - float(hinge_log_marginal(0.0, rate))
    np.testing.assert_allclose(got, want, atol=1e-7)


def _point(variant, seed=0):
    """(values, obs, priors at the flat measure, data, model, kwargs): a prior draw (the flat
    measure has none, so the draw uses Exp(0.8)) read back under the fit's flat measure with
    the fit's margins (1)."""
    model, kw, sites = design(variant, N=8, K=2, T=3)
    values, data = simulate(model, kw, jax.random.PRNGKey(seed), sites)
    data = {**data, "svm_margin": jnp.ones_like(data["svm_margin"])}
    kw_flat = {**kw, "priors": FLAT}
    priors, obs, _ = read_model(model, values, (data,), kw_flat)
    return values, obs, priors, data, model, kw_flat


def _orbit(values, t):
    c = jnp.exp(t)
    return {**values, "beta": values["beta"] * c, "b_beta": values["b_beta"] * c**2,
            "e_beta": values["e_beta"] / c**2, "Phi_beta": values["Phi_beta"] * c**2,
            "Phi_tilde_beta": values["Phi_tilde_beta"] / c**2}


def _marginal_joint_along_orbit(variant, seed, ts):
    """log p(orbit(v, t)) - log p(v) + n t under ``marginal=True`` (λ integrated, the hinge a
    factor): the exact target of the move in t, from the model file alone."""
    values, obs, priors, data, model, kw = _point(variant, seed)
    latent = {k: v for k, v in values.items() if not k.startswith("lam_")}

    def lp(v):
        return log_density(model, (data,), {**kw, "marginal": True}, v)[0]

    n = values["beta"].size
    want = np.array([float(lp(_orbit(latent, t)) - lp(latent)) + n * t for t in ts])
    return values, obs, priors, want


@pytest.mark.parametrize("variant", ["G-L", "G-NL", "R-L"])
def test_log_target_is_the_marginal_joint_density_along_the_orbit(variant):
    """At non-default shapes and rates of every level (fixtures' PRIORS): a dropped top-level
    term, a Jacobian off by a power or a sign error in the β term moves the difference by O(1);
    the right target agrees to round-off."""
    ts = [-1.3, 0.4, 2.0]
    for seed in (0, 1):
        values, obs, priors, want = _marginal_joint_along_orbit(variant, seed, ts)
        got = np.array([float(classifier_scale_log_target(values, obs, priors, jnp.asarray(t)))
                        for t in ts])
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-8)


def test_the_target_with_lambda_held_fixed_fails_the_same_check():
    """The control: the augmented hinge at the current λ (a derivation that forgets to integrate
    λ^c out) in place of the marginal one."""
    ts = [-1.3, 0.4, 2.0]
    values, obs, priors, want = _marginal_joint_along_orbit("G-L", 0, ts)
    lam = values["lam_svm"]
    score = unwrap(priors["svm_margin"]).loc + lam

    def augmented(t):
        hinge = lambda s: jnp.sum(-(obs["svm_margin"] - s * score + lam) ** 2 / (2 * lam))  # noqa: E731
        flat = classifier_scale_log_target(values, obs, priors, t) - jnp.sum(
            hinge_log_marginal(obs["svm_margin"] - jnp.exp(t) * score, 0.0)
            - hinge_log_marginal(obs["svm_margin"] - score, 0.0))
        return flat + hinge(jnp.exp(t)) - hinge(1.0)

    got = np.array([float(augmented(jnp.asarray(t))) for t in ts])
    assert np.max(np.abs(got - want)) > 0.1, (got, want)


def _stationarity_p_value(move, num=3000):
    """t0 ~ π (exact, on a grid), one move from orbit(v, t0): t0 + (the move's t) must be ~ π
    again. KS p-value of the moved draws against π's grid CDF."""
    values, obs, priors, data, model, kw = _point("G-L", 0)
    grid = np.linspace(-12.0, 12.0, 24001)
    log_pi = np.asarray(jax.vmap(lambda t: classifier_scale_log_target(values, obs, priors, t))(
        jnp.asarray(grid)))
    w = np.exp(log_pi - log_pi.max())
    cdf = np.cumsum(w) / w.sum()
    assert w[0] < 1e-8 and w[-1] < 1e-8  # the grid holds π
    rng = np.random.default_rng(0)
    t0 = np.interp(rng.uniform(size=num), cdf, grid)

    def moved(t, key):
        start = _orbit(values, t)
        pri, ob, _ = read_model(model, start, (data,), kw)
        out = move.step(key, start, ob, pri)
        return t + jnp.log(out["beta"][0, 0] / start["beta"][0, 0])

    t1 = np.asarray(jax.jit(jax.vmap(moved))(jnp.asarray(t0), jax.random.split(jax.random.PRNGKey(3), num)))
    assert np.mean(np.abs(t1 - t0) > 1e-12) > 0.3  # it moves
    return stats.kstest(t1, lambda x: np.interp(x, grid, cdf)).pvalue


def test_metropolis_steps_leave_the_target_invariant_and_a_move_without_its_accept_step_does_not():
    """3000 exact draws of t, each moved once: p = 0.3-0.9 for the move; always accepting (the
    accept step lost) spreads them by its random walk: p = 2e-290 (measured)."""
    assert _stationarity_p_value(classifier_scale_move()) > 0.01
    good = classifier_scale_move(num_steps=4, step_size=0.5)

    def no_accept(key, values, obs, priors):  # the random walk with every proposal taken
        k_walk, _ = jax.random.split(key)
        t = jnp.sum(0.5 * jax.random.normal(k_walk, (4,)))
        c = jnp.exp(t)
        return {**good.step(key, values, obs, priors), "beta": values["beta"] * c}

    assert _stationarity_p_value(good._replace(step=no_accept)) < 1e-4


def test_the_move_travels_the_orbit_and_redraws_lambda_for_the_moved_scores():
    """Every site but λ^c lands on the orbit the target was derived for (a hierarchy site moved
    by c instead of c², or the wrong way, fails), and λ^c is the conditional draw at the new
    scores: its mean for a fixed residual δ is |δ|/√(1 + 2r) + 1/(1 + 2r) (GIG(1 + 2r, δ², 1/2));
    at the flat measure |δ| + 1, so a λ left at its old value or drawn at the old scores fails."""
    values, obs, priors, data, model, kw = _point("G-L", 0)
    move = classifier_scale_move()
    outs = jax.vmap(lambda k: move.step(k, values, obs, priors))(jax.random.split(jax.random.PRNGKey(5), 4000))
    c = outs["beta"][:, 0, 0] / values["beta"][0, 0]
    assert float(jnp.mean(jnp.abs(jnp.log(c)) > 1e-9)) > 0.3
    on_orbit = jax.vmap(lambda t: _orbit(values, t))(jnp.log(c))
    for site in ("beta", "b_beta", "e_beta", "Phi_beta", "Phi_tilde_beta"):
        np.testing.assert_allclose(outs[site], on_orbit[site], rtol=1e-10, err_msg=site)
    score = unwrap(priors["svm_margin"]).loc + values["lam_svm"]
    delta = obs["svm_margin"][None] - c[:, None] * score[None]
    resid = np.asarray(outs["lam_svm"] - (jnp.abs(delta) + 1.0))  # E[λ | δ] = |δ| + 1 at r = 0
    # by the direction of the move (a λ drawn at the old scores errs one way when c > 1 and the
    # other when c < 1, which a pooled mean would average away)
    for group in (np.asarray(c) > 1.1, np.asarray(c) < 1 / 1.1):
        assert group.sum() > 200
        z = resid[group].mean(0) / (resid[group].std(0) / np.sqrt(group.sum()))
        assert np.all(np.abs(z) < 4.5), z


def test_log_target_holds_for_a_prior_mean_of_beta_other_than_zero():
    """The model file writes β ~ N(0, b), where the Normal term is constant along the orbit; the
    move's target keeps the mean m (a user may edit it), and this checks that term on a small
    program with m ≠ 0: the hierarchy, β and the SVM hinge at fixed factor scores, written out
    (``marginal``) and augmented (the priors the move reads)."""
    import numpyro
    import numpyro.distributions as dist

    z = jnp.asarray(np.random.default_rng(4).normal(size=(7, 2)))
    y = jnp.asarray([1.0, -1, 1, 1, -1, -1, 1])
    m = jnp.asarray([[0.6, -1.1]])

    def program(marginal):
        pt = numpyro.sample("Phi_tilde_beta", dist.Gamma(2.5, 1.4))
        phi = numpyro.sample("Phi_beta", dist.Gamma(1.8, pt))
        e = numpyro.sample("e_beta", dist.Gamma(1.6, phi).expand((1, 2)).to_event(2))
        b = numpyro.sample("b_beta", dist.Gamma(2.1, e).to_event(2))
        beta = numpyro.sample("beta", dist.Normal(m, jnp.sqrt(b)).to_event(2))
        score = y * (z @ beta[0])
        if marginal:
            numpyro.factor("svm_hinge", -2.0 * jnp.sum(jnp.maximum(0.0, 1.0 - score)))
            return
        lam = numpyro.sample("lam_svm", dist.ImproperUniform(dist.constraints.positive, (), (7,)))
        numpyro.sample("svm_margin", dist.Normal(score - lam, jnp.sqrt(lam)).to_event(1),
                       obs=jnp.ones(7))

    latent = {"Phi_tilde_beta": jnp.asarray(0.7), "Phi_beta": jnp.asarray(1.9),
              "e_beta": jnp.asarray([[0.8, 1.7]]), "b_beta": jnp.asarray([[0.5, 2.2]]),
              "beta": jnp.asarray([[0.9, -0.4]])}
    values = {**latent, "lam_svm": jnp.full(7, 0.6)}
    priors, obs, _ = read_model(lambda: program(False), values, (), {})

    def lp(v):
        return log_density(lambda: program(True), (), {}, v)[0]

    for t in (-1.3, 0.4, 2.0):
        want = float(lp(_orbit(latent, t)) - lp(latent)) + 2 * t
        got = float(classifier_scale_log_target(values, obs, priors, jnp.asarray(t)))
        assert abs(got - want) < 1e-9 * (1 + abs(want)), (t, got, want)
