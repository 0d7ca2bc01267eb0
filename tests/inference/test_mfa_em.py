"""Exact EM for the MFA baseline: the log-likelihood never decreases (shared and per-component
noise), the closed-form log-likelihood matches NumPyro's full-covariance Gaussians, and with one
component EM reaches the same maximum as factor analysis's own EM.

Thresholds: monotonicity allows 1e-9 relative round-off (a wrong M-step, e.g. Psi without the
cross term, loses ~1 nat per iteration on these data); the log-likelihood identity is exact to
1e-9; the J = 1 agreement uses 1e-4 nats per row (both runs converged to 1e-8 per row).
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist

from latentzoo.inference.mfa.em import fit_mfa_em, mfa_em_step, mfa_log_likelihood
from latentzoo.models.mfa import default_mfa_data


def _data():
    return jnp.asarray(default_mfa_data(3, N=150, D=4, J=3, K=1))


def test_log_likelihood_matches_full_covariance_gaussians():
    X = _data()
    rng = np.random.default_rng(0)
    params = {"pi": jnp.array([0.2, 0.5, 0.3]), "W": jnp.asarray(rng.normal(size=(3, 4, 2))),
              "mu": jnp.asarray(rng.normal(size=(3, 4))), "Psi": jnp.asarray(rng.uniform(0.2, 2.0, (3, 4)))}
    ref = jax.nn.logsumexp(jnp.stack([
        jnp.log(params["pi"][j]) + dist.MultivariateNormal(
            params["mu"][j], params["W"][j] @ params["W"][j].T + jnp.diag(params["Psi"][j])).log_prob(X)
        for j in range(3)]), axis=0)
    np.testing.assert_allclose(mfa_log_likelihood(X, params, per_row=True), ref, rtol=1e-10)


def test_em_never_decreases_the_log_likelihood():
    X = _data()
    for shared in (True, False):
        params = {"pi": jnp.full(3, 1 / 3), "W": 0.1 * jnp.ones((3, 4, 2)), "mu": X[:3],
                  "Psi": jnp.ones((3, 4))}
        lls = []
        for _ in range(40):
            params, ll = mfa_em_step(X, params, shared_noise=shared)
            lls.append(float(ll))
        assert np.all(np.diff(lls) >= -1e-9 * np.abs(lls[1:])), np.diff(lls).min()
        assert lls[-1] > lls[0] + 10.0


def test_one_component_reaches_the_maximum_likelihood():
    # With J = 1, MFA is factor analysis. A quasi-Newton optimiser started at the EM answer must
    # find (almost) nothing more: a wrong M-step stops EM short by nats, not by 1e-2.
    from scipy.optimize import minimize

    rng = np.random.default_rng(1)
    X = jnp.asarray(rng.normal(size=(300, 2)) @ rng.normal(size=(2, 5))
                    + rng.uniform(0.5, 1.5, 5) * rng.normal(size=(300, 5)))
    fit = fit_mfa_em(X, J=1, K=2, num_iterations=20000, restarts=1, tol=1e-12)  # EM is slow near the top
    p = {k: jnp.asarray(v) for k, v in fit.params.items()}

    def unpack(v):
        return {"pi": p["pi"], "W": v[:10].reshape(1, 5, 2), "mu": v[10:15].reshape(1, 5),
                "Psi": jnp.exp(v[15:]).reshape(1, 5)}

    f = jax.jit(jax.value_and_grad(lambda v: -mfa_log_likelihood(X, unpack(v))))
    v0 = np.concatenate([np.ravel(p["W"]), np.ravel(p["mu"]), np.log(np.ravel(p["Psi"]))])
    best = minimize(lambda v: tuple(np.asarray(a, dtype=float) for a in f(jnp.asarray(v))), v0,
                    jac=True, method="L-BFGS-B")
    assert float(f(jnp.asarray(v0))[0]) - best.fun < 1e-2


def test_em_stops_once_the_gain_per_row_falls_below_tol():
    # the trace holds one entry per iteration plus the final log-likelihood: a loose tolerance
    # must stop long before the iteration cap, a zero one must not stop at all
    X = _data()
    loose = fit_mfa_em(X, J=3, K=1, num_iterations=200, restarts=1, tol=1e-2)
    assert 2 < len(loose.log_likelihood) < 100
    gains = np.diff(loose.log_likelihood[:-1])
    assert gains[-1] < 1e-2 * X.shape[0] <= gains[:-1].min()
    capped = fit_mfa_em(X, J=3, K=1, num_iterations=7, restarts=1, tol=0.0)
    assert len(capped.log_likelihood) == 8


def test_the_smallest_data_is_two_rows_and_one_row_is_refused():
    X = _data()
    fit = fit_mfa_em(X[:2], J=1, K=1, num_iterations=5, restarts=1)
    assert np.isfinite(fit.log_likelihood[-1])
    for bad, kw in ((X[:1], dict(J=1, K=1)), (X, dict(J=0, K=1)), (X, dict(J=1, K=0)), (X[0], dict(J=1, K=1))):
        try:
            fit_mfa_em(bad, **kw)
        except ValueError as e:
            assert "MFA EM needs" in str(e)
        else:
            raise AssertionError(f"accepted {bad.shape} {kw}")
