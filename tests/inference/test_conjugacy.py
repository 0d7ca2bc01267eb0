"""The conjugacy detector (latentzoo.inference.conjugacy): each supported pair against its
textbook posterior, masks and plates, the reasons it gives when a site is not conjugate, and its
place in the Gibbs builder's plan.

Every pair is checked on a tiny model at random non-default hyperparameters (non-zero means,
unequal scales, shapes away from 1, an affine map with a slope and an offset), so a dropped
prior term, a missed factor or a child counted twice moves a parameter by O(0.1) or more; the
derived parameters must equal the closed form to 1e-8 relative (they agree to round-off).
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro import handlers
from numpyro.infer import MCMC

from latentzoo.inference.conjugacy import NotConjugate, detect
from latentzoo.inference.gibbs import ConjugateGibbs, GenericKernelNote, read_model
from latentzoo.inference.tempering import temper

RTOL = 1e-8


def close(a, b):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=RTOL, atol=1e-12)


def derived_at(model, args, site, values=None, kwargs=None):
    """(Derived, the conditional at the values detect traced at)."""
    result = detect(model, args, kwargs or {}, site, values)
    assert not isinstance(result, NotConjugate), result
    _, latent, observed = _base(model, args, kwargs or {}, values)
    priors, obs, _ = read_model(model, latent, args, kwargs or {})
    # compiled: it is what a sweep runs (and faster than compiling each primitive eagerly)
    cond = jax.jit(lambda v, o, p: result.conditional(v, o, p)[site])(latent, obs, priors)
    return result, cond, latent


def _base(model, args, kwargs, values):
    tr = handlers.trace(handlers.substitute(handlers.seed(model, jax.random.PRNGKey(0)),
                                            data=dict(values or {}))).get_trace(*args, **kwargs)
    latent = {n: s["value"] for n, s in tr.items() if s["type"] == "sample" and not s["is_observed"]}
    observed = {n: s["value"] for n, s in tr.items() if s["type"] == "sample" and s["is_observed"]}
    return tr, latent, observed


RNG = np.random.default_rng(7)
M0, S0 = 0.7, 1.6  # Normal prior
A, C = -1.3, 0.4  # child mean A w + C
SIG = RNG.uniform(0.5, 2.0, size=6)  # known child scales, one per observation
X6 = RNG.normal(size=6)
GA, GB = 2.7, 1.9  # Gamma / InverseGamma shape, rate


# ------------------------------------------------------------------------ Normal prior
def normal_mean_model(X=None):
    w = numpyro.sample("w", dist.Normal(M0, S0))
    with numpyro.plate("N", 6):
        numpyro.sample("X", dist.Normal(A * w + C, SIG), obs=X)


def test_normal_normal_affine_mean():
    d, cond, _ = derived_at(normal_mean_model, (X6,), "w")
    assert d.pair == "Normal–Normal (mean)" and d.children == ("X",)
    prec = 1 / S0**2 + np.sum(A**2 / SIG**2)
    mean = (M0 / S0**2 + np.sum(A * (X6 - C) / SIG**2)) / prec
    close(cond.loc, mean)
    close(cond.scale, prec**-0.5)


def plate_model(X=None, mask=None):
    with numpyro.plate("K", 3):
        w = numpyro.sample("w", dist.Normal(jnp.array([0.5, -1.0, 2.0]), jnp.array([0.7, 1.5, 2.5])))
    with numpyro.plate("N", 5, dim=-2), numpyro.plate("K", 3, dim=-1):
        with handlers.mask(mask=True if mask is None else mask):
            numpyro.sample("X", dist.Normal(2.0 * w - 1.0, 0.8), obs=X)


@pytest.mark.parametrize("masked", [False, True], ids=["all", "masked"])
def test_normal_plate_batched_and_masked(masked):
    # Elements of w are conditionally independent (each column of X reads one): a diagonal
    # Normal; masked-out entries of X add nothing, so only the kept ones enter the sums.
    X = jnp.asarray(RNG.normal(size=(5, 3)))
    mask = jnp.asarray(RNG.uniform(size=(5, 3)) < 0.6) if masked else jnp.ones((5, 3), bool)
    d, cond, _ = derived_at(plate_model, (X, mask if masked else None), "w")
    assert d.structure == "independent elements"
    m = np.asarray(mask, float)
    prec = 1 / np.array([0.7, 1.5, 2.5]) ** 2 + 4.0 * m.sum(0) / 0.8**2
    lin = np.array([0.5, -1.0, 2.0]) / np.array([0.7, 1.5, 2.5]) ** 2 + (2.0 * m * (X + 1.0)).sum(0) / 0.8**2
    close(cond.loc, lin / prec)
    close(cond.scale, prec**-0.5)


def test_masked_out_entries_do_not_decide_conjugacy():
    # tanh(w) only where the mask drops the entry: what is masked out contributes nothing.
    keep = jnp.array([True, False, True, True])

    def model(X=None):
        w = numpyro.sample("w", dist.Normal(0.3, 1.2))
        with numpyro.plate("N", 4), handlers.mask(mask=keep):
            numpyro.sample("X", dist.Normal(jnp.where(keep, 3.0 * w, jnp.tanh(w)), 0.5), obs=X)

    X = jnp.array([0.2, 5.0, -0.7, 1.1])
    d, cond, _ = derived_at(model, (X,), "w")
    prec = 1 / 1.2**2 + 3 * 9.0 / 0.25
    close(cond.loc, (0.3 / 1.2**2 + 3.0 * float(X[keep].sum()) / 0.25) / prec)


def regression_model(X=None):
    w = numpyro.sample("w", dist.Normal(jnp.array([0.2, -0.5, 1.0]), jnp.array([1.0, 0.6, 2.0])).to_event(1))
    numpyro.sample("X", dist.Normal(DESIGN @ w + C, SIG[:4]).to_event(1), obs=X)


DESIGN = jnp.asarray(RNG.normal(size=(4, 3)))


def test_normal_vector_site_couples_into_a_multivariate_normal():
    d, cond, _ = derived_at(regression_model, (X6[:4],), "w")
    assert isinstance(cond, dist.MultivariateNormal) and d.block == 1
    Dm = np.asarray(DESIGN)
    P = np.diag(1 / np.array([1.0, 0.6, 2.0]) ** 2) + Dm.T @ np.diag(1 / SIG[:4] ** 2) @ Dm
    b = np.array([0.2, -0.5, 1.0]) / np.array([1.0, 0.6, 2.0]) ** 2 + Dm.T @ ((X6[:4] - C) / SIG[:4] ** 2)
    close(cond.precision_matrix, P)
    close(cond.loc, np.linalg.solve(P, b))


def test_multivariate_normal_prior():
    L0 = np.array([[1.2, 0.0, 0.0], [0.4, 0.8, 0.0], [-0.3, 0.5, 1.5]])

    def model(X=None):
        w = numpyro.sample("w", dist.MultivariateNormal(jnp.array([0.5, 0.1, -0.4]), scale_tril=jnp.asarray(L0)))
        numpyro.sample("X", dist.Normal(DESIGN @ w, 0.9).to_event(1), obs=X)

    d, cond, _ = derived_at(model, (X6[:4],), "w")
    assert d.pair == "MultivariateNormal–Normal (mean)"
    Dm = np.asarray(DESIGN)
    P0 = np.linalg.inv(L0 @ L0.T)
    P = P0 + Dm.T @ Dm / 0.81
    close(cond.precision_matrix, P)
    close(cond.loc, np.linalg.solve(P, P0 @ np.array([0.5, 0.1, -0.4]) + Dm.T @ X6[:4] / 0.81))


def test_observed_with_obs_mask_uses_both_halves():
    # obs_mask splits X into X_observed (masked to the observed entries) and the latent
    # X_unobserved (masked to the others); both are children of w, each entry counted once.
    obs_mask = jnp.array([True, False, True, True, False, True])

    def model(X=None):
        w = numpyro.sample("w", dist.Normal(M0, S0))
        with numpyro.plate("N", 6):
            numpyro.sample("X", dist.Normal(A * w + C, SIG), obs=X, obs_mask=obs_mask)

    unobs = jnp.asarray(RNG.normal(size=6))
    d, cond, _ = derived_at(model, (jnp.asarray(X6),), "w", values={"X_unobserved": unobs})
    assert set(d.children) == {"X_observed", "X_unobserved"}
    x = np.where(obs_mask, X6, unobs)
    prec = 1 / S0**2 + np.sum(A**2 / SIG**2)
    close(cond.loc, (M0 / S0**2 + np.sum(A * (x - C) / SIG**2)) / prec)


# ------------------------------------------------------------- Gamma and InverseGamma
def test_gamma_normal_precision():
    def model(X=None):
        tau = numpyro.sample("tau", dist.Gamma(GA, GB))
        with numpyro.plate("N", 6):
            numpyro.sample("X", dist.Normal(C, SIG / jnp.sqrt(tau)), obs=X)

    d, cond, _ = derived_at(model, (X6,), "tau")
    assert d.pair == "Gamma–Normal (precision)"
    close(cond.concentration, GA + 3.0)
    close(cond.rate, GB + 0.5 * np.sum((X6 - C) ** 2 / SIG**2))


def test_inverse_gamma_normal_variance_with_a_latent_child():
    # v is the variance of the latent mu and of X: both are children.
    def model(X=None):
        v = numpyro.sample("v", dist.InverseGamma(GA, GB))
        mu = numpyro.sample("mu", dist.Normal(M0, 2.0 * jnp.sqrt(v)))
        with numpyro.plate("N", 6):
            numpyro.sample("X", dist.Normal(mu, SIG * jnp.sqrt(v)), obs=X)

    d, cond, latent = derived_at(model, (X6,), "v")
    assert d.children == ("mu", "X") and d.pair == "InverseGamma–Normal (variance)"
    mu = float(latent["mu"])
    close(cond.concentration, GA + 3.5)
    close(cond.rate, GB + 0.5 * (mu - M0) ** 2 / 4.0 + 0.5 * np.sum((X6 - mu) ** 2 / SIG**2))


COUNTS = jnp.array([3.0, 0.0, 5.0, 2.0])
EXPOSURE = jnp.array([0.5, 1.5, 2.0, 0.8])


def test_gamma_poisson():
    def model(y=None):
        lam = numpyro.sample("lam", dist.Gamma(GA, GB))
        with numpyro.plate("N", 4):
            numpyro.sample("y", dist.Poisson(EXPOSURE * lam), obs=y)

    d, cond, _ = derived_at(model, (COUNTS,), "lam")
    assert d.pair == "Gamma–Poisson"
    close(cond.concentration, GA + COUNTS.sum())
    close(cond.rate, GB + EXPOSURE.sum())


def test_gamma_exponential_and_gamma_rate():
    y = jnp.array([0.4, 1.9, 0.7, 2.5])

    def model(y=None):
        lam = numpyro.sample("lam", dist.Gamma(GA, GB))
        with numpyro.plate("N", 4):
            numpyro.sample("e", dist.Exponential(EXPOSURE * lam), obs=y)
            numpyro.sample("g", dist.Gamma(1.7, EXPOSURE * lam), obs=y[::-1])

    d, cond, _ = derived_at(model, (y,), "lam")
    assert d.children == ("e", "g") and d.pair == "Gamma–Exponential + Gamma–Gamma (rate)"
    close(cond.concentration, GA + 4 + 4 * 1.7)
    close(cond.rate, GB + float((EXPOSURE * y).sum() + (EXPOSURE * y[::-1]).sum()))


# ------------------------------------------------------------------ Beta and Dirichlet
def bernoulli_model(s=None, mask=None, logits=False):
    with numpyro.plate("K", 3, dim=-1):
        pi = numpyro.sample("pi", dist.Beta(jnp.array([1.5, 0.7, 3.0]), jnp.array([2.5, 1.2, 0.9])))
    with numpyro.plate("N", 6, dim=-2), numpyro.plate("K", 3, dim=-1):
        with handlers.mask(mask=True if mask is None else mask):
            fn = dist.Bernoulli(logits=jnp.log(pi) - jnp.log1p(-pi)) if logits else dist.Bernoulli(probs=pi)
            numpyro.sample("s", fn, obs=s)


@pytest.mark.parametrize("logits", [False, True], ids=["probs", "logits"])
def test_beta_bernoulli_plate_batched_masked(logits):
    s = jnp.asarray(RNG.uniform(size=(6, 3)) < 0.4, jnp.float64)
    mask = jnp.asarray(RNG.uniform(size=(6, 3)) < 0.7)
    d, cond, _ = derived_at(bernoulli_model, (s, mask, logits), "pi")
    assert d.pair == "Beta–Bernoulli"
    m = np.asarray(mask, float)
    close(cond.concentration1, np.array([1.5, 0.7, 3.0]) + (m * s).sum(0))
    close(cond.concentration0, np.array([2.5, 1.2, 0.9]) + (m * (1 - s)).sum(0))


def test_beta_binomial():
    n, k = jnp.array([5, 3, 8]), jnp.array([2.0, 3.0, 1.0])

    def model(y=None):
        p = numpyro.sample("p", dist.Beta(1.7, 0.8))
        with numpyro.plate("N", 3):
            numpyro.sample("y", dist.Binomial(n, probs=p), obs=y)

    d, cond, _ = derived_at(model, (k,), "p")
    assert d.pair == "Beta–Binomial"
    close(cond.concentration1, 1.7 + 6.0)
    close(cond.concentration0, 0.8 + 16 - 6.0)


ALPHA = jnp.array([[1.3, 0.6, 2.2], [0.9, 1.8, 0.5]])


def test_dirichlet_categorical_rows_chosen_by_a_table():
    # Two groups, each row of pi a Dirichlet; observation i reads the row of its group.
    group = jnp.array([0, 1, 1, 0, 1, 0, 0])
    c = jnp.array([2, 0, 1, 2, 1, 0, 2])

    def model(c=None):
        with numpyro.plate("G", 2):
            pi = numpyro.sample("pi", dist.Dirichlet(ALPHA))
        with numpyro.plate("N", 7):
            numpyro.sample("c", dist.Categorical(probs=pi[group]), obs=c)

    d, cond, _ = derived_at(model, (c,), "pi")
    assert d.pair == "Dirichlet–Categorical" and d.structure == "one Dirichlet per row"
    counts = np.zeros((2, 3))
    np.add.at(counts, (np.asarray(group), np.asarray(c)), 1.0)
    close(cond.concentration, ALPHA + counts)


def test_dirichlet_multinomial():
    y = jnp.array([[2.0, 0.0, 3.0], [1.0, 1.0, 1.0]])

    def model(y=None):
        pi = numpyro.sample("pi", dist.Dirichlet(ALPHA[0]))
        with numpyro.plate("N", 2):
            numpyro.sample("y", dist.Multinomial(y.sum(-1), probs=pi), obs=y)

    d, cond, _ = derived_at(model, (y,), "pi")
    assert d.pair == "Dirichlet–Multinomial"
    close(cond.concentration, ALPHA[0] + y.sum(0))


# --------------------------------------------------------------------------- tempering
def test_derived_conditional_reads_the_temperature_of_the_caller():
    def model(X=None):
        tau = numpyro.sample("tau", dist.Gamma(GA, GB))
        with numpyro.plate("N", 6):
            numpyro.sample("X", dist.Normal(C, SIG / jnp.sqrt(tau)), obs=X)

    d = detect(model, (X6,), {}, "tau")
    update = d.update()
    assert update.tempered
    priors, obs, _ = read_model(temper(model, 0.3), {"tau": jnp.asarray(1.1)}, (X6,), {})
    cond = update.conditional({"tau": jnp.asarray(1.1)}, obs, priors)["tau"]
    close(cond.concentration, GA + 0.3 * 3.0)
    close(cond.rate, GB + 0.3 * 0.5 * np.sum((X6 - C) ** 2 / SIG**2))


# ------------------------------------------------------------------------ not conjugate
def _one_site(child_fn, prior=None):
    def model(X=None):
        w = numpyro.sample("w", prior if prior is not None else dist.Normal(0.0, 1.0))
        numpyro.sample("X", child_fn(w), obs=X)
    return model


@pytest.mark.parametrize("prior,child,reason", [
    (None, lambda w: dist.Normal(jnp.tanh(w), 1.0), "the mean of child 'X' is not affine in 'w'"),
    (None, lambda w: dist.MixtureSameFamily(dist.Categorical(probs=jnp.array([0.3, 0.7])),
                                            dist.Normal(jnp.stack([w, 2.0 - w]), 1.0)),
     "child 'X' is a mixture (MixtureSameFamily)"),
    (dist.TruncatedNormal(0.0, 1.0, low=0.0), lambda w: dist.Normal(w, 1.0),
     "the prior of 'w' is truncated"),
    (dist.Laplace(0.0, 1.0), lambda w: dist.Normal(w, 1.0), "the prior of 'w' is Laplace"),
    (None, lambda w: dist.Normal(0.0, jnp.exp(w)), "the scale of child 'X' (Normal) depends on 'w'"),
    (dist.Gamma(2.0, 1.0), lambda w: dist.Normal(0.0, w), "the precision of child 'X' is not linear in 'w'"),
    (dist.Gamma(2.0, 1.0), lambda w: dist.Poisson(w + 1.0), "the rate of child 'X' is not linear in 'w'"),
    (dist.Beta(2.0, 1.0), lambda w: dist.Bernoulli(probs=0.5 * w), "the probability of child 'X' is not an element of 'w'"),
    (None, lambda w: dist.Laplace(w, 1.0), "child 'X' is Laplace, which has no conjugate pair with a Normal prior"),
], ids=["tanh-mean", "mixture", "truncated-prior", "laplace-prior", "scale", "gamma-std",
        "poisson-offset", "beta-half", "laplace-child"])
def test_not_conjugate_reasons(prior, child, reason):
    result = detect(_one_site(child, prior), (jnp.asarray(0.3),), {}, "w")
    assert isinstance(result, NotConjugate) and reason in result.reason, result


def test_coupled_elements_are_not_a_product_of_gammas():
    # each rate is linear in lam, but a Poisson child reads the sum of two elements: the
    # conditional couples them and is no product of Gamma densities.
    def model(y=None):
        with numpyro.plate("K", 2):
            lam = numpyro.sample("lam", dist.Gamma(2.0, 1.0))
        numpyro.sample("y", dist.Poisson(lam[0] + lam[1]), obs=y)

    result = detect(model, (jnp.asarray(3.0),), {}, "lam")
    assert isinstance(result, NotConjugate) and "not a product of Gamma densities" in result.reason


def test_non_finite_conditional_raises_naming_the_site():
    with pytest.raises(ValueError, match=r"conditional of 'w' has a non-finite"):
        detect(normal_mean_model, (np.where(np.arange(6) == 2, np.inf, X6),), {}, "w")


def test_unknown_site_raises():
    with pytest.raises(ValueError, match="'nope' is not a latent sample site"):
        detect(normal_mean_model, (X6,), {}, "nope")


# --------------------------------------------------------------------------- under jit
def test_derived_update_is_pure_and_jits():
    d = detect(regression_model, (X6[:4],), {}, "w")
    update = d.update()
    values = {"w": jnp.array([0.3, -0.2, 0.9])}
    priors, obs, _ = read_model(regression_model, values, (X6[:4],), {})
    eager = update.conditional(values, obs, priors)["w"]
    jitted = jax.jit(lambda v, o: update.conditional(v, o, priors)["w"].loc)(values, obs)
    close(jitted, eager.loc)
    # the observed values are read from obs, not from the arguments detect saw
    other = {"X": obs["X"] + 1.0}
    moved = update.conditional(values, other, priors)["w"].loc
    assert float(jnp.max(jnp.abs(moved - eager.loc))) > 0.1
    draw = jax.jit(lambda k: update.sample(k, values, obs, priors)["w"])(jax.random.PRNGKey(0))
    assert draw.shape == (3,)


# ------------------------------------------------------------------------ the builder
def nig(X=None, *, N=6, priors=None):
    p = {"v": dist.LogNormal(0.0, 0.5), **(priors or {})}
    v = numpyro.sample("v", p["v"])
    mu = numpyro.sample("mu", dist.Normal(0.5, jnp.sqrt(v)))
    with numpyro.plate("N", N):
        numpyro.sample("X", dist.Normal(mu, jnp.sqrt(v)), obs=X)


IG = {"v": dist.InverseGamma(3.0, 2.0)}


def test_plan_says_hand_written_derived_or_nuts_and_why():
    plan = ConjugateGibbs(nig, []).plan(X6, priors=IG)
    assert plan.fallback == ()
    assert plan.site_kinds() == {"v": ("derived", "InverseGamma–Normal (variance)"),
                                 "mu": ("derived", "Normal–Normal (mean)")}
    # with the model's default LogNormal prior v goes to NUTS, and the plan says why
    plan = ConjugateGibbs(nig, []).plan(X6)
    kind, why = plan.site_kinds()["v"]
    assert kind == "NUTS" and "not conjugate: the prior of 'v' is LogNormal" in why
    assert "not conjugate: the prior of 'v' is LogNormal" in str(plan)
    assert "mu | derived: Normal–Normal (mean)" in str(plan)
    # opting out restores the generic fallback for every uncovered site
    plan = ConjugateGibbs(nig, [], derive=False).plan(X6, priors=IG)
    assert set(plan.fallback_continuous) == {"v", "mu"} and plan.derived == ()


def test_swapped_fa_prior_plan_gives_the_detectors_reason():
    from latentzoo.inference.fa import fa_updates
    from latentzoo.models.factor_analysis import factor_analysis

    X = jnp.asarray(RNG.normal(size=(8, 3)))
    plan = ConjugateGibbs(factor_analysis, fa_updates()).plan(X, K=1, priors={"W": dist.Laplace(0.0, 1.0)})
    assert plan.fallback_continuous == ("W",)
    assert plan.site_kinds()["z"] == ("hand-written", "z | W, mu, psi")
    assert "W is Laplace, the update needs Normal; not conjugate: the prior of 'W' is Laplace" \
        in plan.site_kinds()["W"][1]


def test_derived_and_nuts_blocks_run_together():
    # mu derived, v (LogNormal) by NUTS: the composite binds the derived update to its own
    # conditioned model at every step. Its mu draws follow the exact conditional mean given v.
    kernel = ConjugateGibbs(nig, [])
    mcmc = MCMC(kernel, num_warmup=150, num_samples=300, progress_bar=False)
    with pytest.warns(GenericKernelNote, match=r"v \(NUTS\)"):
        mcmc.run(jax.random.PRNGKey(0), X6)
    assert kernel.last_plan.site_kinds()["mu"][0] == "derived"
    s = mcmc.get_samples()
    assert bool(jnp.all(jnp.isfinite(s["mu"]))) and bool(jnp.all(s["v"] > 0))
    # E[mu | v, X] = (0.5 + sum X) / (1 + N) whatever v, so exact draws of mu given v are
    # uncorrelated across sweeps: their mean is within 4 standard errors of it.
    exact = (0.5 + X6.sum()) / 7.0
    se = float(jnp.sqrt(jnp.mean(s["v"]) / 7.0 / 300.0))
    assert abs(float(s["mu"].mean()) - exact) < 4 * se


def test_vectorized_chains_with_derived_updates():
    mcmc = MCMC(ConjugateGibbs(nig, []), num_warmup=10, num_samples=20, num_chains=2,
                chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(1), X6, priors=IG)
    v = mcmc.get_samples(group_by_chain=True)["v"]
    assert v.shape == (2, 20) and not np.allclose(v[0], v[1])
