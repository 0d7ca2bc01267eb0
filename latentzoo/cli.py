"""The ``latentzoo`` command: ``list``, ``run``, ``diagnose``.

User errors (bad files, bad sizes, unknown model or method) end in one sentence on stderr and
exit code 2, with nothing written. Set ``LATENTZOO_DEBUG=1`` to see tracebacks instead.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

__all__ = ["main", "SentenceArgumentParser", "fail"]

QUICK = dict(chains=4, samples=1000, warmup=300)
FULL = dict(chains=4, samples=4000, warmup=1000)


def fail(message: str, prog: str = "latentzoo") -> int:
    """Print ``prog: message`` on stderr; return the user-error exit status 2."""
    print(f"{prog}: {message}", file=sys.stderr)
    return 2


class SentenceArgumentParser(argparse.ArgumentParser):
    """argparse parser whose usage errors are one sentence on stderr and exit status 2
    (no usage dump); shared by the CLI and the experiment scripts."""

    def error(self, message):
        raise SystemExit(fail(f"{message[0].upper()}{message[1:]}.", self.prog))


_Parser = SentenceArgumentParser


def _fail(message: str) -> int:
    return fail(message)


def _build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="latentzoo", description="Bayesian latent-factor models on NumPyro.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    sub.add_parser("list", help="the zoo: models, papers, inference methods")

    r = sub.add_parser("run", help="fit a model and write posterior.nc, summary.csv, trace.png")
    r.add_argument("model", help="model name (see `latentzoo list`)")
    r.add_argument("--data", help="CSV (optional header), .npy or .npz; default: embedded data")
    r.add_argument("--method", help="inference method (default: the model's first)")
    r.add_argument("--K", type=int, help="number of latent factors/components")
    r.add_argument("--chains", type=int)
    r.add_argument("--samples", type=int)
    r.add_argument("--warmup", type=int)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--quick", action="store_true", help="small run for a smoke test (< 1 min)")
    r.add_argument("--standardize", action="store_true", help="centre and scale each column first")
    r.add_argument("--chunk-size", type=int, default=1000, help="rows per chunk (online methods)")
    r.add_argument("--no-progress", action="store_true", help="hide progress bars")
    r.add_argument("--out", required=True, help="output directory")

    d = sub.add_parser("diagnose", help="summary, rank.png and ppc.png of a finished run")
    d.add_argument("run_dir")
    return p


def main(argv=None) -> int:
    args = _build_parser().parse_args(argv)
    try:
        return {"list": _cmd_list, "run": _cmd_run, "diagnose": _cmd_diagnose}[args.command](args)
    except ValueError as err:
        if os.environ.get("LATENTZOO_DEBUG"):
            raise
        return _fail(str(err))
    except KeyboardInterrupt:
        return _fail("interrupted; nothing was written")


# ------------------------------------------------------------------------------ list
def _cmd_list(args) -> int:
    from latentzoo.zoo import zoo_table

    print(zoo_table())
    return 0


# ------------------------------------------------------------------------------- run
def _resolve(args):
    from latentzoo.zoo import ZOO

    if args.model not in ZOO:
        raise ValueError(f"Unknown model {args.model!r}; choose one of {', '.join(ZOO)}.")
    entry = ZOO[args.model]
    if not entry.methods:
        raise ValueError(
            f"Model {args.model!r} is available from the Python API only "
            f"({', '.join(entry.api_only)}); see the docs."
        )
    method = args.method or entry.methods[0]
    if method not in entry.methods:
        raise ValueError(
            f"Unknown method {method!r} for {args.model}; choose one of {', '.join(entry.methods)}."
        )
    sizes = dict(QUICK if args.quick else FULL)
    for name in ("chains", "samples", "warmup"):
        value = getattr(args, name)
        if value is not None:
            if value < (1 if name != "warmup" else 0):
                raise ValueError(f"--{name} must be positive, got {value}.")
            sizes[name] = value
    K = args.K if args.K is not None else entry.default_K
    return entry, method, sizes, K


def _load(args, entry, K):
    import numpy as np

    from latentzoo.data import default_fa_data, load_matrix, validate_matrix

    if args.data:
        X = load_matrix(args.data)
    elif entry.name == "fa":
        X = default_fa_data(args.seed)
    else:
        from latentzoo.binary_cli import default_data

        X = np.asarray(default_data(entry.name, seed=args.seed), dtype=float)
    X = validate_matrix(X, K=K, binary=entry.binary, name=args.data or "the default data")
    if args.standardize:
        sd = X.std(0)
        if np.any(sd == 0):
            raise ValueError("--standardize needs every column to vary; some column is constant.")
        X = (X - X.mean(0)) / sd
    return X


def _cmd_run(args) -> int:
    entry, method, sizes, K = _resolve(args)
    progress = not args.no_progress
    if method.startswith("online-"):
        return _run_online(args, method, K)
    X = _load(args, entry, K)
    t0 = time.time()
    if entry.name == "fa":
        from latentzoo import fa_runs

        if method in ("gibbs", "nuts"):
            idata = fa_runs.fit_fa_mcmc(X, K=K, method=method, seed=args.seed,
                                        progress_bar=progress, **sizes)
        else:
            idata = fa_runs.fit_fa_point(X, K=K, method=method, samples=sizes["samples"],
                                         seed=args.seed, progress_bar=progress)
        summary_vars, trace_vars = fa_runs.SUMMARY_VARS, fa_runs.TRACE_VARS
    else:
        idata, summary_vars, trace_vars = _fit_binary(entry.name, X, method, K, sizes, args)
    idata.posterior.attrs.update(latentzoo_model=entry.name, latentzoo_method=method, K=K)
    _write_run(args.out, idata, summary_vars, trace_vars, time.time() - t0, entry.name, method)
    return 0


def _fit_binary(name, X, method, K, sizes, args):
    import numpy as np

    from latentzoo import arviz_adapter as azx
    from latentzoo.binary_cli import fit_binary_model

    fit = fit_binary_model(
        name, X, method=method, K=K, seed=args.seed, quick=args.quick,
        num_samples=sizes["samples"], num_warmup=sizes["warmup"], chains=sizes["chains"],
    )
    if fit["kind"] == "mcmc":
        idata = azx.from_mcmc(fit["mcmc"])
    else:
        # Point estimates under their sites' names (guides call them "<site>_loc"); per-row
        # variational parameters (q(s_n) and the like) are not posterior quantities: left out.
        post = {
            (k[:-4] if k.endswith("_loc") else k): np.asarray(v)[None, None]
            for k, v in fit["params"].items()
            if not (np.ndim(v) and np.shape(v)[0] == X.shape[0])
        }
        stats = {"objective": -np.asarray(fit["losses"])[-1:][None]}
        idata = azx.from_draws(post, observed_data={"X": X}, sample_stats=stats)
    names = [v for v in idata.posterior.data_vars if v not in ("s", "z", "q")]
    return idata, names, names[:3]


def _write_run(out, idata, summary_vars, trace_vars, seconds, model, method):
    from latentzoo import arviz_adapter as azx
    from latentzoo.results import atomic_write_text, staged_run_dir

    table = azx.summary(idata, var_names=summary_vars)
    with staged_run_dir(out) as stage:
        azx.save(idata, os.path.join(stage, "posterior.nc"))
        atomic_write_text(os.path.join(stage, "summary.csv"), table.to_csv())
        azx.plot_trace(idata, os.path.join(stage, "trace.png"), var_names=trace_vars)
    _print_summary(table, model, method, seconds)
    print(f"\nwrote {out}/posterior.nc, {out}/summary.csv, {out}/trace.png")


def _print_summary(table, model, method, seconds):
    import pandas as pd

    with pd.option_context("display.max_rows", 40, "display.width", 120):
        short = table[[not i.startswith("cov[") for i in table.index]]
        print(f"{model} / {method}: fitted in {seconds:.1f} s\n")
        print(short.to_string())
        cov = table[[i.startswith("cov[") for i in table.index]]
        if len(cov):
            print(
                f"\ncov: {len(cov)} entries, max r_hat {cov['r_hat'].max():.3f}, "
                f"min ess_bulk {cov['ess_bulk'].min():.0f} (all rows in summary.csv)"
            )


def _run_online(args, method, K) -> int:
    from latentzoo.streaming import run_streaming_fa

    if args.data and not os.path.exists(args.data):
        raise ValueError(f"Data file {args.data} does not exist.")
    summary = run_streaming_fa(
        args.data, method=method.split("-", 1)[1], n_components=K, out_dir=args.out,
        chunk_size=args.chunk_size, seed=args.seed, quick=args.quick,
    )
    for key, value in summary.items():
        print(f"{key}: {value}")
    print(f"\nwrote {args.out}/params.npz, {args.out}/summary.csv")
    return 0


# -------------------------------------------------------------------------- diagnose
def _cmd_diagnose(args) -> int:
    from latentzoo import arviz_adapter as azx
    from latentzoo.results import staged_run_dir

    path = os.path.join(args.run_dir, "posterior.nc")
    if not os.path.exists(path):
        raise ValueError(f"{path} does not exist; run `latentzoo run ... --out {args.run_dir}` first.")
    try:
        idata = azx.load(path)
    except Exception as err:
        raise ValueError(f"{path} is not a readable InferenceData file ({type(err).__name__}).") from None
    model = idata.posterior.attrs.get("latentzoo_model", "?")
    big = {"s", "z", "q", "cov"}
    names = [v for v in idata.posterior.data_vars if v not in big]
    table = azx.summary(idata, var_names=names)
    _print_summary(table, model, idata.posterior.attrs.get("latentzoo_method", "?"), 0.0)
    wrote = []
    with staged_run_dir(args.run_dir) as stage:
        if idata.posterior.sizes.get("draw", 1) > 1:
            azx.plot_rank(idata, os.path.join(stage, "rank.png"), var_names=names[:2])
            wrote.append("rank.png")
        if model == "fa":
            from latentzoo.fa_runs import fa_posterior_predictive

            azx.add_posterior_predictive(idata, fa_posterior_predictive(idata))
        if "posterior_predictive" in azx.group_names(idata):
            azx.plot_ppc(idata, os.path.join(stage, "ppc.png"))
            wrote.append("ppc.png")
    print(f"\nwrote {', '.join(os.path.join(args.run_dir, w) for w in wrote) or 'no plots'}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
