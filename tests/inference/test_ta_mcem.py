"""Monte Carlo EM for tensor analyzers (latentzoo.inference.ta.mcem).

The M-steps are checked for what they claim, the exact maximiser of the Monte Carlo expected
complete log-likelihood for the draws they are given (any draws will do, so these tests draw
them at random, no sampler involved): against an independent least-squares solution in NumPy,
by the gradient at the answer and by perturbations. The driver with the TA Gibbs table is then
checked to recover a TA from its own samples, on identified quantities only (W, T and the groups
rotate and rescale together; Psi, the mean and the covariance of x and log p(x) do not).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from latentzoo.inference.ta.mcem import (
    PSI_FLOOR,
    expected_complete_loglik,
    fit_ta_mcem,
    log_likelihood_estimate,
    mta_m_step,
    ta_features,
    ta_m_step,
)
from latentzoo.inference.mcem import MCEM
from latentzoo.inference.ta import init_from_data, ta_updates
from latentzoo.models.tensor_analyzer import kron_rows, random_ta_parameters, sample_ta, tensor_analyzer

D, d, N, S = 4, (2, 3), 50, 3


def random_draws(seed, C=None):
    rng = np.random.default_rng(seed)
    samples = {f"z_{j + 1}": jnp.asarray(rng.normal(size=(S, N, dj))) for j, dj in enumerate(d)}
    if C is not None:
        samples["c"] = jnp.asarray(rng.integers(0, C, size=(S, N)))
    X = jnp.asarray(rng.normal(size=(N, D)) * 2.0 + 1.0)
    params = random_ta_parameters(rng, D, d, C=C)
    return samples, X, {k: jnp.asarray(v) for k, v in params.items()}


def numpy_least_squares(samples, X, rows=None):
    """Stack the (draw, row) pairs (those in ``rows``, a (S, N) mask) and solve min ||x - B f||^2
    with numpy's lstsq: B (D, F) and the mean squared residual per coordinate."""
    zs = [np.asarray(samples[f"z_{j + 1}"]) for j in range(len(d))]
    u = np.asarray(kron_rows([jnp.asarray(z) for z in zs]))
    F = np.concatenate([*zs, u, np.ones((S, N, 1))], -1)
    Y = np.broadcast_to(np.asarray(X), (S, N, D))
    mask = np.ones((S, N), bool) if rows is None else np.asarray(rows)
    B = np.linalg.lstsq(F[mask], Y[mask], rcond=None)[0].T
    E = Y[mask] - F[mask] @ B.T
    return B, (E * E).mean(0)


def joined(p):
    return np.concatenate([p["W"], np.reshape(p["T"], (*np.shape(p["W"])[:-1], -1)),
                           np.asarray(p["mu"])[..., None]], -1)


@pytest.mark.smoke
def test_ta_m_step_is_the_joint_least_squares_solution():
    samples, X, params = random_draws(0)
    new = ta_m_step(samples, X, params)
    B, psi = numpy_least_squares(samples, X)
    assert new["T"].shape == params["T"].shape and new["W"].shape == params["W"].shape
    np.testing.assert_allclose(joined(new), B, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(new["Psi"], psi, rtol=1e-8)
    # the features' layout is the model's: f = [z_1; z_2; z_1 ⊗ z_2; 1]
    F = ta_features(samples)
    np.testing.assert_allclose(F[..., 5:11], kron_rows([samples["z_1"], samples["z_2"]]))


def test_ta_m_step_maximises_the_monte_carlo_objective():
    samples, X, params = random_draws(1)
    new = ta_m_step(samples, X, params)
    q = lambda p: float(expected_complete_loglik(samples, X, p))  # noqa: E731
    grad = jax.grad(lambda p: expected_complete_loglik(samples, X, p))(new)
    scale = abs(q(new))
    for k, g in grad.items():  # stationary: every partial derivative vanishes (to round-off)
        assert float(jnp.max(jnp.abs(g))) < 1e-9 * scale, k
    rng = np.random.default_rng(2)
    for k in ("W", "T", "mu", "Psi"):  # and a maximum: any small step goes down
        for _ in range(3):
            step = 1e-3 * rng.normal(size=new[k].shape)
            moved = {**new, k: new[k] * (1 + step) if k == "Psi" else new[k] + step}
            assert q(moved) < q(new), k


def test_solving_eqs_6_and_8_one_after_the_other_is_not_the_maximiser():
    """The supplement's eqs. 6 (W given T) and 8 (T given W) are coupled through E[u yᵀ]: one pass
    of each from the old values falls short of the joint solution (a control: a driver that
    used them separately would fail the test above)."""
    samples, X, params = random_draws(3)
    new = ta_m_step(samples, X, params)
    P = sum(d)
    y = jnp.concatenate([samples["z_1"], samples["z_2"]], -1)
    u = kron_rows([samples["z_1"], samples["z_2"]])
    Xc = X - new["mu"]  # give the separate pass the right mean, so only the coupling differs
    Ey, Eu = y.mean(0), u.mean(0)
    Syy = jnp.einsum("snp,snq->pq", y, y) / S
    Suy = jnp.einsum("snp,snq->pq", u, y) / S
    Suu = jnp.einsum("snp,snq->pq", u, u) / S
    T_old = params["T"].reshape(D, -1)
    W6 = (Xc.T @ Ey - T_old @ Suy) @ jnp.linalg.inv(Syy)  # eq. 6
    T8 = (Xc.T @ Eu - W6 @ Suy.T) @ jnp.linalg.inv(Suu)  # eq. 8
    sep = {**new, "W": W6, "T": T8.reshape(params["T"].shape)}
    assert W6.shape == (D, P)
    q = lambda p: float(expected_complete_loglik(samples, X, p))  # noqa: E731
    assert q(sep) < q(new) - 1.0


def test_mta_m_step_is_per_component_least_squares_on_the_labelled_pairs():
    C = 3
    samples, X, params = random_draws(4, C=C)
    new = mta_m_step(samples, X, params)
    c = np.asarray(samples["c"])
    for k in range(C):
        B, psi = numpy_least_squares(samples, X, rows=c == k)
        np.testing.assert_allclose(joined({q: new[q][k] for q in ("W", "T", "mu")}), B,
                                   rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(new["Psi"][k], psi, rtol=1e-8)
        np.testing.assert_allclose(new["pi"][k], np.mean(c == k), rtol=1e-12)
    grad = jax.grad(lambda p: expected_complete_loglik(samples, X, p))(new)
    scale = abs(float(expected_complete_loglik(samples, X, new)))
    for k in ("W", "T", "mu", "Psi"):
        assert float(jnp.max(jnp.abs(grad[k]))) < 1e-9 * scale, k


def test_mta_m_step_keeps_an_empty_component_and_floors_psi():
    C = 3
    samples, X, params = random_draws(5, C=C)
    samples["c"] = jnp.where(samples["c"] == 2, 0, samples["c"])  # no draw in component 2
    new = mta_m_step(samples, X, params)
    for k in ("W", "T", "mu", "Psi"):
        np.testing.assert_array_equal(new[k][2], params[k][2])
    assert 0 < float(new["pi"][2]) < 1e-11 and abs(float(new["pi"].sum()) - 1) < 1e-12
    # a coordinate the features fit exactly would send Psi to 0: it stops at the floor
    X_exact = X.at[:, 0].set(2.0 * samples["z_1"][0, :, 0] + 0.5)
    one = {k: v for k, v in samples.items() if k != "c"}
    one = {k: v[:1] for k, v in one.items()}
    ta_params = {k: params[k][0] for k in ("W", "T", "mu", "Psi")}
    Psi = ta_m_step(one, X_exact, ta_params)["Psi"]
    np.testing.assert_allclose(Psi[0], PSI_FLOOR * jnp.var(X_exact[:, 0]), rtol=1e-6)
    assert float(Psi[1]) > 100 * PSI_FLOOR * float(jnp.var(X_exact[:, 1]))
    # a constant coordinate (an image border, a dead gene) has variance 0: its floor is the
    # floor of the mean variance, so Psi stays positive and the log-likelihood finite
    X_const = X.at[:, 0].set(3.0)
    Psi = ta_m_step(one, X_const, ta_params)["Psi"]
    np.testing.assert_allclose(Psi[0], PSI_FLOOR * float(jnp.mean(jnp.var(X_const, 0))), rtol=1e-6)
    assert np.isfinite(float(expected_complete_loglik(one, X_const, {**ta_params, "Psi": Psi})))


def test_log_likelihood_estimate_is_exact_for_one_group():
    """With one group (J = 1) x is Gaussian, N(mu, (W + T)(W + T)ᵀ + diag Psi): the estimate has
    nothing left to sample."""
    rng = np.random.default_rng(6)
    p = random_ta_parameters(rng, D, (2,), noise=0.5)
    X = jnp.asarray(rng.normal(size=(20, D)))
    M = p["W"] + p["T"]
    cov = M @ M.T + np.diag(p["Psi"])
    diff = np.asarray(X) - p["mu"]
    exact = -0.5 * (np.einsum("nd,de,ne->n", diff, np.linalg.inv(cov), diff)
                    + np.linalg.slogdet(2 * np.pi * cov)[1])
    est = log_likelihood_estimate(X, p, d=(2,), per_row=True)
    np.testing.assert_allclose(est, exact, rtol=1e-10)


# ------------------------------------------------------------------ recovery by the driver
RD, RN, NOISE, ITERATIONS = 3, 500, 0.3, 150


@pytest.fixture(scope="module")
def ta_problem():
    """A random TA{3, 2, 2} (unit loadings, noise s.d. 0.3), 500 training rows and 2000 held out."""
    rng = np.random.default_rng(0)
    truth = random_ta_parameters(rng, RD, (2, 2), noise=NOISE)
    X = sample_ta(rng, truth, RN, (2, 2))[0]
    X_test = sample_ta(rng, truth, 2000, (2, 2))[0]
    return truth, X, X_test


def held_out(params, X_test):
    return float(log_likelihood_estimate(X_test, params, d=(2, 2), num_draws=1 << 13)) / len(X_test)


def implied_moments(p):
    """Mean and covariance of x under a TA: E[y] = E[u] = 0, E[u uᵀ] = I, E[y uᵀ] = 0, so
    Cov[x] = W Wᵀ + T_(1) T_(1)ᵀ + diag Psi (identified: unchanged by the groups' rotations)."""
    Tm = np.reshape(p["T"], (np.shape(p["T"])[0], -1))
    return np.asarray(p["mu"]), p["W"] @ p["W"].T + Tm @ Tm.T + np.diag(p["Psi"])


@pytest.fixture(scope="module")
def ta_fit(ta_problem):
    _, X, _ = ta_problem
    return fit_ta_mcem(X, d=(2, 2), num_iterations=ITERATIONS, seed=0, num_chains=2,
                       sample_schedule=lambda t: 4, checkpoints=ITERATIONS // 5)


def test_mcem_recovers_a_tensor_analyzer(ta_problem, ta_fit):
    truth, X, X_test = ta_problem
    its, lls = np.asarray(ta_fit.loglik_trace).T
    assert list(its) == list(range(0, ITERATIONS + 1, ITERATIONS // 5))
    per_row = lls / RN
    # climbs from the start (0.7 nats per row below the end), allowing Monte Carlo noise
    assert per_row[-1] > per_row[0] + 0.3
    assert np.all(np.diff(per_row) > -0.02)
    # held out, the estimate is as good as the truth up to EM's slow last approach: measured
    # 0.07 nats per row below it after 150 iterations; the same driver with T held at 0 (an FA
    # M-step, below) ends 0.66 below
    assert held_out(ta_fit.params, X_test) > held_out(truth, X_test) - 0.15
    mu, cov = implied_moments(ta_fit.params)
    mu0, cov0 = implied_moments(truth)
    assert np.linalg.norm(cov - cov0) < 0.2 * np.linalg.norm(cov0)  # measured 0.10
    assert ta_fit.result.state.iteration == ITERATIONS
    assert set(ta_fit.params) == {"W", "T", "mu", "Psi"} and ta_fit.params["T"].shape == (RD, 2, 2)


def additive_only_m_step(samples, X, params):
    """A control: the M-step with the multiplicative term dropped (T = 0, features [y; 1])."""
    zs = [samples["z_1"], samples["z_2"]]
    S, n = zs[0].shape[:2]
    F = jnp.concatenate([*zs, jnp.ones((S, n, 1))], -1)
    G = jnp.einsum("snf,sng->fg", F, F) / S
    B = jnp.linalg.solve(G, (jnp.einsum("nd,snf->df", X, F) / S).T).T
    E = X[None] - F @ B.T
    return {"W": B[:, :-1], "T": jnp.zeros_like(params["T"]), "mu": B[:, -1],
            "Psi": jnp.mean(E * E, (0, 1))}


@pytest.mark.slow
def test_the_recovery_test_fails_an_m_step_without_the_multiplicative_term(ta_problem):
    truth, X, X_test = ta_problem
    start = init_from_data(jax.random.PRNGKey(0), jnp.asarray(X), d=(2, 2))
    params = {k: start[k] for k in ("W", "T", "mu", "Psi")}
    params["Psi"] = jnp.full(RD, float(np.var(X, 0).mean()) / 2)
    mcem = MCEM(tensor_analyzer, ta_updates((2, 2)), additive_only_m_step,
                latent_sites=("z_1", "z_2"), num_chains=2, sample_schedule=lambda t: 4)
    res = mcem.run(jax.random.PRNGKey(1), ITERATIONS, jnp.asarray(X), params, d=(2, 2),
                   progress_bar=False)
    assert held_out(res.params, X_test) < held_out(truth, X_test) - 0.3


def test_mcem_fits_a_mixture_of_tensor_analyzers():
    """MTA{3, 2, 2} with two components 3 apart on average: from k-means++ seeds the fit climbs
    0.55 nats per row and ends, held out, 0.21 nats per row below the truth (measured)."""
    rng = np.random.default_rng(0)
    truth = random_ta_parameters(rng, RD, (2, 2), C=2, noise=NOISE)
    X = sample_ta(rng, truth, 400, (2, 2))[0]
    X_test = sample_ta(rng, truth, 2000, (2, 2))[0]
    fit = fit_ta_mcem(X, d=(2, 2), C=2, num_iterations=100, seed=0, num_chains=2,
                      sample_schedule=lambda t: 4, checkpoints=50)
    assert set(fit.params) == {"pi", "W", "T", "mu", "Psi"} and fit.params["T"].shape == (2, RD, 2, 2)
    per_row = np.asarray([v for _, v in fit.loglik_trace]) / len(X)
    assert per_row[-1] > per_row[0] + 0.3
    assert held_out(fit.params, X_test) > held_out(truth, X_test) - 0.35
    assert np.all(np.abs(fit.params["pi"] - 0.5) < 0.15)  # truth 0.5 each; measured 0.55, 0.45


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(d=()), "group sizes"),
        (dict(d=(2, 0)), "group sizes"),
        (dict(d=3), "sequence of group sizes"),
        (dict(C=0), "C must be"),
        (dict(num_iterations=0), "num_iterations"),
        (dict(seed=-1), "seed"),
        (dict(init_params={"V": np.zeros(3)}), "not parameters"),
        (dict(X=np.array([[1.0, np.nan, 0.0], [0.0, 1.0, 2.0]])), "NaN"),
        (dict(X=np.zeros((1, 3))), "at least 2"),
    ],
)
def test_fit_ta_mcem_refuses_bad_input_in_one_sentence(kwargs, match):
    X = kwargs.pop("X", np.random.default_rng(0).normal(size=(20, 3)))
    with pytest.raises(ValueError, match=match):
        fit_ta_mcem(X, **{"num_iterations": 2, **kwargs})
