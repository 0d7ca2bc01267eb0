"""Run directories: every file of a run appears together or not at all.

A run writes into a staging folder beside the target and moves each finished file into place at
the end, so an error (bad input, an interrupted fit) leaves nothing half-written in the target.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

__all__ = ["staged_run_dir", "atomic_write_text"]


@contextlib.contextmanager
def staged_run_dir(out_dir: str):
    """Yield a staging folder; on success move its files into ``out_dir`` (created if needed)."""
    parent = os.path.dirname(os.path.abspath(out_dir)) or "."
    os.makedirs(parent, exist_ok=True)
    stage = tempfile.mkdtemp(prefix=".staging-", dir=parent)
    try:
        yield stage
        os.makedirs(out_dir, exist_ok=True)
        for name in sorted(os.listdir(stage)):
            os.replace(os.path.join(stage, name), os.path.join(out_dir, name))
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def atomic_write_text(path: str, text: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
