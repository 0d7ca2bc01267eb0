"""The ``latentzoo`` command: ``list``, ``run``, ``diagnose``.

Everything family-specific comes from the registry (:mod:`latentzoo.registry`): this module names
no model and no site. User errors (bad files, bad sizes, unknown model or method) end in one
sentence on stderr and exit code 2, with nothing written. Set ``LATENTZOO_DEBUG=1`` to see
tracebacks instead.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

__all__ = ["main", "SentenceArgumentParser", "fail", "QUICK", "FULL"]

QUICK = dict(chains=4, samples=1000, warmup=300)
FULL = dict(chains=4, samples=4000, warmup=1000)
MAX_SEED = 2**32 - 1


def fail(message: str, prog: str = "latentzoo") -> int:
    """Print ``prog: message`` on stderr; return the user-error exit status 2."""
    print(f"{prog}: {message}", file=sys.stderr)
    return 2


class SentenceArgumentParser(argparse.ArgumentParser):
    """argparse parser whose usage errors are one sentence on stderr and exit status 2
    (no usage dump); shared by the CLI and the experiment scripts."""

    def error(self, message):
        raise SystemExit(fail(f"{message[0].upper()}{message[1:]}.", self.prog))


def _build_parser() -> argparse.ArgumentParser:
    P = SentenceArgumentParser
    p = P(prog="latentzoo", description="Bayesian latent-factor models on NumPyro.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=P)

    sub.add_parser("list", help="the zoo: models, papers, inference methods")

    r = sub.add_parser("run", help="fit a model and write posterior.nc, summary.csv, trace.png")
    r.add_argument("model", help="model name (see `latentzoo list`)")
    r.add_argument("--data", help="data file (.csv with optional header, .npy, .npz); default: embedded data")
    r.add_argument("--method", help="inference method (default: the model's first)")
    r.add_argument("--K", type=int, help="number of latent factors/sources (default: the model's)")
    r.add_argument("--J", type=int, help="number of mixture components (mixture models)")
    r.add_argument("--chains", type=int, help="MCMC chains (default 4)")
    r.add_argument("--samples", type=int, help="draws per chain (default 4000; --quick 1000)")
    r.add_argument("--warmup", type=int, help="warm-up steps per chain (default 1000; --quick 300)")
    r.add_argument("--sweeps", type=int, help="sweeps of a point fit (EM / VB; default: the method's)")
    r.add_argument("--restarts", type=int, help="random restarts of a point fit (best kept)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--quick", action="store_true", help="small run for a smoke test (< 1 min)")
    r.add_argument("--standardize", action="store_true", help="centre and scale each column first")
    r.add_argument("--chunk-size", type=int, default=1000, help="rows per chunk (streaming methods)")
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
        return fail(str(err))
    except FloatingPointError as err:  # a fit that diverged: the data, not the program
        if os.environ.get("LATENTZOO_DEBUG"):
            raise
        return fail(f"{str(err).rstrip('.')}; nothing was written. Constant columns or a very large "
                    "scale are the usual cause: drop them or try --standardize.")
    except KeyboardInterrupt:
        return fail("interrupted; nothing was written")


# ------------------------------------------------------------------------------ list
def zoo_rows():
    """(model, name, paper, methods) per registered family, for `list` and the docs."""
    from latentzoo.registry import families

    return [(f.name, f.title, f.paper, ", ".join(f.cli_methods) or "-") for f in families().values()]


def zoo_table(markdown: bool = False) -> str:
    """The zoo as a plain-text (``latentzoo list``) or Markdown (docs) table."""
    head = ("model", "name", "paper", "inference (latentzoo run --method)")
    rows = [head, *zoo_rows()]
    if markdown:
        lines = ["| " + " | ".join(r) + " |" for r in rows]
        lines.insert(1, "|" + "|".join("---" for _ in head) + "|")
        return "\n".join(lines)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _cmd_list(args) -> int:
    print(zoo_table())
    return 0


# ------------------------------------------------------------------------------- run
def _positive(name, value, minimum=1):
    if value is not None and value < minimum:
        raise ValueError(f"--{name} must be at least {minimum}, got {value}.")
    return value


def _config(args, family):
    from latentzoo.registry import RunConfig

    sizes = dict(QUICK if args.quick else FULL)
    for name in ("chains", "samples", "warmup"):
        value = getattr(args, name)
        if value is not None:
            sizes[name] = _positive(name, value, 0 if name == "warmup" else 1)
    for name in ("sweeps", "restarts", "J", "chunk_size"):
        _positive(name.replace("_", "-"), getattr(args, name))
    if not 0 <= args.seed <= MAX_SEED:
        raise ValueError(f"--seed must be between 0 and {MAX_SEED}, got {args.seed}.")
    K = family.default_K if args.K is None else args.K
    _positive("K", K)
    return RunConfig(
        K=K, J=args.J, seed=args.seed, sweeps=args.sweeps, restarts=args.restarts,
        quick=args.quick, progress=not args.no_progress, chunk_size=args.chunk_size,
        data_path=args.data, standardize=args.standardize, **sizes,
    )


def _check_out(out: str) -> None:
    """Refuse an output path that cannot become a folder before any fitting is done."""
    if not out:
        raise ValueError("--out must name a folder, got an empty path.")
    if os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"--out {out} is an existing file, not a folder.")
    parent = os.path.dirname(os.path.abspath(out))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ValueError(f"--out {out} lies under {parent}, which is a file.")
    if not os.access(parent if not os.path.isdir(out) else out, os.W_OK):
        raise ValueError(f"--out {out} is not writable.")


def _load(args, family, cfg):
    kind = family.data_kind
    name = args.data or "the default data"
    data = kind.load(args.data) if args.data else family.default_data(args.seed)
    data = kind.validate(data, K=cfg.K, name=name)
    if args.standardize:
        if kind.standardize is None:
            raise ValueError(f"--standardize does not apply to {kind.name} data.")
        data = kind.standardize(data)
    return data


def _check_finite(idata) -> None:
    import numpy as np

    for name, value in idata.posterior.data_vars.items():
        if not np.all(np.isfinite(np.asarray(value))):
            raise ValueError(
                f"The fit produced non-finite values in {name!r}; nothing was written. Check the "
                "data's scale (try --standardize) and constant columns."
            )


def _convergence_warning(idata, table) -> None:
    import numpy as np

    from latentzoo.runs import is_point_fit

    if is_point_fit(idata) or idata.posterior.sizes.get("chain", 1) < 2 or "r_hat" not in table:
        return
    r_hat = table["r_hat"].astype(float)
    if not np.any(np.isfinite(r_hat)):
        return
    worst = r_hat.idxmax()
    if r_hat.max() > 1.01:
        ess = float(table.loc[worst, "ess_bulk"])
        print(
            f"warning: not converged: {worst} has R-hat {r_hat.max():.3f} (ESS {ess:.0f}); "
            "run longer (--warmup, --samples) or with more chains before trusting the results.",
            file=sys.stderr,
        )


def _cmd_run(args) -> int:
    from latentzoo.registry import get_family
    from latentzoo.runs import write_run

    family = get_family(args.model)
    method = family.method(args.method)
    if not method.cli:
        raise ValueError(f"Method {method.name!r} of {family.name} is available from Python only.")
    cfg = _config(args, family)
    _check_out(args.out)
    if method.streaming:
        if args.data and not os.path.isfile(args.data):
            raise ValueError(f"Data file {args.data} does not exist.")
        data = None
    else:
        data = _load(args, family, cfg)
    t0 = time.perf_counter()
    idata = method.run(data, cfg)
    seconds = time.perf_counter() - t0
    _check_finite(idata)
    data_name = os.path.basename(args.data) if args.data else "default data"
    table = write_run(args.out, idata, family=family, method=method, seconds=seconds,
                      data_name=data_name)
    _convergence_warning(idata, table)
    return 0


# -------------------------------------------------------------------------- diagnose
def _cmd_diagnose(args) -> int:
    from latentzoo import arviz_adapter as azx
    from latentzoo.registry import families
    from latentzoo.results import staged_run_dir
    from latentzoo.runs import is_point_fit, print_summary, summarise

    path = os.path.join(args.run_dir, "posterior.nc")
    if not os.path.exists(path):
        raise ValueError(f"{path} does not exist; run `latentzoo run ... --out {args.run_dir}` first.")
    try:
        idata = azx.load(path)
        attrs = azx.posterior_attrs(idata)
    except Exception as err:
        raise ValueError(f"{path} is not a readable InferenceData file ({type(err).__name__}).") from None
    family = families().get(attrs.get("latentzoo_model"))
    sites = family.identified if family else tuple(idata.posterior.data_vars)
    table = summarise(idata, sites)
    title = f"{attrs.get('latentzoo_model', '?')} / {attrs.get('latentzoo_method', '?')}"
    if "latentzoo_data" in attrs:
        title += f" on {attrs['latentzoo_data']}"
    print_summary(table, title, attrs.get("latentzoo_seconds"))
    _convergence_warning(idata, table)
    wrote = []
    present = [s for s in sites if s in idata.posterior.data_vars]
    with staged_run_dir(args.run_dir) as stage:
        if not is_point_fit(idata) and idata.posterior.sizes.get("draw", 1) > 1 and present:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                azx.plot_rank(idata, os.path.join(stage, "rank.png"), var_names=present[:2])
            wrote.append("rank.png")
        groups = azx.group_names(idata)
        if family and family.posterior_predictive and "observed_data" in groups \
                and "X" in idata.observed_data:
            replicated = family.posterior_predictive(idata)
            azx.add_posterior_predictive(idata, replicated)
            num = min(100, int(replicated["X"].shape[1]))  # a point fit has one replicate per draw
            azx.plot_ppc(idata, os.path.join(stage, "ppc.png"), num_pp_samples=num)
            wrote.append("ppc.png")
    print(f"\nwrote {', '.join(os.path.join(args.run_dir, w) for w in wrote) or 'no plots'}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
