"""NOCA held-out log-likelihood per row against independent items, and live sources.

Three data sets, each split into training and held-out rows:

- attribute: 40 training rows x 85 attributes (an animals-with-attributes-like set simulated from
  ``attribute_parameters``: 6 sources over 10-20 attributes each, ~30 % ones), 1000 held-out rows
  from the same model, ``--attr-seeds`` data sets; K = 5, 8, 10;
- basket: 9835 training rows x 169 items (a grocery-basket-like set from ``basket_parameters``:
  skewed item popularity, 8 rare sources of 3-6 items, ~2.6 % ones), 2000 held-out rows; K = 8
  (both methods) and K = 15 (variational EM);
- digits: scikit-learn's digits, binarised at pixel > 7 (1797 x 64), a random 1497 / 300 split;
  K = 10.

Baseline: independent items with add-one smoothed frequencies. NOCA's held-out log-likelihood is
exact (enumeration of the 2^K source states, K <= 16). A source is live when it is on in at
least one row in expectation and some gate reaches p = 0.05. Default fit settings (MAP-EM with
the model's priors, the data-driven start, 3 re-seeding rounds), ``--restarts`` starts.

    python experiments/noca_heldout.py [--quick] [--out DIR] [--json FILE] [--only attribute,basket,digits]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import latentzoo  # noqa: E402,F401
from _binary_common import write_csv, write_json  # noqa: E402
from latentzoo.inference.noca import fit_noca, live_sources, noca_heldout_loglik  # noqa: E402
from latentzoo.models.noca import attribute_parameters, basket_parameters, simulate_noca  # noqa: E402


def independent_baseline(Xtr, Xte) -> float:
    """Held-out log-likelihood per row of independent items, add-one smoothed frequencies."""
    p = (Xtr.sum(0) + 1.0) / (Xtr.shape[0] + 2.0)
    return float((Xte @ np.log(p) + (1.0 - Xte) @ np.log1p(-p)).mean())


def digits_split(seed: int = 0, held_out: int = 300):
    from sklearn.datasets import load_digits

    X = (load_digits().data > 7).astype(np.float64)
    perm = np.random.default_rng(seed).permutation(len(X))
    return X[perm[held_out:]], X[perm[:held_out]]


def evaluate(name, Xtr, Xte, K, method, args, extra=None):
    t = time.perf_counter()
    fit = fit_noca(Xtr, K, method=method, num_steps=args.steps, seed=args.seed, restarts=args.restarts,
                   rtol=1e-7)
    secs = time.perf_counter() - t
    ll, how = noca_heldout_loglik(Xte, fit.params)
    base = independent_baseline(Xtr, Xte)
    row = {"data": name, "N_train": int(Xtr.shape[0]), "N_heldout": int(Xte.shape[0]), "D": int(Xtr.shape[1]),
           "density": float(Xtr.mean()), "K": K, "method": method,
           "heldout_loglik_per_row": float(np.mean(ll)), "baseline_per_row": base,
           "gain_over_baseline": float(np.mean(ll)) - base,
           "live_sources": int(live_sources(fit.params, Xtr.shape[0]).sum()),
           "max_p": float(-np.expm1(-np.asarray(fit.params["theta_loc"]).max())),
           "sweeps": int(len(fit.losses)), "seconds": secs, "heldout_method": how, **(extra or {})}
    print(f"{name:9s} K={K:2d} {method:2s}: held-out {row['heldout_loglik_per_row']:9.3f} / row, "
          f"independent {base:9.3f} (gain {row['gain_over_baseline']:+.3f}), live {row['live_sources']:2d}/{K}, "
          f"max p {row['max_p']:.2f}, {row['sweeps']} sweeps, {secs:.0f} s", flush=True)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default="runs/noca_heldout")
    ap.add_argument("--json", default=None, help="also write the summary JSON here")
    ap.add_argument("--only", default="attribute,basket,digits")
    ap.add_argument("--attr-seeds", type=int, default=None)
    ap.add_argument("--restarts", type=int, default=1)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    a.steps = a.steps or (40 if a.quick else 300)
    only = a.only.split(",")
    rows = []

    if "attribute" in only:
        for s in range(a.attr_seeds or (1 if a.quick else 5)):
            theta, theta0, pi = attribute_parameters(s)
            rng = np.random.default_rng(1000 + s)
            Xtr = simulate_noca(theta, theta0, pi, 40, rng)[0]
            Xte = simulate_noca(theta, theta0, pi, 200 if a.quick else 1000, rng)[0]
            for K in (5, 8, 10):
                for method in ("vb", "em"):
                    rows.append(evaluate("attribute", Xtr, Xte, K, method, a, {"data_seed": s}))
                    write_csv(os.path.join(a.out, "noca_heldout.csv"), rows)

    if "basket" in only:
        theta, theta0, pi = basket_parameters(0)
        rng = np.random.default_rng(1)
        Xtr = simulate_noca(theta, theta0, pi, 1500 if a.quick else 9835, rng)[0]
        Xte = simulate_noca(theta, theta0, pi, 500 if a.quick else 2000, rng)[0]
        for K, method in ((8, "vb"), (8, "em"), (15, "vb")):
            if a.quick and K > 8:
                continue
            rows.append(evaluate("basket", Xtr, Xte, K, method, a))
            write_csv(os.path.join(a.out, "noca_heldout.csv"), rows)

    if "digits" in only:
        Xtr, Xte = digits_split(0)
        if a.quick:
            Xtr = Xtr[:300]
        for method in ("vb", "em"):
            rows.append(evaluate("digits", Xtr, Xte, 10, method, a))
            write_csv(os.path.join(a.out, "noca_heldout.csv"), rows)

    summary = {}
    for r in rows:
        key = f"{r['data']} K={r['K']} {r['method']}"
        s = summary.setdefault(key, {"heldout": [], "baseline": [], "live": [], "max_p": [], "seconds": []})
        for k, v in (("heldout", "heldout_loglik_per_row"), ("baseline", "baseline_per_row"),
                     ("live", "live_sources"), ("max_p", "max_p"), ("seconds", "seconds")):
            s[k].append(r[v])
    table = {k: {m: float(np.mean(v)) for m, v in s.items()} | {"runs": len(s["heldout"])} for k, s in summary.items()}
    print("\n| data, K, method | held-out / row | independent / row | gain | live sources | max p | runs |")
    print("|---|---|---|---|---|---|---|")
    for k, v in table.items():
        print(f"| {k} | {v['heldout']:.3f} | {v['baseline']:.3f} | {v['heldout'] - v['baseline']:+.3f} | "
              f"{v['live']:.1f} | {v['max_p']:.2f} | {v['runs']} |")
    out = {"table": table, "rows": rows,
           "config": {"steps": a.steps, "restarts": a.restarts, "seed": a.seed, "quick": a.quick}}
    write_json(os.path.join(a.out, "summary.json"), out)
    if a.json:
        write_json(a.json, out)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
