"""``latentzoo run cfa --method vb``: batch CAVI as a point fit through the CLI (the sampler is
covered by test_every_method.py)."""

from __future__ import annotations

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
