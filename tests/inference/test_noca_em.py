"""NOCA: the Jaakkola-Jordan bound against the exact likelihood, and every EM update."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from latentzoo.inference.cavi import CAVI, VariationalFit
from latentzoo.inference.enumerate import all_states
from latentzoo.inference.noca.bound import log1mexp, noca_bound, noca_exact_loglik, positive_index
from latentzoo.inference.noca.em import (
    fit_noca,
    lam_update,
    noca_exact_em,
    noca_guide,
    noca_vem,
    q_update,
    theta0_update,
    theta_update,
)
from latentzoo.models.noca import noca


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


def test_updates_are_stationary_points_of_the_bound():
    # A wrong derivation leaves a non-zero gradient of F in its own block.
    X, p, P = _random_problem(4, N=40)
    rows, cols = (jnp.asarray(a) for a in np.nonzero(np.asarray(X)))
    F = lambda **kw: noca_bound({**p, **kw}, X, num_pos=P)
    lam = lam_update(p["q"], X, p["theta_loc"], p["theta0_loc"], p["pi_loc"], rows, cols)
    assert float(jnp.abs(jax.grad(lambda l: F(lam=l))(lam)).max()) < 1e-8
    theta = jax.jit(theta_update, static_argnums=7)(p["theta_loc"], p["theta0_loc"], lam, p["q"], X, rows, cols, 60)
    g = jax.grad(lambda t: F(lam=lam, theta_loc=t))(theta)
    interior = (theta > 1e-6) & (theta < 49.0)
    assert float(jnp.abs(jnp.where(interior, g, 0.0)).max()) < 1e-6
    assert bool(jnp.all(jnp.where(theta <= 1e-6, g <= 1e-8, True)))  # at the bound: pushing down
    theta0 = jax.jit(theta0_update, static_argnums=7)(theta, p["theta0_loc"], lam, p["q"], X, rows, cols, 60)
    g0 = jax.grad(lambda t: F(lam=lam, theta_loc=theta, theta0_loc=t))(theta0)
    assert float(jnp.abs(jnp.where(theta0 > 1e-6, g0, 0.0)).max()) < 1e-6


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


@pytest.mark.parametrize("method", ["vb", "em"])
def test_objective_never_decreases(method):
    # every block table: variational EM (E-step, pi, theta, theta0) and exact EM (one block)
    X, _, P = _random_problem(6, N=80, D=8, K=3)
    algo = noca_vem() if method == "vb" else noca_exact_em()
    cavi = CAVI(noca, noca_guide, algo, on_decrease="ignore")
    res = cavi.run(jax.random.PRNGKey(2), 60, X, K=3, num_pos=P, progress_bar=False, rtol=0.0)
    objective = -np.asarray(res.losses)
    assert np.diff(objective).min() >= -1e-9 * np.abs(objective).max()
    assert objective[-1] - objective[0] > 1.0


def test_vem_bound_below_exact_at_fit():
    X, _, P = _random_problem(7, N=80, D=8, K=3)
    fit = fit_noca(np.asarray(X), 3, method="vb", num_steps=60)
    assert isinstance(fit, VariationalFit)
    assert fit.guide is noca_guide and fit.model is noca and fit.params is fit.result.params
    p = fit.params
    assert float(noca_bound(p, X, num_pos=P)) <= float(noca_exact_loglik(X, p["theta_loc"], p["theta0_loc"], p["pi_loc"]))
    assert float(-fit.losses[-1]) == pytest.approx(float(noca_bound(p, X, num_pos=P)), rel=1e-12)


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
