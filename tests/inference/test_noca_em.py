"""NOCA: the Jaakkola-Jordan bound against the exact likelihood, and every MAP-EM update (with
the priors' pseudo-counts) against its own block's objective or an exact answer."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest
from scipy.optimize import minimize

from latentzoo.inference.cavi import CAVI, VariationalFit
from latentzoo.inference.enumerate import all_states
from latentzoo.inference.noca import fit_noca, noca_exact_em, noca_guide, noca_vem
from latentzoo.inference.noca.bound import (
    log1mexp,
    noca_bound,
    noca_exact_loglik,
    noca_importance_loglik,
    positive_index,
)
from latentzoo.inference.noca.em import (
    exact_m_step,
    lam_update,
    pi_update,
    q_update,
    theta0_update,
    theta_update,
)
from latentzoo.models.noca import NoisyOrBeta, noca

# non-default hyperparameters (a > 1 so the "on" pseudo-counts are exercised too)
PRIORS = {"pi": dist.Beta(2.0, 3.0), "theta": NoisyOrBeta(1.5, 3.0), "theta0": NoisyOrBeta(2.0, 10.0)}


def _random_problem(seed, N=30, D=7, K=3):
    rng = np.random.default_rng(seed)
    # a fixed number of ones (40%) keeps the shapes, so one compilation serves every seed
    P = int(0.4 * N * D)
    X = np.zeros(N * D)
    X[rng.choice(N * D, P, replace=False)] = 1.0
    X = X.reshape(N, D)
    q = rng.dirichlet(np.ones(K) * 0.7, size=P)
    params = {
        "pi_loc": rng.uniform(0.05, 0.95, K),
        "theta_loc": rng.exponential(1.0, (K, D)),
        "theta0_loc": rng.exponential(0.1, D) + 1e-3,
        "lam": rng.uniform(size=(N, K)),
        "q": q,
    }
    return jnp.asarray(X), {k: jnp.asarray(v) for k, v in params.items()}, P


def _random_hyper(seed, K, D):
    """Elementwise NoisyOrBeta hyperparameters: a in [1, 3] (some exactly 1), b in [0.2, 5]."""
    rng = np.random.default_rng(100 + seed)
    a = np.where(rng.random((K, D)) < 0.3, 1.0, rng.uniform(1.0, 3.0, (K, D)))
    return jnp.asarray(a), jnp.asarray(rng.uniform(0.2, 5.0, (K, D)))


def test_bound_matches_brute_force():
    # F = sum_s Q(s) [log p(s) + sum_j log Ptilde(x_j | s)] + H(Q), with the Jensen-bounded
    # positive findings written out per state, summed over all 2^K states.
    X, p, P = _random_problem(0, N=6)
    K = 3
    rows, cols = (np.asarray(a) for a in positive_index(X, P))
    S = np.asarray(all_states(K))
    th, th0, pi, lam, q = (np.asarray(p[k]) for k in ("theta_loc", "theta0_loc", "pi_loc", "lam", "q"))
    f = lambda z: np.log(-np.expm1(-z))
    total = 0.0
    for n in range(X.shape[0]):
        for s in S:
            logQ = np.sum(s * np.log(lam[n]) + (1 - s) * np.log1p(-lam[n]))
            lp = np.sum(s * np.log(pi) + (1 - s) * np.log1p(-pi))
            for j in range(X.shape[1]):
                if X[n, j] == 0:
                    lp += -th0[j] - s @ th[:, j]
                else:
                    qq = q[np.flatnonzero((rows == n) & (cols == j))[0]]
                    lp += np.sum(qq * f(th0[j] + th[:, j] * s / qq))
            total += np.exp(logQ) * (lp - logQ)
    assert abs(float(noca_bound(p, X, num_pos=P)) - total) < 1e-9 * abs(total)


@jax.jit
def _e_steps(X, p, rows, cols):
    def body(_, c):
        lam, q = c
        q = q_update(q, lam, p["theta_loc"], p["theta0_loc"], rows, cols, 3)
        return lam_update(q, X, p["theta_loc"], p["theta0_loc"], p["pi_loc"], rows, cols), q

    return jax.lax.fori_loop(0, 30, body, (p["lam"], p["q"]))


def _tighten(X, p, P):
    rows, cols = (jnp.asarray(a) for a in np.nonzero(np.asarray(X)))
    return _e_steps(X, p, rows, cols)


@pytest.mark.parametrize("seed", range(6))
def test_bound_never_exceeds_exact_loglik(seed):
    X, p, P = _random_problem(seed)
    exact = float(noca_exact_loglik(X, p["theta_loc"], p["theta0_loc"], p["pi_loc"]))
    assert float(noca_bound(p, X, num_pos=P)) <= exact
    # and after optimising Q and q for these parameters (the tightest bound we reach)
    lam, q = _tighten(X, p, P)
    tight = float(noca_bound({**p, "lam": lam, "q": q}, X, num_pos=P))
    assert float(noca_bound(p, X, num_pos=P)) <= tight <= exact


_theta_update = jax.jit(theta_update, static_argnums=7)
_theta0_update = jax.jit(theta0_update, static_argnums=7)


def _map_objective(p, X, P, a, b, a0, b0, pi_a=1.0, pi_b=1.0):
    """L = F + log prior, written from the distributions' own log densities."""
    return (noca_bound(p, X, num_pos=P) + NoisyOrBeta(a, b).log_prob(p["theta_loc"]).sum()
            + NoisyOrBeta(a0, b0).log_prob(p["theta0_loc"]).sum()
            + dist.Beta(pi_a, pi_b).log_prob(p["pi_loc"]).sum())


def _assert_stationary(g, v, tol):
    """Zero gradient in the interior; at the lower bound the gradient pushes down (KKT)."""
    interior = (v > 1e-6) & (v < 49.0)
    assert float(jnp.abs(jnp.where(interior, g, 0.0)).max()) < tol
    assert bool(jnp.all(jnp.where(v <= 1e-6, g <= 1e-8, True)))


def test_updates_are_stationary_points_of_the_map_objective():
    # A wrong derivation (or a pseudo-count with the wrong sign or weight) leaves a non-zero
    # gradient of L = F + log prior in its own block.
    X, p, P = _random_problem(4, N=40)
    K, D = p["theta_loc"].shape
    a, b = _random_hyper(4, K, D)
    a0, b0 = a[0], b[0] + 1.0
    rows, cols = (jnp.asarray(v) for v in np.nonzero(np.asarray(X)))
    L = lambda **kw: _map_objective({**p, **kw}, X, P, a, b, a0, b0, 2.0, 3.0)
    lam = lam_update(p["q"], X, p["theta_loc"], p["theta0_loc"], p["pi_loc"], rows, cols)
    assert float(jnp.abs(jax.grad(lambda l: L(lam=l))(lam)).max()) < 1e-8
    pi = pi_update(lam, 2.0, 3.0)
    assert float(jnp.abs(jax.grad(lambda v: L(lam=lam, pi_loc=v))(pi)).max()) < 1e-8
    theta = _theta_update(p["theta_loc"], p["theta0_loc"], lam, p["q"], X, rows, cols, 60, a, b)
    _assert_stationary(jax.grad(lambda t: L(lam=lam, theta_loc=t))(theta), theta, 1e-6)
    theta0 = _theta0_update(theta, p["theta0_loc"], lam, p["q"], X, rows, cols, 60, a0, b0)
    _assert_stationary(jax.grad(lambda t: L(lam=lam, theta_loc=theta, theta0_loc=t))(theta0), theta0, 1e-6)


def test_theta_update_is_stationary_when_q_has_exact_zeros():
    # Each positive finding restricted to a random subset of parents (q = 0 exactly elsewhere):
    # a parent with q = 0 takes no part in that finding's Jensen term, so it must add nothing to
    # the theta equation. Masking it with 1 instead of 0 adds lam to the gradient per such pair
    # and leaves a gradient of order 1 (the test's tolerance is 1e-6).
    X, p, P = _random_problem(8, N=40)
    K, D = p["theta_loc"].shape
    rng = np.random.default_rng(8)
    keep = rng.random((P, K)) < 0.5
    keep[np.arange(P), rng.integers(0, K, P)] = True  # every finding keeps a parent
    q = np.where(keep, np.asarray(p["q"]), 0.0)
    q = jnp.asarray(q / q.sum(1, keepdims=True))
    assert float((q == 0).mean()) > 0.25
    a, b = _random_hyper(8, K, D)
    rows, cols = (jnp.asarray(v) for v in np.nonzero(np.asarray(X)))
    L = lambda t: _map_objective({**p, "q": q, "theta_loc": t}, X, P, a, b, 1.0, 1.0)
    theta = _theta_update(p["theta_loc"], p["theta0_loc"], p["lam"], q, X, rows, cols, 60, a, b)
    _assert_stationary(jax.grad(L)(theta), theta, 1e-6)
    # and the same with no prior (a = 1, b = 0: maximum likelihood)
    theta = _theta_update(p["theta_loc"], p["theta0_loc"], p["lam"], q, X, rows, cols, 60, 1.0, 0.0)
    g = jax.grad(lambda t: noca_bound({**p, "q": q, "theta_loc": t}, X, num_pos=P))(theta)
    _assert_stationary(g, theta, 1e-6)


def test_q_update_raises_the_bound_towards_its_kkt_point():
    X, p, P = _random_problem(5)
    rows, cols = (jnp.asarray(a) for a in np.nonzero(np.asarray(X)))
    bound = jax.jit(lambda q: noca_bound({**p, "q": q}, X, num_pos=P))
    step = jax.jit(lambda q: q_update(q, p["lam"], p["theta_loc"], p["theta0_loc"], rows, cols, 1))
    q = p["q"]
    values = [float(bound(q))]
    for _ in range(40):
        q = step(q)
        values.append(float(bound(q)))
    assert np.all(np.diff(values) >= -1e-10)
    # KKT: on the support the gradient is equal across parents (up to the simplex direction)
    g = jax.grad(lambda qq: noca_bound({**p, "q": qq}, X, num_pos=P))(q)
    g = jnp.where(q > 1e-8, g, jnp.nan)
    spread = jnp.nanmax(g, 1) - jnp.nanmin(g, 1)
    assert float(jnp.nanmedian(spread)) < 1e-3


def _m_step_problem(seed, K=2, D=4, N=60):
    """Exact E-step counts c1, c0 (2^K, D) of random data at random parameters, and priors."""
    rng = np.random.default_rng(seed)
    X = (rng.random((N, D)) < 0.4).astype(float)
    theta = rng.exponential(1.0, (K, D))
    theta0 = rng.exponential(0.1, D) + 1e-2
    pi = rng.uniform(0.2, 0.8, K)
    S = np.asarray(all_states(K))
    z = theta0[None] + S @ theta
    lj = X @ np.log(-np.expm1(-z)).T - (1 - X) @ z.T + (S @ np.log(pi) + (1 - S) @ np.log1p(-pi))[None]
    R = np.exp(lj - lj.max(1, keepdims=True))
    R /= R.sum(1, keepdims=True)
    c1 = R.T @ X
    c0 = R.sum(0)[:, None] - c1
    a = rng.uniform(1.0, 2.5, (K, D))
    b = rng.uniform(0.5, 4.0, (K, D))
    a0, b0 = rng.uniform(1.0, 2.5, D), rng.uniform(0.5, 4.0, D)
    return S, c1, c0, (a0, b0, a, b), theta, theta0


def _reference_maximiser(S, c1, c0, prior, j):
    """argmax over (theta0_j, theta_.j) in [1e-8, 50] of sum_s c1 f(z) - c0 z + log priors, by
    L-BFGS-B on the negated concave objective (independent of the code under test)."""
    a0, b0, a, b = prior
    f = lambda z: np.log(-np.expm1(-z))

    def negQ(v):
        z = v[0] + S @ v[1:]
        val = c1[:, j] @ f(z) - c0[:, j] @ z + (a0[j] - 1) * f(v[0]) - b0[j] * v[0]
        val += np.sum((a[:, j] - 1) * f(v[1:]) - b[:, j] * v[1:])
        fp = lambda z: 1.0 / np.expm1(z)
        g0 = c1[:, j] @ fp(z) - c0[:, j].sum() + (a0[j] - 1) * fp(v[0]) - b0[j]
        gi = S.T @ (c1[:, j] * fp(z) - c0[:, j]) + (a[:, j] - 1) * fp(v[1:]) - b[:, j]
        return -val, -np.concatenate([[g0], gi])

    res = minimize(negQ, np.full(S.shape[1] + 1, 0.5), jac=True, method="L-BFGS-B",
                   bounds=[(1e-8, 50.0)] * (S.shape[1] + 1), options={"ftol": 1e-15, "gtol": 1e-12, "maxiter": 5000})
    return res.x


_exact_m_step = jax.jit(exact_m_step, static_argnums=(4, 5))


@pytest.mark.parametrize("seed", [0, 1])
def test_exact_m_step_reaches_the_maximiser_with_few_solver_iterations(seed):
    # The coordinate solves are safeguarded Newton: with the right derivative each converges
    # quadratically, so 5 iterations per solve (warm-started across sweeps) reach the joint
    # maximiser. A wrong derivative (its sign, say) sends every Newton step out of the bracket and
    # leaves 5 bisections of a 23-unit log-bracket: errors of order 0.1 in log theta, far above
    # the 1e-6 allowed.
    S, c1, c0, prior, theta, theta0 = _m_step_problem(seed)
    th, th0 = _exact_m_step(jnp.asarray(theta), jnp.asarray(theta0), jnp.asarray(c1), jnp.asarray(c0),
                            150, 5, tuple(jnp.asarray(v) for v in prior))
    got = np.concatenate([np.asarray(th0)[None], np.asarray(th)])  # (K+1, D)
    for j in range(c1.shape[1]):
        ref = _reference_maximiser(S, c1, c0, prior, j)
        np.testing.assert_allclose(got[:, j], ref, rtol=1e-6, atol=1e-8)


def test_exact_m_step_prior_alone_gives_the_beta_mode_in_pseudo_counts():
    # No data: the leak's maximiser is the pseudo-count ratio p0 = (a0 - 1) / (a0 - 1 + b0), and a
    # source's gate with a = 1 goes to 0 (only "off" pseudo-counts).
    K, D = 2, 3
    S = all_states(K)
    zero = jnp.zeros((S.shape[0], D))
    a0, b0 = jnp.array([2.0, 3.0, 1.5]), jnp.array([2.0, 8.0, 0.5])
    th, th0 = _exact_m_step(jnp.ones((K, D)), jnp.ones(D), zero, zero, 3, 30,
                            (a0, b0, jnp.ones((K, D)), jnp.full((K, D), 2.0)))
    np.testing.assert_allclose(-np.expm1(-np.asarray(th0)), (a0 - 1) / (a0 - 1 + b0), rtol=1e-10)
    assert float(jnp.max(th)) <= 1e-8 * 1.0001


@pytest.mark.parametrize("method", ["vb", "em"])
def test_map_objective_never_decreases(method):
    # every block table, with the log priors of non-default hyperparameters in the objective
    X, _, P = _random_problem(6, N=80, D=8, K=3)
    algo = noca_vem() if method == "vb" else noca_exact_em()
    cavi = CAVI(noca, noca_guide, algo, on_decrease="ignore")
    res = cavi.run(jax.random.PRNGKey(2), 60, X, K=3, num_pos=P, priors=PRIORS, progress_bar=False, rtol=0.0)
    objective = -np.asarray(res.losses)
    assert np.diff(objective).min() >= -1e-9 * np.abs(objective).max()
    assert objective[-1] - objective[0] > 1.0


def _log_prior(p, priors):
    return sum(float(priors[s].log_prob(p[f"{s}_loc"]).sum()) for s in ("pi", "theta", "theta0"))


def test_exact_em_converges_to_a_stationary_point_of_the_exact_log_posterior():
    # Agreement with the exact answer: at exact MAP-EM's fixed point the gradient of
    # log p(X | pi, theta, theta0) + log p(pi, theta, theta0), both by enumeration, vanishes.
    X, _, P = _random_problem(9, N=80, D=6, K=2)
    fit = fit_noca(np.asarray(X), 2, method="em", num_steps=3000, rtol=1e-13, rounds=0, priors=PRIORS)
    p = fit.params
    assert float(-fit.losses[-1]) == pytest.approx(
        float(noca_exact_loglik(X, p["theta_loc"], p["theta0_loc"], p["pi_loc"])) + _log_prior(p, PRIORS), rel=1e-12)

    def log_post(v):
        th, th0, pi = v
        return (noca_exact_loglik(X, th, th0, pi) + PRIORS["pi"].log_prob(pi).sum()
                + PRIORS["theta"].log_prob(th).sum() + PRIORS["theta0"].log_prob(th0).sum())

    v = (p["theta_loc"], p["theta0_loc"], p["pi_loc"])
    g = jax.grad(log_post)(v)
    for gi, vi in zip(g, v):
        _assert_stationary(gi, vi, 1e-4)


def test_vem_objective_is_bound_plus_log_prior_below_exact():
    X, _, P = _random_problem(7, N=80, D=8, K=3)
    fit = fit_noca(np.asarray(X), 3, method="vb", num_steps=60, priors=PRIORS)
    assert isinstance(fit, VariationalFit)
    assert fit.guide is noca_guide and fit.model is noca and fit.params is fit.result.params
    p = fit.params
    bound = float(noca_bound(p, X, num_pos=P))
    assert bound <= float(noca_exact_loglik(X, p["theta_loc"], p["theta0_loc"], p["pi_loc"]))
    assert float(-fit.losses[-1]) == pytest.approx(bound + _log_prior(p, PRIORS), rel=1e-12)


def test_importance_sampling_loglik_matches_enumeration():
    # K = 5: the estimator (proposal half mean-field posterior, half prior) against the exact
    # per-row log-likelihood; 20 000 draws put its error (and its 1/M bias) below 0.05 nats on
    # every row (with 4000 the worst row is off by 0.09), while a wrong weight (say, without the
    # proposal's log density) is off by nats.
    X, p, P = _random_problem(3, N=30, D=7, K=5)
    lam, _ = _tighten(X, p, P)
    exact = np.asarray(noca_exact_loglik(X, p["theta_loc"], p["theta0_loc"], p["pi_loc"], per_row=True))
    est = np.asarray(noca_importance_loglik(X, p["theta_loc"], p["theta0_loc"], p["pi_loc"],
                                            jax.random.PRNGKey(0), lam=lam, num_samples=20000))
    assert np.abs(est - exact).max() < 0.05
    assert abs(est.mean() - exact.mean()) < 0.01


def test_log1mexp_accuracy():
    z = jnp.array([1e-10, 1e-4, 0.5, 0.7, 5.0, 40.0])
    ref = np.log(-np.expm1(-np.asarray(z)))
    assert np.allclose(np.asarray(log1mexp(z)), ref, rtol=1e-14, atol=1e-16)


@pytest.mark.parametrize(
    "X,K,match",
    [
        (np.full((5, 4), 0.5), 2, "binary"),
        (np.array([[0.0, 1.0, np.nan], [1.0, 0.0, 1.0]]), 1, "NaN"),
        (np.ones((5, 4)), 4, "K"),
    ],
)
def test_bad_input(X, K, match):
    with pytest.raises(ValueError, match=match):
        fit_noca(X, K)


def test_unknown_method():
    X, _, _ = _random_problem(0, N=10, D=5, K=2)
    with pytest.raises(ValueError, match=r"^Unknown NOCA fitting method 'vem'; the valid names are 'vb' and 'em'\.$"):
        fit_noca(np.asarray(X), 2, method="vem")


@pytest.mark.parametrize("priors,match", [
    ({"theta": NoisyOrBeta(0.5, 1.0)}, r"concentration1 >= 1 in the NoisyOrBeta prior of 'theta'"),
    ({"pi": dist.Beta(0.5, 1.0)}, r"concentration1 >= 1 in the Beta prior of 'pi'"),
])
def test_priors_without_a_map_are_refused_in_one_sentence(priors, match):
    X, _, _ = _random_problem(0, N=10, D=5, K=2)
    with pytest.raises(ValueError, match=match):
        fit_noca(np.asarray(X), 2, priors=priors, num_steps=2)


def test_map_objective_is_below_numpyros_trace_elbo_on_the_same_guide():
    # The guide's point estimates are Delta sites, so NumPyro's Trace_ELBO on (model, guide) is
    # E_Q[log p(X, s, pi, theta, theta0)] + H(Q): the log priors included, positives exact. It is
    # computed here exactly by enumeration (K = 3) and by Monte Carlo; L (bound + the same log
    # priors) lies below it by the Jensen gap of the positive findings only.
    from numpyro.infer import Trace_ELBO

    X, p, P = _random_problem(2, N=12, D=5, K=3)
    S = np.asarray(all_states(3))
    th, th0, pi, lam = (np.asarray(p[k]) for k in ("theta_loc", "theta0_loc", "pi_loc", "lam"))
    Xn = np.asarray(X)
    z = th0[None] + S @ th  # (8, D)
    log_px = Xn @ np.log(-np.expm1(-z)).T - (1 - Xn) @ z.T  # (N, 8)
    log_ps = S @ np.log(pi) + (1 - S) @ np.log1p(-pi)
    logQ = np.log(lam) @ S.T + np.log1p(-lam) @ (1 - S).T  # (N, 8)
    exact = float((np.exp(logQ) * (log_px + log_ps[None] - logQ)).sum()) + _log_prior(p, PRIORS)
    one = lambda k: -Trace_ELBO().loss(k, p, noca, noca_guide, X, K=3, priors=PRIORS)
    draws = jax.jit(jax.vmap(one))(jax.random.split(jax.random.PRNGKey(0), 4000))
    draws = np.asarray(draws)
    assert abs(draws.mean() - exact) < 4.0 * draws.std() / np.sqrt(draws.size)
    L = float(noca_bound(p, X, num_pos=P)) + _log_prior(p, PRIORS)
    assert L < exact
