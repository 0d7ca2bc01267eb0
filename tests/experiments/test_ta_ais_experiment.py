"""Smoke test for experiments/ta_ais.py (AIS on TA{2,2,2} against the quadrature oracle)."""

import csv
import json
import math
import os

import pytest


@pytest.fixture(scope="module")
def script(load_experiment):
    return load_experiment("ta_ais")


def test_quick_run_writes_table_csv_json_and_png(script, tmp_path, capsys):
    out = tmp_path / "run"
    # one K, so one compilation of the AIS program
    args = ["--quick", "--out", str(out), "--rows", "3", "--temps", "50", "--prior-samples", "1000"]
    assert script.main(args) == 0
    for name in ("ta_ais.json", "ta_ais.csv", "ta_ais.png"):
        assert (out / name).stat().st_size > 0, name
    assert not [f for f in os.listdir(out) if f.startswith(".tmp")]
    assert "mean - oracle" in capsys.readouterr().out

    report = json.loads((out / "ta_ais.json").read_text())
    (res,) = report["results"]
    assert res["rows"] == 3 and [s["K"] for s in res["ais"]] == [50]
    assert math.isfinite(res["oracle_avg_loglik"])
    for s in res["ais"]:
        assert math.isfinite(s["mean"]) and s["spread_sd"] >= 0
    # even 50 temperatures land within a nat of the oracle per data point
    assert abs(res["ais"][-1]["error_of_mean_vs_oracle"]) < 1.0
    assert abs(res["prior_sampling"]["error_vs_oracle"]) < 0.5
    with open(out / "ta_ais.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == report["repeats"] == 2


@pytest.mark.parametrize("bad", [["--noise", "-1"], ["--rows", "0"], ["--repeats", "1"], ["--temps", "1"]])
def test_bad_arguments_exit_2_with_one_sentence(script, tmp_path, capsys, bad):
    with pytest.raises(SystemExit) as exc:
        script.main(["--quick", "--out", str(tmp_path / "o"), *bad])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ta_ais: ") and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "o").exists()
