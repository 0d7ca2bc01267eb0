"""Exact tests of the shared conjugate and Gaussian algebra (``inference/conjugate.py``,
``inference/gaussian.py``), closing gaps mutation testing found there.

The Gibbs and VB tests use these helpers through the families, at sizes and hyperparameters where a
wrong term can be small (an entropy's additive constant moves every ELBO by the same amount, a
variance term vanishes at var = 0) or where only one branch is taken (shared vs batched
precisions). Here each helper is compared with an independent reference: NumPyro's own
distributions (entropy, log density), quadrature of the defining expectation, dense linear algebra
in NumPy. Every reference is exact up to round-off or quadrature error (< 1e-8), while the mutants
are off by O(0.1) or more, so the tolerances below cannot hide one.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from scipy import integrate, special, stats

from latentzoo.inference import conjugate as cj
from latentzoo.inference import enumerate as en
from latentzoo.inference import gaussian as ga

RNG = np.random.default_rng(0)
A = jnp.asarray(RNG.uniform(0.3, 6.0, 5))  # shapes far from 1 on both sides
B = jnp.asarray(RNG.uniform(0.2, 4.0, 5))


def _quad(f, lo, hi):
    return integrate.quad(f, lo, hi, limit=200, epsabs=1e-10, epsrel=1e-10)[0]


def _gamma_logpdf(t, a, b):  # SciPy's, independent of NumPyro's (rate b)
    return stats.gamma(a, scale=1.0 / b).logpdf(t)


def _gamma_expect(f, a, b):
    """E[f(tau)] under Gamma(a, b), integrated over u = log tau (smooth even for shapes < 1)."""
    return _quad(lambda u: f(np.exp(u)) * np.exp(_gamma_logpdf(np.exp(u), a, b) + u), -300, 15)


# ------------------------------------------------------------------------------- conjugate
def test_gamma_moments_and_entropy_match_numpyro_and_quadrature():
    E_tau, E_log_tau = cj.gamma_moments(A, B)
    np.testing.assert_allclose(E_tau, dist.Gamma(A, B).mean, rtol=1e-12)
    for a, b, el in zip(np.asarray(A), np.asarray(B), np.asarray(E_log_tau)):
        ref = _gamma_expect(np.log, a, b)
        assert abs(el - ref) < 1e-7
    np.testing.assert_allclose(cj.gamma_entropy(A, B), dist.Gamma(A, B).entropy(), rtol=1e-12)


def test_beta_and_dirichlet_log_moments_match_quadrature():
    E_log_pi, E_log_1m = cj.beta_log_moments(A, B)
    for a, b, e1, e0 in zip(np.asarray(A), np.asarray(B), np.asarray(E_log_pi), np.asarray(E_log_1m)):
        pdf = lambda p, a=a, b=b: np.exp((a - 1) * np.log(p) + (b - 1) * np.log1p(-p) - special.betaln(a, b))  # noqa: E731
        assert abs(e1 - _quad(lambda p: np.log(p) * pdf(p), 0, 1)) < 1e-7
        assert abs(e0 - _quad(lambda p: np.log1p(-p) * pdf(p), 0, 1)) < 1e-7
    # Dirichlet: each coordinate's marginal is Beta(alpha_j, sum - alpha_j); batched over rows
    alpha = jnp.stack([A[:3], B[:3]])  # (2, 3)
    got = cj.dirichlet_log_moments(alpha)
    want = jnp.stack([cj.beta_log_moments(r, r.sum() - r)[0] for r in alpha])
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_expected_log_priors_match_their_definitions():
    # E_q[log N(theta; loc0, 1/prec0)] for q = N(mean, var), by Gauss-Hermite quadrature
    loc0, prec0 = jnp.asarray([0.7, -1.3, 2.0]), jnp.asarray([0.4, 3.0, 1.7])
    mean, var = jnp.asarray([-0.2, 0.5, 2.4]), jnp.asarray([0.9, 0.05, 2.5])
    x, w = np.polynomial.hermite_e.hermegauss(40)
    theta = mean[:, None] + jnp.sqrt(var)[:, None] * x[None, :]
    ref = (dist.Normal(loc0[:, None], 1 / jnp.sqrt(prec0)[:, None]).log_prob(theta) * w).sum(1) / w.sum()
    np.testing.assert_allclose(cj.normal_expected_log_prior(loc0, prec0, mean, var), ref, rtol=1e-10)
    # E_q[log Gamma(tau; a, b)] for q = Gamma(c, d), from q's moments
    c, d = A[::-1], B[::-1]
    E_tau, E_log_tau = cj.gamma_moments(c, d)
    got = cj.gamma_expected_log_prior(A, B, E_tau, E_log_tau)
    for i in range(5):
        a, b, ci, di = (float(v[i]) for v in (A, B, c, d))
        ref = _gamma_expect(lambda t: _gamma_logpdf(t, a, b), ci, di)
        assert abs(float(got[i]) - ref) < 1e-6


def test_conjugate_posteriors_match_bayes_rule_on_a_grid():
    # Normal-Gamma: posterior density ratio between two points equals prior x likelihood ratio
    a0, b0, r = 1.7, 0.6, jnp.asarray(RNG.normal(0, 0.8, 7))
    post = cj.gamma_precision_posterior(a0, b0, r.size, (r * r).sum())
    t = jnp.asarray([0.3, 1.1, 2.9])
    joint = dist.Gamma(a0, b0).log_prob(t) + dist.Normal(0, 1 / jnp.sqrt(t[:, None])).log_prob(r).sum(1)
    np.testing.assert_allclose(jnp.diff(post.log_prob(t)), jnp.diff(joint), rtol=1e-10)
    # Normal mean with known precisions
    loc0, prec0, y, py = 0.8, 2.5, jnp.asarray([1.2, -0.4, 3.0]), jnp.asarray([0.5, 4.0, 1.3])
    post = cj.normal_mean_posterior(loc0, prec0, py.sum(), (py * y).sum())
    m = jnp.asarray([-1.0, 0.4, 2.2])
    joint = dist.Normal(loc0, prec0**-0.5).log_prob(m) + dist.Normal(m[:, None], py**-0.5).log_prob(y).sum(1)
    np.testing.assert_allclose(jnp.diff(post.log_prob(m)), jnp.diff(joint), rtol=1e-10)
    # Beta-Bernoulli and Dirichlet-Categorical
    s = jnp.asarray([1, 0, 0, 1, 1, 0, 0, 0], jnp.float64)
    post = cj.beta_bernoulli_posterior(1.3, 2.2, s.sum(), s.size)
    p = jnp.asarray([0.1, 0.45, 0.8])
    joint = dist.Beta(1.3, 2.2).log_prob(p) + dist.Bernoulli(probs=p[:, None]).log_prob(s).sum(1)
    np.testing.assert_allclose(jnp.diff(post.log_prob(p)), jnp.diff(joint), rtol=1e-10)
    alpha0, c = jnp.asarray([0.7, 2.0, 1.2]), jnp.asarray([3.0, 0.0, 5.0])
    post = cj.dirichlet_categorical_posterior(alpha0, c)
    P = jnp.asarray([[0.2, 0.3, 0.5], [0.6, 0.1, 0.3]])
    joint = dist.Dirichlet(alpha0).log_prob(P) + (c * jnp.log(P)).sum(1)
    np.testing.assert_allclose(jnp.diff(post.log_prob(P)), jnp.diff(joint), rtol=1e-10)


# -------------------------------------------------------------------------------- gaussian
def _spd(K, batch=()):
    M = RNG.normal(size=batch + (K, K))
    return jnp.asarray(M @ np.swapaxes(M, -1, -2) + K * np.eye(K))


def test_precision_solve_and_moments_shared_and_batched():
    K = 3
    for P, b in ((_spd(K), jnp.asarray(RNG.normal(size=(4, K)))),  # shared P, 4 rows
                 (_spd(K, (4,)), jnp.asarray(RNG.normal(size=(4, K))))):  # one P per row
        factor, mean = ga.precision_solve(P, b)
        Pn, bn = np.asarray(P), np.asarray(b)
        if Pn.ndim == 2:  # shared: factor is L^-1, and L^-T L^-1 = P^-1
            want = np.linalg.solve(Pn, bn.T).T
            np.testing.assert_allclose(factor.T @ factor, np.linalg.inv(Pn), rtol=1e-10)
        else:  # batched: factor is L, and L L^T = P
            want = np.linalg.solve(Pn, bn[..., None])[..., 0]
            np.testing.assert_allclose(factor @ np.swapaxes(factor, -1, -2), Pn, rtol=1e-10)
        np.testing.assert_allclose(mean, want, rtol=1e-10)
        # the distribution and the coordinate-ascent moments: same mean, covariance P^-1
        d = ga.mvn_from_precision(P, b)
        np.testing.assert_allclose(d.mean, want, rtol=1e-10)
        m, T = ga.gaussian_block(P, b)
        np.testing.assert_allclose(m, want, rtol=1e-10)
        np.testing.assert_allclose(ga.cov_from_tril(T), np.linalg.inv(Pn), rtol=1e-10)


@jax.jit
def _draw_moments(key, P, b):
    x = jax.vmap(lambda k: ga.gaussian_draw(k, P, b))(jax.random.split(key, 20000))  # (M, R, K)
    c = x - x.mean(0)
    return x.mean(0), jnp.einsum("mrk,mrl->rkl", c, c) / x.shape[0]


def test_gaussian_draw_has_the_right_mean_and_covariance():
    # 20,000 draws: mean error s.e. <= 0.01 x sd, covariance entries within ~0.02 of exact;
    # a dropped or mis-signed noise term, or the noise drawn from L instead of L^-T, is off by
    # O(1) in the covariance
    K = 3
    for P in (_spd(K) / 4.0, _spd(K, (2,)) / 4.0):
        b = jnp.asarray(RNG.normal(size=(2, K)))
        mean, cov = _draw_moments(jax.random.PRNGKey(1), P, b)
        Pn = np.asarray(P)
        Pn = np.broadcast_to(Pn, (2, K, K))
        exact_cov = np.linalg.inv(Pn)
        exact_mean = np.einsum("rkl,rl->rk", exact_cov, np.asarray(b))
        sd = np.sqrt(np.diagonal(exact_cov, axis1=-2, axis2=-1))
        assert np.abs((mean - exact_mean) / sd).max() < 0.05
        scale = sd[:, :, None] * sd[:, None, :]
        assert np.abs((cov - exact_cov) / scale).max() < 0.06


def test_shared_gram_rows_match_their_own_precisions():
    """P_r = diag(a) + lam_r G, per group: mean and covariance to round-off against solving each
    row's precision; 20,000 draws within 0.05 sd (mean) and 0.06 (covariance entries)."""
    C, R, F = 2, 3, 4
    a = jnp.asarray(RNG.uniform(0.3, 3.0, (C, F)))
    Z = RNG.normal(size=(C, 9, F))
    G = jnp.asarray(np.einsum("cnf,cng->cfg", Z, Z))
    lam = jnp.asarray(RNG.uniform(0.2, 4.0, (C, R)))
    b = jnp.asarray(RNG.normal(size=(C, R, F)))
    P = np.asarray(a)[:, None, :, None] * np.eye(F) + np.asarray(lam)[..., None, None] * np.asarray(G)[:, None]
    cov = np.linalg.inv(P)
    mean, basis, weights = ga.shared_gram_moments(a, G, lam, b)
    np.testing.assert_allclose(mean, np.einsum("crfg,crg->crf", cov, b), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(np.einsum("cfg,crg,chg->crfh", basis, 1.0 / weights, basis), cov,
                               rtol=1e-10, atol=1e-12)
    x = jax.jit(jax.vmap(lambda k: ga.shared_gram_draw(k, a, G, lam, b)))(
        jax.random.split(jax.random.PRNGKey(2), 20000))
    sd = np.sqrt(np.diagonal(cov, axis1=-2, axis2=-1))
    assert np.abs((np.asarray(x.mean(0)) - np.asarray(mean)) / sd).max() < 0.05
    c = np.asarray(x - x.mean(0))
    emp = np.einsum("mcrf,mcrg->crfg", c, c) / c.shape[0]
    assert np.abs((emp - cov) / (sd[..., :, None] * sd[..., None, :])).max() < 0.06


def test_gaussian_entropy_matches_numpyro_summed_over_the_batch():
    for batch in ((), (3,), (2, 2)):
        T = jnp.linalg.cholesky(_spd(3, batch))
        want = dist.MultivariateNormal(jnp.zeros(3), scale_tril=T).entropy().sum()
        np.testing.assert_allclose(ga.gaussian_entropy(T), want, rtol=1e-12)


# ------------------------------------------------------------------------------- enumerate
def test_enumerated_posterior_sums_over_several_chunks_with_padding():
    # K = 12 (4096 states) makes the row chunk 512 rows, so N = 700 runs two chunks, the second
    # padded with 324 zero rows: the padding must not count, and both chunks must (the tests of
    # the families use N below one chunk, where a lost running sum or a wrong mask cannot show).
    K, N, D = 12, 700, 2
    rng = np.random.default_rng(3)
    W, X = jnp.asarray(rng.normal(size=(D, K))), jnp.asarray(rng.normal(size=(N, D)) * 2.0)
    states = en.all_states(K)
    assert en.chunk_size(states.shape[0], N) < N and N % en.chunk_size(states.shape[0], N)
    lp = jnp.asarray(rng.normal(size=2**K))  # a prior over states

    def log_joint(Xc):  # (C, S): a Gaussian likelihood of each row under every state
        M = states @ W.T
        return -0.5 * ((Xc[:, None, :] - M[None]) ** 2).sum(-1) + lp[None, :]

    st = jax.jit(lambda X: en.enumerate_posterior(log_joint, X, states))(X)
    lj = np.asarray(log_joint(X))  # all rows at once, no chunks
    ll = special.logsumexp(lj, axis=1)
    R = np.exp(lj - ll[:, None])
    np.testing.assert_allclose(st.loglik, ll, rtol=1e-10)
    np.testing.assert_allclose(st.Es, R @ np.asarray(states), rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(st.weights, R.sum(0), rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(st.RtX, R.T @ np.asarray(X), rtol=1e-8, atol=1e-12)
