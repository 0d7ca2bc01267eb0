"""Two-layer convolutional FA dictionaries (Chen, Polatkan, Sapiro, Blei, Dunson & Carin):
layer-1 atoms and layer-2 elements in pixel space, and how many elements the beta-Bernoulli
prior keeps, on two data sets shipped with scikit-learn (no network):

- ``digits``: the 8x8 digits scaled to [0, 1];
- ``photos``: greyscale crops of ``load_sample_images()`` (china.jpg, flower.jpg), each crop
  centred to mean 0 and the stack scaled to unit variance.

Each stack is :func:`latentzoo.inference.conv_factor.stack.fit_stack`: layer 1 by the exact
Gibbs sampler, its posterior-mean maps of the elements in use max-pooled into layer 2's input,
layer 2 the same way, layer-2 elements carried to pixels (un-pooling at the cells' top-left
corners, then the layer-1 atoms). An element is in use when its posterior frequency of b = 1
exceeds ``--threshold``. Writes ``cfa_dictionaries.json`` and one PNG per data set (layer-1 atoms
on top, layer-2 elements below, each sorted by usage) under ``--out``.

    python experiments/cfa_dictionaries.py [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import latentzoo  # noqa: E402,F401
import jax  # noqa: E402

from latentzoo.inference.conv_factor.stack import fit_stack  # noqa: E402
from latentzoo.results import atomic_write_text  # noqa: E402

# sizes per data set: (N, crop side or None, K1, atom1, K2, atom2, pool)
FULL = {"digits": (100, None, 24, 3, 24, 2, 2), "photos": (16, 32, 24, 5, 24, 3, 2)}
QUICK = {"digits": (8, None, 6, 3, 4, 2, 2), "photos": (3, 16, 4, 3, 4, 2, 2)}


def load(name, N, crop, seed=0):
    """(N, 1, H, W) images of data set ``name``."""
    if name == "digits":
        from sklearn.datasets import load_digits

        imgs = load_digits().images / 16.0
        return imgs[np.random.default_rng(seed).choice(len(imgs), N, replace=False)][:, None]
    crops = sample_crops(N, crop, seed)
    X = crops - crops.mean((2, 3), keepdims=True)
    return X / X.std()


def sample_crops(n, size, seed=0):
    """Greyscale crops (n, 1, size, size) of scikit-learn's shipped sample images, in [0, 1]."""
    from sklearn.datasets import load_sample_images

    rng = np.random.default_rng(seed)
    imgs = [im.mean(-1) / 255.0 for im in load_sample_images().images]
    out = []
    for i in range(n):
        im = imgs[i % len(imgs)]
        r, c = rng.integers(0, im.shape[0] - size), rng.integers(0, im.shape[1] - size)
        out.append(im[r:r + size, c:c + size])
    return np.stack(out)[:, None]


def _tiles(ax_row, arrays, label, usage):
    for i, ax in enumerate(ax_row):
        ax.axis("off")
        if i < len(arrays):
            a = arrays[i][0]
            m = np.max(np.abs(a)) or 1.0
            ax.imshow(a, cmap="gray", vmin=-m, vmax=m, interpolation="nearest")
            ax.set_title(f"{usage[i]:.2f}", fontsize=6, pad=1)
    ax_row[0].text(-0.3, 0.5, label, transform=ax_row[0].transAxes, ha="right", va="center",
                   fontsize=8)


def figure(path, name, fit):
    """Layer-1 atoms (top) and layer-2 elements in pixel space (below), most used first; each
    tile titled with its usage."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    l1, l2 = fit.layer1, fit.layer2
    u1, u2 = l1.usage[l1.in_use], l2.usage[l2.in_use]
    o1, o2 = np.argsort(-u1), np.argsort(-u2)
    cols = max(8, min(12, max(len(o1), len(o2))))
    rows1, rows2 = max(1, -(-len(o1) // cols)), max(1, -(-len(o2) // cols))
    fig, axes = plt.subplots(rows1 + rows2, cols, figsize=(cols * 0.75, (rows1 + rows2) * 0.85 + 0.4),
                             squeeze=False)
    for r in range(rows1):
        sl = o1[r * cols:(r + 1) * cols]
        _tiles(axes[r], l1.d[sl], "layer 1" if r == 0 else "", u1[sl])
    for r in range(rows2):
        sl = o2[r * cols:(r + 1) * cols]
        _tiles(axes[rows1 + r], fit.elements[sl], "layer 2" if r == 0 else "", u2[sl])
    fig.suptitle(f"convolutional FA (exact Gibbs), {name}: {l1.num_in_use} layer-1 atoms and "
                 f"{l2.num_in_use} layer-2 elements\n(pixel space) in use; tile titles: usage",
                 fontsize=7)
    fig.tight_layout(rect=(0.06, 0, 1, 0.88), pad=0.2)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def run(name, sizes, burn_in, draws, threshold, out, seed=0):
    N, crop, K1, a1, K2, a2, pool = sizes
    X = load(name, N, crop, seed)
    t = time.perf_counter()
    fit = fit_stack(X, K1=K1, atom1=(a1, a1), K2=K2, atom2=(a2, a2), pool_size=pool,
                    burn_in=burn_in, draws=draws, threshold=threshold, seed=seed)
    seconds = time.perf_counter() - t
    jax.clear_caches()  # each fit compiles its own programs
    norm = lambda A: np.sqrt(np.sum(A**2, axis=(1, 2, 3)))  # noqa: E731
    png = os.path.join(out, f"cfa_dictionaries_{name}.png")
    figure(png, name, fit)
    l1, l2 = fit.layer1, fit.layer2
    return {
        "images": list(X.shape), "K1": K1, "atom1": [a1, a1], "K2": K2, "atom2": [a2, a2],
        "pool": pool, "burn_in": burn_in, "draws": draws, "threshold": threshold,
        "layer1_in_use": l1.num_in_use, "layer2_in_use": l2.num_in_use,
        "layer1_usage": np.round(np.sort(l1.usage)[::-1], 3).tolist(),
        "layer2_usage": np.round(np.sort(l2.usage)[::-1], 3).tolist(),
        "mean_image_norm": float(norm(X).mean()),
        "mean_residual_norm_layer1": float(norm(X - l1.reconstruction()).mean()),
        "mean_residual_norm_layer2": float(norm(X - fit.reconstruction()).mean()),
        "seconds": seconds, "sampling_seconds": l1.sweep_seconds + l2.sweep_seconds,
        "figure": os.path.basename(png),
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes for a smoke run")
    ap.add_argument("--out", default=os.path.join("runs", "cfa_dictionaries"))
    ap.add_argument("--burn-in", type=int, default=None)
    ap.add_argument("--draws", type=int, default=None)
    ap.add_argument("--threshold", type=float, default=0.05)
    ap.add_argument("--data", choices=("digits", "photos", "both"), default="both")
    args = ap.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    burn_in = args.burn_in if args.burn_in is not None else (10 if args.quick else 150)
    draws = args.draws if args.draws is not None else (5 if args.quick else 50)
    if burn_in < 0 or draws < 1:
        raise SystemExit("--burn-in must be >= 0 and --draws >= 1.")
    os.makedirs(args.out, exist_ok=True)
    names = ("digits", "photos") if args.data == "both" else (args.data,)
    res = {n: run(n, sizes[n], burn_in, draws, args.threshold, args.out) for n in names}
    print(f"{'data':<8}{'images':>16}{'K1':>4}{'in use':>8}{'K2':>4}{'in use':>8}"
          f"{'|X|':>8}{'|R1|':>8}{'|R2|':>8}{'s':>8}")
    for n, r in res.items():
        print(f"{n:<8}{'x'.join(map(str, r['images'])):>16}{r['K1']:>4}{r['layer1_in_use']:>8}"
              f"{r['K2']:>4}{r['layer2_in_use']:>8}{r['mean_image_norm']:>8.3f}"
              f"{r['mean_residual_norm_layer1']:>8.3f}{r['mean_residual_norm_layer2']:>8.3f}"
              f"{r['seconds']:>8.1f}")
    path = os.path.join(args.out, "cfa_dictionaries.json")
    atomic_write_text(path, json.dumps(res, indent=2) + "\n")
    print(f"wrote {path}")
    return res


if __name__ == "__main__":
    main()
