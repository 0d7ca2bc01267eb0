"""Benchmark: every family x method at the sizes of real data sets, through the command line.

For each cell the script writes synthetic data of the cell's size (the kind the family reads:
Gaussian-ish columns with some constant ones, binary baskets, labelled features, image stacks),
then runs ``latentzoo run`` once in a fresh process with one chain and its progress bars on:
``S/2`` warm-up and ``S/2`` draws for MCMC, ``S`` sweeps for a point fit. It reports

- ``fit_s``: the CLI's own "fitted in" seconds (data loading and file writing excluded);
- ``compile_s``: the seconds JAX spent tracing, lowering and compiling, summed from its own log
  (``JAX_LOG_COMPILES=1``: "Finished tracing + transforming / jaxpr to MLIR module conversion /
  XLA compilation of ... in S sec");
- ``s_per_sweep``: ``fit_s - compile_s`` over the sweeps run (warm-up and draws for MCMC; for a
  point fit the sweeps it ran, read off its progress bar, else ``S``): the cost of a sweep with
  the run's own bookkeeping (checkpoints, the stored draws) included. Progress bars are no clock
  here: JAX dispatches sweeps asynchronously, so a bar can run ahead of the work;
- ``peak_rss_gb``: the run's peak resident memory (the child process's own ``ru_maxrss``);
- ``s_per_sweep_per_NDK``: the sweep cost over N·D·K, constant when a sweep is linear.

The machine's load enters every number: run it on a quiet machine for absolute ones; the cells of
one run are comparable. Targets (issue "Real sizes"): compile <= 60 s, peak RSS <= 4 GB, cost per
sweep linear in N·D·K. A point fit that converges early stops before ``S`` sweeps.

    python experiments/bench_scaling.py [--only rank-svm,fa] [--sweeps 20] [--json OUT]
                                        [--jobs J] [--timeout SECONDS]

Cells are listed in ``CELLS``; ``--only`` keeps the families named. A cell whose run fails is
reported with its one-line error, not skipped silently; one that runs past ``--timeout`` is
killed and reported as timed out (a hang shows as a row, not as a benchmark that never ends).
``--jobs J`` runs J cells at once: on a machine with many cores (a GPU host) compilation, which
is single-threaded, then overlaps, but the cells share the accelerator, so their per-sweep
seconds are upper bounds; the JSON records ``jobs``. The JSON is rewritten after every cell, so
an interrupted run keeps the cells it finished.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

from _binary_common import usage_error, write_json  # noqa: E402

SCRIPT = "bench_scaling.py"

# (family, method, options, sizes): sizes are (N, D) for matrices, (N, H, W) for image stacks.
_MATRIX = [(1000, 784), (72, 7129)]
CELLS = [
    *[("fa", m, {}, s) for m in ("gibbs", "vb") for s in [(500, 20), *_MATRIX]],
    *[("mfa", "gibbs", {}, s) for s in [(500, 20), *_MATRIX]],
    *[(f, m, {}, s) for f in ("ta", "mta") for m in ("gibbs", "mcem") for s in [(500, 16), *_MATRIX]],
    *[("rank-svm", "gibbs", {"variant": v}, s) for v in ("G-L", "R-L", "G-NL", "R-NL")
      for s in [(1214, 256), *_MATRIX]],
    *[(f, m, {}, s) for f in ("cvq", "noca") for m in ("vb", "gibbs")
      for s in [(10_000, 64), (2000, 500)]],
    *[("cfa", "gibbs", {}, s) for s in [(1, 256, 256), (32, 64, 64)]],
]
K_OF = {"cvq": 8, "noca": 8, "cfa": 8, "mfa": 5}
KIND = {"rank-svm": "labelled", "cvq": "binary", "noca": "binary", "cfa": "images"}
POINT = {"vb", "em", "mcem"}


def make_data(family: str, size, folder: str, seed: int = 0) -> str:
    """A file of the cell's size and the family's data kind."""
    rng = np.random.default_rng(seed)
    kind = KIND.get(family, "matrix")
    if kind == "images":
        X = rng.random(size)
        path = os.path.join(folder, "images.npy")
        np.save(path, X)
        return path
    N, D = size
    if kind == "binary":
        X = (rng.random((N, D)) < 0.05).astype(np.int8)  # sparse baskets
        X[0, :] = 1  # no empty column
    else:
        X = rng.normal(size=(N, min(D, 10))) @ rng.normal(size=(min(D, 10), D)) + rng.normal(size=(N, D))
        X[:, : max(1, D // 50)] = 1.0  # constant columns, as image borders and dead genes
        X = (X - X.mean(0)) / np.where(X.std(0) > 0, X.std(0), 1.0)
    if kind == "labelled":
        y = (X[:, -1] + 0.5 * rng.normal(size=N) > 0).astype(int)
        X = np.column_stack([X, y])
    path = os.path.join(folder, "data.npy")
    np.save(path, X)
    return path


def run_cli(family, method, options, data, K, sweeps, folder, timeout=None):
    """(stdout+stderr, peak RSS in GB, error or None) of one ``latentzoo run`` in a new process,
    killed after ``timeout`` seconds."""
    argv = [sys.executable, "-m", "latentzoo.cli", "run", family, "--method", method,
            "--data", data, "--K", str(K), "--out", os.path.join(folder, "out"), "--chains", "1"]
    if method in POINT:
        argv += ["--sweeps", str(sweeps), "--restarts", "1"]
    else:
        argv += ["--warmup", str(sweeps // 2), "--samples", str(sweeps - sweeps // 2)]
    for name, value in options.items():
        argv += [f"--{name}", str(value)]
    env = dict(os.environ, JAX_LOG_COMPILES="1")
    with tempfile.TemporaryFile("w+") as fout:
        proc = subprocess.Popen(argv, stdout=fout, stderr=subprocess.STDOUT, text=True, env=env)
        start, timed_out = time.monotonic(), False
        while True:  # this child's own exit status and peak RSS, polled so a hang can be ended
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if timeout is not None and time.monotonic() - start > timeout:
                proc.kill()
                _, status, usage = os.wait4(proc.pid, 0)
                timed_out = True
                break
            time.sleep(0.2)
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        fout.seek(0)
        text = fout.read()
    if timed_out:
        return text, None, f"timed out after {timeout:.0f} s"
    if proc.returncode != 0:
        lines = [line for line in text.replace("\r", "\n").splitlines() if line.strip()]
        return text, None, lines[-1] if lines else "no output"
    return text, usage.ru_maxrss / 2**20, None


_COMPILE_LOG = re.compile(r"Finished (?:tracing \+ transforming|jaxpr to MLIR module conversion|"
                          r"XLA compilation) .*? in ([0-9.eE+-]+) sec")


def compile_seconds(text: str) -> float:
    """Seconds JAX logged for tracing, lowering and compiling (``JAX_LOG_COMPILES=1``)."""
    return float(sum(float(s) for s in _COMPILE_LOG.findall(text)))


def _sweeps_run(text: str, default: int) -> int:
    """Sweeps a point fit ran: the last count its progress bar reached (it may stop early)."""
    found = re.findall(r"(?:CAVI|MCEM)[^:|]*:\s+\d+%\|[^|]*\| (\d+)/\d+", text)
    return int(found[-1]) if found else default


def bench_cell(family, method, options, size, sweeps, folder, timeout=None):
    K = K_OF.get(family, 10)
    data = make_data(family, size, folder)
    text, rss, err = run_cli(family, method, options, data, K, sweeps, folder, timeout)
    row = dict(family=family, method=method, options=options, size=list(size), K=K)
    if err is not None:
        return {**row, "error": err}
    fitted = re.search(r"fitted in ([0-9.]+) s", text)
    fit = float(fitted.group(1)) if fitted else float("nan")
    N, D = (size[0], int(np.prod(size[1:])))
    compile_s = compile_seconds(text)
    ran = _sweeps_run(text, sweeps) if method in POINT else sweeps
    per = max(fit - compile_s, 0.0) / max(ran, 1)
    return {**row, "fit_s": fit, "compile_s": compile_s, "sweeps_run": ran, "s_per_sweep": per,
            "peak_rss_gb": rss, "s_per_sweep_per_NDK": per / (N * D * K)}


def markdown_table(rows) -> str:
    """The cells as the Markdown table of ``docs/scaling.md``."""
    out = ["| family | method | variant | size | K | compile s | s / sweep | peak RSS GB | "
           "ns / (N·D·K) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        opts = ",".join(str(v) for v in r["options"].values()) or "-"
        size = " x ".join(map(str, r["size"]))
        if "error" in r:
            out.append(f"| {r['family']} | {r['method']} | {opts} | {size} | {r['K']} | "
                       f"failed: {r['error']} | | | |")
            continue
        out.append(f"| {r['family']} | {r['method']} | {opts} | {size} | {r['K']} | "
                   f"{r['compile_s']:.1f} | {r['s_per_sweep']:.3f} | {r['peak_rss_gb']:.2f} | "
                   f"{1e9 * r['s_per_sweep_per_NDK']:.1f} |")
    return "\n".join(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="", help="comma-separated families to keep (default: all)")
    p.add_argument("--sweeps", type=int, default=200,
                   help="sweeps per run (MCMC: half warm-up, half draws)")
    p.add_argument("--json", default=os.path.join("runs", "bench_scaling.json"))
    p.add_argument("--jobs", type=int, default=1,
                   help="cells run at once (default 1: cells measured alone)")
    p.add_argument("--min-elements", type=int, default=0,
                   help="keep only cells with at least this many data values (N x D)")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds after which a cell's run is killed and reported as timed out")
    p.add_argument("--markdown", metavar="JSON",
                   help="print the cells of an earlier run's JSON file as a Markdown table")
    args = p.parse_args(argv)
    if args.markdown:
        import json

        try:
            with open(args.markdown, encoding="utf-8") as fh:
                rows = json.load(fh)["cells"]
        except (OSError, ValueError, KeyError):
            usage_error(SCRIPT, f"{args.markdown} is not a JSON file written by {SCRIPT}.")
        print(markdown_table(rows))
        return
    if args.sweeps < 4:
        usage_error(SCRIPT, f"--sweeps must be at least 4, got {args.sweeps}.")
    if args.jobs < 1:
        usage_error(SCRIPT, f"--jobs must be at least 1, got {args.jobs}.")
    if args.timeout is not None and args.timeout <= 0:
        usage_error(SCRIPT, f"--timeout must be positive, got {args.timeout}.")
    keep = {f for f in args.only.split(",") if f}
    unknown = keep - {c[0] for c in CELLS}
    if unknown:
        usage_error(SCRIPT, f"--only names unknown families {sorted(unknown)}.")
    cells = [c for c in CELLS if (not keep or c[0] in keep) and np.prod(c[3]) >= args.min_elements]
    print(f"{'family':9} {'method':6} {'options':8} {'size':12} {'fit s':>7} {'compile s':>9} "
          f"{'s/sweep':>9} {'RSS GB':>7}  us/(N·D·K)", flush=True)
    header = {"script": SCRIPT, "sweeps": args.sweeps, "jobs": args.jobs, "machine": machine()}
    start = time.perf_counter()
    rows = [None] * len(cells)
    lock = threading.Lock()

    def one(i):
        family, method, options, size = cells[i]
        with tempfile.TemporaryDirectory() as folder:
            rows[i] = bench_cell(family, method, options, size, args.sweeps, folder, args.timeout)
        with lock:
            print(row_line(rows[i]), flush=True)
            done = [r for r in rows if r is not None]  # the JSON after every cell: a stop keeps them
            write_json(args.json, {**header, "cells": done, "seconds": time.perf_counter() - start})

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        list(pool.map(one, range(len(cells))))
    print(f"\nwrote {args.json}")


def row_line(row) -> str:
    """One printed line per cell."""
    opts = ",".join(f"{v}" for v in row["options"].values())
    dims = "x".join(map(str, row["size"]))
    head = f"{row['family']:9} {row['method']:6} {opts:8} {dims:12}"
    if "error" in row:
        return f"{head} failed: {row['error']}"
    return (f"{head} {row['fit_s']:7.1f} {row['compile_s']:9.1f} {row['s_per_sweep']:9.4f} "
            f"{row['peak_rss_gb']:7.2f}  {1e6 * row['s_per_sweep_per_NDK']:.4f}")


def machine() -> str:
    """The CPU count and JAX's default device, for the JSON."""
    try:
        out = subprocess.run([sys.executable, "-c", "import jax; d = jax.devices()[0]; "
                              "print(d.platform, getattr(d, 'device_kind', ''))"],
                             capture_output=True, text=True, timeout=120).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        out = "unknown"
    return f"{os.cpu_count()} CPU cores ({platform.machine()}), JAX device: {out or 'unknown'}"

if __name__ == "__main__":
    main()
