"""The output folder: staged inside --out (one file system), nothing left behind by SIGTERM or
SIGKILL, a full disk is one sentence with the previous run intact, and a new run removes the files
an earlier run wrote that it does not rewrite (never the user's)."""

import errno
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from latentzoo import arviz_plots as azp
from latentzoo.cli import main
from latentzoo.results import MANIFEST, staged_run_dir

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    rng = np.random.default_rng(1)
    path = tmp_path_factory.mktemp("data") / "x.npy"
    np.save(path, rng.normal(size=(40, 4)) @ rng.normal(size=(4, 4)))
    return str(path)


def _em(data, out, *extra):
    """A point fit: seconds, and the same run folder as any method."""
    return ["run", "fa", "--method", "em", "--data", data, "--K", "1", "--sweeps", "20",
            "--no-progress", "--out", str(out), *extra]


def _leftovers(folder, checkpoint=True):
    kinds = (".staging", ".tmp", ".checkpoint") if checkpoint else (".staging", ".tmp")
    return [p for p in os.listdir(folder) if p.startswith(kinds)]


def _files(folder):
    return {p: (folder / p).read_bytes() for p in os.listdir(folder) if not p.startswith(".")}


# ------------------------------------------------------------------ a mount point
@pytest.mark.smoke
def test_out_on_its_own_file_system_is_written(data, tmp_path, monkeypatch):
    """--out a mount point: a rename from anywhere outside it fails with EXDEV, as a container
    volume does. Staging beside --out (in its parent) failed every time."""
    out = tmp_path / "volume"
    out.mkdir()
    real = os.replace
    inside = str(out) + os.sep

    def replace(src, dst):
        if os.path.abspath(dst).startswith(inside) and not os.path.abspath(src).startswith(inside):
            raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), src, None, dst)
        return real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    assert main(_em(data, out)) == 0
    assert sorted(_files(out)) == ["posterior.nc", "summary.csv", "trace.png"]
    assert not _leftovers(out) and not _leftovers(tmp_path)


# ------------------------------------------------------------------ full disk, any OSError
@pytest.fixture
def previous_run(data, tmp_path):
    out = tmp_path / "run"
    assert main(_em(data, out, "--seed", "1")) == 0
    return out


@pytest.mark.parametrize("victim", ["posterior.nc", "trace.png"])
def test_full_disk_is_one_sentence_and_keeps_the_previous_run(victim, data, previous_run,
                                                              monkeypatch, capsys):
    before = _files(previous_run)
    from latentzoo import results

    real = results.atomic_write

    def atomic_write(path, write):
        if os.path.basename(path) == victim:
            def partial(tmp):
                with open(tmp, "wb") as fh:
                    fh.write(b"half")
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real(path, partial)
        return real(path, write)

    monkeypatch.setattr(results, "atomic_write", atomic_write)
    monkeypatch.setattr("latentzoo.arviz_adapter.atomic_write", atomic_write)
    monkeypatch.setattr("latentzoo.arviz_plots.atomic_write", atomic_write)
    capsys.readouterr()
    assert main(_em(data, previous_run, "--seed", "2")) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    assert f"{previous_run / victim}" in err and "No space left on device" in err, err
    assert _files(previous_run) == before  # byte for byte the previous run
    assert not _leftovers(previous_run)


def test_a_rename_failing_midway_puts_the_previous_files_back(data, previous_run, monkeypatch,
                                                               capsys):
    before = _files(previous_run)
    real = os.replace
    calls = []

    def replace(src, dst):
        # the second new file's move into place fails (after the first has replaced its twin)
        if os.path.abspath(dst) == str(previous_run / "summary.csv") and ".previous" not in src:
            calls.append(dst)
            raise OSError(errno.EIO, os.strerror(errno.EIO), src)
        return real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    assert main(_em(data, previous_run, "--seed", "2")) == 2
    assert calls, "the failing rename was not reached"
    assert "summary.csv" in capsys.readouterr().err
    assert _files(previous_run) == before
    assert not _leftovers(previous_run)


def test_streaming_run_writes_through_the_same_staging(tmp_path, monkeypatch, capsys):
    rng = np.random.default_rng(2)
    path = tmp_path / "x.csv"
    np.savetxt(path, rng.normal(size=(200, 5)), delimiter=",")
    out = tmp_path / "stream"
    argv = ["run", "fa", "--method", "online-em", "--data", str(path), "--K", "1",
            "--chunk-size", "64", "--no-progress", "--out", str(out)]
    assert main(argv) == 0
    before = _files(out)

    def full(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(azp, "plot_trace", full)
    monkeypatch.setattr("latentzoo.runs._plot_objective", full)
    assert main(argv[:-2] + ["--seed", "5", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "trace.png" in err and "No space left" in err
    assert _files(out) == before and not _leftovers(out)


# ------------------------------------------------------------------ stale files of a run
def test_new_run_removes_the_previous_runs_plots_but_never_user_files(data, tmp_path):
    out = tmp_path / "run"
    assert main(_em(data, out)) == 0
    assert main(["diagnose", str(out)]) == 0
    assert (out / "ppc.png").exists()  # a point fit has no rank plot
    (out / "notes.txt").write_text("mine")
    assert main(_em(data, out, "--seed", "3")) == 0
    assert sorted(_files(out)) == ["notes.txt", "posterior.nc", "summary.csv", "trace.png"]

    # a plot the user changed since latentzoo wrote it is theirs now
    assert main(["diagnose", str(out)]) == 0
    with open(out / "ppc.png", "ab") as fh:
        fh.write(b"\0")
    assert main(_em(data, out, "--seed", "4")) == 0
    assert "ppc.png" in _files(out) and "notes.txt" in _files(out)


def test_manifest_cannot_name_a_file_outside_the_folder(tmp_path):
    victim = tmp_path / "precious.txt"
    victim.write_text("x")
    out = tmp_path / "run"
    out.mkdir()
    st = os.stat(victim)
    (out / MANIFEST).write_text(
        '{"run": {"../precious.txt": {"size": %d, "mtime_ns": %d}}, "diagnose": {}}'
        % (st.st_size, st.st_mtime_ns))
    with staged_run_dir(str(out), role="run") as stage:
        open(os.path.join(stage, "a.txt"), "w").close()
    assert victim.read_text() == "x"


# ------------------------------------------------------------------ signals
# The child follows the tests' JAX compilation cache setting (off unless opted in); where a cache
# is used, the conftest makes its writes atomic, so a child killed while writing an entry cannot
# leave a torn entry for other processes to load.
_CHILD = """
import os, runpy, sys, time
sys.path.insert(0, {root!r})
runpy.run_path(os.path.join({root!r}, "tests", "conftest.py"))
import latentzoo.arviz_adapter as azx
real = azx.save

def slow_save(idata, path):  # the signal lands while posterior.nc is being written
    def write(tmp):
        open(tmp, "wb").write(b"partial")
        open({flag!r}, "w").close()
        time.sleep(120)
    azx.atomic_write(path, write)

azx.save = slow_save
import latentzoo.runs
from latentzoo.cli import main
sys.exit(main({argv!r}))
"""


def _start(tmp_path, argv):
    flag = tmp_path / "writing"
    code = _CHILD.format(root=ROOT, flag=str(flag), argv=argv)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not flag.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the child never reached the write"
        time.sleep(0.05)
    return proc


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_while_writing_cleans_up_and_keeps_the_previous_run(sig, data, previous_run,
                                                                    tmp_path):
    before = _files(previous_run)
    proc = _start(tmp_path, _em(data, previous_run, "--seed", "2"))
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err
    err = err.strip()
    assert err.startswith("latentzoo: interrupted") and "\n" not in err, err
    assert _files(previous_run) == before
    assert not _leftovers(previous_run, checkpoint=False)
    # the fit had finished: its checkpoint stays, and --resume writes its result
    assert f"--resume {previous_run}" in err
    argv = ["--resume" if a == "--out" else a for a in _em(data, previous_run, "--seed", "2")]
    assert main(argv) == 0
    assert not _leftovers(previous_run) and _files(previous_run) != before


def test_sigkill_while_writing_leaves_staging_that_the_next_command_removes(data, previous_run,
                                                                            tmp_path):
    proc = _start(tmp_path, _em(data, previous_run, "--seed", "2"))
    proc.kill()
    proc.communicate(timeout=60)
    left = [p for p in os.listdir(previous_run) if p.startswith(".staging")]
    assert left, "SIGKILL should have left the staging folder (nothing can remove it then)"
    assert any(n.startswith(".tmp-") for n in os.listdir(previous_run / left[0]))
    # a live process's staging folder is never touched (this test's parent process is alive)
    live = previous_run / f".staging-{os.getppid()}@{left[0].split('@')[1]}"
    live.mkdir()
    assert main(["diagnose", str(previous_run)]) == 0
    assert [p for p in os.listdir(previous_run) if p.startswith(".staging")] == [live.name]
    live.rmdir()
    assert main(_em(data, previous_run, "--seed", "3")) == 0
    assert not _leftovers(previous_run)
