"""``latentzoo run cfa --method vb``: batch CAVI as a point fit through the CLI (the sampler is
covered by test_every_method.py)."""

from __future__ import annotations

import json

import numpy as np

from latentzoo import arviz_adapter as azx
from latentzoo.cli import main
from latentzoo.models.conv_factor import default_cfa_data


def test_vb_point_fit_writes_estimates_a_monotone_objective_and_diagnoses(tmp_path, capsys):
    path = tmp_path / "digits.npy"
    np.save(path, default_cfa_data(0, N=12))
    out = tmp_path / "run"
    argv = ["run", "cfa", "--method", "vb", "--data", str(path), "--K", "4", "--atom", "3",
            "--sweeps", "15", "--no-progress", "--out", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    idata = azx.load(str(out / "posterior.nc"))
    post = idata.posterior
    assert post["d"].shape[-4:] == (4, 1, 3, 3) and post["gamma"].shape[-1] == 12
    assert "W" not in post and "b" not in post  # per-image latents stay out of the file
    elbo = np.asarray(idata.sample_stats["objective"]).ravel()
    assert len(elbo) >= 2 and np.all(np.diff(elbo) >= -1e-6 * np.abs(elbo[:-1]))
    assert np.all(np.asarray(post["resid_norm"]) < np.sqrt((default_cfa_data(0, N=12) ** 2)
                                                            .sum((1, 2))))
    assert main(["diagnose", str(out)]) == 0, capsys.readouterr().err


def test_vb_refuses_the_samplers_heuristics_in_one_sentence(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["run", "cfa", "--method", "vb", "--pool", "2", "--quick", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "gibbs method" in err and "\n" not in err and "Traceback" not in err
    assert not out.exists()


def test_vb_refuses_the_element_move_in_one_sentence(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["run", "cfa", "--method", "vb", "--element_move", "on", "--quick",
                 "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "--element_move" in err and "\n" not in err and "Traceback" not in err
    assert not out.exists()


def test_the_sampler_runs_with_the_element_move_and_records_it(tmp_path, capsys, monkeypatch):
    from latentzoo.inference import conv_factor

    asked = []
    original = conv_factor.cfa_updates

    def spy(**options):
        asked.append(options.get("element_move"))
        return original(**options)

    monkeypatch.setattr(conv_factor, "cfa_updates", spy)
    path = tmp_path / "digits.npy"
    np.save(path, default_cfa_data(0, N=6)[:, :6, :6])
    out = tmp_path / "run"
    argv = ["run", "cfa", "--data", str(path), "--K", "3", "--atom", "2", "--element_move", "on",
            "--chains", "1", "--warmup", "5", "--samples", "5", "--no-progress", "--out", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    post = azx.load(str(out / "posterior.nc")).posterior
    assert post["num_active"].shape[-1] == 5 and np.all(np.isfinite(post["gamma"]))
    assert asked == [True]
    options = json.loads(azx.load(str(out / "posterior.nc")).posterior.attrs["latentzoo_options"])
    assert options["element_move"] == "on"
