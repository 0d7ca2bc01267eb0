"""MTA against MFA with the same number of parameters on 8x8 greyscale patches from
scikit-learn's shipped sample images (china.jpg, flower.jpg); held-out log-likelihood per patch.

Patches: random 8x8 windows of the greyscale images, each patch's mean removed (the DC component
carries no structure either model is about), then all pixels scaled by one global standard
deviation. Flat patches (sky) stay as they are: rows of near-zeros that a component with tiny
noise variances assigns very high density, while edges and texture get very low density, so the
per-patch log-likelihoods are strongly skewed (a long lower tail: the mean sits some 60 nats
below the median at the full size); the median is printed beside the mean. Train and test
patches come from disjoint image halves (left / right).

Models (C components each): MTA with groups 2 x 2, fitted by Monte Carlo EM; MFA with K factors,
exact EM, K chosen so the parameter counts match (per component D (P + Q + 1) + D for MTA,
D (K + 1) + D for MFA: K = P + Q = 8), and MFA with K = P = 4 factors, which is MTA with T = 0
(what the multiplicative term adds to). Held-out log-likelihood: MFA's exact; MTA's by annealed
importance sampling per patch (:func:`latentzoo.inference.ais.ais`, ``--temps`` intermediate
distributions, 10 chains), with its standard error. Writes CSV and JSON, and a PNG of both
models' component means and a few loadings.

    python experiments/mta_image_patches.py [--quick] [--out DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from functools import partial

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import latentzoo  # noqa: E402,F401
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from _binary_common import check_at_least, save_figure, write_csv, write_json  # noqa: E402
from latentzoo.inference.ais import ais  # noqa: E402
from latentzoo.inference.mfa.em import fit_mfa_em, mfa_log_likelihood  # noqa: E402
from latentzoo.inference.ta import mta_updates  # noqa: E402
from latentzoo.inference.ta.mcem import fit_ta_mcem  # noqa: E402
from latentzoo.models.tensor_analyzer import group_names, mixture_of_tensor_analyzers  # noqa: E402

d = (2, 2)


def patches(n_train, n_test, seed):
    from sklearn.datasets import load_sample_images
    from sklearn.feature_extraction.image import extract_patches_2d

    rng = np.random.RandomState(seed)
    train, test = [], []
    images = load_sample_images().images
    for img in images:
        grey = img.astype(float).mean(-1) / 255.0
        half = grey.shape[1] // 2
        train.append(extract_patches_2d(grey[:, :half], (8, 8), max_patches=n_train // len(images), random_state=rng))
        test.append(extract_patches_2d(grey[:, half:], (8, 8), max_patches=n_test // len(images), random_state=rng))
    Xtr = np.concatenate(train).reshape(-1, 64)
    Xte = np.concatenate(test).reshape(-1, 64)
    Xtr = Xtr - Xtr.mean(1, keepdims=True)
    Xte = Xte - Xte.mean(1, keepdims=True)
    scale = Xtr.std()
    return Xtr / scale, Xte / scale


def mta_heldout(Xte, params, C, args):
    model = partial(mixture_of_tensor_analyzers, d=d, C=C)
    res = ais(model, mta_updates(d), jnp.asarray(Xte), {k: jnp.asarray(v) for k, v in params.items()},
              {"d": d, "C": C}, latent_sites=("c", *group_names(d)), num_chains=10,
              num_temps=args.temps, rng_key=jax.random.PRNGKey(args.seed), per_row=True)
    return np.asarray(res.log_marginal), np.asarray(res.stderr)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="few patches, iterations and temperatures (CI)")
    ap.add_argument("--out", default=None, help="output folder (default experiments/results; "
                    "with --quick runs/mta_image_patches_quick)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--C", type=int, default=None, help="components (default 8; quick 2)")
    ap.add_argument("--iterations", type=int, default=None, help="MCEM iterations (default 200; quick 5)")
    ap.add_argument("--temps", type=int, default=None, help="AIS intermediate distributions (default 500; quick 20)")
    args = ap.parse_args(argv)
    q = args.quick
    args.out = args.out or ("runs/mta_image_patches_quick" if q else "experiments/results")
    C = args.C if args.C is not None else (2 if q else 8)
    args.iterations = args.iterations if args.iterations is not None else (5 if q else 200)
    args.temps = args.temps if args.temps is not None else (20 if q else 500)
    check_at_least("mta_image_patches", C=(C, 1), iterations=(args.iterations, 1), temps=(args.temps, 2))
    n_train, n_test = (400, 60) if q else (6000, 500)
    os.makedirs(args.out, exist_ok=True)
    Xtr, Xte = patches(n_train, n_test, args.seed)
    D = Xtr.shape[1]
    K = sum(d) + int(np.prod(d))
    rows = []
    t = time.perf_counter()
    mta = fit_ta_mcem(Xtr, d=d, C=C, num_iterations=args.iterations, seed=args.seed, checkpoints=())
    t_fit_mta = time.perf_counter() - t
    t = time.perf_counter()
    ll_mta, se_mta = mta_heldout(Xte, mta.params, C, args)
    t_ais = time.perf_counter() - t
    t = time.perf_counter()
    mfa = fit_mfa_em(Xtr, J=C, K=K, seed=args.seed, restarts=1 if q else 2, shared_noise=False)
    t_fit_mfa = time.perf_counter() - t
    mfa_p = {k: jnp.asarray(v) for k, v in mfa.params.items()}
    ll_mfa = np.asarray(mfa_log_likelihood(jnp.asarray(Xte), mfa_p, per_row=True))
    params_per_component = {"MTA": D * (sum(d) + int(np.prod(d)) + 1) + D, "MFA": D * (K + 1) + D}
    # MTA with T = 0 is an MFA with P = sum(d) factors: the baseline its multiplicative term adds to
    P = sum(d)
    t = time.perf_counter()
    mfa_lin = fit_mfa_em(Xtr, J=C, K=P, seed=args.seed, restarts=1 if q else 2, shared_noise=False)
    t_fit_lin = time.perf_counter() - t
    ll_lin = np.asarray(mfa_log_likelihood(jnp.asarray(Xte), {k: jnp.asarray(v) for k, v in mfa_lin.params.items()},
                                           per_row=True))
    rows = [
        {"model": f"MTA (C={C}, groups 2x2)", "heldout_loglik_per_patch": float(ll_mta.mean()),
         "heldout_median": float(np.median(ll_mta)),
         "stderr_of_mean": float(np.sqrt(np.sum(se_mta**2)) / len(se_mta)),
         "parameters_per_component": params_per_component["MTA"], "fit_seconds": t_fit_mta,
         "heldout_seconds": t_ais},
        {"model": f"MFA (C={C}, K={K})", "heldout_loglik_per_patch": float(ll_mfa.mean()),
         "heldout_median": float(np.median(ll_mfa)),
         "stderr_of_mean": 0.0, "parameters_per_component": params_per_component["MFA"],
         "fit_seconds": t_fit_mfa, "heldout_seconds": 0.0},
        {"model": f"MFA (C={C}, K={P}; MTA's linear part)", "heldout_loglik_per_patch": float(ll_lin.mean()),
         "heldout_median": float(np.median(ll_lin)),
         "stderr_of_mean": 0.0, "parameters_per_component": D * (P + 1) + D,
         "fit_seconds": t_fit_lin, "heldout_seconds": 0.0},
    ]
    print(f"{len(Xtr)} training / {len(Xte)} held-out 8x8 patches, C = {C}, AIS with {args.temps} temperatures")
    print(f"{'model':<36} {'held-out ll/patch':>18} {'median':>8} {'AIS s.e.':>9} {'params/comp':>12} {'fit s':>8}")
    for r in rows:
        print(f"{r['model']:<36} {r['heldout_loglik_per_patch']:>18.3f} {r['heldout_median']:>8.2f} {r['stderr_of_mean']:>9.3f} "
              f"{r['parameters_per_component']:>12} {r['fit_seconds']:>8.1f}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    show = min(C, 8)
    fig, axes = plt.subplots(3, show, figsize=(1.4 * show, 4.4), squeeze=False)
    for k in range(show):
        axes[0, k].imshow(np.asarray(mta.params["mu"][k]).reshape(8, 8), cmap="gray")
        axes[1, k].imshow(np.asarray(mta.params["T"][k]).reshape(64, -1)[:, 0].reshape(8, 8), cmap="gray")
        axes[2, k].imshow(np.asarray(mfa.params["W"][k][:, 0]).reshape(8, 8), cmap="gray")
        for a in axes[:, k]:
            a.set_xticks([])
            a.set_yticks([])
    axes[0, 0].set_ylabel("MTA mu", fontsize=7)
    axes[1, 0].set_ylabel("MTA T[:,0,0]", fontsize=7)
    axes[2, 0].set_ylabel("MFA W[:,0]", fontsize=7)
    save_figure(fig, os.path.join(args.out, "mta_image_patches.png"))
    write_csv(os.path.join(args.out, "mta_image_patches.csv"), rows)
    result = {"N_train": len(Xtr), "N_test": len(Xte), "C": C, "iterations": args.iterations,
              "ais_temperatures": args.temps, "rows": rows}
    write_json(args.json or os.path.join(args.out, "mta_image_patches.json"), result)
    return result


if __name__ == "__main__":
    main()
