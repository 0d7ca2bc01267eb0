"""Atomic writes: nothing half-written, and the usual file mode."""

import os
import stat

import pytest

from latentzoo.results import atomic_write, atomic_write_text


def test_atomic_write_text_gives_umask_mode(tmp_path):
    old = os.umask(0o022)
    try:
        path = tmp_path / "out" / "a.csv"
        atomic_write_text(str(path), "x\n")
    finally:
        os.umask(old)
    assert path.read_text() == "x\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # not mkstemp's 0600


def test_failed_write_leaves_nothing(tmp_path):
    path = tmp_path / "b.json"

    def boom(tmp):
        with open(tmp, "w") as fh:
            fh.write("partial")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        atomic_write(str(path), boom)
    assert os.listdir(tmp_path) == []
