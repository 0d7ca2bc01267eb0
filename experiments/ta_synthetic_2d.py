"""MTA against MFA on four 2-D data sets (the tensor-analysers supplement's Table 1 and Figures
4-5): two drawn from random two-component MTAs (TA{2,2,2} components), two from random
two-component MFAs (one factor each).

Both models get 2 components: MTA (group sizes 2 x 2) fitted by Monte Carlo EM
(:func:`latentzoo.inference.ta.mcem.fit_ta_mcem`), MFA (K = 1) by exact EM
(:func:`latentzoo.inference.mfa.em.fit_mfa_em`), each the best of ``--restarts`` starts by
training log-likelihood. Average log-likelihood per row on the training and a held-out set:
MFA's exact; MTA's with z_1 integrated out exactly and z_2 averaged over 2^13 prior draws
(the density contours use 2^10). The supplement's numbers come from its
own random draws; the claim to reproduce is MTA >> MFA on TA data and MTA ~ MFA on MFA data.
Writes a CSV, JSON and a PNG of density contours per data set (data, MTA, MFA).

    python experiments/ta_synthetic_2d.py [--quick] [--out DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import latentzoo  # noqa: E402,F401
import jax.numpy as jnp  # noqa: E402

from _binary_common import check_at_least, save_figure, write_csv, write_json  # noqa: E402
from latentzoo.inference.mfa.em import fit_mfa_em, mfa_log_likelihood  # noqa: E402
from latentzoo.inference.ta.mcem import fit_ta_mcem, log_likelihood_estimate  # noqa: E402
from latentzoo.models.tensor_analyzer import random_ta_parameters, sample_ta  # noqa: E402

PAPER = {"i": (-2.62, -2.85), "ii": (-2.04, -2.48), "iii": (-1.81, -1.82), "iv": (-2.76, -2.75)}
D, d, C = 2, (2, 2), 2
NUM_DRAWS = 2**13


def random_mfa(rng):
    """A random two-component MFA in 2-D with one factor each, as MTA-shaped parameters (T = 0,
    the second group unused) so one sampler draws both kinds of data."""
    p = random_ta_parameters(rng, D, d, C=C, noise=0.2)
    p["T"] = np.zeros_like(p["T"])
    p["W"][:, :, 1:] = 0.0
    return p


def data_sets(seed, n_train, n_test):
    rng = np.random.default_rng(seed)
    out = {}
    for name, kind in (("i", "ta"), ("ii", "ta"), ("iii", "mfa"), ("iv", "mfa")):
        if kind == "ta":
            p = random_ta_parameters(rng, D, d, C=C, noise=0.1, additive=0.5, multiplicative=1.0)
        else:
            p = random_mfa(rng)
        X, _ = sample_ta(rng, p, n_train + n_test, d)
        X = (X - X[:n_train].mean(0)) / X[:n_train].std(0)  # both models see standardised data
        out[name] = (kind, X[:n_train], X[n_train:])
    return out


def fit_mta(X, args):
    best = None
    for r in range(args.restarts):
        fit = fit_ta_mcem(X, d=d, C=C, num_iterations=args.iterations, seed=args.seed + r,
                          num_chains=2, checkpoints=(), num_draws=4096)
        ll = float(log_likelihood_estimate(jnp.asarray(X), fit.params, d=d, num_draws=4096))
        if best is None or ll > best[0]:
            best = (ll, fit)
    return best[1]


def mta_rows(X, params, num_draws=NUM_DRAWS):
    return np.asarray(log_likelihood_estimate(jnp.asarray(X), params, d=d, num_draws=num_draws, per_row=True))


def contours(ax, X, loglik_fn, title):
    lo, hi = X.min(0) - 0.5, X.max(0) + 0.5
    g0, g1 = np.meshgrid(np.linspace(lo[0], hi[0], 50), np.linspace(lo[1], hi[1], 50))
    grid = np.stack([g0.ravel(), g1.ravel()], -1)
    dens = np.exp(loglik_fn(grid)).reshape(g0.shape)
    ax.contourf(g0, g1, dens, levels=12, cmap="Blues")
    ax.scatter(X[:300, 0], X[:300, 1], s=2, c="k", alpha=0.4)
    ax.set_title(title, fontsize=8)
    ax.set_xticks([])
    ax.set_yticks([])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small data and few iterations (CI)")
    ap.add_argument("--out", default=None, help="output folder (default experiments/results; "
                    "with --quick runs/ta_synthetic_2d_quick)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--restarts", type=int, default=None, help="MCEM restarts per fit (default 3; quick 1)")
    ap.add_argument("--iterations", type=int, default=None, help="MCEM iterations (default 150; quick 10)")
    args = ap.parse_args(argv)
    q = args.quick
    args.out = args.out or ("runs/ta_synthetic_2d_quick" if q else "experiments/results")
    args.restarts = args.restarts if args.restarts is not None else (1 if q else 3)
    args.iterations = args.iterations if args.iterations is not None else (10 if q else 150)
    check_at_least("ta_synthetic_2d", restarts=(args.restarts, 1), iterations=(args.iterations, 1))
    n_train, n_test = (200, 200) if args.quick else (1000, 1000)
    os.makedirs(args.out, exist_ok=True)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = data_sets(args.seed, n_train, n_test)
    fig, axes = plt.subplots(3, 4, figsize=(10, 7.5))
    rows = []
    for col, (name, (kind, Xtr, Xte)) in enumerate(sets.items()):
        t = time.perf_counter()
        mta = fit_mta(Xtr, args)
        t_mta = time.perf_counter() - t
        t = time.perf_counter()
        mfa = fit_mfa_em(Xtr, J=C, K=1, restarts=args.restarts, seed=args.seed)
        t_mfa = time.perf_counter() - t
        mfa_p = {k: jnp.asarray(v) for k, v in mfa.params.items()}
        row = {
            "data": name, "drawn_from": kind, "N_train": len(Xtr), "N_test": len(Xte),
            "mta_train": float(mta_rows(Xtr, mta.params).mean()),
            "mta_test": float(mta_rows(Xte, mta.params).mean()),
            "mfa_train": float(mfa_log_likelihood(jnp.asarray(Xtr), mfa_p, per_row=True).mean()),
            "mfa_test": float(mfa_log_likelihood(jnp.asarray(Xte), mfa_p, per_row=True).mean()),
            "paper_mta_test": PAPER[name][0], "paper_mfa_test": PAPER[name][1],
            "seconds_mta": t_mta, "seconds_mfa": t_mfa,
        }
        rows.append(row)
        axes[0, col].scatter(Xtr[:, 0], Xtr[:, 1], s=2, c="k", alpha=0.4)
        axes[0, col].set_title(f"data {name} (from {kind.upper()})", fontsize=8)
        contours(axes[1, col], Xtr, lambda G: mta_rows(G, mta.params, 2**10), f"MTA, test {row['mta_test']:.2f}")
        contours(axes[2, col], Xtr, lambda G: np.asarray(mfa_log_likelihood(jnp.asarray(G), mfa_p, per_row=True)),
                 f"MFA, test {row['mfa_test']:.2f}")
    save_figure(fig, os.path.join(args.out, "ta_synthetic_2d.png"))
    print(f"{'data':<5} {'from':<4} {'MTA train':>10} {'MTA test':>9} {'MFA train':>10} {'MFA test':>9}   paper test (MTA / MFA)")
    for r in rows:
        print(f"{r['data']:<5} {r['drawn_from']:<4} {r['mta_train']:>10.3f} {r['mta_test']:>9.3f} "
              f"{r['mfa_train']:>10.3f} {r['mfa_test']:>9.3f}   {r['paper_mta_test']:.2f} / {r['paper_mfa_test']:.2f}")
    write_csv(os.path.join(args.out, "ta_synthetic_2d.csv"), rows)
    result = {"restarts": args.restarts, "iterations": args.iterations, "rows": rows}
    write_json(args.json or os.path.join(args.out, "ta_synthetic_2d.json"), result)
    return result


if __name__ == "__main__":
    main()
