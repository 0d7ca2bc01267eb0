"""`latentzoo predict RUN_DIR --data NEW --out DIR`: new rows scored with a finished run's draws,
no refit. Round trip: on the training rows it reproduces the run's own pointwise log-likelihood;
missing entries get the exact conditional density and mean; a standardised run's transform is
applied to the new rows; bad input is one sentence with nothing written."""

import os

import numpy as np
import pandas as pd
import pytest
from scipy.special import logsumexp
from scipy.stats import multivariate_normal

from latentzoo import arviz_adapter as azx
from latentzoo.cli import main
from latentzoo.models.factor_analysis import default_fa_data


# The tests on FA's runs are also run on the newest Python (the predictions and constant_data
# groups on both ArviZ lines); the other families' predictors write through the same adapter
# calls, so their numeric checks (a run and a prediction each, 10-50 s) run on the default Python only.
SMOKE = pytest.mark.smoke

SMALL = ["--chains", "2", "--samples", "30", "--warmup", "20", "--K", "2", "--no-progress"]


@pytest.fixture(scope="module")
def fa_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("predict")
    X = default_fa_data(0, N=40, D=5, K=2) * 3.0 + 10.0  # off unit scale, for --standardize
    np.save(root / "X.npy", X)
    runs = {}
    for name, extra in (("plain", []), ("standardized", ["--standardize"])):
        runs[name] = root / name
        assert main(["run", "fa", *SMALL, *extra, "--data", str(root / "X.npy"),
                     "--out", str(runs[name])]) == 0
    return root, X, runs


def _lpd(root, run, rows, capsys, name="pred"):
    np.save(root / f"{name}.npy", rows)
    out = root / f"{name}-{run.name}"
    assert main(["predict", str(run), "--data", str(root / f"{name}.npy"), "--out", str(out)]) == 0, \
        capsys.readouterr().err
    return pd.read_csv(out / "predictions.csv"), out


@SMOKE
def test_training_rows_reproduce_the_runs_pointwise_log_likelihood(fa_runs, capsys):
    root, X, runs = fa_runs
    table, out = _lpd(root, runs["plain"], X[:7], capsys)
    stored = np.asarray(azx.load(str(runs["plain"] / "posterior.nc")).log_likelihood["X"])
    draws = stored.shape[0] * stored.shape[1]  # 60: all of them (under predict's 200)
    want = logsumexp(stored.reshape(draws, -1), 0) - np.log(draws)
    np.testing.assert_allclose(table["log_predictive_density"], want[:7], rtol=1e-10)
    pred = azx.load(str(out / "predictions.nc"))
    assert "predictions" in azx.group_names(pred)
    assert pred.predictions["log_lik"].shape == (2, 30, 7)
    assert "mean log predictive density" in capsys.readouterr().out


@SMOKE
def test_the_package_call_returns_the_inference_data_arviz_reads(fa_runs):
    """``latentzoo.predict(run_dir, X_new)`` (no import of the module first) is the
    prediction's InferenceData, with its predictions group, the same values as the function's."""
    import latentzoo
    from latentzoo.predict import predict

    root, X, runs = fa_runs
    idata = latentzoo.predict(str(runs["plain"]), X[:5])
    assert "predictions" in azx.group_names(idata) and idata.predictions["log_lik"].shape == (2, 30, 5)
    np.testing.assert_array_equal(idata.predictions["log_lik"],
                                  predict(str(runs["plain"]), X[:5]).idata.predictions["log_lik"])


@SMOKE
def test_missing_entries_get_the_exact_conditional_density_and_mean(fa_runs, capsys):
    root, X, runs = fa_runs
    rows = X[:3].copy()
    rows[0, [1, 3]] = np.nan
    rows[2, 4] = np.nan
    table, out = _lpd(root, runs["plain"], rows, capsys, "missing")
    post = azx.load(str(runs["plain"] / "posterior.nc")).posterior
    W, mu, psi = (np.asarray(post[k]).reshape(-1, *post[k].shape[2:]) for k in ("W", "mu", "psi"))
    dens, means = [], []
    for w, m, p in zip(W, mu, psi):  # dense Gaussians, draw by draw
        C = w @ w.T + np.diag(1 / p)
        row_d, row_m = [], []
        for x in rows:
            o = ~np.isnan(x)
            row_d.append(multivariate_normal(m[o], C[np.ix_(o, o)]).logpdf(x[o]))
            cm = x.copy()
            cm[~o] = m[~o] + C[np.ix_(~o, o)] @ np.linalg.solve(C[np.ix_(o, o)], x[o] - m[o])
            row_m.append(cm)
        dens.append(row_d)
        means.append(row_m)
    dens, means = np.array(dens), np.array(means)
    np.testing.assert_allclose(table["log_predictive_density"],
                               logsumexp(dens, 0) - np.log(len(dens)), rtol=1e-9)
    np.testing.assert_allclose(table[[f"x{d}" for d in range(5)]].to_numpy(), means.mean(0), rtol=1e-9)
    assert "3 missing entries imputed" in capsys.readouterr().out


@SMOKE
def test_each_rows_latents_get_their_exact_conditional_mean(fa_runs, capsys):
    """``z_mean`` (per draw) is E[z_n | x_{n,O}, draw] = W_Oᵀ C_OO⁻¹ (x_O − mu_O), checked draw
    by draw against that dense formula (a missing entry left out); the table's ``z_mean_k``
    columns average the first chain's draws. A Woodbury slip (a dropped identity, psi for
    1/psi) or a missing entry read as 0 changes the values by far more than 1e-9."""
    root, X, runs = fa_runs
    rows = X[:3].copy()
    rows[1, [0, 2]] = np.nan
    table, out = _lpd(root, runs["plain"], rows, capsys, "latents")
    pred = azx.load(str(out / "predictions.nc"))
    post = pred.posterior
    W, mu, psi = (np.asarray(post[k]).reshape(-1, *post[k].shape[2:]) for k in ("W", "mu", "psi"))
    want = []
    for w, m, p in zip(W, mu, psi):
        C = w @ w.T + np.diag(1 / p)
        per_row = []
        for x in rows:
            o = ~np.isnan(x)
            per_row.append(w[o].T @ np.linalg.solve(C[np.ix_(o, o)], x[o] - m[o]))
        want.append(per_row)
    z = np.asarray(pred.predictions["z_mean"])
    np.testing.assert_allclose(z.reshape(-1, 3, 2), np.array(want), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(table[["z_mean_0", "z_mean_1"]].to_numpy(), z[0].mean(0), rtol=1e-9)


@SMOKE
def test_a_standardised_run_scores_rows_in_their_own_units(fa_runs, capsys):
    """The run stored its columns' centre and scale; new rows are transformed the same way and
    their densities carry the transform's Jacobian: the same rows, shifted into standardised
    units by hand and scored by the plain formula, differ by exactly sum(log scale)."""
    from latentzoo.data import standardize_columns, standardize_scalers

    root, X, runs = fa_runs
    centre, scale = standardize_scalers(X)
    np.testing.assert_allclose((X - centre) / scale, standardize_columns(X), atol=1e-12)
    table, _ = _lpd(root, runs["standardized"], X[:5], capsys, "std")
    stored = np.asarray(azx.load(str(runs["standardized"] / "posterior.nc")).log_likelihood["X"])
    want = logsumexp(stored.reshape(-1, stored.shape[-1]), 0) - np.log(60) - np.log(scale).sum()
    np.testing.assert_allclose(table["log_predictive_density"], want[:5], rtol=1e-10)


@SMOKE
@pytest.mark.parametrize("case, rows, message", [
    ("columns", lambda X: X[:, :3], "have 3 columns; the run was fitted on 5"),
    ("infinite", lambda X: np.where(np.arange(5) == 2, np.inf, X[:4]), "infinite value"),
])
def test_bad_new_rows_are_one_sentence_and_nothing_is_written(fa_runs, capsys, case, rows, message):
    root, X, runs = fa_runs
    np.save(root / f"bad-{case}.npy", rows(X))
    out = root / f"bad-out-{case}"
    assert main(["predict", str(runs["plain"]), "--data", str(root / f"bad-{case}.npy"),
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize("model, method", [("cvq", "gibbs"), ("noca", "vb")])
def test_binary_source_families_score_complete_rows_exactly(model, method, tmp_path, capsys):
    """CVQ and NOCA sum their sources out over the 2^K states: on the training rows predict gives
    the run's own pointwise log-likelihood (its posterior mean over the draws; a point fit's one
    value); a row with a missing entry, or (noca) a value other than 0/1, is one sentence."""
    from latentzoo.registry import families

    X = np.asarray(families()[model].default_data(0))[:30]
    np.save(tmp_path / "X.npy", X)
    run = tmp_path / "run"
    extra = SMALL[:-3] if method == "gibbs" else ["--sweeps", "5"]
    assert main(["run", model, "--method", method, *extra, "--K", "3", "--no-progress", "--data",
                 str(tmp_path / "X.npy"), "--out", str(run)]) == 0
    table, _ = _lpd(tmp_path, run, X[:6], capsys, "new")
    stored = np.asarray(azx.load(str(run / "posterior.nc")).log_likelihood["X"])
    S = stored.shape[0] * stored.shape[1]
    np.testing.assert_allclose(table["log_predictive_density"],
                               (logsumexp(stored.reshape(S, -1), 0) - np.log(S))[:6], rtol=1e-9)
    probs = table[[f"p_source_{k}" for k in range(3)]].to_numpy()  # each row's sources' posterior
    assert probs.shape == (6, 3) and np.all((probs >= 0) & (probs <= 1))
    bad = X[:2].copy()
    bad[0, 0] = np.nan
    np.save(tmp_path / "bad.npy", bad)
    assert main(["predict", str(run), "--data", str(tmp_path / "bad.npy"), "--out",
                 str(tmp_path / "p")]) == 2
    assert "scores complete rows only" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "p")


def test_cvq_beyond_enumeration_scores_a_labelled_lower_bound(tmp_path, capsys):
    """K = 13 sources (over the 12 predict sums out): each row gets the mean-field lower bound,
    in a column named for it and announced as such; it lies below the exact density (2^13
    states, summed here from the stored point estimates) and, on these rows, equal to it."""
    from latentzoo.inference.cvq.em import cvq_exact_loglik
    from latentzoo.registry import families

    X = np.asarray(families()["cvq"].default_data(0))[:30]
    np.save(tmp_path / "X.npy", X)
    run = tmp_path / "run"
    assert main(["run", "cvq", "--method", "vb", "--sweeps", "5", "--K", "13", "--no-progress",
                 "--data", str(tmp_path / "X.npy"), "--out", str(run)]) == 0
    capsys.readouterr()
    table, out = _lpd(tmp_path, run, X[:5], capsys, "new")
    assert "mean-field lower bound" in capsys.readouterr().out
    assert "log_predictive_density" not in table and f"p_source_{12}" in table
    post = azx.load(str(run / "posterior.nc")).posterior
    W, pi, sigma = (np.asarray(post[k])[0, 0] for k in ("W", "pi", "sigma"))
    exact = np.asarray(cvq_exact_loglik(X[:5], W, pi, sigma, per_row=True))
    gap = exact - table["log_predictive_density_lower_bound"].to_numpy()
    # measured |gap| < 1e-13: the fitted sources are well separated on these rows, so the mean
    # field is the exact posterior to round-off; a bound term dropped or doubled moves it by nats
    assert np.all(gap >= -1e-9) and np.all(gap < 1e-6), gap
    assert azx.load(str(out / "predictions.nc")).posterior.attrs["latentzoo_log_lik"] == \
        "mean-field lower bound"


@SMOKE
def test_a_family_that_cannot_predict_yet_says_so(tmp_path, capsys):
    from latentzoo.registry import families, register, unregister

    rng = np.random.default_rng(0)
    idata = azx.from_draws({"psi": rng.gamma(2.0, size=(1, 5, 3))},
                           observed_data={"X": rng.normal(size=(10, 3))})
    # every shipped family predicts: a family without ``predict`` (a user's new one) is refused
    register(families()["fa"]._replace(name="no-predict", predict=None))
    try:
        azx.set_posterior_attrs(idata, latentzoo_model="no-predict", latentzoo_method="gibbs",
                                latentzoo_standardized=0)
        azx.save(idata, str(tmp_path / "ta" / "posterior.nc"))
        np.save(tmp_path / "new.npy", np.zeros((2, 3)))
        assert main(["predict", str(tmp_path / "ta"), "--data", str(tmp_path / "new.npy"),
                     "--out", str(tmp_path / "p")]) == 2
    finally:
        unregister("no-predict")
    assert "cannot score new rows yet" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "p")
    assert main(["predict", str(tmp_path / "nowhere"), "--data", str(tmp_path / "new.npy"),
                 "--out", str(tmp_path / "p")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_mfa_training_rows_reproduce_its_pointwise_log_likelihood(tmp_path, capsys):
    """The mixture's predictive: the run stores log sum_j pi_j N(x_n; ...) per draw; predict on
    the training rows must give its posterior mean; a row with a missing entry is scored on the
    others, and its imputed entry is the responsibility-weighted conditional mean (finite)."""
    from latentzoo.models.mfa import default_mfa_data

    X = np.asarray(default_mfa_data(0))[:40]
    np.save(tmp_path / "X.npy", X)
    run = tmp_path / "mfa"
    assert main(["run", "mfa", *SMALL[:-3], "--K", "1", "--no-progress", "--data",
                 str(tmp_path / "X.npy"), "--out", str(run)]) == 0
    rows = X[:4].copy()
    rows[1, 0] = np.nan
    table, _ = _lpd(tmp_path, run, rows, capsys, "mfa-new")
    stored = np.asarray(azx.load(str(run / "posterior.nc")).log_likelihood["X"])
    want = logsumexp(stored.reshape(-1, stored.shape[-1]), 0) - np.log(60)
    np.testing.assert_allclose(table["log_predictive_density"].to_numpy()[[0, 2, 3]], want[[0, 2, 3]],
                               rtol=1e-10)
    assert np.isfinite(table["log_predictive_density"][1]) and table["log_predictive_density"][1] != want[1]
    assert np.isfinite(table["x0"][1]) and table["x1"][1] == rows[1, 1]
    c = table.filter(like="c_mean_").to_numpy()  # the components' probabilities per row
    assert c.shape[1] >= 2 and (c >= 0).all()
    np.testing.assert_allclose(c.sum(1), 1.0, rtol=1e-9)


@SMOKE
def test_a_run_written_before_the_transform_record_is_refused(fa_runs, capsys):
    """An older run does not say whether its columns were standardised: scoring raw rows against
    a standardised fit would be silently wrong, so predict says why it cannot."""
    root, X, runs = fa_runs
    idata = azx.load(str(runs["plain"] / "posterior.nc"))
    attrs = dict(idata.posterior.attrs)
    attrs.pop("latentzoo_standardized")
    idata.posterior.attrs.clear()
    idata.posterior.attrs.update(attrs)
    azx.save(idata, str(root / "old" / "posterior.nc"))
    np.save(root / "old-new.npy", X[:2])
    assert main(["predict", str(root / "old"), "--data", str(root / "old-new.npy"), "--out",
                 str(root / "old-pred")]) == 2
    assert "written before runs recorded whether their columns were standardised" in \
        capsys.readouterr().err
