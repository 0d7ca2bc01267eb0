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
    attrs = azx.load(str(out / "posterior.nc")).posterior.attrs
    options = json.loads(attrs["latentzoo_options"])
    assert [options[o] for o in OPTIONS] == ["on", "on", "on"]
    assert json.loads(attrs["latentzoo_gibbs_moves"]) == list(OPTIONS)


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
    choices = "auto, off, on" if option == "relabel" else "off, on"
    assert code == 2 and f"--{option} must be one of {choices}" in capsys.readouterr().err


def test_relabel_auto_is_on_for_the_mixture_and_off_otherwise(monkeypatch, tmp_path, capsys):
    """What each variant's Gibbs run asks for under --relabel auto (the default) and off, read
    from the table request (which then stops the run before anything compiles)."""
    asked = []

    def spy(variant, **kw):
        asked.append((variant, kw.get("relabel")))
        raise ValueError("stopped here by the test.")

    monkeypatch.setattr(rank_svm, "rank_svm_updates", spy)
    for variant, value in (("G-NL", "auto"), ("R-NL", "auto"), ("G-L", "auto"), ("G-NL", "off")):
        code = main(["run", "rank-svm", "--variant", variant, "--relabel", value, *TINY,
                     "--out", str(tmp_path / variant / value)])
        assert code == 2 and "stopped here by the test" in capsys.readouterr().err
    assert asked == [("G-NL", True), ("R-NL", True), ("G-L", False), ("G-NL", False)]
