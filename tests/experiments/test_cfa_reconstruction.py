"""``experiments/cfa_reconstruction.py --quick`` fits one small layer to digits, compares with PCA
at the same number of components and writes its JSON."""

import json


def test_cfa_reconstruction_quick(load_experiment, tmp_path):
    exp = load_experiment("cfa_reconstruction")
    exp.main(["--quick", "--out", str(tmp_path)])
    rec = json.loads((tmp_path / "cfa_reconstruction.json").read_text())
    assert 1 <= rec["elements_in_use"] <= rec["K"] and rec["pca_components"] >= 1
    # both reconstruct: their residuals are below the images' own norm
    assert 0 < rec["cfa_mean_residual_norm"] < rec["mean_image_norm"]
    assert 0 < rec["pca_mean_residual_norm"] < rec["mean_image_norm"]
