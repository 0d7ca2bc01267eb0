"""Smoke tests for experiments/online_fa_linear_regression.py (thesis ch. 6)."""

import csv
import json
import math

import pytest


@pytest.fixture(scope="module")
def script(load_experiment):
    return load_experiment("online_fa_linear_regression")


def test_quick_run_writes_finite_distances(script, tmp_path):
    out = tmp_path / "run"
    script.main(["--quick", "--epochs", "40", "--out", str(out)])
    for name in ("results.csv", "summary.csv", "results.json", "fig_linear_regression_posterior.png"):
        assert (out / name).stat().st_size > 0, name
    with open(out / "results.csv") as fh:
        rows = list(csv.DictReader(fh))
    methods = {r["method"] for r in rows}
    assert methods == {"sgd_iterates_empirical", "thesis_em", "thesis_sga", "ours_em", "batch_fa_sklearn"}
    assert {r["K"] for r in rows} == {"", "1", "2"}
    assert {int(r["seed"]) for r in rows} == {0, 1}
    for r in rows:
        for metric in ("rel_mean_dist", "rel_cov_dist", "wasserstein", "emp_rel_cov_dist"):
            assert math.isfinite(float(r[metric])), (r["method"], r["K"], metric)
    record = json.loads((out / "results.json").read_text())
    assert 0 < record["data"]["lr"] < record["data"]["lr_stability_limit"]
    assert record["final_epoch"] == 40


@pytest.mark.parametrize(
    "content, needle",
    [
        ("a,b,c,d,y\n" + "1,2,3,4,5\n" * 70 + "1,2,x,4,5\n", "non-numeric"),
        ("a,b,c,d,y\n" + "1,2,3,4,5\n" * 70 + "1,2,nan,4,5\n", "NaN"),
        ("a,b,c,d,y\n" + "1,2,3,4,5\n" * 10, "too few"),
    ],
)
def test_bad_csv_exits_2_with_one_sentence(script, tmp_path, capsys, content, needle):
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(SystemExit) as exc:
        script.main(["--data", str(path), "--out", str(tmp_path / "out")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "Traceback" not in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_missing_file_exits_2(script, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        script.main(["--data", str(tmp_path / "nope.csv"), "--out", str(tmp_path / "out")])
    assert exc.value.code == 2
    assert "does not exist" in capsys.readouterr().err
