"""log K_v (latentzoo.inference.bessel) and the GIG / inverse Gaussian distributions
(latentzoo.inference.gig) against scipy, quadrature and Monte Carlo.

KS tests: 20000 draws each, fixed seeds, and a Bonferroni threshold over all the file's KS tests
(family-wise level 1%): a right sampler passes all of them with probability >= 0.99, while a
sampler that returns unaccepted proposals (one round, below) gives p-values below 1e-10.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats as st
from scipy.special import kve

from latentzoo.inference.bessel import bessel_kv_ratio, log_bessel_kv, log_bessel_kve
from latentzoo.inference.gig import (
    GeneralizedInverseGaussian,
    InverseGaussian,
    devroye_envelope,
    devroye_round,
    polson_scott_inverse_lambda,
    polson_scott_lambda,
    standard_gig_log_sample,
)

N_DRAWS = 20000
# Every KS test in this file: 10 GIG + 2 limits + 1 tiny omega + 5 IG + 6 Polson-Scott.
N_KS_TESTS = 24
KS_THRESHOLD = 0.01 / N_KS_TESTS


# ------------------------------------------------------------------------------------------
# log K_v(x)
# ------------------------------------------------------------------------------------------

ORDERS = np.array([0.0, 1e-6, 0.5, 1.0, 2.5, 10.0, 100.0, 1000.0])
ARGS = np.logspace(-6, 6, 25)


def debye_log_kv(v, x):
    """log K_v(x) by the Debye uniform expansion (DLMF 10.41.4, terms u_0..u_4): the reference
    where kve overflows (v = 100, 1000 at small x), with relative error O(v^-5) < 1e-10."""
    z = x / v
    sq = np.sqrt(1.0 + z * z)
    eta = sq + np.log(z / (1.0 + sq))
    p = 1.0 / sq
    u = [
        1.0,
        (3 * p - 5 * p**3) / 24,
        (81 * p**2 - 462 * p**4 + 385 * p**6) / 1152,
        (30375 * p**3 - 369603 * p**5 + 765765 * p**7 - 425425 * p**9) / 414720,
        (4465125 * p**4 - 94121676 * p**6 + 349922430 * p**8 - 446185740 * p**10 + 185910725 * p**12)
        / 39813120,
    ]
    series = sum((-1) ** k * u[k] / v**k for k in range(5))
    return 0.5 * np.log(np.pi / (2 * v)) - v * eta - 0.25 * np.log1p(z * z) + np.log(series)


def reference_log_kv(v, x):
    with np.errstate(over="ignore", divide="ignore"):
        ref = np.log(kve(v, x)) - x
    debye = np.where(v >= 100, debye_log_kv(np.maximum(v, 1.0), x), np.nan)
    return np.where(np.isfinite(ref), ref, debye)


def test_debye_reference_agrees_with_scipy_where_both_exist():
    # Guards the reference itself: at v = 100, 1000 and x where kve is finite.
    v, x = np.meshgrid([100.0, 1000.0], np.logspace(1, 6, 11), indexing="ij")
    with np.errstate(over="ignore"):
        ref = np.log(kve(v, x)) - x
    ok = np.isfinite(ref)
    assert ok.sum() >= 15
    assert np.max(np.abs(debye_log_kv(v, x) - ref)[ok] / np.abs(ref[ok])) < 1e-12


def test_log_bessel_kv_matches_scipy_over_the_grid():
    # Relative error of log K (absolute where |log K| < 1) over v in {0..1000} x x in 1e-6..1e6.
    # Measured worst is ~1e-15; 1e-12 fails a window that misses the peak, a rule with a
    # wrong end weight (error ~ step * integrand(0)) or an O(h^2) rule at 128 nodes.
    v, x = np.meshgrid(ORDERS, ARGS, indexing="ij")
    got = np.asarray(jax.jit(log_bessel_kv)(v, x))
    ref = reference_log_kv(v, x)
    assert np.all(np.isfinite(ref))
    err = np.abs(got - ref) / np.maximum(1.0, np.abs(ref))
    assert err.max() < 1e-12, (err.max(), v.flat[err.argmax()], x.flat[err.argmax()])
    # The overflow corner is part of the grid: log K_1000(1e-6) ~ 2e4.
    assert got.max() > 2e4 and got.min() < -9.9e5


def test_log_bessel_kv_exact_cases_and_domain():
    x = ARGS
    # K_{1/2}(x) = sqrt(pi / (2x)) e^{-x}; K is even in v.
    np.testing.assert_allclose(log_bessel_kv(0.5, x), 0.5 * np.log(np.pi / (2 * x)) - x, rtol=1e-14, atol=1e-14)
    np.testing.assert_array_equal(log_bessel_kv(-2.5, x), log_bessel_kv(2.5, x))
    np.testing.assert_allclose(log_bessel_kv(3.0, x), log_bessel_kve(3.0, x) - x, rtol=1e-15, atol=0)
    out = np.asarray(log_bessel_kv(1.0, jnp.array([0.0, -1.0])))
    assert out[0] == np.inf and np.isnan(out[1])
    # Broadcasting and vmap.
    assert log_bessel_kv(ORDERS[:, None], ARGS[None, :]).shape == (8, 25)
    np.testing.assert_allclose(jax.vmap(log_bessel_kv)(ORDERS, ORDERS + 1.0),
                               log_bessel_kv(ORDERS, ORDERS + 1.0), rtol=1e-14)


def test_log_bessel_kv_gradient_in_x():
    # d/dx log K_v(x) = v/x - K_{v+1}(x)/K_v(x) (DLMF 10.29.2).
    v, x = (a.ravel() for a in np.meshgrid([0.0, 0.5, 2.5, 100.0], [1e-3, 1.0, 30.0, 1e4], indexing="ij"))
    grad = jax.vmap(jax.grad(log_bessel_kv, argnums=1))(jnp.asarray(v), jnp.asarray(x))
    expected = v / x - np.exp(reference_log_kv(v + 1, x) - reference_log_kv(v, x))
    np.testing.assert_allclose(grad, expected, rtol=1e-9)


def test_bessel_ratio_keeps_digits_at_large_x():
    # K_{3/2}(x)/K_{1/2}(x) = 1 + 1/x exactly; at x = 1e6 a difference of log K (each ~ -1e6)
    # would lose ~1e-10 to rounding, the kve difference does not.
    x = np.array([1e-6, 1.0, 1e6])
    np.testing.assert_allclose(bessel_kv_ratio(0.5, 1.0, x), 1.0 + 1.0 / x, rtol=1e-13)


# ------------------------------------------------------------------------------------------
# GIG: sampler
# ------------------------------------------------------------------------------------------

# (a, b, p): a, b over 1e-6..1e6, p = 0 (horseshoe), +-1/2, negative, large.
GIG_PARAMS = [
    (1e-6, 1e-6, 0.0),
    (1e6, 1e6, 0.0),
    (1.4, 0.3, 0.0),
    (1e-6, 1e6, 0.5),
    (1e6, 1e-6, -0.5),
    (1.0, 1.0, -1.5),
    (2.0, 3.0, 2.0),
    (1e3, 1e-3, -3.0),
    (1e-3, 1e-3, 50.0),
    (1e6, 1e6, -1.5),
]


def scipy_gig(a, b, p):
    # scipy's geninvgauss(p, b_s): density ~ x^{p-1} exp(-b_s (x + 1/x)/2); scale sqrt(b/a).
    return st.geninvgauss(p, math.sqrt(a * b), scale=math.sqrt(b / a))


@pytest.fixture(scope="module")
def gig_draws():
    a, b, p = (jnp.array(z) for z in zip(*GIG_PARAMS))
    d = GeneralizedInverseGaussian(a, b, p)
    return np.asarray(jax.jit(lambda k: d.sample(k, (N_DRAWS,)))(jax.random.PRNGKey(0)))


@pytest.mark.parametrize("i", range(len(GIG_PARAMS)), ids=[str(q) for q in GIG_PARAMS])
def test_gig_sampler_ks_against_scipy(gig_draws, i):
    x = gig_draws[:, i]
    assert np.all(np.isfinite(x)) and np.all(x > 0)
    assert st.kstest(x, scipy_gig(*GIG_PARAMS[i]).cdf).pvalue > KS_THRESHOLD


def test_gig_limits_ks():
    # b = 0, p > 0: Gamma(p, rate a/2); a = 0, p < 0: inverse-Gamma(-p, scale b/2).
    d = GeneralizedInverseGaussian(jnp.array([3.0, 0.0]), jnp.array([0.0, 5.0]), jnp.array([0.7, -2.5]))
    x = np.asarray(d.sample(jax.random.PRNGKey(1), (N_DRAWS,)))
    assert st.kstest(x[:, 0], st.gamma(0.7, scale=2 / 3.0).cdf).pvalue > KS_THRESHOLD
    assert st.kstest(x[:, 1], st.invgamma(2.5, scale=2.5).cdf).pvalue > KS_THRESHOLD


def test_capped_sampler_fails_the_ks_test():
    # Control: the same envelope, but returning the first proposal whether accepted or not (a
    # loop capped at one round) is caught at p = 0, omega = 1 (about 18% of proposals rejected).
    lam, omega = jnp.zeros(N_DRAWS), jnp.ones(N_DRAWS)
    y, accepted = devroye_round(jax.random.PRNGKey(2), devroye_envelope(lam, omega))
    assert 0.05 < 1 - float(accepted.mean()) < 0.5
    assert st.kstest(np.exp(np.asarray(y)), st.geninvgauss(0.0, 1.0).cdf).pvalue < 1e-10


def test_sampler_returns_the_first_accepted_proposal_of_each_element():
    # Replays the loop's rounds (the same key sequence) and checks that each output is the
    # proposal of that element's first accepted round, and that the loop ran until every element
    # had one: no element can come back unaccepted, whatever the number of rounds.
    n, p, omega = 50000, jnp.full(50000, -0.5), jnp.full(50000, 0.7)
    key = jax.random.PRNGKey(3)
    log_x, rounds = standard_gig_log_sample(key, p, omega, return_rounds=True)
    rounds = int(rounds)
    assert rounds >= 4  # with ~15% rejections some of 5e4 elements need several rounds
    env = devroye_envelope(jnp.abs(p), omega)
    first = np.full(n, np.nan)
    for _ in range(rounds):
        key, sub = jax.random.split(key)
        y, ok = devroye_round(sub, env)
        take = np.asarray(ok) & np.isnan(first)
        first[take] = np.asarray(y)[take]
    assert not np.any(np.isnan(first))
    expected = -(np.arcsinh(0.5 / 0.7) + first)  # p < 0: the reciprocal of GIG(1/2, 0.7)
    np.testing.assert_allclose(log_x, expected, rtol=0, atol=1e-12)


def test_sampler_terminates_and_stays_finite_at_extreme_parameters():
    # omega from 1e-300 to 1e300 and p from 0 to 1e10: the envelope stays finite (an overflowing
    # cosh or a subnormal alpha used to give NaN, and a NaN envelope never accepts, so the
    # uncapped loop would spin for ever). Invalid parameters give NaN in zero rounds.
    p, omega = (z.ravel() for z in jnp.meshgrid(jnp.array([0.0, 1e-10, 0.5, -3.0, 1e10]),
                                                 jnp.array([1e-300, 1e-150, 1e-20, 1e20, 1e150, 1e300])))
    log_x, rounds = standard_gig_log_sample(jax.random.PRNGKey(8), jnp.repeat(p, 200), jnp.repeat(omega, 200),
                                            return_rounds=True)
    assert np.all(np.isfinite(np.asarray(log_x))) and int(rounds) < 20
    bad, rounds = standard_gig_log_sample(jax.random.PRNGKey(8), jnp.array([jnp.nan, 0.0, 0.0, 1.0, jnp.inf, 0.5]),
                                          jnp.array([1.0, 0.0, -1.0, jnp.nan, 1.0, jnp.inf]), return_rounds=True)
    assert np.all(np.isnan(np.asarray(bad))) and int(rounds) == 0
    # At omega = 1e-150, GIG(1/2, omega) is (2/omega) Gamma(1/2) to a relative 1e-150.
    x = np.exp(np.asarray(standard_gig_log_sample(jax.random.PRNGKey(9), jnp.full(N_DRAWS, 0.5),
                                                  jnp.full(N_DRAWS, 1e-150))))
    assert st.kstest(x * 1e-150 / 2, st.gamma(0.5).cdf).pvalue > KS_THRESHOLD


def test_sampler_jit_vmap_and_determinism():
    d = GeneralizedInverseGaussian(2.0, 0.5, 0.0)
    keys = jax.random.split(jax.random.PRNGKey(4), 3)
    draws = jax.jit(jax.vmap(lambda k: d.sample(k, (4,))))(keys)
    assert draws.shape == (3, 4) and np.all(np.asarray(draws) > 0)
    np.testing.assert_allclose(draws[1], d.sample(keys[1], (4,)), rtol=1e-14)
    # Built inside a trace from concrete arrays (the parameter check must not branch on a
    # tracer) and from traced parameters (the check is skipped).
    inside = jax.jit(lambda k: GeneralizedInverseGaussian(jnp.array([2.0, 1.0]), 0.5, 0.0).sample(k))(keys[0])
    assert inside.shape == (2,)
    np.testing.assert_allclose(jax.jit(lambda a: GeneralizedInverseGaussian(a, 0.5, 0.0).mean)(2.0), d.mean, rtol=1e-14)


def test_unsupported_parameters_raise_one_clear_error():
    bad = [(1.0, 0.0, -0.5), (1.0, 0.0, 0.0), (0.0, 1.0, 0.5), (0.0, 0.0, 1.0), (-1.0, 1.0, 1.0)]
    for a, b, p in bad:
        with pytest.raises(ValueError, match="needs a > 0 and b > 0"):
            GeneralizedInverseGaussian(a, b, p)
    # Traced, they cannot raise: every method gives NaN, and sampling terminates.
    a, b, p = (jnp.array(z) for z in zip(*bad))

    def methods(a, b, p):
        d = GeneralizedInverseGaussian(a, b, p)
        return (d.sample(jax.random.PRNGKey(0)), d.log_prob(1.0), d.mean, d.variance, d.mean_reciprocal(),
                d.mean_log())

    for out in jax.jit(methods)(a, b, p):
        assert np.all(np.isnan(np.asarray(out)))


# ------------------------------------------------------------------------------------------
# GIG: density and moments
# ------------------------------------------------------------------------------------------

# Parameters where the moments are finite; the limits included.
MOMENT_PARAMS = [
    (1e-6, 1e-6, 0.0),
    (1.4, 0.3, 0.0),
    (1e-6, 1e6, 0.5),
    (1.0, 1.0, -1.5),
    (2.0, 3.0, 2.0),
    (1e3, 1e-3, -3.0),
    (1e6, 1e6, -1.5),
    (3.0, 0.0, 2.5),
    (0.0, 5.0, -3.5),
]


def quadrature(d, scale):
    """E[1], E[x], E[1/x], E[log x], Var x under d by the trapezoid in u = log(x/scale)."""
    # Step 3e-4: a third of the narrowest bulk's width in u (1e-3 at sqrt(ab) = 1e6).
    u = np.linspace(-60.0, 60.0, 400_001)
    log_x = u + math.log(scale)
    w = np.exp(np.asarray(d.log_prob(jnp.exp(log_x))) + log_x) * (u[1] - u[0])
    m1 = np.sum(w * np.exp(log_x))
    return np.sum(w), m1, np.sum(w * np.exp(-log_x)), np.sum(w * log_x), np.sum(w * (np.exp(log_x) - m1) ** 2)


@pytest.mark.parametrize("params", MOMENT_PARAMS, ids=str)
def test_gig_density_and_moments_against_quadrature(params):
    # Normalisation to 1e-9 and the four moments to 1e-8 relative: a wrong sign of p in the
    # normaliser, a missing factor 2 or a Bessel ratio of the wrong order fails by far more.
    a, b, p = params
    d = GeneralizedInverseGaussian(a, b, p)
    # Centre the grid on the bulk: sqrt(b/a) (or the limit's scale).
    scale = math.sqrt(b / a) if a > 0 and b > 0 else (2 * p / a if b == 0 else b / (2 * -p))
    total, mean, mean_recip, mean_log, var = quadrature(d, scale)
    assert abs(total - 1.0) < 1e-9
    np.testing.assert_allclose(float(d.mean), mean, rtol=1e-8)
    np.testing.assert_allclose(float(d.mean_reciprocal()), mean_recip, rtol=1e-8)
    np.testing.assert_allclose(float(d.mean_log()), mean_log, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(float(d.variance), var, rtol=1e-6)


def test_gig_log_prob_gradient_in_the_parameters():
    # Central differences (step 1e-6, error ~1e-9) against jax.grad in (a, b, p), p = 0 included
    # (where d log K_p / dp = 0 by evenness); a lost Bessel term or a wrong sign fails by > 1e-2.
    def f(theta):
        return GeneralizedInverseGaussian(theta[0], theta[1], theta[2]).log_prob(0.7)

    for theta in (jnp.array([1.3, 0.4, -0.7]), jnp.array([1.3, 0.4, 0.0]), jnp.array([0.02, 30.0, 2.5])):
        eps = 1e-6
        fd = [(f(theta.at[i].add(eps)) - f(theta.at[i].add(-eps))) / (2 * eps) for i in range(3)]
        np.testing.assert_allclose(jax.grad(f)(theta), fd, rtol=1e-6, atol=1e-7)


def test_gig_log_prob_against_scipy():
    x = np.array([0.01, 0.3, 1.0, 4.0, 50.0])
    for a, b, p in [(1.4, 0.3, 0.0), (2.0, 3.0, 2.0), (1.0, 1.0, -1.5), (0.2, 7.0, 0.5)]:
        np.testing.assert_allclose(GeneralizedInverseGaussian(a, b, p).log_prob(x),
                                   scipy_gig(a, b, p).logpdf(x), rtol=1e-12)
    np.testing.assert_allclose(GeneralizedInverseGaussian(3.0, 0.0, 0.7).log_prob(x),
                               st.gamma(0.7, scale=2 / 3.0).logpdf(x), rtol=1e-12)
    np.testing.assert_allclose(GeneralizedInverseGaussian(0.0, 5.0, -2.5).log_prob(x),
                               st.invgamma(2.5, scale=2.5).logpdf(x), rtol=1e-12)


def test_gig_moments_against_monte_carlo(gig_draws):
    # Sample means within 5 standard errors of mean and E[1/x], for parameters with finite
    # variances of x and 1/x.
    for i in (2, 5, 6, 7):
        x, d = gig_draws[:, i], GeneralizedInverseGaussian(*GIG_PARAMS[i])
        for f, expected in ((x, d.mean), (1 / x, d.mean_reciprocal())):
            assert abs(f.mean() - float(expected)) < 5 * f.std() / math.sqrt(N_DRAWS)


def test_supplement_reciprocal_moment_is_upside_down():
    # The supplement's <xi^-1> = sqrt(a/b) K_p / K_{p-1}; the right one is sqrt(a/b) K_{p-1} / K_p.
    # At (a, b, p) = (2 * 0.7, 0.3, 0) quadrature gives 3.5244, the supplement 1.3241. The two
    # coincide only where K_p = K_{p-1}, i.e. p = 1/2 (r_a = 1).
    def supplement(a, b, p):
        return math.sqrt(a / b) * float(bessel_kv_ratio(p - 1, 1.0, math.sqrt(a * b)))

    for a, b, p in [(1.4, 0.3, 0.0), (2.0, 3.0, 2.0), (1.0, 1.0, -1.5)]:
        _, _, mean_recip, _, _ = quadrature(GeneralizedInverseGaussian(a, b, p), math.sqrt(b / a))
        assert abs(supplement(a, b, p) / mean_recip - 1.0) > 0.1
        np.testing.assert_allclose(float(GeneralizedInverseGaussian(a, b, p).mean_reciprocal()), mean_recip,
                                   rtol=1e-8)
    np.testing.assert_allclose(supplement(1.4, 0.3, 0.5),
                               float(GeneralizedInverseGaussian(1.4, 0.3, 0.5).mean_reciprocal()), rtol=1e-12)
    np.testing.assert_allclose(float(GeneralizedInverseGaussian(1.4, 0.3, 0.0).mean_reciprocal()), 3.5244, atol=1e-4)
    np.testing.assert_allclose(supplement(1.4, 0.3, 0.0), 1.3241, atol=1e-4)


# ------------------------------------------------------------------------------------------
# Inverse Gaussian and the Polson-Scott variable
# ------------------------------------------------------------------------------------------

IG_PARAMS = [(1.0, 1.0), (0.3, 2.0), (1e3, 1.0), (1e-6, 1e6), (1e6, 1e-6)]


def test_inverse_gaussian_ks_and_moments():
    mu, lam = (jnp.array(z) for z in zip(*IG_PARAMS))
    d = InverseGaussian(mu, lam)
    x = np.asarray(jax.jit(lambda k: d.sample(k, (N_DRAWS,)))(jax.random.PRNGKey(5)))
    for i, (m, l) in enumerate(IG_PARAMS):
        # scipy's invgauss(mu_s, scale): mean mu_s * scale, shape scale.
        ref = st.invgauss(m / l, scale=l)
        assert st.kstest(x[:, i], ref.cdf).pvalue > KS_THRESHOLD, (m, l)
        np.testing.assert_allclose(InverseGaussian(m, l).log_prob(x[:50, i]), ref.logpdf(x[:50, i]), rtol=1e-10)
        np.testing.assert_allclose([float(d.mean[i]), float(d.variance[i])], [ref.mean(), ref.var()], rtol=1e-10)
        # IG(mu, lam) = GIG(lam / mu^2, lam, -1/2): the two E[1/x] agree.
        gig = GeneralizedInverseGaussian(l / m**2, l, -0.5)
        np.testing.assert_allclose(float(d.mean_reciprocal()[i]), 1 / m + 1 / l, rtol=1e-14)
        np.testing.assert_allclose(float(gig.mean_reciprocal()), 1 / m + 1 / l, rtol=1e-10)


MARGINS = [0.0, 1e-12, 1e-3, 1.0, -5.0, 1e3]


def test_polson_scott_lambda_ks():
    # The supplement's lambda^{-1} | . ~ IG(1/|m|, 1), i.e. P(lambda <= t) = P(IG >= 1/t); at m = 0
    # lambda ~ GIG(1, 0, 1/2) = chi^2_1, and at m = 1e-12 it is chi^2_1 to within 1e-12.
    margins = jnp.repeat(jnp.array(MARGINS)[:, None], N_DRAWS, axis=1)
    lam = np.asarray(jax.jit(polson_scott_lambda)(jax.random.PRNGKey(6), margins))
    for i, m in enumerate(MARGINS):
        if abs(m) < 1e-9:
            cdf = st.chi2(1).cdf
        else:
            cdf = lambda t, m=m: st.invgauss(1 / abs(m)).sf(1 / t)  # noqa: E731
        assert st.kstest(lam[i], cdf).pvalue > KS_THRESHOLD, m


def test_zero_margin_is_finite_where_the_naive_draw_is_not():
    margin = jnp.zeros(N_DRAWS).at[:3].set(jnp.array([-0.0, 1e-300, -1e-200]))
    key = jax.random.PRNGKey(7)
    lam = np.asarray(polson_scott_lambda(key, margin))
    inv = np.asarray(polson_scott_inverse_lambda(key, margin))
    assert np.all(np.isfinite(lam)) and np.all(lam > 0) and np.all(np.isfinite(inv))
    np.testing.assert_allclose(inv, 1 / lam, rtol=1e-15)
    # Control: IG(1/|m|, 1) drawn as written (mean 1/0 = inf) gives no finite lambda^{-1}.
    naive = np.asarray(InverseGaussian(1.0 / jnp.abs(margin[:10]), 1.0).sample(key))
    assert not np.any(np.isfinite(naive[3:]))
