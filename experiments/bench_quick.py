"""Benchmark: does ``--quick`` keep its word? Wall seconds of ``latentzoo run MODEL --method M
--quick`` on the family's default data, for every family and command-line method, each in a
fresh process as a user's first run is (interpreter start, data, compilation, sampling, files).

    python experiments/bench_quick.py [--only fa,cfa] [--json OUT]

Target (issue "Real sizes"): <= 60 s per family and method on 2 quiet cores. The table also
gives the seconds JAX spent compiling (its own log, ``JAX_LOG_COMPILES=1``) and the CLI's
"fitted in" seconds. A failed run is reported with its last line, not skipped.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _binary_common import usage_error, write_json  # noqa: E402
from bench_scaling import compile_seconds  # noqa: E402

SCRIPT = "bench_quick.py"
TARGET_S = 60.0


def cells():
    """(model, method) for every family and command-line method, from the registry."""
    from latentzoo.registry import families

    return [(f.name, m) for f in families().values() for m in f.cli_methods]


def run_quick(model: str, method: str) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        argv = [sys.executable, "-m", "latentzoo.cli", "run", model, "--method", method, "--quick",
                "--no-progress", "--out", os.path.join(folder, "run")]
        env = dict(os.environ, JAX_LOG_COMPILES="1")
        t0 = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True, env=env)
        wall = time.perf_counter() - t0
    text = proc.stdout + proc.stderr
    row = {"model": model, "method": method, "wall_s": wall}
    if proc.returncode != 0:
        lines = [line for line in text.splitlines() if line.strip()]
        return {**row, "error": lines[-1] if lines else f"exit {proc.returncode}"}
    fitted = re.search(r"fitted in ([0-9.]+) s", text)
    return {**row, "fit_s": float(fitted.group(1)) if fitted else float("nan"),
            "compile_s": compile_seconds(text), "within_target": wall <= TARGET_S}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="", help="comma-separated families to keep (default: all)")
    p.add_argument("--json", default=os.path.join("runs", "bench_quick.json"))
    args = p.parse_args(argv)
    every = cells()
    keep = {f for f in args.only.split(",") if f}
    unknown = keep - {m for m, _ in every}
    if unknown:
        usage_error(SCRIPT, f"--only names unknown families {sorted(unknown)}.")
    rows = []
    print(f"{'model':9} {'method':11} {'wall s':>7} {'fitted s':>8} {'compile s':>9}  <= {TARGET_S:.0f} s")
    for model, method in every:
        if keep and model not in keep:
            continue
        row = run_quick(model, method)
        rows.append(row)
        if "error" in row:
            print(f"{model:9} {method:11} failed: {row['error']}", flush=True)
        else:
            print(f"{model:9} {method:11} {row['wall_s']:7.1f} {row['fit_s']:8.1f} "
                  f"{row['compile_s']:9.1f}  {'yes' if row['within_target'] else 'NO'}", flush=True)
    write_json(args.json, {"script": SCRIPT, "target_s": TARGET_S, "cells": rows})
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
