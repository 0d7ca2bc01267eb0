"""`latentzoo predict` for convolutional FA: new images restored with the run's dictionary (its
atoms and element probabilities held at posterior draws, the new images' maps, switches and noise
drawn), no refit. Denoising lowers the error against the clean images and infers the noise level;
NaN pixels are inpainted better than by each image's mean; the files come back in the input's
layout; a stack with other channels is one sentence with nothing written."""

import os

import numpy as np
import pandas as pd
import pytest

from latentzoo.cli import main
from latentzoo.models.conv_factor import default_cfa_data


@pytest.fixture(scope="module")
def cfa_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("cfa_predict")
    np.save(root / "train.npy", default_cfa_data(0, N=40))
    run = root / "run"
    assert main(["run", "cfa", "--chains", "2", "--warmup", "40", "--samples", "20",
                 "--no-progress", "--data", str(root / "train.npy"), "--out", str(run)]) == 0
    clean = default_cfa_data(1, N=6)  # other digits than the fit's first 40
    return root, run, clean


def test_denoising_lowers_the_error_and_infers_the_noise(cfa_run, capsys):
    root, run, clean = cfa_run
    noisy = clean + 0.1 * np.random.default_rng(0).normal(size=clean.shape)
    np.save(root / "noisy.npy", noisy)
    out = root / "denoised"
    assert main(["predict", str(run), "--data", str(root / "noisy.npy"), "--out", str(out)]) == 0
    assert "6 images denoised" in capsys.readouterr().out
    restored = np.load(out / "restored.npy")
    assert restored.shape == clean.shape  # (N, H, W) in, (N, H, W) out
    before, after = np.mean((noisy - clean) ** 2), np.mean((restored - clean) ** 2)
    # measured 0.0101 -> 0.0071; a dictionary ignored (the noisy image returned) or a wrong
    # noise precision (no shrinkage, or everything smoothed away) does not get under 0.9x
    assert after < 0.9 * before, (before, after)
    table = pd.read_csv(out / "predictions.csv")
    assert table["noise_sd"].mean() == pytest.approx(0.1, rel=0.35)  # measured 0.112
    assert os.path.getsize(out / "restored.png") > 0 and os.path.exists(out / "predictions.nc")


def test_nan_pixels_are_inpainted_better_than_the_images_mean(cfa_run, capsys):
    root, run, clean = cfa_run
    holes = clean.copy()
    holes[np.random.default_rng(0).random(clean.shape) < 0.2] = np.nan  # a fifth of the pixels
    np.save(root / "holes.npy", holes)
    out = root / "inpainted"
    assert main(["predict", str(run), "--data", str(root / "holes.npy"), "--out", str(out)]) == 0
    missing = np.isnan(holes)
    assert f"{missing.sum()} missing pixels" in capsys.readouterr().out
    restored = np.load(out / "restored.npy")
    mean_fill = np.where(missing, np.nanmean(holes, axis=(1, 2), keepdims=True), holes)
    # measured 0.055 against the mean fill's 0.155 (8x8 digits, 3x3 atoms): the neighbours
    # predict a pixel through the atoms. With the imputation step switched off (the missing
    # pixels left at the mean fill, treated as data) it measured 0.087: the bound 0.45 x 0.155
    # = 0.070 lies between the two
    err = np.mean((restored - clean)[missing] ** 2)
    assert err < 0.45 * np.mean((mean_fill - clean)[missing] ** 2), err
    assert np.isfinite(restored).all()
    np.testing.assert_array_equal(pd.read_csv(out / "predictions.csv")["missing_pixels"],
                                  missing.sum((1, 2)))


def test_other_channels_are_one_sentence_and_nothing_is_written(cfa_run, capsys):
    root, run, clean = cfa_run
    np.save(root / "rgb.npy", np.repeat(clean[..., None], 3, axis=-1))  # (6, 8, 8, 3)
    out = root / "rgb"
    assert main(["predict", str(run), "--data", str(root / "rgb.npy"), "--layout", "NHWC",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "3 channel(s); the run was fitted on 1" in err and "Traceback" not in err
    assert not os.path.exists(out)
