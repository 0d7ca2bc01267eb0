"""Run folders: every file of a run appears together or not at all.

A run (or ``diagnose``) writes its files into a staging folder *inside* the output folder
(``out/.staging-<pid>@<host>-XXXX``), so moving them into place is a rename within one file
system even when ``out`` is a mount point (a container volume). The files are moved in together
at the end; if a move fails, the ones already moved are taken back out and the previous run's
files are put back. An error (bad input, an interrupted fit, a full disk) leaves the folder as it
was.

Temporary names carry the writer's process id and host (``.staging-<pid>@<host>-...``,
``.tmp-<pid>@<host>-...``): a process killed with SIGKILL cannot clean up after itself, so the
next run or ``diagnose`` into the same folder removes those of processes on this host that no
longer exist, and nothing else.

Each run folder keeps a manifest, ``.latentzoo-files``: the files the last ``run`` and the last
``diagnose`` wrote, with their size and modification time. A new run removes the files an
earlier run or diagnose wrote that it does not write itself (a ``rank.png`` of the previous run
beside a new ``posterior.nc``), but only those that are still as latentzoo wrote them: a file the
user added, or changed since, is never deleted.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import socket
import tempfile

__all__ = [
    "staged_run_dir",
    "atomic_write",
    "atomic_write_text",
    "atomic_savefig",
    "writing",
    "WriteError",
    "remove_stale",
    "owner_tag",
    "MANIFEST",
]

MANIFEST = ".latentzoo-files"
_ROLES = ("run", "diagnose")
# .staging-<pid>@<host>-<random> and .tmp-<pid>@<host>-<random>[.ext]
_OWNED = re.compile(r"^\.(?:staging|tmp)-(\d+)@([A-Za-z0-9._]+)-")


class WriteError(ValueError):
    """A run folder could not be written (full disk, permissions, ...); the message is one
    sentence naming the file and the reason."""


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9._]", "_", socket.gethostname() or "localhost")


def owner_tag() -> str:
    """``<pid>@<host>``: what temporary names start with, so stale ones can be told apart."""
    return f"{os.getpid()}@{_host()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, under another user
        return True
    return True


def remove_stale(folder: str) -> list[str]:
    """Remove staging folders and temporary files in ``folder`` left by processes of this host
    that no longer exist (a SIGKILL mid-write); returns the names removed."""
    removed = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    host = _host()
    for name in names:
        m = _OWNED.match(name)
        if not m or m.group(2) != host or int(m.group(1)) == os.getpid() or _alive(int(m.group(1))):
            continue
        path = os.path.join(folder, name)
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.remove(path)
            removed.append(name)
        except OSError:
            pass
    return removed


def _reason(err: OSError) -> str:
    return (err.strerror or str(err) or type(err).__name__).rstrip(".")


@contextlib.contextmanager
def writing(path: str, out_dir: str | None = None):
    """Turn an ``OSError`` raised while writing ``path`` into a :class:`WriteError` sentence that
    names ``path`` and the reason (``out_dir``: the folder whose files stay unchanged)."""
    try:
        yield
    except WriteError:
        raise
    except OSError as err:
        where = out_dir or os.path.dirname(path) or "."
        raise WriteError(
            f"Could not write {path} ({_reason(err)}); nothing was written and the files already "
            f"in {where} are unchanged."
        ) from None


def _read_manifest(out_dir: str) -> dict[str, dict[str, dict]]:
    """The manifest, with anything that is not a plain file name in ``out_dir`` dropped (a
    hand-edited or corrupt manifest can never name a file elsewhere)."""
    try:
        with open(os.path.join(out_dir, MANIFEST), encoding="utf-8") as fh:
            raw = json.load(fh)
    except (OSError, ValueError):
        return {role: {} for role in _ROLES}
    out = {}
    for role in _ROLES:
        entries = raw.get(role) if isinstance(raw, dict) else None
        out[role] = {
            name: stamp for name, stamp in (entries.items() if isinstance(entries, dict) else ())
            if isinstance(name, str) and name == os.path.basename(name)
            and name not in ("", ".", "..", MANIFEST) and not name.startswith(".")
            and isinstance(stamp, dict)
        }
    return out


def _stamp(path: str) -> dict:
    st = os.stat(path)
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _unchanged(path: str, stamp: dict) -> bool:
    """Whether ``path`` is a regular file still as latentzoo wrote it."""
    try:
        if os.path.islink(path) or not os.path.isfile(path):
            return False
        return _stamp(path) == {"size": stamp.get("size"), "mtime_ns": stamp.get("mtime_ns")}
    except OSError:
        return False


def _commit(stage: str, out_dir: str, role: str | None) -> None:
    """Move the staged files into ``out_dir`` together, and (``role``) remove what an earlier
    run/diagnose wrote that this one does not rewrite; all or nothing."""
    names = sorted(n for n in os.listdir(stage) if not n.startswith("."))
    manifest = _read_manifest(out_dir)
    stale = []
    if role is not None:
        owned = dict(manifest["diagnose"])
        if role == "run":
            owned.update(manifest["run"])
        stale = sorted(n for n, s in owned.items()
                       if n not in names and _unchanged(os.path.join(out_dir, n), s))
    aside = os.path.join(stage, ".previous")
    os.mkdir(aside)
    moved_aside, placed = [], []
    try:
        for name in [*names, *stale]:
            target = os.path.join(out_dir, name)
            with writing(target, out_dir):
                if os.path.isdir(target) and not os.path.islink(target):
                    raise IsADirectoryError(errno.EISDIR, "a folder of that name is in the way")
                if not os.path.lexists(target):
                    continue
                os.replace(target, os.path.join(aside, name))
                moved_aside.append(name)
        for name in names:
            target = os.path.join(out_dir, name)
            with writing(target, out_dir):
                os.replace(os.path.join(stage, name), target)
            placed.append(name)
        if role is not None:
            stamps = {n: _stamp(os.path.join(out_dir, n)) for n in names}
            new = {"run": stamps, "diagnose": {}} if role == "run" else \
                {"run": manifest["run"], "diagnose": stamps}
            path = os.path.join(out_dir, MANIFEST)
            with writing(path, out_dir):
                atomic_write_text(path, json.dumps(new, indent=1, sort_keys=True) + "\n")
    except BaseException:
        for name in placed:  # roll back: the previous files, exactly as they were
            with contextlib.suppress(OSError):
                os.remove(os.path.join(out_dir, name))
        for name in moved_aside:
            with contextlib.suppress(OSError):
                os.replace(os.path.join(aside, name), os.path.join(out_dir, name))
        raise


@contextlib.contextmanager
def staged_run_dir(out_dir: str, role: str | None = None):
    """Yield a staging folder inside ``out_dir`` (created if needed); on success move its files
    into ``out_dir`` together.

    ``role`` ("run" or "diagnose") records the files in the folder's manifest; a "run" removes
    the files of an earlier run or diagnose that it does not rewrite, a "diagnose" those of an
    earlier diagnose (only files still as latentzoo wrote them). On any error the staging folder
    is removed, a folder this call created is removed again, the previous files stay as they
    were, and an ``OSError`` becomes a :class:`WriteError` naming the file.
    """
    if role not in (None, *_ROLES):
        raise ValueError(f"role must be one of {_ROLES} or None, got {role!r}.")
    created = not os.path.isdir(out_dir)
    with writing(out_dir, out_dir):
        os.makedirs(out_dir, exist_ok=True)
        remove_stale(out_dir)
        stage = tempfile.mkdtemp(prefix=f".staging-{owner_tag()}-", dir=out_dir)
    try:
        try:
            yield stage
        except OSError as err:  # a writer's own error that names a staged file: name the target
            name = os.path.basename(getattr(err, "filename", "") or "")
            target = os.path.join(out_dir, name) if name and not name.startswith(".") else out_dir
            with writing(target, out_dir):
                raise
        _commit(stage, out_dir, role)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        if created:
            with contextlib.suppress(OSError):
                os.rmdir(out_dir)  # only if empty: never anything but what this call made
        raise
    shutil.rmtree(stage, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str, write) -> None:
    """Call ``write(tmp_path)`` on a temporary file beside ``path``, then rename it into place.

    The folder is created if needed; on any error the temporary file is removed and ``path`` is
    left as it was. The temporary name carries the process id (see :func:`remove_stale`).
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".tmp-{owner_tag()}-",
                               suffix=os.path.splitext(path)[1])
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
