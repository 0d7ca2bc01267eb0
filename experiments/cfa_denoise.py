"""Denoising and inpainting an image with one convolutional FA layer, against NL-means
(scikit-image), a patch-based dictionary-learning baseline (scikit-learn) and interpolation.

Data: a greyscale ``--size`` x ``--size`` crop of ``--image``: one of scikit-learn's shipped sample
images (``china.jpg``, the default, or ``flower.jpg``; no network), or a 2-D greyscale ``.npy`` on
the 0-255 scale (a ``--size`` crop from its centre). Tasks:

- **denoising** at additive Gaussian noise of sd ``--sigmas`` (default 15, 25, 50);
- **inpainting** with ``--missing`` (default 50 %) of the pixels removed at random.

Convolutional FA (:func:`latentzoo.inference.conv_factor.restore.restore`) is fitted to the
degraded image itself (its mean removed, scaled by 1/255) by the exact block Gibbs sampler; the
estimate is the posterior mean of the clean image. It infers the noise level; missing pixels are
imputed by data augmentation.

Baselines:

- denoising: scikit-image's non-local means (``denoise_nl_means``, the original pixelwise
  algorithm, 5x5 patches searched within 6 pixels, cut-off h = 0.8 sigma, *given* the true sigma:
  the settings of scikit-image's NL-means example), and scikit-learn's ``MiniBatchDictionaryLearning`` on the noisy image's 7x7 patches
  (64 atoms), codes by orthogonal matching pursuit stopped at the K-SVD tolerance
  ``49 (1.15 sigma)^2`` (it is *given* the true sigma), overlapping patches averaged (the
  scikit-learn denoising example's pipeline);
- inpainting: linear interpolation of the observed pixels (``scipy.interpolate.griddata``), and
  the observed mean.

PSNR = 10 log10(255^2 / MSE) over the whole crop.

scikit-image comes with the ``experiments`` extra (``pip install -e ".[experiments]"``).

    python experiments/cfa_denoise.py [--quick] [--out DIR] [--image china.jpg|flower.jpg|FILE.npy]
                                      [--size S] [--sigmas 15 25 50]
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

from latentzoo.inference.conv_factor.restore import psnr, restore  # noqa: E402
from latentzoo.results import atomic_write_text  # noqa: E402


SAMPLE_IMAGES = {"china.jpg": (150, 250), "flower.jpg": (120, 260)}  # name: crop's top, left


def sample_crop(size: int, image: str = "china.jpg", top: int | None = None, left: int | None = None):
    """A greyscale crop (size, size), 0-255 floats, of a scikit-learn sample image (at its
    ``SAMPLE_IMAGES`` corner unless given) or of a 2-D ``.npy`` file (from its centre)."""
    if image in SAMPLE_IMAGES:
        from sklearn.datasets import load_sample_image

        grey = load_sample_image(image).astype(np.float64).mean(-1)
        top = SAMPLE_IMAGES[image][0] if top is None else top
        left = SAMPLE_IMAGES[image][1] if left is None else left
    else:
        from latentzoo.data import load_array

        try:
            grey = np.asarray(load_array(image, exts=(".npy",)), dtype=np.float64)
        except ValueError as e:
            raise SystemExit(str(e)) from None
        if grey.ndim != 2:
            raise SystemExit(f"--image {image} holds an array of shape {grey.shape}; a greyscale "
                             "image is 2-D (height, width), on the 0-255 scale.")
        top = (grey.shape[0] - size) // 2 if top is None else top
        left = (grey.shape[1] - size) // 2 if left is None else left
    if top < 0 or left < 0 or top + size > grey.shape[0] or left + size > grey.shape[1]:
        raise SystemExit(f"a {size}x{size} crop does not fit in {image} {grey.shape}.")
    return grey[top:top + size, left:left + size]


def nl_means_denoise(noisy, sigma: float):
    """scikit-image's NL-means (module docstring) on the 0-255 scale, given the true sigma."""
    try:
        from skimage.restoration import denoise_nl_means
    except ImportError:
        raise SystemExit("The NL-means baseline needs scikit-image: pip install -e '.[experiments]'.") from None
    x = noisy / 255.0
    s = sigma / 255.0
    out = denoise_nl_means(x, patch_size=5, patch_distance=6, h=0.8 * s, sigma=s, fast_mode=False,
                           preserve_range=True)
    return out * 255.0


def dictionary_denoise(noisy, sigma: float, patch: int = 7, atoms: int = 64, seed: int = 0):
    """The patch-based baseline (module docstring): noisy (H, W) on the 0-255 scale."""
    from sklearn.decomposition import MiniBatchDictionaryLearning
    from sklearn.feature_extraction.image import extract_patches_2d, reconstruct_from_patches_2d
    from sklearn.linear_model import orthogonal_mp

    x = noisy / 255.0
    flat = extract_patches_2d(x, (patch, patch)).reshape(-1, patch * patch)
    means = flat.mean(1, keepdims=True)
    flat = flat - means
    dl = MiniBatchDictionaryLearning(n_components=atoms, alpha=1.0, batch_size=64, max_iter=10,
                                     random_state=seed).fit(flat[::3])
    D = dl.components_
    tol = patch * patch * (1.15 * sigma / 255.0) ** 2
    codes = orthogonal_mp(D.T, flat.T, tol=tol).T
    rec = (codes @ D + means).reshape(-1, patch, patch)
    return reconstruct_from_patches_2d(rec, x.shape) * 255.0


def interpolate(image, observed):
    from scipy.interpolate import griddata

    rows, cols = np.nonzero(observed)
    gr, gc = np.mgrid[: image.shape[0], : image.shape[1]]
    out = griddata((rows, cols), image[observed], (gr, gc), method="linear")
    return np.where(np.isnan(out), image[observed].mean(), out)


def cfa_restore(degraded, observed, args):
    mu = degraded[observed].mean()
    X = np.where(observed, (degraded - mu) / 255.0, np.nan)[None, None]
    out = restore(X, observed[None, None], K=args.K, atom_shape=(args.atom, args.atom),
                  burn_in=args.burn_in, draws=args.draws, seed=args.seed)
    est = out.image[0, 0] * 255.0 + mu
    return est, {"noise_sd_estimate": float(out.noise_sd[0] * 255.0),
                 "elements_in_use": int(np.sum(out.usage > 0.05)), "seconds": out.seconds}


def figure(path, clean, panels):
    """One row per task: clean, degraded, convolutional FA, the baselines, each titled with its PSNR;
    written to a temporary file and renamed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 1 + max(len(images) for _, images in panels)
    fig, axes = plt.subplots(len(panels), cols, figsize=(1.8 * cols, 1.9 * len(panels)), squeeze=False)
    for row, (task, images) in zip(axes, panels):
        for ax in row[1 + len(images):]:
            ax.axis("off")
        for ax, (title, img) in zip(row, [("clean", clean)] + images):
            ax.imshow(np.clip(img, 0, 255), cmap="gray", vmin=0, vmax=255)
            ax.set_title(title if title == "clean" else f"{title}\n{psnr(clean, img):.2f} dB",
                         fontsize=7)
            ax.axis("off")
        row[0].text(-0.1, 0.5, task, transform=row[0].transAxes, rotation=90, ha="right",
                    va="center", fontsize=7)
    fig.tight_layout(pad=0.3)
    tmp = path + ".tmp"
    fig.savefig(tmp, dpi=100, format="png")
    plt.close(fig)
    os.replace(tmp, path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes for a smoke run")
    ap.add_argument("--out", default=os.path.join("runs", "cfa_denoise"))
    ap.add_argument("--image", default="china.jpg",
                    help="china.jpg or flower.jpg (shipped with scikit-learn), or a 2-D .npy (0-255)")
    ap.add_argument("--size", type=int, default=None)
    ap.add_argument("--sigmas", type=float, nargs="+", default=[15.0, 25.0, 50.0])
    ap.add_argument("--missing", type=float, default=0.5)
    ap.add_argument("--K", type=int, default=None)
    ap.add_argument("--atom", type=int, default=6)
    ap.add_argument("--burn-in", type=int, default=None)
    ap.add_argument("--draws", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    args.size = args.size or (24 if args.quick else 128)
    args.K = args.K or (4 if args.quick else 16)
    args.burn_in = args.burn_in if args.burn_in is not None else (5 if args.quick else 150)
    args.draws = args.draws if args.draws is not None else (3 if args.quick else 100)
    if args.size < 16 or args.K < 1 or not 1 <= args.atom <= args.size // 2 or args.burn_in < 0 \
            or args.draws < 1 or not 0 <= args.missing < 1 or any(s <= 0 for s in args.sigmas):
        raise SystemExit("need --size >= 16, --K >= 1, 1 <= --atom <= size/2, --burn-in >= 0, "
                         "--draws >= 1, 0 <= --missing < 1 and positive --sigmas.")
    clean = sample_crop(args.size, args.image)
    rng = np.random.default_rng(args.seed)
    everything = np.ones(clean.shape, bool)
    rows, panels = [], []
    for sigma in args.sigmas:
        noisy = clean + sigma * rng.normal(size=clean.shape)
        t = time.perf_counter()
        base = dictionary_denoise(noisy, sigma, seed=args.seed)
        base_s = time.perf_counter() - t
        t = time.perf_counter()
        nlm = nl_means_denoise(noisy, sigma)
        nlm_s = time.perf_counter() - t
        est, info = cfa_restore(noisy, everything, args)
        rows.append({"task": f"denoise sigma={sigma:g}", "sigma": sigma,
                     "psnr": {"degraded": psnr(clean, noisy), "cfa": psnr(clean, est),
                              "nl_means": psnr(clean, nlm), "dictionary_learning": psnr(clean, base)},
                     "baseline_seconds": base_s, "nl_means_seconds": nlm_s, **info})
        panels.append((f"sigma = {sigma:g}", [("noisy", noisy), ("conv FA", est), ("NL-means", nlm),
                                              ("dictionary learning", base)]))
    if args.missing > 0:
        observed = rng.random(clean.shape) >= args.missing
        est, info = cfa_restore(np.where(observed, clean, 0.0), observed, args)
        fill = np.where(observed, clean, clean[observed].mean())
        lin = interpolate(clean, observed)
        rows.append({"task": f"inpaint {args.missing:.0%} missing", "missing": args.missing,
                     "psnr": {"degraded": psnr(clean, fill), "cfa": psnr(clean, est),
                              "linear_interpolation": psnr(clean, lin)},
                     **info})
        panels.append((f"{args.missing:.0%} missing", [("missing at mean", fill),
                                                      ("conv FA", est), ("linear interp.", lin)]))
    os.makedirs(args.out, exist_ok=True)
    png = os.path.join(args.out, "cfa_denoise.png")
    figure(png, clean, panels)
    res = {"image": os.path.basename(args.image), "figure": os.path.basename(png), "size": args.size, "K": args.K, "atom": [args.atom, args.atom],
           "burn_in": args.burn_in, "draws": args.draws, "seed": args.seed, "results": rows}
    print(f"{os.path.basename(args.image)} {args.size}x{args.size} crop, K={args.K}, {args.atom}x{args.atom} atoms, "
          f"{args.burn_in}+{args.draws} sweeps; PSNR in dB")
    print(f"{'task':<22} {'input':>7} {'conv FA':>8} {'NL-means':>9} {'dict./interp.':>13} "
          f"{'sd est.':>8} {'in use':>7}")
    for r in rows:
        p = r["psnr"]
        other = p.get("dictionary_learning", p.get("linear_interpolation"))
        nlm = f"{p['nl_means']:>9.2f}" if "nl_means" in p else f"{'-':>9}"
        print(f"{r['task']:<22} {p['degraded']:>7.2f} {p['cfa']:>8.2f} {nlm} {other:>13.2f} "
              f"{r['noise_sd_estimate']:>8.1f} {r['elements_in_use']:>7d}")
    path = os.path.join(args.out, "cfa_denoise.json")
    atomic_write_text(path, json.dumps(res, indent=2) + "\n")
    print(f"wrote {path}")
    return res


if __name__ == "__main__":
    main()
