"""Does every family's default run converge? ``latentzoo run MODEL`` at the command line's
defaults (4 chains from dispersed starts, the family's default warm-up and draws), on the
family's default data and on the real data its docs use, each in a fresh process; the verdict
is read from the run's own ``summary.csv`` (its identified quantities, the ones no relabelling
or rotation changes: ``Family.identified``).

    python experiments/convergence.py [--only fa,ta] [--methods gibbs] [--data default|real|both]
                                      [--extra "--replicas 48 --min-beta 0.2"] [--quick]
                                      [--json OUT]

Target (issue "Converged in the default budget"): max R-hat <= 1.01 and min bulk ESS >= 400 over
the identified quantities. The table gives both, the quantity that is worst for each, the wall
seconds, the run's peak resident memory (its own rusage), and the sampler's own sentence when it
failed. Point-fit methods (EM, VB) have no chains and are left out. ``--extra`` is passed to
every run (a sampler option to compare, such as replica exchange); ``--quick`` runs ``--quick``
instead of the defaults (a smoke test of the script, not a verdict).

Real data (scikit-learn's, no network): breast cancer (569 x 30, standardised) for FA, MFA, TA,
MTA; digits > 7 (1797 x 64 binary) for CVQ and NOCA; breast cancer with its labels for the
rank SVM; a 64 x 64 grey crop of ``china.jpg`` (scaled to [0, 1]) for convolutional FA.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

from _binary_common import usage_error, write_json  # noqa: E402

SCRIPT = "convergence.py"
MAX_RHAT, MIN_ESS = 1.01, 400.0


def cells():
    """(model, method) for every family and sampling method, from the registry."""
    from latentzoo.registry import families

    return [(f.name, m) for f in families().values() for m in f.cli_methods
            if f.method(m).kind != "point"]


def real_data(model: str, folder: str) -> list[str]:
    """Command-line arguments that put the docs' real data set in front of ``model``."""
    from sklearn import datasets

    if model == "cfa":
        image = datasets.load_sample_image("china.jpg").astype(float).mean(-1) / 255.0
        np.save(os.path.join(folder, "real.npy"), image[100:164, 200:264][None])
        return ["--data", os.path.join(folder, "real.npy")]
    if model in ("cvq", "noca"):
        X = (datasets.load_digits().data > 7).astype(float)
        np.save(os.path.join(folder, "real.npy"), X)
        return ["--data", os.path.join(folder, "real.npy")]
    d = datasets.load_breast_cancer()
    np.save(os.path.join(folder, "real.npy"), d.data.astype(float))
    if model == "rank-svm":
        np.save(os.path.join(folder, "labels.npy"), d.target.astype(float))
        return ["--data", os.path.join(folder, "real.npy"), "--labels",
                os.path.join(folder, "labels.npy"), "--standardize"]
    return ["--data", os.path.join(folder, "real.npy"), "--standardize"]


def verdict(summary_csv: str) -> dict:
    """Max R-hat and min bulk ESS over the run's summary (its identified quantities), with the
    entries that set them."""
    import pandas as pd

    table = pd.read_csv(summary_csv, index_col=0)
    if "r_hat" not in table:
        return {"error": "the summary has no R-hat (a point fit?)"}
    rhat = table["r_hat"].astype(float)
    ess = table["ess_bulk"].astype(float)
    if rhat.isna().all():  # every quantity constant over the draws: no verdict is possible
        return {"error": f"R-hat is undefined for all {len(table)} quantities (constant draws)"}
    if rhat.isna().any():
        return {"error": f"R-hat is undefined for {int(rhat.isna().sum())} of {len(table)} "
                         f"quantities, first {rhat.index[rhat.isna()][0]} (constant draws)"}
    worst_r, worst_e = rhat.idxmax(), ess.idxmin()
    max_r, min_e = float(rhat.max()), float(ess.min())
    return {"max_rhat": max_r, "worst_rhat": str(worst_r), "min_ess_bulk": min_e,
            "worst_ess": str(worst_e), "quantities": int(len(table)),
            "converged": bool(max_r <= MAX_RHAT and min_e >= MIN_ESS)}


def run_measured(argv: list[str]) -> tuple[int, str, float]:
    """Run argv to its end: (exit status, stdout and stderr, the process's peak resident memory
    in GB, from its own rusage: this run's, not the largest of every child so far)."""
    with tempfile.TemporaryFile(mode="w+") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, text=True)
        _, status, usage = os.wait4(proc.pid, 0)  # Popen.wait would not give this child's rusage
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: tell Popen so
        out.seek(0)
        return proc.returncode, out.read(), usage.ru_maxrss / 2**20  # KiB on Linux


def run_one(model: str, method: str, data: str, extra: list[str], quick: bool) -> dict:
    row = {"model": model, "method": method, "data": data, "extra": " ".join(extra)}
    with tempfile.TemporaryDirectory() as folder:
        argv = [sys.executable, "-m", "latentzoo.cli", "run", model, "--method", method,
                "--no-progress", "--out", os.path.join(folder, "run"), *extra]
        if quick:
            argv.append("--quick")
        if data == "real":
            argv += real_data(model, folder)
        t0 = time.perf_counter()
        returncode, output, row["peak_rss_gb"] = run_measured(argv)
        row["wall_s"] = time.perf_counter() - t0
        if returncode != 0:
            lines = [line for line in output.splitlines() if line.strip()]
            return {**row, "error": lines[-1] if lines else f"exit {returncode}"}
        return {**row, **verdict(os.path.join(folder, "run", "summary.csv"))}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="", help="comma-separated families to keep (default: all)")
    p.add_argument("--methods", default="", help="comma-separated methods to keep (default: all)")
    p.add_argument("--data", default="both", choices=("default", "real", "both"))
    p.add_argument("--extra", default="", help="options passed to every run, quoted")
    p.add_argument("--quick", action="store_true", help="--quick runs (a smoke test, no verdict)")
    p.add_argument("--json", default=os.path.join("runs", "convergence.json"))
    args = p.parse_args(argv)
    every = cells()
    keep = {f for f in args.only.split(",") if f}
    unknown = keep - {m for m, _ in every}
    if unknown:
        usage_error(SCRIPT, f"--only names unknown or point-fit-only families {sorted(unknown)}.")
    extra = shlex.split(args.extra)
    datas = ("default", "real") if args.data == "both" else (args.data,)
    print(f"{'model':9} {'method':8} {'data':8} {'wall s':>7} {'max R-hat':>9} {'min ESS':>8}  "
          f"worst (R-hat / ESS)", flush=True)
    rows = []
    methods = {m for m in args.methods.split(",") if m}
    for model, method in every:
        if (keep and model not in keep) or (methods and method not in methods):
            continue
        for data in datas:
            row = run_one(model, method, data, extra, args.quick)
            rows.append(row)
            if "error" in row:
                print(f"{model:9} {method:8} {data:8} {row['wall_s']:7.0f} failed: {row['error']}", flush=True)
                continue
            flag = "" if row["converged"] else "  NOT converged"
            print(f"{model:9} {method:8} {data:8} {row['wall_s']:7.0f} {row['max_rhat']:9.3f} "
                  f"{row['min_ess_bulk']:8.0f}  {row['worst_rhat']} / {row['worst_ess']}  "
                  f"(peak RSS {row['peak_rss_gb']:.2f} GB){flag}",
                  flush=True)
    ok = [r for r in rows if r.get("converged")]
    print(f"\n{len(ok)} of {len(rows)} runs converged (max R-hat <= {MAX_RHAT}, "
          f"min bulk ESS >= {MIN_ESS:.0f})" + (" -- --quick runs: no verdict" if args.quick else ""))
    write_json(args.json, {"script": SCRIPT, "max_rhat": MAX_RHAT, "min_ess": MIN_ESS,
                           "quick": args.quick, "extra": args.extra,
                           "runs": [{k: (None if isinstance(v, float) and math.isnan(v) else v)
                                     for k, v in r.items()} for r in rows]})
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
