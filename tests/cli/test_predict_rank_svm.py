"""`latentzoo predict` for the rank SVM: class probabilities of new rows from the saved draws
(no refit), in the user's own label values. The CLI's probabilities equal `RankFactorSVC`'s on
the same draws (the same posterior predictive, the same seed); held-out digits are classified
well, also by a run fitted with --standardize; labels it was not fitted on and missing entries
are one sentence each, with nothing written."""

import json
import os

import numpy as np
import pandas as pd
import pytest

from latentzoo import arviz_adapter as azx
from latentzoo.cli import main
from latentzoo.inference.rank_svm.classifier import RankFactorSVC
from latentzoo.models.rank_factor_svm import default_rank_svm_data

SMALL = ["--chains", "2", "--samples", "30", "--warmup", "30", "--K", "3", "--no-progress"]


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """Digits 3 (label 3) against 5 (label 5): 80 training rows, 40 new ones."""
    root = tmp_path_factory.mktemp("rank_svm_predict")
    X, y = default_rank_svm_data(0, N=120)
    y = np.where(y > 0, 5, 3)
    np.savetxt(root / "train.csv", np.column_stack([X[:80], y[:80]]), delimiter=",")
    np.savetxt(root / "new.csv", np.column_stack([X[80:], y[80:]]), delimiter=",")
    np.save(root / "new_X.npy", X[80:])
    return root, X[80:], y[80:]


def _fit(root, variant, *extra):
    run = root / f"run-{variant}{''.join(extra)}"
    if not run.exists():
        assert main(["run", "rank-svm", "--variant", variant, *SMALL, *extra,
                     "--data", str(root / "train.csv"), "--out", str(run)]) == 0
    return run


def _estimator_on_the_runs_draws(run):
    """A fitted RankFactorSVC holding exactly the draws (and transform) the run stored."""
    idata = azx.load(str(run / "posterior.nc"))
    const = idata.constant_data
    attrs = azx.posterior_attrs(idata)
    variant = json.loads(attrs["latentzoo_options"])["variant"]
    post = idata.posterior
    if "z_draw_index" in const:  # R: the draws whose training scores were stored
        post = post.isel(draw=np.asarray(const["z_draw_index"]))
    draws = {k: np.asarray(post[k]).reshape(-1, *post[k].shape[2:]) for k in post.data_vars}
    if "z_for_prediction" in const:
        z = np.asarray(const["z_for_prediction"], dtype=float)
        draws["z"] = z.reshape(-1, *z.shape[2:])
    svc = RankFactorSVC(variant=variant, K=3, max_draws=10**6)
    svc.posterior_, svc.X_fit_ = draws, np.asarray(const["X_model"])
    svc.classes_, svc.n_features_in_ = np.array([3.0, 5.0]), svc.X_fit_.shape[1]
    if variant.startswith("G"):
        svc.mean_ = np.asarray(const["standardize_centre"])
        svc.scale_ = np.asarray(const["standardize_scale"])
        svc.cuts_ = None
    else:
        svc.cuts_ = [c[np.isfinite(c)] for c in np.asarray(const["rank_cuts"])]
    return svc


@pytest.mark.parametrize("variant", ["R-L", "G-L"])
def test_the_cli_equals_the_estimator_on_the_same_draws(digits, variant, capsys):
    root, X_new, y_new = digits
    run = _fit(root, variant)
    out = root / f"pred-{variant}"
    assert main(["predict", str(run), "--data", str(root / "new.csv"), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    table = pd.read_csv(out / "predictions.csv")
    want = _estimator_on_the_runs_draws(run).predict_proba(X_new)[:, 1]
    np.testing.assert_allclose(table["probability_of_5"], want, rtol=1e-6, atol=1e-9)
    assert set(table["predicted"]) <= {3.0, 5.0}
    np.testing.assert_array_equal(table["label"], y_new)
    accuracy = float(np.mean(table["predicted"] == y_new))
    # 3 against 5 is separable enough that a short run classifies most held-out digits (a
    # swapped label mapping or an unscaled G input scores near 0.5 or below)
    assert accuracy >= 0.85, accuracy
    assert f"accuracy {accuracy:.4f}" in printed
    pred = azx.load(str(out / "predictions.nc"))
    assert pred.predictions["prob"].shape[-1] == len(y_new)
    assert azx.posterior_attrs(pred)["latentzoo_accuracy"] == pytest.approx(accuracy)


def test_labels_from_a_file_and_a_point_fit(digits, capsys):
    root, X_new, y_new = digits
    run = root / "run-vb"
    assert main(["run", "rank-svm", "--method", "vb", "--sweeps", "30", "--K", "3",
                 "--no-progress", "--data", str(root / "train.csv"), "--out", str(run)]) == 0
    np.save(root / "new_y.npy", y_new)
    out = root / "pred-vb"
    assert main(["predict", str(run), "--data", str(root / "new_X.npy"), "--labels",
                 str(root / "new_y.npy"), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "over 1 posterior draws" in printed  # a plug-in prediction, and it says so
    table = pd.read_csv(out / "predictions.csv")
    assert float(np.mean(table["predicted"] == y_new)) >= 0.85


def test_a_standardised_run_puts_new_rows_on_its_scale(digits, capsys):
    """--standardize's column transform is recorded and applied to the new rows before the
    R variant's value groups: a constant shift of the new data's units would otherwise move
    every row across the training cuts."""
    root, X_new, y_new = digits
    train = np.loadtxt(root / "train.csv", delimiter=",")
    keep = np.flatnonzero(train[:, :-1].std(0) > 0.2)  # --standardize needs varying columns
    np.savetxt(root / "varying.csv", train[:, [*keep, -1]], delimiter=",")
    run = root / "run-standardized"
    assert main(["run", "rank-svm", *SMALL, "--standardize", "--data", str(root / "varying.csv"),
                 "--out", str(run)]) == 0
    np.save(root / "new_varying.npy", X_new[:, keep])
    np.save(root / "new_y.npy", y_new)
    assert main(["predict", str(run), "--data", str(root / "new_varying.npy"), "--labels",
                 str(root / "new_y.npy"), "--out", str(root / "pred-standardized")]) == 0
    table = pd.read_csv(root / "pred-standardized" / "predictions.csv")
    assert float(np.mean(table["predicted"] == y_new)) >= 0.85


@pytest.mark.parametrize("case, message", [
    ("third_class", "not the run's label values"),
    ("nan", "complete rows only"),
])
def test_bad_input_is_one_sentence_and_nothing_is_written(digits, case, message, capsys):
    root, X_new, y_new = digits
    run, data = _fit(root, "R-L"), root / "third.csv"
    if case == "third_class":
        np.savetxt(data, np.column_stack([X_new, np.where(np.arange(len(y_new)) == 0, 8, y_new)]),
                   delimiter=",")
    if case == "nan":
        data = root / "nan.npy"
        X = X_new.copy()
        X[2, 5] = np.nan
        np.save(data, X)
    out = root / f"bad-{case}"
    assert main(["predict", str(run), "--data", str(data), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not os.path.exists(out)


def test_the_stored_pointwise_log_likelihood_is_the_label_probability():
    """What a run stores for az.loo: log p(y | u) of the hinge normalised over the two labels,
    the probability prediction uses (a flipped sign or a dropped normaliser fails here)."""
    import jax.numpy as jnp

    from latentzoo.families.rank_svm import label_loglik
    from latentzoo.inference.rank_svm.predict import label_probability

    u = np.linspace(-3.0, 3.0, 25)
    p = np.asarray(label_probability(jnp.asarray(u)))
    np.testing.assert_allclose(np.exp(label_loglik(1.0, u)), p, rtol=1e-12)
    np.testing.assert_allclose(np.exp(label_loglik(-1.0, u)), 1.0 - p, rtol=1e-10)
