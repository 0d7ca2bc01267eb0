"""``experiments/cfa_dictionaries.py --quick`` fits a tiny two-layer stack on digits, counts the
elements in use from the usages it reports and writes its JSON and figure; the photo crops'
loader is checked on its own (a second stack would double the test's compilation time)."""

import json

import numpy as np


def test_cfa_dictionaries_quick(load_experiment, tmp_path):
    exp = load_experiment("cfa_dictionaries")
    exp.main(["--quick", "--data", "digits", "--out", str(tmp_path), "--burn-in", "4",
              "--draws", "2"])
    rec = json.loads((tmp_path / "cfa_dictionaries.json").read_text())
    assert set(rec) == {"digits"}
    r = rec["digits"]
    assert r["layer1_in_use"] == sum(u > r["threshold"] for u in r["layer1_usage"])
    assert r["layer2_in_use"] == sum(u > r["threshold"] for u in r["layer2_usage"])
    assert 1 <= r["layer1_in_use"] <= r["K1"] and r["layer2_in_use"] <= r["K2"]
    assert r["mean_residual_norm_layer1"] < r["mean_image_norm"]
    assert (tmp_path / r["figure"]).stat().st_size > 1000


def test_photo_crops_are_greyscale_centred_and_standardised(load_experiment):
    X = load_experiment("cfa_dictionaries").load("photos", 5, 16)
    assert X.shape == (5, 1, 16, 16)
    np.testing.assert_allclose(X.mean(axis=(1, 2, 3)), 0, atol=1e-12)
    assert abs(X.std() - 1) < 1e-12
