"""Smoke tests for experiments/multiswag_fa.py (MultiSWAG with online factor analysis)."""

import csv
import json
import math
import os

import pytest


@pytest.fixture(scope="module")
def script(load_experiment):
    return load_experiment("multiswag_fa")


def test_quick_run_writes_finite_metrics_for_every_method(script, tmp_path):
    out = tmp_path / "run"
    assert script.main(["--quick", "--out", str(out)]) == 0
    for name in ("results.csv", "summary.csv", "results.json", "multiswag_fa.png"):
        assert (out / name).stat().st_size > 0, name
    assert not [f for f in os.listdir(out) if f.startswith(".tmp-")]

    with open(out / "results.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["method"] for r in rows] == script.METHODS
    assert set(script.METHODS) == {"sgd", "swa", "swag_diag", "swag_fa", "ensemble", "multiswa",
                                   "multiswag_diag", "multiswag_fa"}
    for r in rows:
        assert math.isfinite(float(r["rmse"])) and float(r["rmse"]) > 0, r
        assert math.isfinite(float(r["nll"])), r

    report = json.loads((out / "results.json").read_text())
    assert report["dataset"] == "diabetes" and report["methods"] == script.METHODS
    msfa = next(s for s in report["summary"] if s["method"] == "multiswag_fa")
    assert math.isfinite(msfa["nll_mean"]) and math.isfinite(msfa["rmse_mean"])
    run0 = report["diagnostics"][0]["runs"][0]
    assert run0["fa_variance_trace"] > 0 and run0["fa_mean_minus_swa_max"] < 1e-8  # FA mean = SWA


def test_missing_data_file_exits_2_with_one_sentence(script, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        script.main(["--quick", "--data", str(tmp_path / "nope.csv"), "--out", str(tmp_path / "o")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "does not exist" in err and "Traceback" not in err and len(err.splitlines()) == 1
    assert not (tmp_path / "o").exists()
