"""Run directories: every file of a run appears together or not at all.

A run writes into a staging folder beside the target and moves each finished file into place at
the end, so an error (bad input, an interrupted fit) leaves nothing half-written in the target.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

__all__ = ["staged_run_dir", "atomic_write", "atomic_write_text", "atomic_savefig"]


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


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str, write) -> None:
    """Call ``write(tmp_path)`` on a temporary file beside ``path``, then rename it into place.

    The folder is created if needed; on any error the temporary file is removed and ``path`` is
    left as it was.
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=os.path.splitext(path)[1])
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual new-file mode
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def atomic_write_text(path: str, text: str) -> None:
    def write(tmp):
        with open(tmp, "w") as fh:
            fh.write(text)

    atomic_write(path, write)


def atomic_savefig(fig, path: str, **savefig_kwargs) -> None:
    """Save a matplotlib figure atomically (format from the file name, PNG by default)."""
    ext = os.path.splitext(path)[1].lstrip(".").lower()
    savefig_kwargs.setdefault("format", ext or "png")
    atomic_write(path, lambda tmp: fig.savefig(tmp, **savefig_kwargs))
