"""``latentzoo run MODEL --distributed``: the Gibbs sweep with the rows split over 4 forced host
devices of one process, and over 2 processes x 2 devices (jax.distributed, Gloo), gives the draws
of the plain run (to 1e-9), and only process 0 writes; what it cannot run is one sentence, exit
2, nothing written."""

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
GROUPS = ("posterior", "sample_stats", "log_likelihood")

# one interpreter with 4 host devices: the plain run (NumPyro's MCMC, chains on 2 devices in
# parallel) and the same run --distributed (fa; mfa with its k-means++ start per chain; cvq's
# binary sources), and 42 rows that 4 devices cannot share
_FOUR_DEVICES = textwrap.dedent("""
    import json, os, sys
    from latentzoo.cli import main
    tmp = sys.argv[1]
    base = ["run", "--data", os.path.join(tmp, "X.npy"), *json.loads(sys.argv[2])]
    codes = {}
    for fam in ("fa", "mfa", "cvq"):
        args = [base[0], fam, *base[1:], "--method", "gibbs"]
        codes[f"{fam}-plain"] = main([*args, "--out", os.path.join(tmp, f"{fam}-plain")])
        codes[f"{fam}-dist"] = main([*args, "--out", os.path.join(tmp, f"{fam}-dist"), "--distributed"])
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
    r = subprocess.run([sys.executable, "-c", _FOUR_DEVICES, str(tmp), json.dumps(SIZES)], cwd=ROOT,
                       env=_env(4), capture_output=True, text=True, timeout=300)
    line = next((s for s in r.stdout.splitlines() if s.startswith("CODES ")), None)
    assert line is not None, r.stderr[-3000:]
    return tmp, json.loads(line[6:]), r.stderr


@pytest.mark.parametrize("fam", ["fa", "mfa", "cvq"])
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

    untested = next((f, m) for f in families().values() for m in f.methods
                    if m.cli and m.name == "gibbs" and not m.distributed)
    code = main(["run", untested[0].name, "--distributed", "--method", "gibbs", "--out",
                 str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2
    assert f"--distributed is not available for {untested[0].name} --method gibbs" in err
    assert not (tmp_path / "out").exists()
