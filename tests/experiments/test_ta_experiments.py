"""Quick runs of the tensor-analyzer experiments and benchmark (the AIS experiment has its own
file): each writes its table, CSV, JSON and PNG into the folder it is given, nothing half-written,
finite numbers; bad arguments exit 2 with one sentence and write nothing."""

import json
import math
import os

import pytest

from tests.experiments.marks import thorough_run


def _no_temporaries(folder):
    return not [f for f in os.listdir(folder) if f.startswith(".tmp")]


@thorough_run
def test_synthetic_2d_quick_run(load_experiment, tmp_path, capsys):
    script = load_experiment("ta_synthetic_2d")
    out = tmp_path / "run"
    result = script.main(["--quick", "--out", str(out), "--iterations", "4"])
    for name in ("ta_synthetic_2d.json", "ta_synthetic_2d.csv", "ta_synthetic_2d.png"):
        assert (out / name).stat().st_size > 0, name
    assert _no_temporaries(out)
    assert [r["drawn_from"] for r in result["rows"]] == ["ta", "ta", "mfa", "mfa"]
    for r in result["rows"]:
        assert all(math.isfinite(r[k]) for k in ("mta_train", "mta_test", "mfa_train", "mfa_test"))
    assert "paper test" in capsys.readouterr().out


@thorough_run
def test_gibbs_convergence_quick_run(load_experiment, tmp_path):
    script = load_experiment("ta_gibbs_convergence")
    out = tmp_path / "run"
    script.main(["--quick", "--out", str(out), "--window", "20", "--chains", "2"])
    report = json.loads((out / "ta_gibbs_convergence.json").read_text())
    assert (out / "ta_gibbs_rhat.png").stat().st_size > 0
    assert _no_temporaries(out)
    rhats = [r["max_rhat_all_factors"] for r in report["rows"]]
    assert rhats and all(math.isfinite(v) and v > 0.9 for v in rhats)


@thorough_run
def test_image_patches_quick_run(load_experiment, tmp_path, capsys):
    script = load_experiment("mta_image_patches")
    out = tmp_path / "run"
    result = script.main(["--quick", "--out", str(out), "--iterations", "2", "--temps", "5"])
    for name in ("mta_image_patches.json", "mta_image_patches.csv", "mta_image_patches.png"):
        assert (out / name).stat().st_size > 0, name
    assert _no_temporaries(out)
    rows = result["rows"]
    assert len(rows) == 3 and all(math.isfinite(r["heldout_loglik_per_patch"]) for r in rows)
    # the parameter counts the comparison is about
    assert rows[0]["parameters_per_component"] == rows[1]["parameters_per_component"] == 640
    assert "held-out ll/patch" in capsys.readouterr().out


@thorough_run
def test_benchmark_quick_run_writes_its_json(load_experiment, tmp_path):
    script = load_experiment("bench_tensor_analyzer")
    path = tmp_path / "bench.json"
    script.main(["--quick", "--json", str(path)])
    report = json.loads(path.read_text())
    for ratio in (report["gibbs_vs_nuts"]["gibbs_over_nuts"], report["ais"]["jax_over_numpy_speed"],
                  report["mcem"]["ta_jax_over_numpy_speed"]):
        assert math.isfinite(ratio) and ratio > 0


@pytest.mark.parametrize("name, bad", [
    ("ta_synthetic_2d", ["--iterations", "0"]),
    ("ta_synthetic_2d", ["--restarts", "0"]),
    ("ta_gibbs_convergence", ["--chains", "1"]),
    ("mta_image_patches", ["--C", "0"]),
    ("mta_image_patches", ["--temps", "1"]),
])
def test_bad_arguments_exit_2_with_one_sentence(load_experiment, tmp_path, capsys, name, bad):
    script = load_experiment(name)
    with pytest.raises(SystemExit) as exc:
        script.main(["--quick", "--out", str(tmp_path / "o"), *bad])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"{name}: ") and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "o").exists()
