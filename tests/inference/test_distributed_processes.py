"""Several processes with jax.distributed (Gloo CPU collectives): two processes of two forced
host devices each run FA's Gibbs sweep, online FA, FA's EM and CVQ's exact EM on their own rows
(tests/inference/distributed_fa_worker.py) and must reproduce one process on one device; a process
killed while the others wait inside a compiled program must end the run within seconds, with one
sentence from the peer watch and no JAX fatal log; bad input ends every process, with one
sentence from process 0; a normal end says nothing."""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import jax
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKER = "tests.inference.distributed_fa_worker"
HEARTBEAT = 20  # s: JAX's own limit (its default), which the peer watch must beat by far
KILL_BOUND = 5.0  # s: a killed process's peers end within this (measured: well under a second)
# JAX's fatal log: absl lines ("F1129 00:40:02.213016 ... client.h:80] Terminating process ...")
JAX_LOG = re.compile(r"^[FEW]\d{4} \d\d:\d\d:\d\d|Terminating process|Check failure", re.MULTILINE)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Run:
    """Processes of one run, stdout piped (JOINED / READY / DONE lines), stderr to a file."""

    def __init__(self, args=(), ids=(0, 1), num_processes=2, env_change=None, init_timeout=30):
        port = _free_port()
        self.procs, self.errs, self.lines_out = {}, {}, {}
        for p in ids:
            env = {**os.environ, "JAX_PLATFORMS": "cpu",
                   "XLA_FLAGS": (os.environ.get("XLA_FLAGS", "") +
                                 " --xla_force_host_platform_device_count=2").strip(),
                   "LATENTZOO_COORDINATOR": f"127.0.0.1:{port}",
                   "LATENTZOO_NUM_PROCESSES": str(num_processes), "LATENTZOO_PROCESS_ID": str(p),
                   "LATENTZOO_INIT_TIMEOUT": str(init_timeout),
                   "LATENTZOO_HEARTBEAT_TIMEOUT": str(HEARTBEAT)}
            if env_change:
                env_change(env)
            self.errs[p] = tempfile.TemporaryFile("w+")
            self.procs[p] = subprocess.Popen([sys.executable, "-m", WORKER, *args], cwd=ROOT, env=env,
                                             stdout=subprocess.PIPE, stderr=self.errs[p], text=True)
            self.lines_out[p] = queue.Queue()
            threading.Thread(target=self._read, args=(p,), daemon=True).start()

    def _read(self, p):
        for line in self.procs[p].stdout:
            self.lines_out[p].put(line)
        self.lines_out[p].put("")  # end of output

    def wait_for(self, word: str, timeout: float = 300):
        """Block until every process printed ``word p``; fail with their stderr otherwise."""
        deadline = time.monotonic() + timeout
        for p in self.procs:
            while True:
                try:  # Gloo's own lines come here too
                    line = self.lines_out[p].get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    line = None
                if line is not None and line.startswith(word):
                    break
                if line is None or line == "":
                    self.kill()
                    pytest.fail(f"process {p} never printed {word}: {self.stderr(p)[-3000:]}")

    def wait(self, timeout: float = 300) -> dict[int, int]:
        try:
            return {p: proc.wait(timeout=timeout) for p, proc in self.procs.items()}
        finally:
            self.kill()

    def stderr(self, p) -> str:
        f = self.errs[p]
        f.seek(0)
        return f.read()

    def lines(self, p) -> list[str]:
        return [s for s in self.stderr(p).splitlines() if s.strip() and not s.startswith("[Gloo")]

    def kill(self):
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _reference(N, D, K, samples, warmup, batch, seed, processes):
    """One process, one device, the zoo's own entry points: MCMC and OnlineFactorAnalysis (fed
    the rows in the order the sharded stream forms its batches)."""
    from numpyro.infer import MCMC

    from latentzoo.inference.distributed import stream_order
    from latentzoo.inference.fa import OnlineFactorAnalysis, fa_updates
    from latentzoo.inference.gibbs import ConjugateGibbs
    from latentzoo.models.factor_analysis import default_fa_data, factor_analysis

    X = default_fa_data(0, N=N, D=D, K=K)
    mcmc = MCMC(ConjugateGibbs(factor_analysis, fa_updates()), num_warmup=warmup,
                num_samples=samples, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(seed), X, K=K)
    ofa = OnlineFactorAnalysis(K, batch_size=batch, warmup=8, averaging_start=16, random_state=seed)
    ofa.partial_fit(X[stream_order(N // processes, batch, processes)])
    return mcmc.get_samples(), ofa


def _stderr_lines(run: Run, p) -> list[str]:
    return [s for s in run.stderr(p).splitlines() if s.strip()]


def _kill_inside_a_sweep(run: Run, victim: int, survivor: int) -> tuple[int, float]:
    """Once every process runs its endless compiled Gibbs program (SWEEPING), SIGKILL ``victim``;
    ``survivor``'s status and seconds to end."""
    run.wait_for("SWEEPING")
    time.sleep(0.5)  # well inside the program, waiting in its collectives
    run.procs[victim].send_signal(signal.SIGKILL)
    start = time.monotonic()
    rc = run.procs[survivor].wait(timeout=60)
    return rc, time.monotonic() - start


def _one_sentence(run: Run, p: int, sentence: str) -> None:
    text = run.stderr(p)
    assert not JAX_LOG.search(text), text[-3000:]
    assert _stderr_lines(run, p) == [sentence], text[-3000:]


def test_two_processes_match_one_device_and_a_killed_one_ends_the_other(tmp_path):
    out = tmp_path / "draws.npz"
    run = Run([str(out), "--loop", "--rows", "32", "--samples", "3", "--warmup", "2", "--batch", "8"])
    try:
        ref_gibbs, ofa = _reference(32, 5, 2, 3, 2, 8, 1, 2)  # meanwhile, on this process
        run.wait_for("READY")
        got = np.load(out)
        assert int(got["processes"]) == 2 and int(got["devices"]) == 4
        for k, v in ref_gibbs.items():
            err = float(np.max(np.abs(got["gibbs_" + k] - np.asarray(v))))
            assert err <= 1e-9, (k, err)
        assert np.max(np.abs(got["online_F"].T - ofa.components_)) <= 1e-9
        assert np.max(np.abs(got["online_psi"] - ofa.noise_variance_)) <= 1e-9
        assert np.max(np.abs(got["online_mean"] - ofa.mean_)) <= 1e-9

        # both wait inside a compiled sweep's collectives; kill process 1: process 0 must end
        # at once, status 1, with the watch's one sentence (JAX alone: SIGABRT and its fatal
        # log after the heartbeat limit)
        rc, took = _kill_inside_a_sweep(run, victim=1, survivor=0)
    finally:
        run.kill()
    assert rc == 1 and took <= KILL_BOUND, (rc, took, run.stderr(0)[-3000:])
    _one_sentence(run, 0, "Process 1 of 2 stopped unexpectedly (its connection to process 0 "
                          "closed); the whole run is stopped.")


def test_killing_the_coordinator_ends_the_other():
    run = Run(["--fits", "", "--loop"])
    try:
        # process 0 hosts JAX's coordination service: without the watch's relay, process 1's JAX
        # client would see it vanish and abort with its fatal log within milliseconds
        rc, took = _kill_inside_a_sweep(run, victim=0, survivor=1)
    finally:
        run.kill()
    assert rc == 1 and took <= KILL_BOUND, (rc, took, run.stderr(1)[-3000:])
    _one_sentence(run, 1, "Process 0 of 2 (the coordinator) stopped unexpectedly (its connection "
                          "closed); the whole run is stopped.")


def test_two_processes_em_match_one_device_and_end_normally(tmp_path):
    """FA's MAP-EM and CVQ's exact EM through fit_sharded (traced init=) on 2 processes x 2
    devices equal fit_fa_variational / fit_cvq on one device; both processes end with status 0
    and say nothing (their ends are not taken for deaths)."""
    from latentzoo.inference.cvq.em import fit_cvq
    from latentzoo.inference.fa import fit_fa_variational
    from latentzoo.models.factor_analysis import default_fa_data

    out = tmp_path / "em.npz"
    run = Run([str(out), "--fits", "em", "--rows", "32", "--em-steps", "8", "--seed", "1"])
    try:
        X = default_fa_data(0, N=32, D=5, K=2)  # meanwhile, on this process
        fa = fit_fa_variational(X, 2, method="em", num_steps=8, seed=1)
        cv = fit_cvq(X, 2, method="em", num_steps=8, seed=1)
        codes = run.wait(timeout=300)
    finally:
        run.kill()
    assert codes == {0: 0, 1: 0}, (codes, run.stderr(0)[-2000:], run.stderr(1)[-2000:])
    assert run.lines(0) == [] and run.lines(1) == [], (run.lines(0), run.lines(1))
    got = np.load(out)
    assert int(got["processes"]) == 2 and int(got["devices"]) == 4
    for prefix, fit in (("em_", fa), ("cvq_", cv)):
        assert {prefix + k for k in fit.params} <= set(got.files), (prefix, got.files)
        for k, v in fit.params.items():
            v = np.asarray(v)
            err = float(np.max(np.abs(got[prefix + k] - v))) / max(1.0, float(np.max(np.abs(v))))
            assert err <= 1e-9, (prefix + k, err)
    np.testing.assert_allclose(got["em_losses"], np.asarray(fa.losses), rtol=1e-9)


@pytest.mark.parametrize("case", ["rows", "shapes"])
def test_bad_input_ends_every_process_with_one_sentence_from_process_0(case):
    args = ["--rows", "33"] if case == "rows" else ["--columns-off-by", "1"]
    run = Run(args)
    codes = run.wait(timeout=120)
    assert codes[0] == 1 and codes[1] == 1, (codes, run.stderr(0)[-2000:], run.stderr(1)[-2000:])
    lines = run.lines(0)
    assert len(lines) == 1, lines
    if case == "rows":
        assert lines[0] == ("The data has 33 rows, which 2 processes cannot share equally; use a "
                            "row count divisible by 2."), lines
    else:
        assert lines[0].startswith("The processes hold different X: process 0 has shape (16, 5)"), lines
        assert "process 1 has (16, 4)" in lines[0], lines
    assert run.lines(1) == []


def test_a_missing_coordinator_variable_is_one_sentence():
    run = Run(env_change=lambda env: env.pop("LATENTZOO_COORDINATOR"))
    codes = run.wait(timeout=120)
    assert codes == {0: 1, 1: 1}
    for p in (0, 1):
        assert len(run.lines(p)) == 1 and run.lines(p)[0].startswith("LATENTZOO_COORDINATOR is not set"), run.lines(p)


def test_no_coordinator_to_join_is_one_sentence_within_the_time_limit():
    start = time.monotonic()
    run = Run(ids=(1,), init_timeout=3)  # process 0 never starts
    codes = run.wait(timeout=60)
    took = time.monotonic() - start
    assert codes == {1: 1} and took < 30, (codes, took)
    lines = run.lines(1)
    assert len(lines) == 1 and lines[0].startswith(
        "Process 1 of 2 could not reach the coordinator (process 0) at 127.0.0.1:"), lines
    assert "within 3 s" in lines[0]
