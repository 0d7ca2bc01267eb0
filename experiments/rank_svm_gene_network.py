"""Classifier coefficients and the feature network of the rank-likelihood factor SVM (the
supplement's gene-expression Figures 3-4) on scikit-learn's breast-cancer table (569 x 30,
standardised), which stands in for the paper's gene-expression data (not shipped).

The variants are fitted by Gibbs with K factors on a stratified training split (the rest gives a
held-out accuracy, next to logistic regression's). Figure 3: the posterior mean of each variant's
classifier coefficients β (T x K; one row for L). Figure 4: the feature network of each fitted
variant (R-L, as in the supplement, and G-L when fitted): per draw, the correlation of the
features' loading vectors, C_ij = (AAᵀ)_ij / √((AAᵀ)_ii (AAᵀ)_jj) (which no sign flip or rotation
of the factors changes), averaged over draws; features are linked where |C_ij| >=
``--threshold``, the ``--max-edges`` strongest links kept. The edge lists (bounded by
``--max-edges``) go to the JSON, each with the rank correlation between C and the features' own
Spearman correlations as a check that the network reflects the data.

    python experiments/rank_svm_gene_network.py [--quick] [--K 10] [--out DIR] [--json FILE]
        [--data FILE] [--threshold 0.9] [--max-edges 60]
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import latentzoo  # noqa: E402,F401

from _binary_common import save_figure, usage_error, write_json  # noqa: E402
from rank_svm_digits import (  # noqa: E402
    VARIANTS,
    baseline_models,
    classifier,
    common_arguments,
    factor_order,
    load_labelled,
    parse_variants,
    release_compiled,
    settle,
    splits,
)

PROG = "rank_svm_gene_network"


def breast_cancer():
    """(X standardised (569, 30), labels, feature names)."""
    from sklearn.datasets import load_breast_cancer

    d = load_breast_cancer()
    X = (d.data - d.data.mean(0)) / d.data.std(0)
    return X, d.target, [str(n) for n in d.feature_names]


def loading_correlation(A_draws: np.ndarray) -> np.ndarray:
    """(D, D) posterior mean over draws (S, D, K) of the loading vectors' correlation."""
    G = np.einsum("sik,sjk->sij", A_draws, A_draws)
    d = np.sqrt(np.einsum("sii->si", G))
    return (G / (d[:, :, None] * d[:, None, :])).mean(0)


def network_edges(C: np.ndarray, names, threshold: float, max_edges: int) -> list[dict]:
    i, j = np.triu_indices(C.shape[0], 1)
    w = C[i, j]
    keep = np.flatnonzero(np.abs(w) >= threshold)
    keep = keep[np.argsort(-np.abs(w[keep]))][:max_edges]
    return [{"a": names[i[k]], "b": names[j[k]], "weight": round(float(w[k]), 4)} for k in keep]


def plot_coefficients(fitted: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(fitted), figsize=(3.2 * len(fitted), 2.8), squeeze=False)
    for ax, (variant, est) in zip(axes[0], fitted.items()):
        coef = est.coef_[:, factor_order(est)]  # (T, K), factors by |β|
        T, K = coef.shape
        width = 0.8 / T
        for t in range(T):
            ax.bar(np.arange(K) + t * width - 0.4 + width / 2, coef[t], width,
                   label=f"component {t + 1}" if T > 1 else None)
        ax.axhline(0.0, color="k", lw=0.5)
        ax.set_title(f"{variant}: beta", fontsize=9)
        ax.set_xlabel("factor (by |beta|)", fontsize=8)
        if T > 1:
            ax.legend(fontsize=5)
    save_figure(fig, path)
    plt.close(fig)


def plot_networks(networks: dict, names, path: str) -> None:
    """One panel per variant: features on a circle, links coloured by sign, widths by |C|."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(networks), figsize=(7.5 * len(networks), 7.5), squeeze=False)
    for ax, (variant, net) in zip(axes[0], networks.items()):
        _network_panel(ax, net["edges"], names, f"{variant}: {len(net['edges'])} links (red +, blue -); "
                       f"rank corr. with the data's {net['agreement']:.2f}")
    save_figure(fig, path)
    plt.close(fig)


def _network_panel(ax, edges: list[dict], names, title: str) -> None:
    D = len(names)
    angle = 2 * np.pi * np.arange(D) / D
    xy = np.stack([np.cos(angle), np.sin(angle)], 1)
    where = {n: k for k, n in enumerate(names)}
    for e in edges:
        a, b = xy[where[e["a"]]], xy[where[e["b"]]]
        ax.plot([a[0], b[0]], [a[1], b[1]], color="tab:red" if e["weight"] > 0 else "tab:blue",
                lw=0.5 + 3.0 * (abs(e["weight"]) - 0.5), alpha=0.6)
    ax.scatter(xy[:, 0], xy[:, 1], s=25, c="k", zorder=3)
    for k, n in enumerate(names):
        ax.text(1.07 * xy[k, 0], 1.07 * xy[k, 1], n, fontsize=6, rotation=np.degrees(angle[k]),
                ha="left" if xy[k, 0] >= 0 else "right", va="center", rotation_mode="anchor")
    ax.set_xlim(-1.7, 1.7)
    ax.set_ylim(-1.7, 1.7)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(title, fontsize=9)


def main(argv=None):
    ap = common_arguments(PROG, __doc__.splitlines()[0], splits=1, K=10)
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help="variants whose beta is shown (default all four; quick R-L); R-L always")
    ap.add_argument("--threshold", type=float, default=0.9, help="|C_ij| at least this links i, j")
    ap.add_argument("--max-edges", type=int, default=60, help="keep at most this many links")
    args = ap.parse_args(argv)
    if args.quick and args.variants == ",".join(VARIANTS):
        args.variants = "R-L"
    variants = parse_variants(PROG, args.variants)
    if "R-L" not in variants:
        variants = ("R-L",) + variants
    args.train_fraction = 0.7 if args.train_fraction == 0.5 else args.train_fraction
    settle(PROG, args, splits=1, K=10)
    if not 0.0 <= args.threshold < 1.0:
        usage_error(PROG, f"--threshold must lie in [0, 1), got {args.threshold}.")
    if args.max_edges < 1:
        usage_error(PROG, f"--max-edges must be at least 1, got {args.max_edges}.")
    if args.data:
        X, y = load_labelled(PROG, args.data)
        X = (X - X.mean(0)) / np.where(X.std(0) > 0, X.std(0), 1.0)
        names = [f"x{j}" for j in range(X.shape[1])]
        data_name = os.path.basename(args.data)
    else:
        X, y, names = breast_cancer()
        data_name = "sklearn breast cancer (standardised)"
    os.makedirs(args.out, exist_ok=True)

    tr, te = splits(y, 1, args.train_fraction, args.seed)[0]
    fitted, accuracy, seconds = {}, {}, {}
    for v in variants:
        t = time.perf_counter()
        est = classifier(v, args, seed=args.seed).fit(X[tr], y[tr])
        accuracy[v] = float(est.score(X[te], y[te]))
        seconds[v] = time.perf_counter() - t
        fitted[v] = est
        release_compiled()
        print(f"{v:<18} held-out accuracy {accuracy[v]:.4f}  ({seconds[v]:.1f} s)", flush=True)
    lr = baseline_models(args.seed)["LogisticRegression"].fit(X[tr], y[tr])
    accuracy["LogisticRegression"] = float(lr.score(X[te], y[te]))
    print(f"{'LogisticRegression':<18} held-out accuracy {accuracy['LogisticRegression']:.4f}")

    from scipy.stats import spearmanr

    iu = np.triu_indices(len(names), 1)
    rho_features = spearmanr(X[tr]).statistic[iu]
    networks = {}
    for v in ("R-L", "G-L"):
        if v not in fitted:
            continue
        C = loading_correlation(fitted[v].posterior_["A"])
        edges = network_edges(C, names, args.threshold, args.max_edges)
        agreement = float(spearmanr(C[iu], rho_features).statistic)
        networks[v] = {"edges": edges, "agreement": agreement,
                       "mean_abs_loading": float(np.abs(fitted[v].loadings_).mean())}
        print(f"\n{v} network: {len(edges)} links with |C| >= {args.threshold} (at most "
              f"{args.max_edges}); rank correlation of C with the features' Spearman "
              f"correlations: {agreement:.3f}; mean |A| {networks[v]['mean_abs_loading']:.3f}")
        for e in edges[:10]:
            print(f"  {e['a']:<24} {e['b']:<24} {e['weight']:+.3f}")
    plot_coefficients(fitted, os.path.join(args.out, f"{PROG}_beta.png"))
    plot_networks(networks, names, os.path.join(args.out, f"{PROG}_network.png"))
    result = {
        "data": data_name, "N": int(len(y)), "D": int(X.shape[1]), "K": args.K, "T": args.T,
        "levels": args.levels,
        "warmup": args.warmup, "samples": args.samples, "seed": args.seed,
        "train_fraction": args.train_fraction, "accuracy": accuracy, "seconds": seconds,
        "beta": {v: est.coef_.round(4).tolist() for v, est in fitted.items()},
        "threshold": args.threshold, "max_edges": args.max_edges, "networks": networks,
        "figures": [f"{PROG}_beta.png", f"{PROG}_network.png"],
    }
    write_json(args.json or os.path.join(args.out, f"{PROG}.json"), result)
    return result


if __name__ == "__main__":
    main()
