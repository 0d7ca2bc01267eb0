"""NOCA structure recovery (lecture, "Structure Recovery Experiment").

Binary 8x8 images from 8 shape sources (prior 0.25, p_ij = 0.9 inside a shape, leak 0.001),
10 000 samples per seed. Learned sources are matched to the true ones by the Hungarian algorithm
on the L-inf distance between log failure-probability vectors (log(1 - p_ij) = -theta_ij); a
source counts as recovered when its distance is <= 1.0. Reports recovered/8 per seed and method,
the variational bound vs the exact log-likelihood per sample (K = 8 <= 12), a picture of true and
learned sources, and components learned from binarised scikit-learn digits.

Methods: exact MAP-EM by enumeration ("em") and variational MAP-EM on the Jaakkola-Jordan bound
("vem"), both from the data-driven start with re-seeding rounds (``--rounds``), best of
``--restarts`` starts by final objective. For each fit the bound is also evaluated at the fitted
parameters after optimising Q and q.

    python experiments/noca_structure_recovery.py [--quick] [--out DIR] [--json FILE] [--methods em,vem]
        [--seeds S] [--N N] [--restarts R] [--rounds R] [--steps S]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import latentzoo  # noqa: E402,F401
from _binary_common import match_by_linf, save_figure, show_image, write_csv, write_json  # noqa: E402
from latentzoo.inference.noca.bound import noca_bound, noca_exact_loglik  # noqa: E402
from latentzoo.inference.noca import fit_noca, live_sources  # noqa: E402
from latentzoo.inference.noca.em import lam_update, q_update  # noqa: E402
from latentzoo.models.noca import simulate_noca, true_parameters  # noqa: E402


@jax.jit
def _tight_bound(X, theta, theta0, pi, rows, cols):
    """The bound at fixed parameters after 60 rounds of (q, lam) E-step updates."""
    N, K = X.shape[0], theta.shape[0]
    P = rows.shape[0]
    lam = jnp.full((N, K), 0.5)
    q = jnp.full((P, K), 1.0 / K)

    def body(_, c):
        lam, q = c
        q = q_update(q, lam, theta, theta0, rows, cols, 2)
        return lam_update(q, X, theta, theta0, pi, rows, cols), q

    lam, q = jax.lax.fori_loop(0, 60, body, (lam, q))
    params = {"theta_loc": theta, "theta0_loc": theta0, "pi_loc": pi, "lam": lam, "q": q}
    return noca_bound(params, X, num_pos=P)


def _show(ax, img, title=None):
    show_image(ax, img, title, vmin=0, vmax=1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default="runs/noca_structure_recovery")
    ap.add_argument("--methods", default="em,vem")
    ap.add_argument("--seeds", type=int, default=None)
    ap.add_argument("--N", type=int, default=None)
    ap.add_argument("--restarts", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None, help="also write the summary JSON here")
    a = ap.parse_args(argv)
    seeds = a.seeds or (2 if a.quick else 10)
    N = a.N or (1000 if a.quick else 10000)
    restarts = a.restarts or (1 if a.quick else 2)
    steps = a.steps or (40 if a.quick else 200)
    methods = a.methods.split(",")
    theta_t, theta0_t, pi_t = true_parameters(0.9, 0.001, 0.25)
    rows, last = [], {}
    for seed in range(seeds):
        X, _ = simulate_noca(theta_t, theta0_t, pi_t, N, np.random.default_rng(1000 + seed))
        Xj = jnp.asarray(X)
        r, c = (jnp.asarray(v) for v in np.nonzero(X))
        true_ll = float(noca_exact_loglik(Xj, jnp.asarray(theta_t), jnp.asarray(theta0_t), jnp.asarray(pi_t))) / N
        for method in methods:
            t = time.perf_counter()
            res = fit_noca(X, 8, method="vb" if method == "vem" else method, num_steps=steps, seed=seed,
                           restarts=restarts, rounds=a.rounds, rtol=1e-8)
            secs = time.perf_counter() - t
            p = res.params
            theta = np.asarray(p["theta_loc"])
            idx, dist, ok = match_by_linf(theta_t, theta)
            exact = float(noca_exact_loglik(Xj, p["theta_loc"], p["theta0_loc"], p["pi_loc"])) / N
            bound = float(_tight_bound(Xj, p["theta_loc"], p["theta0_loc"], p["pi_loc"], r, c)) / N
            row = {"seed": seed, "method": method, "recovered": int(ok.sum()), "N": N,
                   "loglik_per_sample": exact, "bound_per_sample": bound,
                   "true_params_loglik_per_sample": true_ll, "max_matched_linf": float(dist.max()),
                   "live_sources": int(live_sources(p, N).sum()),
                   "iterations": int(len(res.losses)), "seconds": secs}
            rows.append(row)
            last[method] = (theta[idx], ok)
            print(f"seed {seed} {method}: recovered {ok.sum()}/8, loglik/N {exact:.4f} "
                  f"(truth {true_ll:.4f}), bound/N {bound:.4f}, {len(res.losses)} its, {secs:.0f}s", flush=True)
            write_csv(os.path.join(a.out, "noca_recovery.csv"), rows)
    summary = {m: {"mean_recovered": float(np.mean([x["recovered"] for x in rows if x["method"] == m])),
                   "recovered_per_seed": [x["recovered"] for x in rows if x["method"] == m],
                   "mean_gap_exact_minus_bound": float(np.mean([x["loglik_per_sample"] - x["bound_per_sample"]
                                                                for x in rows if x["method"] == m]))}
               for m in methods}
    summary["config"] = {"N": N, "seeds": seeds, "restarts": restarts, "rounds": a.rounds, "steps": steps}
    summary["rows"] = rows
    print("\n| method | " + " | ".join(f"seed {s}" for s in range(seeds)) + " | mean recovered / 8 |")
    print("|---|" + "---|" * (seeds + 1))
    for m in methods:
        per = summary[m]["recovered_per_seed"]
        print(f"| {m} | " + " | ".join(str(v) for v in per) + f" | {summary[m]['mean_recovered']:.2f} |")

    fig, axes = plt.subplots(1 + len(methods), 8, figsize=(9, 1.4 * (1 + len(methods))))
    axes = np.atleast_2d(axes)
    for k in range(8):
        _show(axes[0, k], 1 - np.exp(-theta_t[k]), "true" if k == 0 else None)
        for m_i, m in enumerate(methods):
            th, ok = last[m]
            _show(axes[1 + m_i, k], 1 - np.exp(-th[k]), f"{m} {'ok' if ok[k] else 'miss'}")
    fig.suptitle("NOCA sources p_ij (last seed): true and learned")
    save_figure(fig, os.path.join(a.out, "noca_sources.png"))
    plt.close(fig)

    from sklearn.datasets import load_digits

    Dg = (load_digits().data > 7).astype(float)
    if a.quick:
        Dg = Dg[:300]
    Kd = 10
    t = time.perf_counter()
    res = fit_noca(Dg, Kd, method="vb", num_steps=30 if a.quick else 150, seed=0, rtol=1e-9)
    secs = time.perf_counter() - t
    th, pi = np.asarray(res.params["theta_loc"]), np.asarray(res.params["pi_loc"])
    fig, axes = plt.subplots(1, Kd, figsize=(12, 1.8))
    for j, k in enumerate(np.argsort(-pi)):
        _show(axes[j], 1 - np.exp(-th[k]), f"pi={pi[k]:.2f}")
    fig.suptitle(f"NOCA (variational EM, K={Kd}) sources of binarised sklearn digits, N={len(Dg)}")
    save_figure(fig, os.path.join(a.out, "noca_digits_components.png"))
    plt.close(fig)
    summary["digits"] = {"N": int(len(Dg)), "K": Kd, "objective_per_sample": float(-res.losses[-1]) / len(Dg),
                         "live_sources": int(live_sources(res.params, len(Dg)).sum()), "seconds": secs}
    write_json(os.path.join(a.out, "summary.json"), summary)
    if a.json:
        write_json(a.json, summary)
    print(f"digits: objective/N {summary['digits']['objective_per_sample']:.3f}, "
          f"{summary['digits']['live_sources']} of {Kd} sources live, {secs:.0f}s; wrote {a.out}")


if __name__ == "__main__":
    main()
