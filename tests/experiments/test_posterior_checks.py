"""experiments/posterior_checks.py: prior and posterior predictive checks, PSIS-LOO and LOO-PIT for
every registered family, a family registered here included, with one-sentence errors."""

import json
import os

import numpy as np
import pandas as pd
import pytest

from latentzoo import arviz_adapter as azx
from latentzoo.data import MATRIX
from latentzoo.registry import Family, Method, families, register, unregister

# Small sizes: the test checks the plumbing and the files; the docs' tables use the defaults.
TINY = ["--quick", "--chains", "1", "--samples", "60", "--warmup", "30", "--replicates", "20"]
FILES = {"checks.csv", "columns.csv", "results.json", "prior_columns.png", "ppc_columns.png"}


@pytest.fixture(scope="module")
def script(load_experiment):
    return load_experiment("posterior_checks")


def _read(out):
    table = pd.read_csv(out / "checks.csv")
    with open(out / "results.json") as fh:
        report = json.load(fh)
    return table, report


def _longest_list(obj):
    if isinstance(obj, dict):
        return max([_longest_list(v) for v in obj.values()] or [0])
    if isinstance(obj, list):
        return max([len(obj)] + [_longest_list(v) for v in obj])
    return 0


# ---------------------------------------------------------------- a family registered here
def normal_mean(X=None, *, K=1, N=None, D=None, priors=None):
    """x_nd ~ N(theta_d, 1), theta_d ~ N(0, 1)."""
    import numpyro
    import numpyro.distributions as dist

    N, D = (X.shape if X is not None else (N, D))
    with numpyro.plate("D", D):
        theta = numpyro.sample("theta", dist.Normal(0.0, 1.0))
    with numpyro.plate("N", N):
        numpyro.sample("X", dist.Normal(theta, 1.0).to_event(1), obs=X)


def exact_draws(X, cfg):
    """Exact conjugate posterior draws theta | X ~ N(sum x / (N + 1), 1 / (N + 1)), with the
    pointwise (per-row) log-likelihood."""
    N, D = X.shape
    rng = np.random.default_rng(cfg.seed)
    theta = X.sum(0) / (N + 1) + rng.normal(size=(cfg.chains, cfg.samples, D)) / np.sqrt(N + 1)
    ll = -0.5 * (((X - theta[:, :, None, :]) ** 2).sum(-1) + D * np.log(2 * np.pi))
    return azx.from_draws({"theta": theta}, observed_data={"X": X}, log_likelihood={"X": ll})


def replicate(idata, rng_seed=0, max_draws=200):
    theta = azx.posterior_array(idata, "theta").reshape(-1, idata.observed_data["X"].shape[1])
    N = idata.observed_data["X"].shape[0]
    rng = np.random.default_rng(rng_seed)
    # a one-draw posterior (as LOO-PIT hands over) gives 20 replicates of that draw
    pick = rng.choice(len(theta), size=min(max_draws, len(theta)), replace=False) \
        if len(theta) >= 20 else np.zeros(20, dtype=int)
    return {"X": (theta[pick][:, None, :] + rng.normal(size=(len(pick), N, theta.shape[1])))[None]}


@pytest.fixture
def toy():
    family = register(Family(
        name="normal-mean-checks", title="Normal mean (test)", paper="-", model=normal_mean,
        data_kind=MATRIX,
        default_data=lambda seed: np.random.default_rng(seed).normal(1.0, 1.0, size=(80, 4)),
        methods=(Method("gibbs", exact_draws),), identified=("theta",), default_K=1,
        posterior_predictive=replicate,
    ))
    yield family
    unregister(family.name)


@pytest.mark.smoke
def test_a_newly_registered_family_gets_every_check(script, toy, tmp_path, capsys):
    out = tmp_path / "toy"
    assert script.main(["--model", toy.name, *TINY, "--out", str(out)]) == 0
    assert set(os.listdir(out)) == FILES | {"loo_pit.png"}
    table, report = _read(out)
    assert set(table["check"]) == {"prior", "posterior"}
    assert table["p_value"].between(0, 1).all()
    assert report["loo"]["n_data_points"] == 80
    assert sum(report["loo"]["pareto_k_counts"].values()) == 80
    # The model is right: the exact posterior predictive replicates the data, so LOO-PIT is
    # close to uniform (a PIT computed with misaligned draws or without weights drifts).
    assert abs(report["loo_pit"]["mean"] - 0.5) < 0.05 and abs(report["loo_pit"]["sd"] - 0.289) < 0.03
    text = capsys.readouterr().out
    assert "PSIS-LOO over 80 rows" in text and "col_mean" in text
    assert "named under `about`" in text and {"about", "replicates"} <= set(table.columns)
    # the quick LOO-PIT rests on 40 draws: the run says the plot cannot judge calibration
    assert report["loo_pit"]["draws"] < script.FEW_PIT_DRAWS
    assert f"only {report['loo_pit']['draws']} draws" in text


def test_default_output_goes_under_runs_in_the_current_folder(script, toy, tmp_path, monkeypatch):
    """The first quick run once replaced six committed result files: the default folder is
    ``runs/posterior_checks/<model>`` under the current folder, never the repository's results."""
    results = os.path.join(os.path.dirname(script.__file__), "results")
    before = {os.path.join(d, f): os.stat(os.path.join(d, f)).st_mtime_ns
              for d, _, fs in os.walk(results) for f in fs}
    monkeypatch.chdir(tmp_path)
    assert script.main(["--model", toy.name, *TINY]) == 0
    assert FILES <= set(os.listdir(tmp_path / "runs" / "posterior_checks" / toy.name))
    after = {os.path.join(d, f): os.stat(os.path.join(d, f)).st_mtime_ns
             for d, _, fs in os.walk(results) for f in fs}
    assert after == before


def test_results_json_does_not_grow_with_D(script, toy, tmp_path):
    sizes = {}
    for D in (4, 80):  # 80 columns: 3160 pairs, past MAX_PAIRS, so the pair subset is used too
        X = np.random.default_rng(D).normal(size=(60, D))
        np.save(tmp_path / f"x{D}.npy", X)
        out = tmp_path / f"d{D}"
        assert script.main(["--model", toy.name, "--data", str(tmp_path / f"x{D}.npy"), *TINY,
                            "--out", str(out)]) == 0
        sizes[D] = (out / "results.json").stat().st_size
        _, report = _read(out)
        assert _longest_list(report) <= 50  # no per-column (D) or D x D arrays
        assert len(pd.read_csv(out / "columns.csv")) >= 4 * D  # the per-column p-values are there
    assert sizes[80] < 1.3 * sizes[4] and sizes[80] < 20_000


# ----------------------------------------------------------------- every registered family
@pytest.mark.parametrize("model", sorted(families()))
def test_quick_run_of_every_family(script, model, tmp_path, capsys):
    family = families()[model]
    out = tmp_path / model
    if family.posterior_predictive is None:  # nothing to replicate: one sentence, nothing written
        assert script.main(["--model", model, *TINY, "--out", str(out)]) == 2
        assert "has no posterior predictive of its data table" in capsys.readouterr().err
        assert not out.exists()
        return
    assert script.main(["--model", model, *TINY, "--out", str(out)]) == 0
    files = set(os.listdir(out))
    assert FILES <= files
    table, report = _read(out)
    assert report["model"] == model and report["method"] == family.methods[0].name
    assert table["p_value"].between(0, 1).all(), table
    assert set(table["statistic"]) == set(report["statistics"])
    assert (table["n_values"] >= 1).all()
    vector = table["n_values"] > 1
    assert table.loc[vector, "frac_extreme"].between(0, 1).all()
    assert (out / "results.json").stat().st_size < 20_000 and _longest_list(report) <= 50
    if "skipped" in report["loo"]:
        assert "loo_pit.png" not in files and report["loo_pit"] == {"skipped": report["loo"]["skipped"]}
    else:
        assert "loo_pit.png" in files and 0 < report["loo_pit"]["mean"] < 1


# ------------------------------------------------------------------ power: misfits are seen
def _fa_em(script, tmp_path, name, X, K):
    path = tmp_path / f"{name}.npy"
    np.save(path, X)
    out = tmp_path / name
    argv = ["--model", "fa", "--method", "em", "--K", str(K), "--data", str(path),
            "--replicates", "20", "--quick", "--out", str(out)]
    assert script.main(argv) == 0
    table, report = _read(out)
    assert "point fit" in report["loo"]["skipped"]
    assert set(table["check"]) == {"prior", "plug-in"}  # one estimate's replicates: not a posterior
    assert (table["replicates"] == 20).all()
    return table[table["check"] == "plug-in"].set_index("statistic")


def test_misspecified_fits_get_extreme_p_values(script, tmp_path):
    rng = np.random.default_rng(0)
    N, D = 400, 9
    # Three blocks of three strongly correlated columns (correlation 0.8 within a block): FA with
    # K = 1 explains one block, so its replicates have far weaker correlations than observed.
    blocks = np.repeat(rng.normal(size=(N, 3)), 3, axis=1)
    X_blocks = 2.0 * blocks + rng.normal(size=(N, D))
    # Heavy tails: Student-t with 1.5 degrees of freedom; a Gaussian model cannot replicate the
    # columns' extremes.
    X_tails = rng.standard_t(1.5, size=(N, D))
    # Control: data from an FA model with one factor, fitted with K = 1 (all three fits share
    # their shapes, so they share compiled programs).
    X_fa = np.outer(rng.normal(size=N), rng.normal(size=D)) + 0.7 * rng.normal(size=(N, D))

    too_few = _fa_em(script, tmp_path, "blocks", X_blocks, K=1)
    tails = _fa_em(script, tmp_path, "tails", X_tails, K=1)
    right = _fa_em(script, tmp_path, "control", X_fa, K=1)
    # p = P(T_rep >= T_obs): too little correlation in the replicates -> p near 0. A p-value that
    # compared the other way, or statistics that pooled the columns, would not be extreme here.
    assert too_few.loc["corr_mean_abs", "p_value"] < 0.05
    assert too_few.loc["corr_mean_abs", "replicated_mean"] < 0.8 * too_few.loc["corr_mean_abs", "observed"]
    # heavy tails: most columns' max above (p near 0) and min below (p near 1) every replicate's
    assert tails.loc["col_max", "frac_extreme"] >= 0.5 and tails.loc["col_min", "frac_extreme"] >= 0.5
    # the well-specified control: no statistic is extreme for most of its columns
    assert 0.05 < right.loc["corr_mean_abs", "p_value"] < 0.95
    assert right.loc["col_max", "frac_extreme"] <= 0.34 and right.loc["col_var", "frac_extreme"] <= 0.34


# ---------------------------------------------------------------------------- bad input
def _write(path, text):
    path.write_text(text)
    return str(path)


BAD = {
    "unknown model": (lambda d: ["--model", "nope"], "Unknown model"),
    "unknown method": (lambda d: ["--model", "fa", "--method", "magic"], "Unknown method"),
    "streaming method": (lambda d: ["--model", "fa", "--method", "online-em"], "streams"),
    "missing file": (lambda d: ["--model", "fa", "--data", str(d / "nope.csv")], "does not exist"),
    "ragged csv": (lambda d: ["--model", "fa", "--data", _write(d / "r.csv", "1,2,3\n4,5\n")],
                   "ragged"),
    "K >= D": (lambda d: ["--model", "fa", "--K", "5", "--data",
                          _write(d / "k.csv", "1,2,3\n4,5,7\n5,7,1\n")], "smaller than"),
    "non-binary for a binary model": (
        lambda d: ["--model", "noca", "--K", "1", "--data",
                   _write(d / "b.csv", "0,1,2\n1,0,1\n0,0,1\n")],
        "binary"),
    "unknown sklearn set": (lambda d: ["--model", "fa", "--data", "sklearn:iris"], "Unknown data set"),
    "bad replicates": (lambda d: ["--model", "fa", "--replicates", "0"], "positive integer"),
}


@pytest.mark.smoke
@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_sentence_exit_2_nothing_written(script, case, tmp_path, capsys):
    argv, phrase = BAD[case]
    out = tmp_path / "out"
    try:
        code = script.main([*argv(tmp_path), "--quick", "--out", str(out)])
    except SystemExit as exit_:  # argparse's usage errors
        code = exit_.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and phrase in err and "Traceback" not in err
    assert err.startswith("posterior_checks: ")
    assert not out.exists()
