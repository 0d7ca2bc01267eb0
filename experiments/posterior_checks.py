"""Prior and posterior predictive checks, PSIS-LOO and LOO-PIT for any family of the zoo.

    python experiments/posterior_checks.py --model MODEL [--data FILE | --data sklearn:NAME]
        [--method METHOD] [--K K] [--J J] [--standardize] [--quick] [--seed 0]
        [--replicates 200] [--out DIR]

Everything family-specific is read from the registry (:mod:`latentzoo.registry`): the model and
how it is called, the data kind (loader, validator), the default data, the methods, the
posterior predictive and the test statistics (``Family.test_statistics``, else the data kind's
defaults in :mod:`latentzoo.predictive_checks`). A newly registered family works unedited.

1. Prior predictive check: ``--replicates`` data sets from the model's prior (NumPyro
   ``Predictive``) at the data's sizes; each statistic's Bayesian p-value P(T(x_rep) >= T(x_obs)).
2. Fit with the chosen method, then the posterior predictive check on at least ``--replicates``
   of the family's replicated data sets (``Family.posterior_predictive``; for a point fit, all
   from its one estimate: a plug-in check, blind to parameter uncertainty).
3. PSIS-LOO (elpd_loo, p_loo, Pareto k counts) and LOO-PIT where the fit stores a pointwise
   log-likelihood over posterior draws; a point fit or a fit without one is skipped, with a
   sentence saying why.

``--data sklearn:NAME`` loads a data set shipped with scikit-learn (no network): ``breast_cancer``
(569 x 30), ``digits`` (1797 x 64, pixel values 0-16), ``digits_binary`` (digits > 7, 0/1),
``sample_patches`` (520 x 64: non-overlapping 8x8 patches of the two sample photographs,
grey, downsampled 4x, scaled to [0, 1]). Bad input ends in one sentence and exit status 2, with
nothing written.

Writes into ``--out`` (default ``runs/posterior_checks/<model>/`` under the current folder, or
``<model>-<data>/`` with ``--data``; never into the repository's tracked results unless ``--out``
names them), all files together through a staging folder:
``checks.csv`` (one row per check and statistic; ``about`` names the column or pair the row's
numbers are about, ``replicates`` the data sets behind its p-value; the check is ``plug-in``
rather than ``posterior`` for a point fit), ``columns.csv`` (every per-column or per-pair
p-value), ``results.json`` (the table, LOO and LOO-PIT summaries, sizes and timings; its size does
not grow with D), ``prior_columns.png`` and ``ppc_columns.png`` (one panel per column: the 16
columns with the most extreme p-values for the posterior check) and ``loo_pit.png``.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import sys
import time

import numpy as np
import pandas as pd

from latentzoo.cli import SentenceArgumentParser, fail

PROG = "posterior_checks"
RESULTS = os.path.join("runs", "posterior_checks")  # relative to the current folder
FEW_PIT_DRAWS = 100  # below this a LOO-PIT's histogram is too coarse to read calibration from
SKLEARN = ("breast_cancer", "digits", "digits_binary", "sample_patches")
QUICK = dict(chains=2, samples=100, warmup=100, replicates=50, pit_draws=40)
FULL = dict(chains=4, samples=1000, warmup=500, replicates=200, pit_draws=100)
MAX_SEED = 2**32 - 1


# ---------------------------------------------------------------------------------- data
def sklearn_data(name: str) -> np.ndarray:
    """A data set shipped with scikit-learn, as an (N, D) matrix (see the module docstring)."""
    from sklearn import datasets

    if name == "breast_cancer":
        return datasets.load_breast_cancer().data.astype(float)
    if name in ("digits", "digits_binary"):
        X = datasets.load_digits().data.astype(float)
        return (X > 7).astype(float) if name == "digits_binary" else X
    if name == "sample_patches":
        rows = []
        for image in datasets.load_sample_images().images:
            grey = image.astype(float).mean(-1) / 255.0
            H, W = (s // 4 * 4 for s in grey.shape)
            small = grey[:H, :W].reshape(H // 4, 4, W // 4, 4).mean((1, 3))
            h, w = (s // 8 * 8 for s in small.shape)
            patches = small[:h, :w].reshape(h // 8, 8, w // 8, 8).swapaxes(1, 2).reshape(-1, 64)
            rows.append(patches)
        return np.concatenate(rows)
    raise ValueError(f"Unknown data set sklearn:{name}; choose one of "
                     f"{', '.join('sklearn:' + n for n in SKLEARN)}.")


def load_data(args, family, cfg):
    """(data, name): the family's default data or ``--data``, validated by its data kind."""
    kind = family.data_kind
    if args.data is None:
        data, name = family.default_data(args.seed), "default data"
    elif args.data.startswith("sklearn:"):
        name = args.data.split(":", 1)[1]
        data = sklearn_data(name)
    else:
        data, name = kind.load(args.data), os.path.splitext(os.path.basename(args.data))[0]
    data = kind.validate(data, K=cfg.K, name=args.data or "the default data")
    if args.standardize:
        if kind.standardize is None:
            raise ValueError(f"--standardize does not apply to {kind.name} data.")
        data = kind.standardize(data)
        name += ", standardised"
    return data, name


# ------------------------------------------------------------------------ prior predictive
def model_arguments(family, observed: dict, cfg):
    """(keyword arguments of ``family.model`` for prior draws at the data's sizes, config).

    ``N`` and ``D`` come from the observed ``X``; other observed arrays the model takes by name
    (labels) are passed as they are; any other required argument (a mixture's ``J``) comes
    from the run config, else from the family's conformance-check sizes, and is written back
    into the config so the fit uses the same value."""
    X = np.asarray(observed["X"])
    kwargs = {}
    for name, p in inspect.signature(family.model).parameters.items():
        if name in ("X", "priors") or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if name == "N":
            kwargs[name] = X.shape[0]
        elif name == "D":
            kwargs[name] = X.shape[1] if X.ndim == 2 else tuple(X.shape[1:])
        elif name in observed:
            kwargs[name] = observed[name]
        elif name in cfg._fields and getattr(cfg, name) is not None:
            kwargs[name] = getattr(cfg, name)
        elif p.default is not p.empty:
            continue
        elif family.checks is not None and name in family.checks.model_kwargs:
            kwargs[name] = family.checks.model_kwargs[name]
            if name in cfg._fields:
                cfg = cfg._replace(**{name: kwargs[name]})
        else:
            raise ValueError(f"The {family.name} model needs {name}; pass --{name}.")
    return kwargs, cfg


def prior_replicates(family, kwargs: dict, num: int, seed: int) -> np.ndarray:
    """``num`` data sets from the prior predictive: (num, N, ...)."""
    import jax
    from numpyro.infer import Predictive

    # parallel: one vmapped draw of all data sets (the default maps over them one at a time)
    draws = Predictive(family.model, num_samples=num, return_sites=["X"], parallel=True)(
        jax.random.PRNGKey(seed), **kwargs)
    return np.asarray(draws["X"], dtype=float)


def posterior_replicates(family, idata, shape, num: int, seed: int) -> np.ndarray:
    """At least ``num`` replicated data sets (S, *shape) from the family's posterior predictive.
    It gives one per posterior draw it picks (up to 200) but a point fit only 20 of its single
    draw, too few for p-values finer than 0.05: it is called again with new seeds until there
    are ``num`` (at most 20 calls)."""
    reps, total = [], 0
    for call in range(20):
        x = np.asarray(family.posterior_predictive(idata, seed + call)["X"], dtype=float)
        reps.append(x.reshape(-1, *shape))
        total += reps[-1].shape[0]
        if total >= num:
            break
    return np.concatenate(reps)


# --------------------------------------------------------------------------- LOO, LOO-PIT
def _draws(idata) -> int:
    return idata.posterior.sizes.get("chain", 1) * idata.posterior.sizes.get("draw", 1)


def loo_section(azx, idata, family, method):
    """(PSIS-LOO summary, None) or ({"skipped": sentence}, sentence)."""
    groups = azx.group_names(idata)
    if "log_likelihood" not in groups or "X" not in idata.log_likelihood.data_vars:
        why = (f"PSIS-LOO and LOO-PIT skipped: the {family.name} {method.name} fit stores no "
               "pointwise log-likelihood.")
        return {"skipped": why}, why
    if method.kind == "point" or _draws(idata) < 30:
        why = (f"PSIS-LOO and LOO-PIT skipped: {method.name} is a point fit ({_draws(idata)} draw); "
               "leaving one observation out needs posterior draws to reweight, so PSIS-LOO over "
               "one draw is meaningless.")
        return {"skipped": why}, why
    res = azx.loo(idata, var_name="X", pointwise=True)
    k = res.pop("pareto_k")
    res["pareto_k_counts"] = {
        "(-inf, 0.5]": int(np.sum(k <= 0.5)),
        "(0.5, 0.7]": int(np.sum((k > 0.5) & (k <= 0.7))),
        "(0.7, 1]": int(np.sum((k > 0.7) & (k <= 1.0))),
        "(1, inf)": int(np.sum(k > 1.0)),
    }
    ll_shape = tuple(idata.log_likelihood["X"].shape[2:])
    res["pointwise_over"] = "rows" if len(ll_shape) == 1 else "entries"
    high = res["pareto_k_counts"]["(0.7, 1]"] + res["pareto_k_counts"]["(1, inf)"]
    if high:
        res["warning"] = (
            f"{high} of {res['n_data_points']} points have Pareto k > 0.7, where PSIS-LOO is "
            "unreliable: expected when the stored log-likelihood is conditional on per-row latent "
            "variables (each row then dominates its own latents), else a sign of influential "
            "observations or a misfit.")
    return res, None


def aligned_predictive(azx, idata, family, num_draws: int, seed: int):
    """A copy of ``idata``'s draws thinned to ``num_draws``, with one replicated data set per
    draw simulated from that draw (LOO-PIT weights are per draw). The family's predictive picks
    draws at random, so each draw is handed to it alone (a one-draw posterior)."""
    names = azx.posterior_var_names(idata)
    post = {n: azx.posterior_array(idata, n) for n in names}
    C, S = next(iter(post.values())).shape[:2]
    ll = np.asarray(idata.log_likelihood["X"].transpose("chain", "draw", ...).values)
    flat = np.linspace(0, C * S - 1, min(num_draws, C * S)).round().astype(int)
    observed = {"X": np.asarray(idata.observed_data["X"])}
    reps = []
    for i, f in enumerate(flat):
        c, d = divmod(int(f), S)
        one = azx.from_draws({n: v[c : c + 1, d : d + 1] for n, v in post.items()},
                             observed_data=observed)
        reps.append(np.asarray(family.posterior_predictive(one, seed + i)["X"])[0, 0])
    chosen = np.unravel_index(flat, (C, S))
    thinned = azx.from_draws({n: v[chosen][None] for n, v in post.items()}, observed_data=observed,
                             log_likelihood={"X": ll[chosen][None]})
    return azx.add_posterior_predictive(thinned, {"X": np.stack(reps)[None]})


def pit_summary(pit: np.ndarray) -> dict:
    """Summaries of LOO-PIT values; uniform values give mean 0.5, sd 0.289, 5% outside
    [0.025, 0.975] and a KS distance of order 1/sqrt(n)."""
    u = np.sort(np.ravel(pit))
    n = u.size
    ks = float(np.max(np.maximum(np.arange(1, n + 1) / n - u, u - np.arange(n) / n)))
    return {"n_values": int(n), "mean": float(u.mean()), "sd": float(u.std()),
            "frac_outside_95": float(np.mean((u < 0.025) | (u > 0.975))), "ks_distance": ks}


# ---------------------------------------------------------------------------------- output
def _json_safe(obj):
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return None if not math.isfinite(float(obj)) else float(obj)
    return obj


def _annotations(results, columns):
    """Per plotted column: the p-values of the per-column statistics, e.g. "mean .41 var .02"."""
    out = {}
    for c in columns:
        parts = [f"{r.name.split('_', 1)[-1]} {float(np.ravel(r.p_value)[c]):.2f}" for r in results
                 if np.ndim(r.observed) == 1 and r.labels is None and c < np.size(r.observed)]
        out[c] = "p: " + " ".join(parts[:4])
    return out


def _check_out(out: str) -> None:
    if not out:
        raise ValueError("--out must name a folder, got an empty path.")
    if os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"--out {out} is an existing file, not a folder.")


def _positive_int(text):
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def parse(argv):
    ap = SentenceArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="model name (see `latentzoo list`)")
    ap.add_argument("--data", help="data file (.csv/.npy/.npz) or sklearn:NAME; default: the model's")
    ap.add_argument("--method", help="inference method (default: the model's first)")
    ap.add_argument("--K", type=_positive_int, help="latent dimension (default: the model's)")
    ap.add_argument("--J", type=_positive_int, help="mixture components (mixture models)")
    ap.add_argument("--standardize", action="store_true", help="centre and scale each column first")
    ap.add_argument("--quick", action="store_true", help="short fit and fewer replicates (< 1 min)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--chains", type=_positive_int)
    ap.add_argument("--samples", type=_positive_int, help="draws per chain")
    ap.add_argument("--warmup", type=_positive_int)
    ap.add_argument("--replicates", type=_positive_int,
                    help="prior (and at least as many posterior) predictive data sets (200; --quick 50)")
    ap.add_argument("--out", help="output folder (default runs/posterior_checks/<model>)")
    return ap.parse_args(argv)


def run(args) -> int:
    from latentzoo import arviz_adapter as azx
    from latentzoo import arviz_plots as azp
    from latentzoo import predictive_checks as pc
    from latentzoo.registry import RunConfig, get_family
    from latentzoo.results import atomic_write_text, staged_run_dir

    t_start = time.perf_counter()
    family = get_family(args.model)
    method = family.method(args.method)
    if family.posterior_predictive is None:
        raise ValueError(f"The {family.name} model has no posterior predictive of its data table "
                         f"to check; its docs ({family.docs}) say which checks it has.")
    if method.streaming:
        raise ValueError(f"Method {method.name!r} streams its data and keeps none for the checks; "
                         f"choose one of {', '.join(m.name for m in family.methods if not m.streaming)}.")
    if not 0 <= args.seed <= MAX_SEED:
        raise ValueError(f"--seed must be between 0 and {MAX_SEED}, got {args.seed}.")
    sizes = dict(QUICK if args.quick else FULL)
    sizes.update({k: getattr(args, k) for k in ("chains", "samples", "warmup", "replicates")
                  if getattr(args, k) is not None})
    cfg = RunConfig(K=args.K or family.default_K, J=args.J, seed=args.seed, chains=sizes["chains"],
                    samples=sizes["samples"], warmup=sizes["warmup"], quick=args.quick)
    data, data_name = load_data(args, family, cfg)
    out = args.out or os.path.join(
        RESULTS, family.name if args.data is None else f"{family.name}-{data_name.split(',')[0]}")
    _check_out(out)
    observed = family.data_kind.observed(data)
    X = np.asarray(observed["X"], dtype=float)
    statistics = pc.statistics_for(family)
    kwargs, cfg = model_arguments(family, observed, cfg)
    title = f"{family.name} / {method.name} on {data_name}"
    print(f"{title}: N = {X.shape[0]}, shape {X.shape}, K = {cfg.K}"
          + (f", J = {cfg.J}" if cfg.J else ""), flush=True)

    t0 = time.perf_counter()
    prior_X = prior_replicates(family, kwargs, sizes["replicates"], args.seed)
    prior = pc.run_checks(X, prior_X, statistics)
    t_prior = time.perf_counter() - t0

    t0 = time.perf_counter()
    idata = method.run(data, cfg)
    t_fit = time.perf_counter() - t0

    t0 = time.perf_counter()
    post_X = posterior_replicates(family, idata, X.shape, sizes["replicates"], args.seed)
    posterior = pc.run_checks(X, post_X, statistics)
    # a point fit's replicates all come from its one estimate: a plug-in check, not a posterior one
    post_check = "posterior" if method.kind == "draws" else "plug-in"
    table = pd.concat([pc.check_table(prior, "prior"), pc.check_table(posterior, post_check)],
                      ignore_index=True)
    columns = pd.concat([pc.column_table(prior, "prior"), pc.column_table(posterior, post_check)],
                        ignore_index=True)

    loo, skipped = loo_section(azx, idata, family, method)
    pit = None
    if skipped is None:
        aligned = aligned_predictive(azx, idata, family, sizes["pit_draws"], args.seed)
        pit = azx.loo_pit(aligned, "X", seed=args.seed)
        pit_info = pit_summary(pit)
        pit_info["draws"] = int(_draws(aligned))
    else:
        pit_info = {"skipped": skipped}
    t_checks = time.perf_counter() - t0

    num_cols = int(np.prod(X.shape[1:]))
    shown = pc.extreme_columns(posterior, num_cols)
    files = ["checks.csv", "columns.csv", "results.json", "prior_columns.png", "ppc_columns.png"]
    if pit is not None:
        files.append("loo_pit.png")
    report = {
        "model": family.name, "method": method.name, "method_kind": method.kind, "data": data_name,
        "data_kind": family.data_kind.name, "shape": list(X.shape), "K": cfg.K, "J": cfg.J,
        "quick": bool(args.quick), "seed": args.seed,
        "fit": {k: sizes[k] for k in ("chains", "samples", "warmup")} if method.kind == "draws" else "point",
        "replicates": {"prior": int(prior_X.shape[0]), "posterior": int(post_X.shape[0])},
        "statistics": list(statistics), "extreme_p": [pc.EXTREME, 1 - pc.EXTREME],
        "checks": table.to_dict(orient="records"), "loo": loo, "loo_pit": pit_info,
        "ppc_columns_shown": shown,
        "seconds": {"prior": t_prior, "fit": t_fit, "checks": t_checks,
                    "total": time.perf_counter() - t_start},
        "files": files,
    }
    with staged_run_dir(out) as stage:
        atomic_write_text(os.path.join(stage, "checks.csv"), table.to_csv(index=False))
        atomic_write_text(os.path.join(stage, "columns.csv"), columns.to_csv(index=False))
        azp.plot_predictive_columns(X, prior_X, os.path.join(stage, "prior_columns.png"),
                                    title=f"{title}: prior predictive", label="prior replicate")
        azp.plot_predictive_columns(X, post_X, os.path.join(stage, "ppc_columns.png"), columns=shown,
                                    title=f"{title}: {post_check} predictive (most extreme columns)",
                                    annotations=_annotations(posterior, shown))
        if pit is not None:
            few = "; too few to judge calibration" if pit_info["draws"] < FEW_PIT_DRAWS else ""
            azp.plot_loo_pit(pit, os.path.join(stage, "loo_pit.png"),
                             title=f"{title}: LOO-PIT ({pit_info['draws']} draws{few})")
        text = json.dumps(_json_safe(report), indent=1, allow_nan=False)
        atomic_write_text(os.path.join(stage, "results.json"), text + "\n")

    what = "posterior predictive" if post_check == "posterior" else \
        "plug-in predictive (from the point estimate: blind to parameter uncertainty)"
    print(f"\nprior predictive ({prior_X.shape[0]} data sets) and {what} ({post_X.shape[0]}) "
          f"checks; p = P(T(x_rep) >= T(x_obs)) over the `replicates` data sets, extreme: "
          f"< {pc.EXTREME} or > {1 - pc.EXTREME}; a vector statistic's observed value, "
          "replicated mean and p are those of its worst value, named under `about`")
    print(pc.format_table(table))
    if skipped:
        print(f"\n{skipped}")
    else:
        counts = ", ".join(f"{k}: {v}" for k, v in loo["pareto_k_counts"].items())
        print(f"\nPSIS-LOO over {loo['n_data_points']} {loo['pointwise_over']}: elpd_loo "
              f"{loo['elpd_loo']:.1f} (se {loo['se']:.1f}), p_loo {loo['p_loo']:.1f}; Pareto k {counts}")
        if "warning" in loo:
            print(loo["warning"])
        print(f"LOO-PIT ({pit_info['draws']} draws): mean {pit_info['mean']:.3f} (uniform 0.5), "
              f"sd {pit_info['sd']:.3f} (0.289), outside [0.025, 0.975] "
              f"{pit_info['frac_outside_95']:.3f} (0.05), KS {pit_info['ks_distance']:.3f}")
        if pit_info["draws"] < FEW_PIT_DRAWS:
            print(f"  only {pit_info['draws']} draws: each PIT value moves in steps of about "
                  f"1/{pit_info['draws']}, so the plot can look miscalibrated when the model is "
                  f"not; use at least {FEW_PIT_DRAWS} draws (no --quick) before reading it")
    print(f"\nfit {t_fit:.1f} s, total {time.perf_counter() - t_start:.1f} s; wrote "
          f"{', '.join(files)} to {out}")
    return 0


def main(argv=None) -> int:
    args = parse(argv)
    try:
        return run(args)
    except ValueError as err:
        if os.environ.get("LATENTZOO_DEBUG"):
            raise
        return fail(str(err), PROG)
    except FloatingPointError as err:  # a fit that diverged: the data, not the program
        return fail(f"{str(err).rstrip('.')}; nothing was written (try --standardize).", PROG)


if __name__ == "__main__":
    sys.exit(main())
