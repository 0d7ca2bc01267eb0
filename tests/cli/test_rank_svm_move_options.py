"""``latentzoo run rank-svm --classifier-scale on --factor-rotation on --relabel on``: the Gibbs
table gains the classifier-scale move, the factor-rotation move and the DP relabelling moves
(their Geweke, SBC and orbit tests are in tests/inference/test_rank_svm_classifier_scale.py,
test_rank_svm_rotation.py, test_rank_svm_relabel.py and test_rank_svm_gibbs.py), the run records
the settings, and methods (or, for --relabel, variants) without the moves refuse them in one
sentence before anything is compiled or written."""

import json

import pytest

import latentzoo.inference.rank_svm as rank_svm
from latentzoo import arviz_adapter as azx
from latentzoo.cli import main

TINY = ["--chains", "1", "--warmup", "5", "--samples", "10", "--K", "2", "--no-progress"]
OPTIONS = ("classifier-scale", "factor-rotation", "relabel")


def test_on_puts_the_moves_in_the_gibbs_table_and_the_run_records_them(tmp_path, monkeypatch, capsys):
    # all in one run of an NL variant (each run compiles for about 10 s); off is every other
    # run's default
    on = OPTIONS
    original, asked = rank_svm.rank_svm_updates, []

    def spy(variant, **kw):
        asked.append((kw.get("classifier_scale", False), kw.get("rotation", False),
                      kw.get("relabel", False)))
        return original(variant, **kw)

    monkeypatch.setattr(rank_svm, "rank_svm_updates", spy)
    out = tmp_path / "run"
    flags = [a for o in on for a in (f"--{o}", "on")]
    code = main(["run", "rank-svm", "--variant", "G-NL", *flags, *TINY, "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    assert asked == [(True, True, True)]
    options = json.loads(azx.load(str(out / "posterior.nc")).posterior.attrs["latentzoo_options"])
    assert [options[o] for o in OPTIONS] == ["on", "on", "on"]


@pytest.mark.parametrize("option", OPTIONS)
@pytest.mark.parametrize("argv, words", [
    (["rank-svm", "--method", "nuts", "--variant", "G-L"], "--method nuts has none"),
    (["rank-svm", "--method", "vb"], "--method vb has none"),
    (["fa"], "does not apply to fa"),
])
def test_where_there_is_no_such_move_it_is_one_sentence(option, argv, words, tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["run", *argv, f"--{option}", "on", *TINY, "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and words in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


@pytest.mark.parametrize("option", OPTIONS)
def test_a_value_other_than_on_or_off_is_refused(option, tmp_path, capsys):
    code = main(["run", "rank-svm", f"--{option}", "yes", *TINY, "--out", str(tmp_path / "run")])
    assert code == 2 and f"--{option} must be one of off, on" in capsys.readouterr().err


def test_relabelling_a_variant_with_one_classifier_is_one_sentence(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["run", "rank-svm", "--variant", "G-L", "--relabel", "on", *TINY, "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "--variant G-L has one classifier" in err, err
    assert len(err.strip().splitlines()) == 1 and not out.exists(), err
