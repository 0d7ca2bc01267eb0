"""``latentzoo run MODEL --distributed``: the Gibbs sweep with the rows split over 4 forced host
devices of one process, and over 2 processes x 2 devices (jax.distributed, Gloo), gives the draws
of the plain run (to 1e-9), and only process 0 writes; what it cannot run is one sentence, exit
2, nothing written.

fa, mfa, cvq and the rank SVM's G-NL variant (features and --labels, split by rows together) are
compared over 2 chains of 20 + 20 sweeps. The route is one piece of glue for every family
(``runs.run_mcmc`` hands the family's kernel, data and per-chain starts to
``runs.run_sharded_chains``; no family's runner but the rank SVM's reads ``--distributed``), so
the families here are those whose sharded sweep no other test checks (mfa, cvq), the plainest
(fa) and the one whose runner passes a row-wise table beside the data (the rank SVM's labels).
TA, MTA and NOCA's sharded sweeps are checked draw by draw and in distribution, with a control,
in tests/inference/test_distributed_families.py; their CLI pairs here (45 s and 35 s of a 323 s
fixture, measured) checked that glue again and were dropped. G-L is not run here either: the
sharding is the same code for every table (nothing in an update knows about devices), and
G-NL's table has every kind of row-wise draw and sum that G-L's has (z, the per-row augmentation
lam_svm, the classifier's sums over rows) plus the mixture labels; G-L's pair of runs cost 54 s of
compiling (measured, cold) and its --distributed run matched the plain one to 6.5e-14 when
recorded in docs/distributed.md."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from latentzoo import arviz_adapter as azx
from latentzoo.cli import main

ROOT = Path(__file__).resolve().parents[2]
SIZES = ["--K", "2", "--chains", "2", "--warmup", "20", "--samples", "20", "--no-progress", "--seed", "3"]
# family -> (data arguments, sizes); the files are the fixture's
NEW = {
    # the DP mixture's labels are per-row draws too (measured: 1.6e-12 over 2 chains of 20 + 20)
    "rank-svm:G-NL": (["--data", "F.npy", "--labels", "y.npy", "--variant", "G-NL"], SIZES),
}
GROUPS = ("posterior", "sample_stats", "log_likelihood")

# one interpreter with 4 host devices: the plain run (NumPyro's MCMC, chains on 2 devices in
# parallel) and the same run --distributed (fa; mfa with its k-means++ start per chain; cvq's
# binary sources and data-driven starts; the rank SVM's features and labels), and 42 rows that 4
# devices cannot share
_FOUR_DEVICES = textwrap.dedent("""
    import json, os, sys, time
    from latentzoo.cli import main
    tmp = sys.argv[1]
    base = ["run", "--data", os.path.join(tmp, "X.npy"), *json.loads(sys.argv[2])]
    codes = {}
    for fam in ("fa", "mfa", "cvq"):
        args = [base[0], fam, *base[1:], "--method", "gibbs"]
        codes[f"{fam}-plain"] = main([*args, "--out", os.path.join(tmp, f"{fam}-plain")])
        codes[f"{fam}-dist"] = main([*args, "--out", os.path.join(tmp, f"{fam}-dist"), "--distributed"])
    seconds = {}
    for fam, (data, sizes) in json.loads(sys.argv[3]).items():
        t0 = time.perf_counter()
        data = [os.path.join(tmp, a) if a.endswith(".npy") else a for a in data]
        args = ["run", fam.split(":")[0], *data, *sizes, "--method", "gibbs"]
        codes[f"{fam}-plain"] = main([*args, "--out", os.path.join(tmp, f"{fam}-plain")])
        codes[f"{fam}-dist"] = main([*args, "--out", os.path.join(tmp, f"{fam}-dist"), "--distributed"])
        seconds[fam] = round(time.perf_counter() - t0, 1)
    print("SECONDS " + json.dumps(seconds))  # what each family adds (compiling, mostly)
    codes["odd"] = main(["run", "fa", "--data", os.path.join(tmp, "X42.npy"), *json.loads(sys.argv[2]),
                         "--out", os.path.join(tmp, "odd"), "--distributed"])
    print("CODES " + json.dumps(codes))
""")


def _env(devices: int, **extra) -> dict:
    return {**os.environ, "JAX_PLATFORMS": "cpu",
            "XLA_FLAGS": (os.environ.get("XLA_FLAGS", "") +
                          f" --xla_force_host_platform_device_count={devices}").strip(), **extra}


def _same(a_dir, b_dir, tol=1e-9):
    a, b = azx.load(os.path.join(a_dir, "posterior.nc")), azx.load(os.path.join(b_dir, "posterior.nc"))
    for group in GROUPS:
        assert hasattr(a, group) == hasattr(b, group), group
        if not hasattr(a, group):  # TA and MTA store no pointwise log-likelihood
            continue
        ga, gb = getattr(a, group), getattr(b, group)
        assert set(ga.data_vars) == set(gb.data_vars), group
        for name in ga.data_vars:
            x, y = np.asarray(ga[name], dtype=float), np.asarray(gb[name], dtype=float)
            assert x.shape == y.shape, (group, name)
            np.testing.assert_allclose(y, x, rtol=0, atol=tol * max(1.0, np.abs(x).max()),
                                       err_msg=f"{group}/{name}")


@pytest.fixture(scope="module")
def four_devices(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("distributed_run")
    X = np.random.default_rng(0).normal(size=(40, 5))
    np.save(tmp / "X.npy", X)
    np.save(tmp / "X42.npy", np.random.default_rng(1).normal(size=(42, 5)))
    rng = np.random.default_rng(3)
    F = rng.normal(size=(40, 5))
    np.save(tmp / "F.npy", F)
    np.save(tmp / "y.npy", (F[:, 0] + 0.5 * rng.normal(size=40) > 0).astype(float))  # labels 0 / 1
    script = tmp / "four_devices.py"  # a file, not ``python -c`` (a family's note looks up its caller's module)
    script.write_text(_FOUR_DEVICES)
    r = subprocess.run([sys.executable, str(script), str(tmp), json.dumps(SIZES), json.dumps(NEW)],
                       cwd=ROOT, env=_env(4), capture_output=True, text=True, timeout=600)
    print(next((s for s in r.stdout.splitlines() if s.startswith("SECONDS ")), ""))  # shown with -s
    line = next((s for s in r.stdout.splitlines() if s.startswith("CODES ")), None)
    assert line is not None, r.stderr[-3000:]
    return tmp, json.loads(line[6:]), r.stderr


@pytest.mark.parametrize("fam", ["fa", "mfa", "cvq", *NEW])
def test_four_devices_give_the_plain_runs_draws(four_devices, fam):
    tmp, codes, _ = four_devices
    assert codes[f"{fam}-plain"] == 0 and codes[f"{fam}-dist"] == 0
    _same(tmp / f"{fam}-plain", tmp / f"{fam}-dist")
    assert sorted(os.listdir(tmp / f"{fam}-dist")) == sorted(os.listdir(tmp / f"{fam}-plain"))


def test_rows_the_devices_cannot_share(four_devices):
    tmp, codes, err = four_devices
    assert codes["odd"] == 2
    assert "latentzoo: The data has 42 rows, which 4 devices cannot share equally; use a row count " \
           "divisible by 4." in err
    assert not (tmp / "odd").exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _processes(args_of, num=2, devices=2, timeout=240):
    """Run ``python -m latentzoo.cli run ...`` as ``num`` processes; [(status, stderr)]."""
    port = _free_port()
    procs = []
    for p in range(num):
        env = _env(devices, LATENTZOO_COORDINATOR=f"127.0.0.1:{port}",
                   LATENTZOO_NUM_PROCESSES=str(num), LATENTZOO_PROCESS_ID=str(p),
                   LATENTZOO_INIT_TIMEOUT="60", LATENTZOO_HEARTBEAT_TIMEOUT="20")
        procs.append(subprocess.Popen([sys.executable, "-m", "latentzoo.cli", *args_of(p)], cwd=ROOT,
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    out = []
    try:
        for proc in procs:
            _, err = proc.communicate(timeout=timeout)
            out.append((proc.returncode, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return out


def test_two_processes_write_process_0s_run_equal_to_one_process(four_devices):
    tmp, codes, _ = four_devices
    assert codes["fa-plain"] == 0
    data = str(tmp / "X.npy")
    # process 1 is given its own --out only to show that it writes nothing there
    res = _processes(lambda p: ["run", "fa", "--data", data, *SIZES, "--distributed",
                                "--out", str(tmp / f"procs-{p}")])
    assert [code for code, _ in res] == [0, 0], res[0][1][-2000:] + res[1][1][-2000:]
    assert not (tmp / "procs-1").exists()
    assert sorted(os.listdir(tmp / "procs-0")) == sorted(os.listdir(tmp / "fa-plain"))
    _same(tmp / "fa-plain", tmp / "procs-0")


def test_two_processes_refuse_rows_they_cannot_share(tmp_path):
    np.save(tmp_path / "X41.npy", np.random.default_rng(2).normal(size=(41, 5)))
    res = _processes(lambda p: ["run", "fa", "--data", str(tmp_path / "X41.npy"), *SIZES,
                                "--distributed", "--out", str(tmp_path / "out")], timeout=120)
    assert [code for code, _ in res] == [2, 2]
    # found alike by both: process 0 says it
    assert "latentzoo: The data has 41 rows, which 2 processes cannot share equally; use a row " \
           "count divisible by 2." in res[0][1]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("extra, sentence", [
    (["--method", "nuts"], "--distributed runs a Gibbs sampler's sweeps with the rows split over "
                           "devices and processes; fa --method nuts is not one (use --method gibbs)."),
    (["--method", "em"], "fa --method em is not one (use --method gibbs)."),
    (["--replicas", "3"], "--replicas and --distributed cannot be combined"),
    (["--checkpoint-every", "5"], "--distributed keeps no checkpoint"),
])
def test_what_distributed_cannot_run_is_one_sentence(tmp_path, capsys, extra, sentence):
    out = tmp_path / "out"
    code = main(["run", "fa", "--distributed", *SIZES, *extra, "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    assert sentence in err and err.count("\n") == 1, err
    assert not out.exists()


def test_a_family_without_a_tested_sharded_sweep_is_refused(tmp_path, capsys):
    from latentzoo.registry import families

    untested = [f.name for f in families().values() for m in f.methods
                if m.cli and m.name == "gibbs" and not m.distributed]
    assert untested == ["cfa"]  # the convolutional factor model's images: not split by rows yet
    code = main(["run", "cfa", "--distributed", "--method", "gibbs", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2
    assert "--distributed is not available for cfa --method gibbs" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("extra, sentence", [
    # the R variants' rank pairs join rows that may sit on different devices
    (["--variant", "R-L"], "--distributed runs the rank SVM's G-L and G-NL variants only (the R "
                           "variants' rank pairs are not rows); got --variant R-L."),
    (["--variant", "G-L", "--labels", "y.npy"], "With --distributed, --data and --labels name each "
                                                "process's part with {process} both or neither"),
])
def test_a_rank_svm_run_distributed_cannot_do_is_one_sentence(tmp_path, capsys, monkeypatch, extra, sentence):
    monkeypatch.chdir(tmp_path)
    np.save(tmp_path / "F0.npy", np.random.default_rng(0).normal(size=(8, 3)))
    np.save(tmp_path / "y.npy", np.arange(8) % 2)
    np.save(tmp_path / "Fy.npy", np.column_stack([np.load(tmp_path / "F0.npy"), np.arange(8) % 2]))
    data = "F{process}.npy" if "--labels" in extra else "Fy.npy"
    code = main(["run", "rank-svm", "--data", data, *extra, "--distributed", *SIZES,
                 "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2
    assert sentence in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()
