"""Online (stochastic) VB for one layer of convolutional FA: it reaches the batch CAVI's
reconstruction error on the same images, its state does not grow with the images seen, and the
image axis sharded over two (forced host) devices gives the single-device result."""

import os
import subprocess
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest

from latentzoo.inference.conv_factor.online import OnlineConvFactor, step_size
from latentzoo.inference.conv_factor.vb import fit_vb, reconstruction
from latentzoo.models.conv_factor import default_cfa_data
from tests.optimised_child import run_optimised

K, ATOM = 6, (3, 3)


def _digits(n=24):
    return default_cfa_data(0, N=n)[:, None]  # (n, 1, 8, 8), values in [0, 1]


def _recon_error(X, X_hat):
    """mean_n ||X_n - X_hat_n|| (the per-image residual norm the paper's comparisons report)."""
    return float(np.mean(np.sqrt(np.sum((np.asarray(X) - np.asarray(X_hat)) ** 2, (1, 2, 3)))))


# Coefficient precisions Ga(1, 1) and a weakly informative noise precision; PAPER_ALPHA has the
# paper's (and default_priors') coefficient prior Ga(1, 1e-3). See docs/models/conv_factor_vb.md.
PRIORS = {"alpha": dist.Gamma(1.0, 1.0), "gamma": dist.Gamma(1.0, 0.01)}
PAPER_ALPHA = {"alpha": dist.Gamma(1.0, 1e-3), "gamma": dist.Gamma(1.0, 0.01)}
ONLINE = dict(kappa=0.55, tau0=1.0, atom_norm=1.0, local_iters=30, burn_in=6, seed=0)


def _in_use(online, X):
    return int(np.sum(np.any(np.asarray(online.transform(X)["b_probs"]) > 0.5, 0)))


def online_and_batch_errors(case: str) -> dict:
    """Reconstruction errors of batch CAVI and online VB on the same 24 digits; ``case``
    "default" (coefficient prior Ga(1, 1), ONLINE's settings, 4 epochs) or "paper" (the paper's
    Ga(1, 1e-3), the estimator's own defaults, 60 epochs). Run in a child process by the
    fixture below."""
    X = _digits()
    if case == "default":
        priors, online_kw, epochs = PRIORS, ONLINE, 4
    else:  # the estimator's defaults: tau0 = 2, kappa = 0.7, atoms started at norm sqrt(C h w) = 3
        priors, online_kw, epochs = PAPER_ALPHA, dict(local_iters=30, burn_in=6, seed=0), 60
    fit = fit_vb(X, K=K, atom_shape=ATOM, num_steps=150, seed=0, rtol=1e-7, priors=priors)
    online = OnlineConvFactor(K, n_total=len(X), priors=priors, atom_shape=ATOM, **online_kw)
    online.fit(X, batch_size=4, epochs=epochs)
    return {"batch": _recon_error(X, reconstruction(fit.params)),
            "online": _recon_error(X, online.reconstruct(X)),
            "in_use": _in_use(online, X), "n_seen": int(online.n_seen), "n": len(X)}


@pytest.fixture(scope="module")
def errors():
    """Both comparisons, in one child process compiled with LLVM's optimisation on
    (tests/optimised_child.py): they run hundreds of online steps (a Python loop over compiled
    calls), so they are run-bound, and the suite's XLA level 0 (tests/conftest.py) made them 5x
    slower (measured: 164 s in the suite's process, 35 s optimised, compilation included)."""
    code = ("import json; from tests.inference.test_conv_factor_online import "
            "online_and_batch_errors as f; "
            "print('RESULT', json.dumps({c: f(c) for c in ('default', 'paper')}))")
    return run_optimised(code)[0]


def test_online_reaches_the_batch_reconstruction_error(errors):
    # Same 24 digits, K, atoms and priors. Batch CAVI for 150 sweeps: mean ||X_n - X_hat_n|| =
    # 0.85 (1 element in use). Online VB, batches of 4 for 4 epochs (24 steps, 6 of burn-in,
    # 30 local passes): 0.71 (per epoch 1.02, 0.79, 0.73, 0.71). It must be within 5 % of batch;
    # a wrong residual in the atoms-in-turn step fails it. (A dropped N/|B| scale or a wrong
    # pi count fails the first-step test; rho_t = 1 always fails the two-step test.)
    e = errors["default"]
    assert e["batch"] < 1.0
    assert e["online"] <= 1.05 * e["batch"], e
    assert e["in_use"] >= 1
    assert e["n_seen"] == 4 * e["n"]


def test_online_reaches_batch_at_the_paper_coefficient_prior(errors):
    # alpha ~ Ga(1, 1e-3) (<alpha> = 1000 a priori). Batch CAVI, 150 sweeps, seed 0: 0.392 (400
    # sweeps: 0.386). Online, atoms started at norm sqrt(C h w) = 3, tau0 = 2, kappa = 0.7,
    # batches of 4, seed 0: 0.442, 0.429, 0.421 after 40, 60, 80 epochs (1.13, 1.10, 1.07 x).
    # kappa = 0.55 levels off near 0.50, kappa = 0.9 near 0.60. Both methods find different
    # optima from different starts at this prior: batch gives 0.39, 0.58, 0.60, 1.04 at seeds
    # 0-3, online 0.42 and 0.63 at seeds 0 and 1 (80 epochs); seed 0 is compared for both. The
    # bound is 1.12 x batch. Unit-norm starting atoms give 0.90 and tau0 = 1 gives 0.61 at 60
    # epochs: both fail, as do rho_t = 1 and a sign or a factor planted in the local q(alpha).
    e = errors["paper"]
    assert e["batch"] < 0.45
    assert e["online"] <= 1.12 * e["batch"], e
    assert e["in_use"] >= 1


def test_the_state_does_not_grow_with_the_images_seen():
    # the state is the global factors only: its size does not depend on the images seen
    X = _digits(12)
    online = OnlineConvFactor(K, n_total=len(X), priors=PRIORS, atom_shape=ATOM, **ONLINE)
    online.partial_fit(X[:4])
    size = sum(np.size(a) for a in online.state)
    online.partial_fit(X[4:])
    assert sum(np.size(a) for a in online.state) == size


def test_online_refuses_bad_input():
    online = OnlineConvFactor(2, n_total=10, atom_shape=(3, 3))
    with pytest.raises(ValueError, match="no images yet"):
        online.reconstruct(np.zeros((1, 1, 5, 5)))
    online.partial_fit(np.random.default_rng(0).random((2, 1, 5, 5)))
    with pytest.raises(ValueError, match="do not match"):
        online.partial_fit(np.zeros((2, 1, 6, 6)))
    with pytest.raises(ValueError, match="kappa"):
        OnlineConvFactor(2, n_total=10, kappa=0.3)
    with pytest.raises(ValueError, match="tau0 >= 1"):  # rho_0 = tau0^-kappa > 1
        OnlineConvFactor(2, n_total=10, tau0=0.5)
    with pytest.raises(ValueError, match="atom_norm"):
        OnlineConvFactor(2, n_total=10, atom_norm=0.0)
    with pytest.raises(ValueError, match="burn_in"):
        OnlineConvFactor(2, n_total=10, burn_in=-1)
    with pytest.raises(ValueError, match="iters"):
        online.transform(np.zeros((1, 1, 5, 5)), iters=0)


_SHARDED = textwrap.dedent("""
    import jax, numpy as np
    import latentzoo
    from latentzoo.inference.conv_factor.online import OnlineConvFactor, step_size
    assert len(jax.devices()) == 2, jax.devices()
    rng = np.random.default_rng(0)
    X = rng.random((10, 2, 7, 6))
    out = {}
    for name, devices in (("one", jax.devices()[:1]), ("two", jax.devices())):
        m = OnlineConvFactor(3, n_total=30, atom_shape=(3, 2), local_iters=4, devices=devices)
        for lo in range(0, 10, 5):  # batches of 5: padded to 6 on two devices
            m.partial_fit(X[lo:lo + 5])
        if name == "two":
            assert len(m.state.d_loc.sharding.device_set) == 2
        out[name] = {k: np.asarray(v) for k, v in m.params.items()}
        out[name]["recon"] = np.asarray(m.reconstruct(X[:5]))
    for k in out["one"]:
        np.testing.assert_allclose(out["two"][k], out["one"][k], rtol=1e-9, atol=1e-12, err_msg=k)
    print("SHARDED-OK")
""")


def test_sharded_over_two_devices_equals_one_device():
    # The per-image local steps are vmapped over an image axis sharded over a 1-D mesh; the
    # statistics are sums across devices. Two forced host devices must reproduce one device to
    # round-off (summation order only), the odd batch padded with zero-weight images.
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
           "JAX_PLATFORMS": "cpu"}
    r = subprocess.run([sys.executable, "-c", _SHARDED], capture_output=True, text=True, env=env,
                       timeout=600)
    assert r.returncode == 0 and "SHARDED-OK" in r.stdout, r.stderr[-3000:]


def test_first_step_is_the_batch_global_update_on_the_scaled_data():
    # With one element (so Jacobi over atoms = atoms in turn), a step size of 1 (t = 0, tau0 = 1)
    # and n_total = 2 x the batch, the online global step must equal the batch CAVI's q(d),
    # q(beta), q(pi) updates on the batch repeated twice, with the same local factors: this pins
    # the N/|B| scaling and the natural parameters, which the reconstruction error cannot see
    # (a wrong atom scale is absorbed by the maps).
    from latentzoo.inference.conv_factor.vb import read_cfa_priors, update_beta, update_d, update_pi
    from latentzoo.models.conv_factor import conv_factor

    X = _digits(6)
    online = OnlineConvFactor(1, n_total=12, atom_shape=ATOM, local_iters=3, seed=1, priors=PRIORS,
                              tau0=1.0, atom_norm=1.0)
    online._setup(X)
    before = online.params
    loc = online.transform(X)
    online.partial_fit(X)
    X2 = jnp.asarray(np.concatenate([X, X]))
    two = lambda a: jnp.concatenate([jnp.asarray(a), jnp.asarray(a)])
    params = {**before, "W_loc": two(loc["W_loc"]), "W_scale": two(loc["W_scale"]),
              "b_probs": two(loc["b_probs"]), "gamma_concentration": two(loc["E_gamma"]),
              "gamma_rate": jnp.ones(12)}
    pri = read_cfa_priors(conv_factor, X2, K=1, atom_shape=ATOM, priors=PRIORS)
    q = update_beta(update_d(update_pi(params, X2, pri), X2, pri), X2, pri)
    for k, v in online.params.items():
        np.testing.assert_allclose(np.asarray(v), np.asarray(q[k]), rtol=1e-8, atol=1e-10, err_msg=k)


def test_steps_are_convex_combinations_with_the_decaying_step_size():
    # rho_t = (tau0 + t)^-kappa, checked directly, and the state after the SECOND step (t = 1,
    # rho_1 = 2^-0.7 = 0.62) equals (1 - rho_1) x the state after the first + rho_1 x the batch
    # update on the mini-batch repeated N/|B| times with the same locals, for q(pi) and q(d)'s
    # natural parameters (one element, so atoms in turn = one atom). A step size stuck at 1, a
    # dropped N/|B| or a (1 - rho) weight on the wrong side fails it; the first-step test below
    # cannot see rho_t at all (rho_0 = 1).
    from latentzoo.inference.conv_factor.vb import read_cfa_priors, update_d, update_pi
    from latentzoo.inference.gaussian import cov_from_tril
    from latentzoo.models.conv_factor import conv_factor

    tau0, kappa = 1.0, 0.7
    np.testing.assert_allclose([float(step_size(t, tau0, kappa)) for t in range(4)],
                               [1.0, 2**-0.7, 3**-0.7, 4**-0.7], rtol=1e-12)
    X = _digits(12)
    X1, X2 = X[:6], X[6:]
    online = OnlineConvFactor(1, n_total=18, atom_shape=ATOM, local_iters=3, seed=1, priors=PRIORS,
                              tau0=tau0, kappa=kappa, burn_in=0, atom_norm=1.0)
    online.partial_fit(X1)
    s1, before = online.state, online.params
    loc = online.transform(X2)
    online.partial_fit(X2)
    s2 = online.state
    r = 2**-0.7
    rep = lambda a: jnp.concatenate([jnp.asarray(a)] * 3)  # N/|B| = 18/6 = 3
    X3 = rep(X2)
    params = {**before, "W_loc": rep(loc["W_loc"]), "W_scale": rep(loc["W_scale"]),
              "b_probs": rep(loc["b_probs"]), "gamma_concentration": rep(loc["E_gamma"]),
              "gamma_rate": jnp.ones(18), "beta_concentration": s1.beta_a, "beta_rate": s1.beta_b}
    pri = read_cfa_priors(conv_factor, X3, K=1, atom_shape=ATOM, priors=PRIORS)
    q = update_d(update_pi(params, X3, pri), X3, pri)
    P_hat = np.linalg.inv(np.asarray(cov_from_tril(q["d_scale_tril"])))
    lin_hat = np.einsum("kcij,kcj->kci", P_hat, np.asarray(q["d_loc"]).reshape(1, 1, 9))
    for name, got, old, new in (
            ("pi_a1", s2.pi_a1, s1.pi_a1, q["pi_concentration1"]),
            ("pi_a0", s2.pi_a0, s1.pi_a0, q["pi_concentration0"]),
            ("d_prec", s2.d_prec, s1.d_prec, P_hat), ("d_lin", s2.d_lin, s1.d_lin, lin_hat)):
        np.testing.assert_allclose(np.asarray(got), (1 - r) * np.asarray(old) + r * np.asarray(new),
                                   rtol=1e-7, atol=1e-9, err_msg=name)
    assert float(s2.step) == 2.0
