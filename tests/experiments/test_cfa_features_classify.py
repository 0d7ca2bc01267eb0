"""``experiments/cfa_features_classify.py --quick`` fits a small two-layer stack to digits,
classifies pooled features against raw pixels over stratified splits and writes its JSON."""

import json


def test_cfa_features_classify_quick(load_experiment, tmp_path):
    exp = load_experiment("cfa_features_classify")
    exp.main(["--quick", "--splits", "2", "--out", str(tmp_path)])
    res = json.loads((tmp_path / "cfa_features_classify.json").read_text())
    acc = res["accuracy"]
    assert set(acc) == {"pixels", "layer1 maps", "layer1", "layer2", "layer1+2"}
    assert res["feature_dims"]["pixels"] == 64
    used = res["elements_in_use"]["layer1"]
    assert res["feature_dims"]["layer1 maps"] == used * 16  # 5x5 atoms on 8x8: 4x4 maps
    assert res["feature_dims"]["layer1"] == used * 4  # pooled over 2x2 cells
    assert all(len(a["per_split"]) == 2 for a in acc.values())
    # raw pixels on 60 digits: far above the 10-class chance level
    assert acc["pixels"]["mean"] > 0.6
    for a in acc.values():
        assert a["mean"] is None or 0.0 <= a["mean"] <= 1.0
