"""Hostile input files, arguments and run folders, for every registered family.

Each case must end the way a user error should: exit status 2, one sentence on stderr, no
traceback, no output folder and no staging leftovers. The cases fail before any fitting, so the
whole file runs in seconds. Output-folder faults and signals are in ``test_output_folder.py``.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from latentzoo.cli import main
from latentzoo.registry import families

ROOT = os.geteuid() == 0 if hasattr(os, "geteuid") else False


def _text(name, text):
    def make(d):
        p = d / name
        p.write_text(text)
        return str(p)

    return make


def _bytes(name, data):
    def make(d):
        p = d / name
        p.write_bytes(data)
        return str(p)

    return make


def _npy(name, array):
    def make(d):
        p = d / name
        np.save(p, array)
        return str(p)

    return make


def _npz(name, **arrays):
    def make(d):
        p = d / name
        np.savez(p, **arrays)
        return str(p)

    return make


def _dir(d):
    (d / "adir.csv").mkdir()
    return str(d / "adir.csv")


_rng = np.random.default_rng(0)
_GOOD = (_rng.random((30, 6)) < 0.4).astype(float)  # valid for every family's data kind

# name -> (make(tmp_path) -> path, phrase the sentence must contain (case-insensitive))
FILE_CASES = {
    "missing file": (lambda d: str(d / "nope.csv"), "does not exist"),
    "a directory": (_dir, "directory"),
    "empty csv": (_text("empty.csv", ""), "no data rows"),
    "header only": (_text("head.csv", "a,b,c\n"), "no data rows"),
    "blank lines only": (_text("blank.csv", "\n\n  \n"), "no data rows"),
    "binary bytes as csv": (_bytes("bin.csv", b"\xff\xfe\x00\x81\x92" * 40), "not a readable"),
    "garbage npy": (_bytes("junk.npy", b"not an array at all" * 10), "could not be read"),
    "garbage npz": (_bytes("junk.npz", b"PK\x03\x04broken" * 10), "could not be read"),
    "unknown extension": (_text("x.xlsx", "1,2\n3,4\n"), "must be one of"),
    "semicolon csv": (_text("semi.csv", "1;2;3\n4;5;6\n"), "non-numeric"),
    "trailing comma": (_text("trail.csv", "1,2,3,\n4,5,6,\n"), "non-numeric"),
    "ragged csv": (_text("rag.csv", "1,0,1\n0,1\n1,1,0\n"), "ragged"),
    "typo in first row": (_text("typo.csv", "1,O,1\n0,1,0\n1,1,0\n"), "non-numeric"),
    "nan cell": (_text("nan.csv", "1,0,1,0\n0,nan,1,1\n1,1,0,0\n"), "nan"),
    "inf cell": (_text("inf.csv", "1,0,1,0\n0,inf,1,1\n1,1,0,0\n"), "infinit"),
    "1-D npy": (_npy("v.npy", np.ones(10)), "2-d"),
    "3-D npy": (_npy("cube.npy", np.ones((4, 3, 2))), "2-d"),
    "object npy": (_npy("o.npy", np.array([[1, "a"], [None, 2.0]], dtype=object)), "could not be read"),
    "string npy": (_npy("s.npy", np.array([["a", "b"], ["c", "d"]])), "numeric"),
    "complex npy": (_npy("c.npy", _GOOD + 1j), "complex"),
    "nan npy": (_npy("n.npy", np.where(_GOOD > 0, np.nan, 0.0)), "nan"),
    "no rows": (_npy("r0.npy", np.zeros((0, 5))), "row"),
    "no columns": (_npy("c0.npy", np.zeros((5, 0))), "column"),
    "one row": (_npy("r1.npy", _GOOD[:1]), "at least 2"),
    "npz without X": (_npz("two.npz", a=_GOOD, b=_GOOD), "name the data"),
}

if not ROOT:  # root reads any file, so an unreadable file cannot be made
    def _unreadable(d):
        p = d / "locked.csv"
        p.write_text("1,0\n0,1\n")
        p.chmod(0)
        return str(p)

    FILE_CASES["unreadable file"] = (_unreadable, "could not be read")


# An image stack is read from .npy / .npz only and must be 3-D or 4-D: the same files are
# refused with these sentences instead (a 3-D array of 3x2 "images" is too small for 3x3 atoms).
IMAGE_PHRASES = {
    **{case: "must be one of" for case in (
        "empty csv", "header only", "blank lines only", "binary bytes as csv", "semicolon csv",
        "trailing comma", "ragged csv", "typo in first row", "nan cell", "inf cell")},
    **{case: "image stack" for case in ("1-D npy", "nan npy", "no rows", "no columns", "one row")},
    "3-D npy": "--atom",
}


def _assert_user_error(code, capsys, phrase, out, tmp_path):
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert "Traceback" not in err and "\n" not in err, err
    assert err.startswith("latentzoo"), err
    assert phrase.lower() in err.lower(), err
    assert not os.path.exists(out), "a refused run must not create its output folder"
    assert not [p for p in os.listdir(tmp_path) if p.startswith((".staging", ".tmp"))]


@pytest.mark.smoke
@pytest.mark.parametrize("model", sorted(families()))
@pytest.mark.parametrize("case", sorted(FILE_CASES))
def test_bad_file_is_one_sentence_for_every_family(model, case, tmp_path, capsys):
    make, phrase = FILE_CASES[case]
    if families()[model].data_kind.name == "image stack":
        phrase = IMAGE_PHRASES.get(case, phrase)
    out = tmp_path / "out"
    code = main(["run", model, "--data", make(tmp_path), "--K", "2", "--quick", "--no-progress",
                 "--out", str(out)])
    _assert_user_error(code, capsys, phrase, out, tmp_path)


# Data that is a valid file but wrong for a model: the sentence names the problem.
_NONBINARY = _rng.normal(size=(30, 6))
_THREE_CLASSES = np.column_stack([_NONBINARY[:, :5], np.arange(30) % 3])  # labels last
MODEL_CASES = [
    (m, case, make, phrase)
    for m, f in sorted(families().items()) if f.data_kind.name != "image stack"
    for case, make, phrase in [
        ("K too large", _npy("g.npy", _GOOD), "smaller than"),
        # values its kind cannot take: a scale float64 cannot square (matrix), a third label
        # class (labelled: any two labels are fine), a value other than 0/1 (binary)
        ("values wrong for the kind", _npy("wrong.npy", {
            "matrix": _NONBINARY * 1e200, "labelled matrix": _THREE_CLASSES}.get(
                f.data_kind.name, _GOOD * 2)),
         {"matrix": "scale", "labelled matrix": "exactly two classes"}.get(f.data_kind.name, "0 or 1")),
    ]
] + [
    # image stacks: K is a truncation level (no upper bound); the atom must fit the images
    (m, case, make, phrase)
    for m, f in sorted(families().items()) if f.data_kind.name == "image stack"
    for case, make, phrase in [
        ("atom too large", _npy("tiny.npy", _NONBINARY[:4, :4].reshape(4, 2, 2)), "--atom"),
        ("huge scale", _npy("huge.npy", _NONBINARY.reshape(5, 6, 6)[:, :4] * 1e200), "scale"),
    ]
]


@pytest.mark.parametrize("model, case, make, phrase", MODEL_CASES,
                         ids=[f"{m}-{c}" for m, c, _, _ in MODEL_CASES])
def test_data_wrong_for_the_model(model, case, make, phrase, tmp_path, capsys):
    out = tmp_path / "out"
    K = "6" if case == "K too large" else "2"
    code = main(["run", model, "--data", make(tmp_path), "--K", K, "--quick", "--no-progress",
                 "--out", str(out)])
    _assert_user_error(code, capsys, phrase, out, tmp_path)


IMAGE_ARGUMENT_CASES = {
    # a channels-first stack read as channels-last would be 3 x 10 images of 10 channels
    "channels-first stack without --layout": (
        _npy("nchw.npy", _rng.normal(size=(12, 3, 10, 10))), [], "--layout"),
    "K far above the values of one image": (
        _npy("imgs.npy", _NONBINARY.reshape(5, 6, 6)), ["--K", "100000"], "--K must be between"),
}


@pytest.mark.parametrize("case", sorted(IMAGE_ARGUMENT_CASES))
def test_image_stack_arguments_are_checked_before_compiling(case, tmp_path, capsys):
    make, extra, phrase = IMAGE_ARGUMENT_CASES[case]
    out = tmp_path / "out"
    code = main(["run", "cfa", "--data", make(tmp_path), "--K", "2", *extra, "--quick",
                 "--no-progress", "--out", str(out)])
    _assert_user_error(code, capsys, phrase, out, tmp_path)


def test_layout_reads_a_channels_first_stack(tmp_path):
    from latentzoo.families.conv_factor import image_stack
    from latentzoo.registry import RunConfig

    X = _rng.normal(size=(4, 3, 6, 7))
    cfg = RunConfig(K=2)._replace(options={"layout": "NCHW"})
    np.testing.assert_array_equal(image_stack(X, cfg), X)
    cfg = cfg._replace(options={"layout": "NHWC"})
    assert image_stack(X, cfg).shape == (4, 7, 3, 6)


BINARY_CASES = {
    "real values": (_npy("real.npy", _NONBINARY), "0 or 1"),
    "halves": (_npy("half.npy", _GOOD * 0.5), "0 or 1"),
    "minus ones": (_npy("neg.npy", _GOOD * 2 - 1), "0 or 1"),
}


@pytest.mark.parametrize("case", sorted(BINARY_CASES))
@pytest.mark.parametrize("model", sorted(m for m, f in families().items()
                                         if f.data_kind.name == "binary matrix"))
def test_binary_models_refuse_non_binary(model, case, tmp_path, capsys):
    make, phrase = BINARY_CASES[case]
    out = tmp_path / "out"
    code = main(["run", model, "--data", make(tmp_path), "--K", "2", "--quick", "--no-progress",
                 "--out", str(out)])
    _assert_user_error(code, capsys, phrase, out, tmp_path)


def test_boolean_and_integer_arrays_are_read_as_numbers(tmp_path):
    """Not hostile: bool and int .npy files are ordinary data and must not be refused."""
    from latentzoo.data import BINARY_MATRIX, MATRIX

    for arr in (_GOOD.astype(bool), _GOOD.astype(np.int8)):
        path = tmp_path / "ok.npy"
        np.save(path, arr)
        for kind in (MATRIX, BINARY_MATRIX):
            X = kind.validate(kind.load(str(path)), K=2, name=str(path))
            assert X.dtype == np.float64 and np.array_equal(X, _GOOD)


ARG_CASES = [
    (["run", "fa", "--K", "0"], "--K"),
    (["run", "fa", "--K", "-3"], "--K"),
    (["run", "fa", "--samples", "0"], "--samples"),
    (["run", "fa", "--warmup", "-1"], "--warmup"),
    (["run", "fa", "--sweeps", "0"], "--sweeps"),
    (["run", "fa", "--restarts", "0"], "--restarts"),
    (["run", "fa", "--chunk-size", "0"], "--chunk-size"),
    (["run", "fa", "--seed", "-1"], "--seed"),
    (["run", "fa", "--seed", str(2**63 + 5)], "--seed"),
    (["run", "fa", "--K", "two"], "invalid int"),
    (["run", "fa", "--bogus", "1"], "unrecognized"),
    (["run"], "required"),
    (["frobnicate"], "invalid choice"),
]


def _cli(argv) -> int:
    """Exit status of ``latentzoo argv``: argparse's usage errors leave through SystemExit."""
    try:
        return main(argv)
    except SystemExit as stop:
        return stop.code


@pytest.mark.parametrize("argv, phrase", ARG_CASES, ids=[" ".join(a) for a, _ in ARG_CASES])
def test_bad_arguments_are_one_sentence(argv, phrase, tmp_path, capsys):
    out = tmp_path / "out"
    argv = [*argv, "--out", str(out)] if argv[0] == "run" and len(argv) > 1 else argv
    _assert_user_error(_cli(argv), capsys, phrase, out, tmp_path)


# ------------------------------------------------------------------------- diagnose
def _posterior_nc(tmp_path, posterior, attrs=None):
    from latentzoo import arviz_adapter as azx

    idata = azx.from_draws(posterior)
    if attrs:
        azx.set_posterior_attrs(idata, **attrs)
    run = tmp_path / "run"
    azx.save(idata, str(run / "posterior.nc"))
    return run


def _file(path, data: bytes):
    path.parent.mkdir(parents=True)
    path.write_bytes(data)
    return path.parent


DIAGNOSE_CASES = {
    "no run folder": (lambda d: d / "missing", "does not exist"),
    "no posterior.nc": (lambda d: (d / "empty").mkdir() or d / "empty", "does not exist"),
    "posterior.nc is garbage": (
        lambda d: _file(d / "g" / "posterior.nc", b"\x89HDF junk"),
        "not a readable"),
    "posterior.nc is empty": (
        lambda d: _file(d / "e" / "posterior.nc", b""),
        "not a readable"),
    "posterior.nc is a folder": (
        lambda d: (d / "f" / "posterior.nc").mkdir(parents=True) or d / "f", "not a readable"),
    "all-NaN posterior": (
        lambda d: _posterior_nc(d, {"mu": np.full((2, 30, 3), np.nan)},
                                {"latentzoo_model": "fa", "latentzoo_method": "gibbs"}),
        "non-finite"),
}


@pytest.mark.parametrize("case", sorted(DIAGNOSE_CASES))
def test_bad_run_folder_for_diagnose(case, tmp_path, capsys):
    make, phrase = DIAGNOSE_CASES[case]
    run = make(tmp_path)
    before = sorted(os.listdir(run)) if os.path.isdir(run) else None
    code = main(["diagnose", str(run)])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert phrase.lower() in err.lower() and "\n" not in err and "Traceback" not in err, err
    if before is not None:  # diagnose writes nothing on a bad run folder
        assert sorted(os.listdir(run)) == before


def test_diagnose_on_a_run_of_an_unknown_family_summarises_what_is_there(tmp_path, capsys):
    run = _posterior_nc(tmp_path, {"a": np.random.default_rng(1).normal(size=(2, 40))},
                        {"latentzoo_model": "not-a-family", "latentzoo_method": "gibbs"})
    assert main(["diagnose", str(run)]) == 0
    assert "a" in capsys.readouterr().out


def test_diagnose_on_an_fa_run_without_cov(tmp_path, capsys):
    """A high-dimensional FA run stores no D x D ``cov``; diagnose uses what is there."""
    rng = np.random.default_rng(2)
    run = _posterior_nc(tmp_path, {"mu": rng.normal(size=(2, 40, 3)), "psi": rng.gamma(2.0, size=(2, 40, 3))},
                        {"latentzoo_model": "fa", "latentzoo_method": "gibbs"})
    assert main(["diagnose", str(run)]) == 0
    out = capsys.readouterr().out
    assert "mu[0]" in out and "psi[0]" in out


# ------------------------------------------------------------------------------ API
def test_api_validators_raise_value_error_sentences():
    """The same validators back the Python API: one ValueError naming the problem."""
    from latentzoo.inference.validation import check_K, check_matrix

    bad = [
        (lambda: check_matrix(np.ones(5)), "2-D"),
        (lambda: check_matrix(np.array([[1.0, np.nan], [0.0, 1.0]])), "NaN"),
        (lambda: check_matrix(np.ones((3, 2)) + 1j), "complex"),
        (lambda: check_matrix(np.array([["a", "b"]])), "numeric"),
        (lambda: check_matrix(np.array([[0.0, 0.5], [1.0, 0.0]]), binary=True), "0 or 1"),
        (lambda: check_matrix(np.ones((5, 3)), K=3), "smaller than"),
        (lambda: check_K(0, 5), "K"),
    ]
    for call, phrase in bad:
        with pytest.raises(ValueError) as info:
            call()
        msg = str(info.value)
        assert phrase.lower() in msg.lower() and "\n" not in msg, msg


def test_a_fit_that_diverges_is_one_sentence(tmp_path, capsys, monkeypatch):
    """A runner that hits a non-finite objective (FloatingPointError) ends in one sentence."""
    from latentzoo.registry import REGISTRY, Method, get_family

    fam = get_family("fa")

    def diverge(data, cfg):
        raise FloatingPointError("The ELBO became NaN at sweep 1.")

    monkeypatch.setitem(REGISTRY, "fa", fam._replace(methods=(Method("em", diverge, kind="point"),)))
    out = tmp_path / "out"
    code = main(["run", "fa", "--method", "em", "--no-progress", "--out", str(out)])
    _assert_user_error(code, capsys, "nothing was written", out, tmp_path)


def _sparse_npy(name, shape):
    """A .npy of ``shape`` float32 values whose file is sparse (its header and a hole)."""
    def make(d):
        p = d / name
        np.lib.format.open_memmap(p, mode="w+", dtype=np.float32, shape=shape).flush()
        return str(p)

    return make


def test_a_file_larger_than_memory_is_refused_from_its_header(tmp_path, capsys):
    """10^5 x 10^5 values (75 GB as float64) on a machine with less: one sentence naming the
    size, before the file is read or anything compiled."""
    out = tmp_path / "out"
    code = main(["run", "fa", "--data", _sparse_npy("huge.npy", (100_000, 100_000))(tmp_path),
                 "--no-progress", "--out", str(out)])
    _assert_user_error(code, capsys, "100000 x 100000 values", out, tmp_path)


@pytest.mark.parametrize("model", sorted(families()))
def test_a_fit_larger_than_memory_is_refused_before_compiling(model, monkeypatch, tmp_path, capsys):
    """Every family, its default data, under a memory cap below the JAX runtime's own floor."""
    monkeypatch.setenv("LATENTZOO_MEMORY_LIMIT", "100M")
    out = tmp_path / "out"
    code = main(["run", model, "--quick", "--no-progress", "--out", str(out)])
    _assert_user_error(code, capsys, "needs at least", out, tmp_path)


def test_a_bad_memory_cap_is_one_sentence(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("LATENTZOO_MEMORY_LIMIT", "lots")
    out = tmp_path / "out"
    code = main(["run", "fa", "--quick", "--no-progress", "--out", str(out)])
    _assert_user_error(code, capsys, "LATENTZOO_MEMORY_LIMIT", out, tmp_path)
