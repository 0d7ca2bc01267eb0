"""CVQ image separation (lecture, "Image Separation Experiment").

Source images (8 bars on an 8x8 grid) are combined by random binary s plus Gaussian noise; the
sources are recovered by variational EM and by exact EM, scored by Hungarian matching of
recovered to true sources (correlation of matched pairs), and shown side by side. The same model
is then fitted to scikit-learn's 8x8 digits and its components are plotted.

    python experiments/cvq_image_separation.py [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import latentzoo  # noqa: E402,F401
from _binary_common import match_by_correlation, save_figure, show_image, write_csv, write_json  # noqa: E402
from latentzoo.inference.cvq.em import cvq_bound, cvq_exact_loglik, fit_cvq  # noqa: E402
from latentzoo.models.cvq import bar_sources, simulate_cvq  # noqa: E402


def _show(ax, img, title=None):
    show_image(ax, img, title)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default="runs/cvq_image_separation")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    N = 200 if a.quick else 500
    steps = 60 if a.quick else 300
    rng = np.random.default_rng(a.seed)
    W_true = bar_sources(8, 8)
    X, _ = simulate_cvq(W_true, 0.3, 0.5, N, rng)
    rows, fits = [], {}
    for method, restarts in (("vem", 2 if a.quick else 5), ("em", 1 if a.quick else 2)):
        t = time.perf_counter()
        res = fit_cvq(X, 8, method="vb" if method == "vem" else method, num_steps=steps, seed=a.seed, restarts=restarts)
        secs = time.perf_counter() - t
        W = np.asarray(res.params["W_loc"])
        idx, corr = match_by_correlation(W_true, W)
        fits[method] = (W[:, idx], corr)
        exact = float(cvq_exact_loglik(X, res.params["W_loc"], res.params["pi_loc"], res.params["sigma_loc"]))
        bound = float(cvq_bound(res.params, X)) if method == "vem" else float("nan")
        for k in range(8):
            rows.append({"method": method, "source": k, "matched_correlation": float(corr[k])})
        print(f"{method}: matched correlation min {corr.min():.4f} mean {corr.mean():.4f}; "
              f"loglik/N {exact / N:.4f} bound/N {bound / N:.4f}; sigma {float(res.params['sigma_loc']):.3f}; {secs:.1f}s")
        fits[method + "_summary"] = {"min_corr": float(corr.min()), "mean_corr": float(corr.mean()),
                                     "loglik_per_sample": exact / N, "bound_per_sample": bound / N,
                                     "seconds": secs, "iterations": int(len(res.losses))}
    write_csv(os.path.join(a.out, "cvq_recovery.csv"), rows)

    fig, axes = plt.subplots(4, 8, figsize=(9, 5))
    for k in range(8):
        _show(axes[0, k], X[k], "mixed" if k == 0 else None)
        _show(axes[1, k], W_true[:, k], "true" if k == 0 else None)
        _show(axes[2, k], fits["vem"][0][:, k], f"VEM r={fits['vem'][1][k]:.2f}")
        _show(axes[3, k], fits["em"][0][:, k], f"EM r={fits['em'][1][k]:.2f}")
    fig.suptitle("CVQ image separation: data, true sources, variational EM, exact EM")
    save_figure(fig, os.path.join(a.out, "cvq_sources.png"))
    plt.close(fig)

    # real data: scikit-learn digits (8x8, scaled to [0, 1])
    from sklearn.datasets import load_digits

    D = load_digits().data / 16.0
    if a.quick:
        D = D[:300]
    K = 10
    t = time.perf_counter()
    res = fit_cvq(D, K, method="vb", num_steps=40 if a.quick else 200, seed=a.seed, restarts=1 if a.quick else 3)
    secs = time.perf_counter() - t
    W = np.asarray(res.params["W_loc"])
    pi = np.asarray(res.params["pi_loc"])
    fig, axes = plt.subplots(1, K, figsize=(12, 1.8))
    for j, k in enumerate(np.argsort(-pi)):
        _show(axes[j], W[:, k], f"pi={pi[k]:.2f}")
    fig.suptitle(f"CVQ (variational EM, K={K}) components of sklearn digits, N={len(D)}")
    save_figure(fig, os.path.join(a.out, "cvq_digits_components.png"))
    plt.close(fig)
    summary = {"synthetic": {m: fits[m + "_summary"] for m in ("vem", "em")},
               "digits": {"N": int(len(D)), "K": K, "bound_per_sample": float(-res.losses[-1]) / len(D),
                          "sigma": float(res.params["sigma_loc"]), "seconds": secs}}
    write_json(os.path.join(a.out, "summary.json"), summary)
    print(f"digits: bound/N {summary['digits']['bound_per_sample']:.3f}, {secs:.1f}s; wrote {a.out}")


if __name__ == "__main__":
    main()
