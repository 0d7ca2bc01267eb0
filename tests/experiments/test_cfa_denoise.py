"""``experiments/cfa_denoise.py --quick`` denoises and inpaints a small crop of a shipped sample
image, with its baselines, and writes its JSON."""

import json

import numpy as np


def test_cfa_denoise_quick(load_experiment, tmp_path):
    exp = load_experiment("cfa_denoise")
    exp.main(["--quick", "--sigmas", "25", "--out", str(tmp_path)])
    res = json.loads((tmp_path / "cfa_denoise.json").read_text())
    tasks = [r["task"] for r in res["results"]]
    assert tasks == ["denoise sigma=25", "inpaint 50% missing"]
    assert (tmp_path / res["figure"]).stat().st_size > 0
    for r in res["results"]:
        assert all(np.isfinite(v) and 5 < v < 60 for v in r["psnr"].values()), r
        assert r["noise_sd_estimate"] > 0 and r["elements_in_use"] >= 0
    # the patch baseline is a real denoiser: it beats the noisy input even at quick sizes
    den = res["results"][0]["psnr"]
    assert den["dictionary_learning"] > den["degraded"] + 1
    assert den["nl_means"] > den["degraded"] + 1  # as is NL-means


def test_cfa_denoise_takes_another_image(load_experiment, tmp_path):
    """--image: the other shipped photograph, or a 2-D .npy (its centre cropped); a 3-D array is
    one sentence, nothing written."""
    import pytest

    exp = load_experiment("cfa_denoise")
    grey = np.random.default_rng(0).uniform(0, 255, (40, 50))
    np.save(tmp_path / "img.npy", grey)
    np.testing.assert_array_equal(exp.sample_crop(24, str(tmp_path / "img.npy")), grey[8:32, 13:37])
    assert exp.sample_crop(24, "flower.jpg").shape == (24, 24)
    np.save(tmp_path / "rgb.npy", np.zeros((30, 30, 3)))
    out = tmp_path / "out"
    with pytest.raises(SystemExit, match="2-D"):
        exp.main(["--quick", "--image", str(tmp_path / "rgb.npy"), "--out", str(out)])
    assert not out.exists()


def test_cfa_denoise_refuses_bad_arguments(load_experiment, tmp_path):
    import pytest

    exp = load_experiment("cfa_denoise")
    with pytest.raises(SystemExit):
        exp.main(["--quick", "--missing", "1.5", "--out", str(tmp_path)])
    assert not list(tmp_path.iterdir())
