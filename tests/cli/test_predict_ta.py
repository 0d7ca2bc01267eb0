"""`latentzoo predict` for the tensor analyzers: each new row's log density under each posterior
draw by annealed importance sampling, with its standard error, and the posterior predictive
density over the draws. Checked draw by draw against an exact answer for TA (quadrature over
the second group, :func:`ta_oracle_log_marginal`) and against the Rao-Blackwellised estimator
for MTA; missing entries are left out of the density and imputed."""


import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
from scipy.special import logsumexp

from latentzoo import arviz_adapter as azx
from latentzoo.cli import main
from latentzoo.inference.ta import ta_oracle_log_marginal
from latentzoo.inference.ta.mcem import log_likelihood_estimate
from latentzoo.models.tensor_analyzer import default_ta_data, ta_mean

SMALL = ["--chains", "2", "--samples", "6", "--warmup", "20", "--K", "2", "--no-progress"]  # 12 draws: each is one AIS run per row


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    root = tmp_path_factory.mktemp("ta_predict")
    X = default_ta_data(0)
    np.save(root / "train.npy", X[:60])
    np.save(root / "new.npy", X[60:66])
    return root, X[60:66]


_PREDICTED = {}  # (root, model) -> (predictions, table): one run and one prediction per model


def _predict(root, model, capsys):
    """The run of ``model`` on the training rows and its prediction of the new rows, made once
    per module (each AIS prediction costs a minute on a busy machine) and read by every test."""
    if (root, model) not in _PREDICTED:
        run, out = root / f"run-{model}", root / f"pred-{model}"
        if not run.exists():
            assert main(["run", model, *SMALL, "--data", str(root / "train.npy"), "--out", str(run)]) == 0
        assert main(["predict", str(run), "--data", str(root / "new.npy"), "--out", str(out)]) == 0
        assert "mean log predictive density" in capsys.readouterr().out
        _PREDICTED[root, model] = (azx.load(str(out / "predictions.nc")),
                                   pd.read_csv(out / "predictions.csv"))
    return _PREDICTED[root, model]


def _per_draw(pred, sites):
    post = pred.posterior
    flat = {k: np.asarray(post[k]).reshape(-1, *post[k].shape[2:]) for k in sites}
    ll = np.asarray(pred.predictions["log_lik"])
    se = np.asarray(pred.predictions["log_lik_stderr"])
    return flat, ll.reshape(-1, ll.shape[-1]), se.reshape(-1, se.shape[-1])


def test_ta_rows_match_the_exact_density_draw_by_draw(rows, capsys):
    root, X_new = rows
    pred, table = _predict(root, "ta", capsys)
    flat, ll, se = _per_draw(pred, ("W", "T", "mu", "Psi"))
    exact = np.stack([np.asarray(ta_oracle_log_marginal(X_new, flat["W"][s], flat["T"][s],
                                                         flat["mu"][s], flat["Psi"][s], per_row=True))
                      for s in range(ll.shape[0])])
    # AIS is unbiased in p, biased low in log p by about se^2 / 2; measured |error| <= 2.5 se.
    # A dropped temperature factor or a wrong Psi in the weights misses by whole nats.
    assert np.all(np.abs(ll - exact) <= 4 * se + 0.05), np.max(np.abs(ll - exact) / se)
    want = logsumexp(exact, 0) - np.log(exact.shape[0])
    np.testing.assert_allclose(table["log_predictive_density"], want, atol=0.3)
    assert (table["stderr"] > 0).all() and (table["stderr"] < 0.5).all()


def test_mta_rows_agree_with_the_rao_blackwellised_estimate(rows, capsys):
    root, X_new = rows
    pred, table = _predict(root, "mta", capsys)
    flat, ll, se = _per_draw(pred, ("W", "T", "mu", "Psi", "pi"))
    rb = np.stack([np.asarray(log_likelihood_estimate(
        X_new, {k: v[s] for k, v in flat.items()}, d=(2, 2), num_draws=8192, per_row=True))
        for s in range(ll.shape[0])])
    # two estimators of the same density (the second exact in z_1, 8192 prior draws of z_2)
    assert np.all(np.abs(ll - rb) <= 4 * se + 0.1), np.max(np.abs(ll - rb) / se)


def _importance_oracle(x, missing, W, T, mu, Psi, rng, draws=200_000):
    """E[x_missing | x_observed, parameters] by importance sampling with the groups' N(0, 1)
    prior as proposal (the observed entries' likelihood as weight): independent of AIS."""
    z = [rng.normal(size=(draws, 2)), rng.normal(size=(draws, 2))]
    e = np.asarray(ta_mean(W, T, mu, [jnp.asarray(v) for v in z]))
    obs = ~missing
    lw = -0.5 * (((x[obs] - e[:, obs]) ** 2) / Psi[obs]).sum(1)
    w = np.exp(lw - lw.max())
    return (w[:, None] * e[:, missing]).sum(0) / w.sum()


def test_missing_entries_are_left_out_of_the_density_and_imputed(rows, capsys):
    """NaN cells: each row's density is that of its observed entries (checked draw by draw
    against the quadrature oracle on the observed columns), and each missing entry is imputed
    by its conditional mean given the observed ones (checked against importance sampling from
    the prior with 2e5 draws per posterior draw). The imputation's Monte Carlo error is that of
    8 weighted AIS chains per draw (per-draw differences about 0.1-0.2); over the run's 12 draws the means
    agreed within 0.05 (measured); the tolerance is 0.2. Filling the cells with 0 and scoring
    them as data (no masking) misses the densities by whole nats."""
    root, X_new = rows
    run = root / "run-ta"  # written by the first test; a fresh one when run alone
    if not run.exists():
        assert main(["run", "ta", *SMALL, "--data", str(root / "train.npy"), "--out", str(run)]) == 0
    X = X_new.copy()
    X[1, 2] = np.nan
    X[3, [0, 4]] = np.nan
    np.save(root / "nan.npy", X)
    out = root / "nan-pred"
    assert main(["predict", str(run), "--data", str(root / "nan.npy"), "--out", str(out)]) == 0
    assert "3 missing entries imputed" in capsys.readouterr().out
    pred = azx.load(str(out / "predictions.nc"))
    flat, ll, se = _per_draw(pred, ("W", "T", "mu", "Psi"))
    for n in (0, 1, 3):  # a complete row and both rows with missing entries
        obs = ~np.isnan(X[n])
        exact = np.array([float(ta_oracle_log_marginal(X[n:n + 1, obs], flat["W"][s][obs], flat["T"][s][obs],
                                                       flat["mu"][s][obs], flat["Psi"][s][obs], per_row=True)[0])
                          for s in range(ll.shape[0])])
        assert np.all(np.abs(ll[:, n] - exact) <= 4 * se[:, n] + 0.05), (n, np.max(np.abs(ll[:, n] - exact) / se[:, n]))
    completed = np.asarray(pred.predictions["X_completed"]).reshape(-1, *X.shape)
    rng = np.random.default_rng(0)
    for n in (1, 3):
        missing = np.isnan(X[n])
        oracle = np.mean([_importance_oracle(X[n], missing, *(flat[k][s] for k in ("W", "T", "mu", "Psi")), rng)
                          for s in range(completed.shape[0])], axis=0)
        np.testing.assert_allclose(completed[:, n, missing].mean(0), oracle, atol=0.2)
    table = pd.read_csv(out / "predictions.csv")
    assert np.isfinite(table.filter(like="x").to_numpy()).all()


def test_each_rows_latent_groups_get_their_posterior_mean(rows, capsys):
    """``z_j_mean`` (per draw, in the predictions group) is E[z_j | x_n, draw] from the AIS
    chains' importance-weighted final latents: checked against importance sampling from the
    groups' prior (2e5 draws per posterior draw), averaged over the run's draws. The linear term
    W y breaks the groups' joint sign symmetry, so the means are not 0 by symmetry (|mean| up to
    about 1 here). 8 AIS chains per row and draw: per-draw errors about 0.1-0.3, and over the 12 draws
    the averages agreed within 0.1 (measured); tolerance 0.25, which the prior mean 0 misses
    (asserted). Dropping the weights is not a control: AIS ends with Gibbs steps at the
    posterior, so the plain mean of the chains' final latents is consistent too (it passes).
    The table's ``z_j_mean_k`` columns average the first chain's draws."""
    root, X_new = rows
    pred, table = _predict(root, "ta", capsys)
    flat, ll, _ = _per_draw(pred, ("W", "T", "mu", "Psi"))
    z1 = np.asarray(pred.predictions["z_1_mean"])
    assert z1.shape[-2:] == (X_new.shape[0], 2)
    z1 = z1.reshape(-1, *z1.shape[2:])
    rng = np.random.default_rng(1)
    oracle = []
    for s in range(ll.shape[0]):
        W, T, mu, Psi = (flat[k][s] for k in ("W", "T", "mu", "Psi"))
        z = [rng.normal(size=(200_000, 2)), rng.normal(size=(200_000, 2))]
        e = np.asarray(ta_mean(W, T, mu, [jnp.asarray(v) for v in z]))
        lw = -0.5 * (((X_new[:, None, :] - e[None]) ** 2) / Psi).sum(-1)  # (M, draws)
        w = np.exp(lw - lw.max(1, keepdims=True))
        oracle.append((w @ z[0]) / w.sum(1, keepdims=True))
    oracle = np.mean(oracle, 0)
    assert np.abs(oracle).max() > 0.3  # a test the prior mean would fail
    np.testing.assert_allclose(z1.mean(0), oracle, atol=0.25)
    chain0 = np.asarray(pred.predictions["z_1_mean"])[0].mean(0)
    np.testing.assert_allclose(table[["z_1_mean_0", "z_1_mean_1"]].to_numpy(), chain0, rtol=1e-9)


def test_mta_rows_get_their_component_probabilities(rows, capsys):
    """MTA adds ``c_mean`` (per draw: p(c_n = c | x_n) from the weighted AIS chains' labels):
    a probability vector per row and draw."""
    root, X_new = rows
    pred, _ = _predict(root, "mta", capsys)
    c = np.asarray(pred.predictions["c_mean"])
    C = int(pred.posterior["pi"].shape[-1])
    assert c.shape[-2:] == (X_new.shape[0], C) and (c >= 0).all()
    np.testing.assert_allclose(c.sum(-1), 1.0, rtol=1e-9)
