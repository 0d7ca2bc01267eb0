"""The note on data whose columns are far from unit scale: the default priors of every model
assume unit scale, so on raw data with tiny or huge columns the priors set those columns' noise.
The note must fire on such data (scikit-learn's breast cancer: s.d. 0.003 to 569), never on
the embedded default data of any family (the main command stays quiet), and not after
--standardize."""

import argparse

import numpy as np
import pytest

from latentzoo import cli
from latentzoo.registry import families


def test_note_on_wide_scales_and_silence_near_unit_scale():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 4))
    assert cli.scale_note(X) is None
    assert cli.scale_note(np.c_[X, np.zeros(200)]) is None  # constant columns are left to validation
    wide = X * np.array([0.003, 1.0, 1.0, 569.0])
    note = cli.scale_note(wide)
    assert "0.00292" in note and "593" in note and "--standardize" in note
    assert cli.scale_note(X * 100.0) is not None  # uniformly large: far from the priors' scale
    assert cli.scale_note(X * 0.01) is not None


@pytest.mark.parametrize("name", [n for n, f in families().items()
                                  if f.data_kind.standardize is not None and not f.scale_free])
def test_no_note_on_any_default_data(name):
    data = families()[name].default_data(0)
    assert cli.scale_note(data[0] if isinstance(data, tuple) else data) is None


def test_loading_prints_the_note_once_and_not_with_standardize(tmp_path, capsys):
    from sklearn.datasets import load_breast_cancer

    path = tmp_path / "bc.csv"
    np.savetxt(path, load_breast_cancer().data, delimiter=",")
    family = families()["fa"]
    cfg = argparse.Namespace(K=2)
    for standardize, expect in ((False, 1), (True, 0)):
        args = argparse.Namespace(data=str(path), seed=0, standardize=standardize)
        cli.load_data(args, family, cfg)
        err = capsys.readouterr().err
        assert err.count("note: column standard deviations") == expect, err
