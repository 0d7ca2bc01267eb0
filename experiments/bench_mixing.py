"""Mixing benchmark: min bulk ESS per second and per 1000 sweeps over a family's identified
quantities, the current Gibbs table against the table without its moves and against NUTS, in the
same run.

    python experiments/bench_mixing.py [--only fa,mfa,ta,mta,rank-svm,cvq,noca] [--data default|real]
                                       [--quick] [--json OUT]

Each variant is ``latentzoo run MODEL`` at the command line's defaults (4 chains of 1000 warm-up
sweeps + 4000 draws, or what ``--warmup``/``--samples``/``--chains`` say) in a fresh process, so
compilation is in its seconds as a user meets it; the ESS is read from the run's own
``summary.csv`` (its identified quantities, ``Family.identified``), the seconds are the run's
own (``latentzoo_seconds``: fitting, compilation included, not interpreter start or files).
"Per 1000 sweeps" divides by chains x draws / 1000, the sweeps after warm-up. A run that keeps
fewer draws than it made (storage thinning) reports the ESS of the kept ones, the same for
every variant of a family.

Variants (the table's moves switched off with the update table's own flag, in the child process
before the command line runs):

- fa: Gibbs (z, W, mu, psi + scale, shear and shift interweaving moves); Gibbs without the moves
  (``fa_updates(interweave=False)``); NUTS over the same model;
- mfa: Gibbs ((c, z) block, W, mu, psi, pi + shift and scale moves per component); Gibbs without
  the moves (``mfa_updates(interweave=False)``). NUTS cannot sample MFA's discrete labels;
- ta, mta: Gibbs; Gibbs without the collapsed label move and the shift move;
- rank-svm: Gibbs; Gibbs without the factor-scale and hierarchy-scale moves; NUTS;
- cvq: Gibbs; Gibbs without the split-merge move;
- noca: Gibbs (NUTS for theta, theta0 given s); the table with theta, theta0 by slice sampling
  (``noca_kernel(theta="slice")``, the tempered table replica exchange runs).

Targets (issue "Converged in the default budget"): >= 10x NUTS in min ESS per second and >= 100
min ESS per 1000 sweeps. Ratios are against the family's first variant (the current table).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _binary_common import usage_error, write_json  # noqa: E402
from convergence import real_data  # noqa: E402

SCRIPT = "bench_mixing.py"

# family -> [(label, method, None or (module, update-table factory, keyword arguments that switch
# its moves off), extra command-line arguments)]
VARIANTS = {
    "fa": [("gibbs", "gibbs", None, []),
           ("gibbs, no moves", "gibbs", ("latentzoo.inference.fa", "fa_updates", {"interweave": False}), []),
           ("nuts", "nuts", None, [])],
    "mfa": [("gibbs", "gibbs", None, []),
            ("gibbs, no moves", "gibbs", ("latentzoo.inference.mfa", "mfa_updates", {"interweave": False}), [])],
    "ta": [("gibbs", "gibbs", None, []),
           ("gibbs, no moves", "gibbs",
            ("latentzoo.inference.ta", "ta_updates", {"collapsed_move": False, "shift": False}), [])],
    "mta": [("gibbs", "gibbs", None, []),
            ("gibbs, no moves", "gibbs",
             ("latentzoo.inference.ta", "mta_updates", {"collapsed_move": False, "shift": False}), [])],
    "rank-svm": [("gibbs", "gibbs", None, []),
                 ("gibbs, no scale moves", "gibbs",
                  ("latentzoo.inference.rank_svm", "rank_svm_updates", {"scale": False}), []),
                 ("nuts", "nuts", None, [])],
    "cvq": [("gibbs", "gibbs", None, []),
            ("gibbs, no split-merge", "gibbs",
             ("latentzoo.inference.cvq", "cvq_updates", {"with_split_merge": False}), [])],
    "noca": [("gibbs", "gibbs", None, []),
             ("gibbs, theta by slice", "gibbs", ("latentzoo.inference.noca", "noca_kernel", {"theta": "slice"}), [])],
}

# the child: switch the moves off where asked, then run the command line
_CHILD = """
import functools, importlib, json, sys
argv, plain = json.loads(sys.argv[1]), json.loads(sys.argv[2])
if plain:
    module = importlib.import_module(plain[0])
    setattr(module, plain[1], functools.partial(getattr(module, plain[1]), **plain[2]))
from latentzoo.cli import main
sys.exit(main(argv))
"""


def read_run(folder: str) -> dict:
    """Min bulk ESS (and its quantity), max R-hat and the run's own seconds."""
    import arviz as az
    import pandas as pd

    table = pd.read_csv(os.path.join(folder, "summary.csv"), index_col=0)
    ess, rhat = table["ess_bulk"].astype(float), table["r_hat"].astype(float)
    idata = az.from_netcdf(os.path.join(folder, "posterior.nc"))
    seconds = float(idata.posterior.attrs.get("latentzoo_seconds", float("nan")))
    return {"min_ess_bulk": float(ess.min()), "worst": str(ess.idxmin()),
            "max_rhat": float(rhat.max()), "seconds": seconds}


def run_variant(model, label, method, plain, extra, sizes, data) -> dict:
    row = {"model": model, "variant": label, "method": method, "data": data}
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "run")
        argv = ["run", model, "--method", method, "--no-progress", "--out", out, *sizes, *extra]
        if data == "real":
            argv += real_data(model, folder)
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(argv), json.dumps(plain)],
                              capture_output=True, text=True)
        row["wall_s"] = time.perf_counter() - t0
        if proc.returncode != 0:
            lines = [s for s in (proc.stdout + proc.stderr).splitlines() if s.strip()]
            return {**row, "error": lines[-1] if lines else f"exit {proc.returncode}"}
        return {**row, **read_run(out)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="", help="comma-separated families (default: all listed)")
    p.add_argument("--data", default="default", choices=("default", "real"))
    p.add_argument("--methods", default="", help="comma-separated methods to keep (default: all)")
    p.add_argument("--chains", type=int, default=4)
    p.add_argument("--warmup", type=int, default=1000)
    p.add_argument("--samples", type=int, default=4000)
    p.add_argument("--quick", action="store_true", help="2 chains of 100 + 200 (a smoke test)")
    p.add_argument("--json", default=os.path.join("runs", "bench_mixing.json"))
    args = p.parse_args(argv)
    keep = [f for f in args.only.split(",") if f] or list(VARIANTS)
    unknown = sorted(set(keep) - set(VARIANTS))
    if unknown:
        usage_error(SCRIPT, f"--only names families without variants here: {unknown}; "
                            f"choose from {sorted(VARIANTS)}.")
    chains, warmup, samples = (2, 100, 200) if args.quick else (args.chains, args.warmup, args.samples)
    if min(chains, warmup, samples) < 1 or chains < 2:
        usage_error(SCRIPT, "--chains must be at least 2 (R-hat), --warmup and --samples at least 1.")
    sizes = ["--chains", str(chains), "--warmup", str(warmup), "--samples", str(samples)]
    sweeps_k = chains * samples / 1000.0
    print(f"{'model':6} {'variant':16} {'s':>7} {'min ESS':>8} {'ESS/s':>8} {'ESS/1k':>7} "
          f"{'x ESS/s':>8}  worst", flush=True)
    rows = []
    for model in keep:
        first = None
        methods = {m for m in args.methods.split(",") if m}
        for label, method, plain, extra in VARIANTS[model]:
            if methods and method not in methods:
                continue
            row = run_variant(model, label, method, plain, extra, sizes, args.data)
            rows.append(row)
            if "error" in row:
                print(f"{model:6} {label:16} failed: {row['error']}", flush=True)
                continue
            row["ess_per_s"] = row["min_ess_bulk"] / row["seconds"]
            row["ess_per_1000_sweeps"] = row["min_ess_bulk"] / sweeps_k
            first = first or row
            row["ess_per_s_ratio_to_first"] = first["ess_per_s"] / row["ess_per_s"]
            print(f"{model:6} {label:16} {row['seconds']:7.1f} {row['min_ess_bulk']:8.0f} "
                  f"{row['ess_per_s']:8.2f} {row['ess_per_1000_sweeps']:7.1f} "
                  f"{row['ess_per_s_ratio_to_first']:8.1f}  {row['worst']}", flush=True)
    print("(x ESS/s: the family's first variant's min ESS per second over this row's; targets:"
          " >= 10 over NUTS, >= 100 min ESS per 1000 sweeps)")
    write_json(args.json, {"script": SCRIPT, "chains": chains, "warmup": warmup,
                           "samples": samples, "data": args.data, "runs": rows})
    print(f"wrote {args.json}")
    return rows


if __name__ == "__main__":
    main()
