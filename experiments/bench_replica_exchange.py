"""Benchmark: replica exchange against plain Gibbs on a family's default data, in one run.

Each cell is ``latentzoo run MODEL --method gibbs [--replicas M --min-beta B]`` in a fresh
process on the same data, seeds and budget; the table gives the fit's seconds, the max R-hat and
min bulk ESS over the family's identified quantities, min ESS per second (and its ratio to plain
Gibbs in the same run: these machines are noisy), and the range of the pairs' mean swap rates.

    python experiments/bench_replica_exchange.py [--model ta] [--ladders 8:0.2,16:0.1,48:0.2] \\
        [--warmup 500] [--samples 1000] [--quick] [--json OUT]

``--quick``: 2 chains of 40 + 40 sweeps and one ladder of 4 rungs (a smoke test of the script,
not a measurement). Measured tables are in docs/replica_exchange.md.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _binary_common import check_at_least, usage_error, write_json  # noqa: E402

SCRIPT = "bench_replica_exchange.py"


def parse_ladders(text: str) -> list[tuple[int, float]]:
    """'M:B,M:B' -> [(M, B), ...], each M >= 2 and B in (0, 1); one sentence otherwise."""
    out = []
    for item in filter(None, text.split(",")):
        try:
            m, b = item.split(":")
            m, b = int(m), float(b)
        except ValueError:
            usage_error(SCRIPT, f"--ladders takes M:B pairs separated by commas, got {item!r}.")
        if m < 2 or not 0.0 < b < 1.0:
            usage_error(SCRIPT, f"each ladder needs M >= 2 rungs and B in (0, 1), got {item!r}.")
        out.append((m, b))
    return out


def run_cell(model: str, replicas: int, min_beta: float, chains: int, warmup: int, samples: int) -> dict:
    import numpy as np

    from latentzoo import arviz_adapter as azx
    from latentzoo.registry import get_family

    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "run")
        argv = [sys.executable, "-m", "latentzoo.cli", "run", model, "--method", "gibbs",
                "--chains", str(chains), "--warmup", str(warmup), "--samples", str(samples),
                "--no-progress", "--out", out]
        if replicas > 1:
            argv += ["--replicas", str(replicas), "--min-beta", str(min_beta)]
        proc = subprocess.run(argv, capture_output=True, text=True)
        text = proc.stdout + proc.stderr
        row = {"model": model, "replicas": replicas, "min_beta": min_beta if replicas > 1 else None}
        if proc.returncode != 0:
            lines = [line for line in text.splitlines() if line.strip()]
            return {**row, "error": lines[-1] if lines else f"exit {proc.returncode}"}
        idata = azx.load(os.path.join(out, "posterior.nc"))
        sites = [s for s in get_family(model).identified if s in idata.posterior]
        table = azx.summary(idata, var_names=sites)
        fitted = re.search(r"fitted in ([0-9.]+) s", text)
        seconds = float(fitted.group(1)) if fitted else float("nan")
        row.update(fit_s=seconds, max_rhat=float(table["r_hat"].max()),
                   min_ess_bulk=float(table["ess_bulk"].min()))
        row["min_ess_per_s"] = row["min_ess_bulk"] / seconds
        if "swap_accept_prob" in idata.sample_stats:
            rates = np.asarray(idata.sample_stats["swap_accept_prob"]).reshape(-1, replicas - 1).mean(0)
            row.update(swap_min=float(rates.min()), swap_max=float(rates.max()))
        return row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="ta", help="a family with a tempered Gibbs table (ta, mta, mfa, cvq, rank-svm)")
    p.add_argument("--ladders", default="8:0.2,16:0.1,48:0.2", help="M:B pairs: rungs and hottest beta")
    p.add_argument("--chains", type=int, default=4)
    p.add_argument("--warmup", type=int, default=500)
    p.add_argument("--samples", type=int, default=1000)
    p.add_argument("--quick", action="store_true", help="2 chains of 40 + 40 sweeps, one ladder 4:0.3")
    p.add_argument("--json", default=os.path.join("runs", "bench_replica_exchange.json"))
    args = p.parse_args(argv)
    check_at_least(SCRIPT, chains=(args.chains, 2), warmup=(args.warmup, 0), samples=(args.samples, 1))
    from latentzoo.registry import families

    if args.model not in families():
        usage_error(SCRIPT, f"unknown model {args.model!r}; see `latentzoo list`.")
    ladders = [(4, 0.3)] if args.quick else parse_ladders(args.ladders)
    chains, warmup, samples = (2, 40, 40) if args.quick else (args.chains, args.warmup, args.samples)
    rows = []
    print(f"{args.model}: {chains} chains, {warmup} + {samples} sweeps")
    print(f"{'sampler':24} {'fit s':>7} {'max R-hat':>9} {'min ESS':>8} {'ESS/s':>7} {'ratio':>6}  swap rates")
    for replicas, beta in [(1, 1.0), *ladders]:
        row = run_cell(args.model, replicas, beta, chains, warmup, samples)
        rows.append(row)
        name = "plain Gibbs" if replicas == 1 else f"{replicas} rungs to {beta:g}"
        if "error" in row:
            print(f"{name:24} failed: {row['error']}", flush=True)
            continue
        row["ess_per_s_ratio"] = row["min_ess_per_s"] / rows[0].get("min_ess_per_s", float("nan"))
        swaps = f"{row['swap_min']:.2f}-{row['swap_max']:.2f}" if "swap_min" in row else ""
        print(f"{name:24} {row['fit_s']:7.1f} {row['max_rhat']:9.3f} {row['min_ess_bulk']:8.0f} "
              f"{row['min_ess_per_s']:7.2f} {row['ess_per_s_ratio']:6.2f}  {swaps}", flush=True)
    write_json(args.json, {"script": SCRIPT, "model": args.model, "chains": chains, "warmup": warmup,
                           "samples": samples, "cells": rows})
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
