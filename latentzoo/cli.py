"""The ``latentzoo`` command: ``list``, ``run``, ``diagnose``.

Everything family-specific comes from the registry (:mod:`latentzoo.registry`): this module names
no model and no site. User errors (bad files, bad sizes, unknown model or method, a full disk) end
in one sentence on stderr and exit code 2, with nothing written. SIGINT and SIGTERM end a command
the same way (exit 128 + the signal's number) after removing what it had staged. Set
``LATENTZOO_DEBUG=1`` to see tracebacks instead.

``run`` checkpoints into ``OUT/.checkpoint`` as it goes (:mod:`latentzoo.checkpoint`), and
``run ... --resume OUT`` continues an interrupted run from there.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import sys
import time
import warnings

from latentzoo.signals import (  # noqa: F401 (Interrupted, SignalGuard: re-exported for callers of the CLI)
    Interrupted,
    SignalGuard,
    close_progress_bars,
    interrupt_in,
    interrupt_on_signals,
    release_interrupted_frames,
)

__all__ = ["main", "entry", "interrupt_on_signals", "SignalGuard", "Interrupted", "SentenceArgumentParser", "fail",
           "load_data", "scale_note", "QUICK", "FULL"]

QUICK = dict(chains=4, samples=1000, warmup=300)
FULL = dict(chains=4, samples=4000, warmup=1000)
MAX_SEED = 2**32 - 1
_OPTION = "option:"  # argparse dest prefix of the families' own options (Family.options)
_RUN_FLAGS = "run_flags"  # argparse dest: the flags `run` has itself (no family may reuse them)


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
    r.add_argument("--labels", help="labels, one per row of --data (.csv or .npy; models with labelled data)")
    r.add_argument("--method", help="inference method (default: the model's first)")
    r.add_argument("--K", type=int, help="number of latent factors/sources (default: the model's)")
    r.add_argument("--J", type=int, help="number of mixture components (mixture models)")
    r.add_argument("--chains", type=int, help="MCMC chains (default 4)")
    r.add_argument("--samples", type=int, help="draws per chain (default 4000; --quick 1000)")
    r.add_argument("--warmup", type=int, help="warm-up steps per chain (default 1000; --quick 300)")
    r.add_argument("--sweeps", type=int, help="sweeps of a point fit (EM / VB; default: the method's)")
    r.add_argument("--restarts", type=int, help="random restarts of a point fit (best kept)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--quick", action="store_true",
                   help="small run for a smoke test: 4 chains of 300 warm-up + 1000 draws, short "
                        "point fits; the Gibbs samplers of cfa, cvq and noca cap at 50 + 50, "
                        "rank-svm, ta and mta at 100 + 100 "
                        "(rank-svm's nuts method at trees of depth 5)")
    r.add_argument("--replicas", type=int, default=1, metavar="M",
                   help="run a Gibbs method as replica exchange over M tempered copies of its "
                        "table (swap rates go to sample_stats, and a pair under 0.05 is warned of; every "
                        "family's table but fa's has a tempered form); default 1: plain Gibbs")
    r.add_argument("--min-beta", type=float, default=0.01, metavar="B",
                   help="the hottest copy's inverse temperature with --replicas, in (0, 1) (default 0.01)")
    r.add_argument("--distributed", action="store_true",
                   help="run a Gibbs method with the rows split over every device (one process), "
                        "or over the processes of LATENTZOO_COORDINATOR / LATENTZOO_NUM_PROCESSES / "
                        "LATENTZOO_PROCESS_ID, each keeping its block of --data's rows (or reading "
                        "its own file: --data 'part{process}.npy'); process 0 writes --out. "
                        "every Gibbs sampler but cfa's (rank-svm: the G variants); no --replicas, "
                        "--resume or checkpoints")
    r.add_argument("--standardize", action="store_true", help="centre and scale each column first")
    r.add_argument("--chunk-size", type=int, default=1000, help="rows per chunk (streaming methods)")
    r.add_argument("--no-progress", action="store_true", help="hide progress bars")
    r.add_argument("--out", help="output directory (checkpoints go to OUT/.checkpoint)")
    r.add_argument("--resume", metavar="OUT",
                   help="continue the interrupted run in OUT (same arguments as that run)")
    r.add_argument("--checkpoint-every", type=int, metavar="N",
                   help="checkpoint every N draws (MCMC) or sweeps (point fits); default: "
                        "about every two minutes")
    _add_family_options(r)

    d = sub.add_parser("diagnose", help="summary, rank.png and ppc.png of a finished run")
    d.add_argument("run_dir")

    q = sub.add_parser("predict", help="score new rows with a finished run's posterior (no refit): "
                       "predictions.nc and predictions.csv")
    q.add_argument("run_dir")
    q.add_argument("--data", required=True, help="new rows (.csv/.npy/.npz); NaN marks a missing entry")
    q.add_argument("--labels", help="a classifier's true labels of the new rows (.csv/.npy), for "
                   "accuracy and log loss; a labelled model also reads them from a last column")
    q.add_argument("--layout", choices=("NHWC", "NCHW"),
                   help="an image model's new stack of 4 axes: channels last (NHWC) or first (NCHW)")
    q.add_argument("--out", required=True, help="folder for predictions.nc and predictions.csv")
    return p


def _add_family_options(r) -> None:
    """``--<name>`` for every option any registered family declares (read as text: the chosen
    family's :class:`~latentzoo.registry.Option` converts and checks it in :func:`_options`).
    A name the command already uses stays the command's; :func:`_options` refuses such a
    declaration in one sentence when that family runs."""
    from latentzoo.registry import families

    taken = {flag for action in r._actions for flag in action.option_strings}
    users: dict[str, list] = {}
    for family in families().values():
        for opt in family.options:
            users.setdefault(opt.name, []).append((family.name, opt))
    for name, declared in users.items():
        if f"--{name}" in taken:
            continue
        opt = declared[0][1]
        models = ", ".join(f for f, _ in declared)
        choices = f" ({'|'.join(map(str, opt.choices))})" if opt.choices else ""
        r.add_argument(f"--{name}", dest=_OPTION + name, metavar=name.upper(),
                       help=f"{opt.help}{choices} [models: {models}]")
    r.set_defaults(**{_RUN_FLAGS: frozenset(taken)})


def main(argv=None) -> int:
    if "--distributed" in (sys.argv[1:] if argv is None else list(argv)):
        # before anything else: importing the families may already run JAX computations
        try:
            _join_processes()
        except (ValueError, RuntimeError) as err:
            return fail(str(err))
    args = _build_parser().parse_args(argv)
    guard = None
    try:
        with interrupt_on_signals() as guard:
            args.signals = guard
            return {"list": _cmd_list, "run": _cmd_run, "diagnose": _cmd_diagnose,
                    "predict": _cmd_predict}[args.command](args)
    except KeyboardInterrupt as err:
        return _interrupted(err, args)
    except Exception as err:
        # A signal whose Interrupted was raised inside library code that wraps what it catches is
        # still the signal, not bad input: found in the error's causes, or, where the library
        # kept only the text (jaxlib's cache lookup turns an exception from a key's __eq__ into
        # an error of its own), by the signal having arrived at all.
        stop = interrupt_in(err)
        if stop is None and guard is not None:
            stop = guard.pending()
            if stop is not None:
                stop.__context__ = err  # so that the frames it unwound through are released too
        if stop is not None:
            return _interrupted(stop, args)
        if os.environ.get("LATENTZOO_DEBUG") or not isinstance(err, (ValueError, FloatingPointError)):
            raise
        if _collective_failure(err):  # found alike by every process: process 0 says it, all leave
            return 2
        if isinstance(err, FloatingPointError):  # a fit that diverged: the data, not the program
            return fail(f"{str(err).rstrip('.')}; nothing was written. Constant columns or a very "
                        "large scale are the usual cause: drop them or try --standardize.")
        return fail(str(err))


def _collective_failure(err) -> bool:
    """For bad input that every process of a multi-process ``--distributed`` run found alike
    (:class:`~latentzoo.inference.distributed.CollectiveValueError`): print the sentence on
    process 0 only, let the processes leave together (process 0 last) and return True."""
    if "jax" not in sys.modules:
        return False
    import jax

    from latentzoo.inference.distributed import CollectiveValueError, leave_together

    if not isinstance(err, CollectiveValueError) or not jax.distributed.is_initialized():
        return False
    if jax.process_index() == 0:
        fail(str(err))
    leave_together()
    return True


def _interrupted(err, args) -> int:
    signum = getattr(err, "signum", signal.SIGINT)
    name = signal.Signals(signum).name
    release_interrupted_frames(err)
    close_progress_bars()
    hint = getattr(args, "resume_hint", None)
    more = f"; `latentzoo run ... --resume {hint}` continues from its last checkpoint" if hint else ""
    fail(f"interrupted ({name}); nothing was written{more}")
    return 128 + int(signum)


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
    for name in ("sweeps", "restarts", "J", "chunk_size", "checkpoint_every"):
        _positive(name.replace("_", "-"), getattr(args, name))
    if not 0 <= args.seed <= MAX_SEED:
        raise ValueError(f"--seed must be between 0 and {MAX_SEED}, got {args.seed}.")
    K = family.default_K if args.K is None else args.K
    _positive("K", K)
    _positive("replicas", args.replicas)
    if args.replicas > 1 and not 0.0 < args.min_beta < 1.0:
        raise ValueError(f"--min-beta must lie strictly between 0 and 1, got {args.min_beta}.")
    return RunConfig(
        replicas=args.replicas, min_beta=args.min_beta, distributed=args.distributed,
        K=K, J=args.J, seed=args.seed, sweeps=args.sweeps, restarts=args.restarts,
        quick=args.quick, progress=not args.no_progress, chunk_size=args.chunk_size,
        data_path=args.data, standardize=args.standardize, checkpoint_every=args.checkpoint_every,
        options=_options(args, family), **sizes,
    )


def _options(args, family):
    """The family's options from the command line (defaults where not given), converted and
    checked; an option of another family, a wrong type or a value outside the choices is one
    ValueError sentence."""
    from types import MappingProxyType

    declared = {opt.name: opt for opt in family.options}
    for key, text in sorted(vars(args).items()):
        if key.startswith(_OPTION) and text is not None and key[len(_OPTION):] not in declared:
            own = ", ".join(f"--{n}" for n in declared)
            raise ValueError(f"--{key[len(_OPTION):]} does not apply to {family.name} "
                             + (f"(its own options: {own})." if own else "(it has no options of its own)."))
    values = {}
    for name, opt in declared.items():
        if f"--{name}" in getattr(args, _RUN_FLAGS, ()):
            raise ValueError(f"{family.name} declares an option --{name}, which `latentzoo run` "
                             "already has; rename the option in its registry entry.")
        text = getattr(args, _OPTION + name, None)
        if text is None:
            values[name] = opt.default
            continue
        try:
            value = opt.type(text)
        except (TypeError, ValueError):
            kind = getattr(opt.type, "__name__", "a valid value")
            raise ValueError(f"--{name} must be {'an' if kind[0] in 'aeiou' else 'a'} {kind}, "
                             f"got {text!r}.") from None
        if opt.choices is not None and value not in opt.choices:
            raise ValueError(f"--{name} must be one of {', '.join(map(str, opt.choices))}, "
                             f"got {text!r}.")
        values[name] = value
    return MappingProxyType(values)


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


def load_data(args, family, cfg, raw=None):
    """The run's data from ``args.data`` (or the family's embedded data), validated and, with
    ``args.standardize``, standardised; a note on stderr for data far from unit scale.
    ``raw``: the data already read (a ``--distributed`` run's gathered rows, labels included)
    instead of ``--data`` / ``--labels``."""
    from latentzoo.inference.validation import ScaleError

    kind = family.data_kind
    name = args.data or "the default data"
    labels = getattr(args, "labels", None)
    if raw is not None:  # read already (with its labels, where given)
        data = raw
    elif labels is not None:
        if kind.load_with_labels is None:
            raise ValueError(f"--labels applies only to models with labelled data; {family.name} "
                             f"takes {kind.name} data.")
        if not args.data:
            raise ValueError("--labels needs --data with the features (one row per label).")
        data = kind.load_with_labels(args.data, labels)
    else:
        data = kind.load(args.data) if args.data else family.default_data(args.seed)
    if args.standardize and kind.standardize is None:
        raise ValueError(f"--standardize does not apply to {kind.name} data.")
    try:
        data = kind.validate(data, K=cfg.K, name=name)
    except ScaleError:
        if not args.standardize:
            raise
        # well-formed data on a scale float64 cannot square: standardised, it can be fitted
        return kind.validate(kind.standardize(data), K=cfg.K, name=name)
    if args.standardize:
        from latentzoo.data import standardize_scalers

        # prediction applies the same transform to new rows (a labelled set's features)
        args.standardize_scalers = standardize_scalers(data[0] if isinstance(data, tuple) else data)
        return kind.standardize(data)
    if kind.standardize is not None and not family.scale_free:
        note = scale_note(data[0] if isinstance(data, tuple) else data)
        if note:
            print(f"note: {note}", file=sys.stderr)
    return data


def scale_note(X, spread: float = 1e3) -> str | None:
    """A sentence when the non-constant columns' standard deviations span more than ``spread``
    or lie far from 1: every model's default priors (loadings N(0, 1), noise scales near 1)
    assume unit-scale data, so on such data the priors, not the data, set the small columns'
    noise (a column with s.d. 0.01 gets a noise variance near the prior's ~1 / N)."""
    import numpy as np

    sd = np.std(np.asarray(X, dtype=float), axis=0)
    sd = sd[sd > 0]
    if sd.size == 0:
        return None
    lo, hi = float(sd.min()), float(sd.max())
    if hi / lo <= spread and 1.0 / spread ** 0.5 <= lo and hi <= spread ** 0.5:
        return None
    return (f"column standard deviations range from {lo:.3g} to {hi:.3g}, and the default priors "
            "assume unit-scale data; --standardize centres and scales every column first.")


def _check_finite(idata, source: str | None = None) -> None:
    """ValueError naming the first posterior site with NaN or infinity: from a fit (``source``
    None: nothing is written) or in a stored run ``source`` (nothing is plotted)."""
    import numpy as np

    for name, value in idata.posterior.data_vars.items():
        if not np.all(np.isfinite(np.asarray(value))):
            if source is not None:
                raise ValueError(
                    f"{source} holds non-finite values in {name!r}; nothing was plotted. Rerun the "
                    "fit (a current latentzoo refuses to write such a run)."
                )
            raise ValueError(
                f"The fit produced non-finite values in {name!r}; nothing was written. Check the "
                "data's scale (try --standardize) and constant columns."
            )


def _convergence_warning(idata, table) -> None:
    import numpy as np

    from latentzoo.runs import is_point_fit

    if is_point_fit(idata):
        return
    if idata.posterior.sizes.get("chain", 1) < 2:
        print("note: R-hat needs two or more chains and this run has one, so convergence is not "
              "checked (its r_hat column is NaN); run with --chains 2 or more to check it.",
              file=sys.stderr)
        return
    if "r_hat" not in table:
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


def _swap_rate_warning(idata) -> None:
    from latentzoo.runs import swap_rate_warning

    sentence = swap_rate_warning(idata)
    if sentence is not None:
        print(sentence, file=sys.stderr)


def _out_folder(args) -> str:
    if args.resume is not None and args.out is not None \
            and os.path.abspath(args.resume) != os.path.abspath(args.out):
        raise ValueError(f"--resume {args.resume} and --out {args.out} name different folders; "
                         "a resumed run writes into the folder it resumes.")
    out = args.resume if args.resume is not None else args.out
    if out is None:
        raise ValueError("The following arguments are required: --out (or --resume).")
    return out


# The run's arguments as a checkpoint records them, with the flag that sets each.
_RECORD_FLAGS = {
    "model": "MODEL", "method": "--method", "data": "--data", "K": "--K", "J": "--J",
    "seed": "--seed", "chains": "--chains", "samples": "--samples", "warmup": "--warmup",
    "sweeps": "--sweeps", "restarts": "--restarts", "quick": "--quick",
    "standardize": "--standardize", "labels": "--labels",
}


def _run_record(args, family, method, cfg) -> dict:
    from latentzoo.checkpoint import file_digest

    def digest(path):
        try:
            return "sha256:" + file_digest(path)
        except OSError as err:
            raise ValueError(f"Data file {path} could not be read ({err.strerror}).") from None

    labels = getattr(args, "labels", None)
    return {
        "model": family.name, "method": method.name,
        "data": digest(args.data) if args.data else "default data", "K": cfg.K, "J": cfg.J,
        "seed": cfg.seed, "chains": cfg.chains, "samples": cfg.samples, "warmup": cfg.warmup,
        "sweeps": cfg.sweeps, "restarts": cfg.restarts, "quick": cfg.quick,
        "standardize": cfg.standardize, "labels": digest(labels) if labels else None,
        "options": _plain_options(cfg), "replicas": cfg.replicas,
        "min_beta": cfg.min_beta if cfg.replicas > 1 else None,
    }


def _plain_options(cfg) -> dict:
    """The family's options as JSON values (anything else as its text)."""
    return {k: v if isinstance(v, (str, int, float, bool)) or v is None else str(v)
            for k, v in cfg.options.items()}


def _check_record(ck: str, out: str, record: dict) -> None:
    """Refuse, in one sentence, to resume a run made with other arguments."""
    path = os.path.join(ck, "run.json")
    try:
        with open(path, encoding="utf-8") as fh:
            saved = json.load(fh)
    except FileNotFoundError:
        raise ValueError(
            f"{out} holds no interrupted run to resume (no {path}; a finished run removes its "
            "checkpoint): start one with --out."
        ) from None
    except (OSError, ValueError):
        raise ValueError(f"The checkpoint {path} cannot be read; start afresh with --out.") from None
    saved_options = saved.get("options") or {}  # runs recorded before options existed: none
    changed = [(key, flag, saved.get(key), record[key]) for key, flag in _RECORD_FLAGS.items()]
    changed += [(name, f"--{name}", saved_options.get(name), value)
                for name, value in record["options"].items()]
    for key, flag, before, now in changed:
        if before == now:
            continue
        if key in ("data", "labels"):
            what = f"on other data (the {flag} file's contents differ)"
        else:
            what = f"with {flag} {before}, not {now}"
        raise ValueError(
            f"The interrupted run in {out} was made {what}; resume it with its own arguments, "
            "or start afresh with --out."
        )


@contextlib.contextmanager
def _compilation_cache(folder: str):
    """JAX's persistent compilation cache in the checkpoint folder, unless one is configured:
    each MCMC segment compiles NumPyro's sampling loop again, and a resumed run its programs,
    which the cache turns into loads."""
    import jax

    try:
        from jax.experimental.compilation_cache import compilation_cache as cc
    except ImportError:  # pragma: no cover
        yield
        return
    if jax.config.jax_compilation_cache_dir or not jax.config.jax_enable_compilation_cache:
        yield
        return
    cc.reset_cache()
    jax.config.update("jax_compilation_cache_dir", folder)
    try:
        yield
    finally:
        cc.reset_cache()
        jax.config.update("jax_compilation_cache_dir", None)


def _check_memory(data, cfg, method) -> None:
    """Refuse, before compiling, a fit whose least memory (:mod:`latentzoo.memory`) is more
    than the machine has available."""
    import numpy as np

    from latentzoo.memory import check_fits, run_floor_bytes

    X = data[0] if isinstance(data, tuple) else data
    shape = np.shape(X)
    rows, per_row = shape[0], int(np.prod(shape[1:]))
    chains = cfg.chains if method.kind == "draws" else 1
    need = run_floor_bytes(rows, per_row, cfg.K, chains)
    dims = " x ".join(str(n) for n in shape)
    check_fits(need, f"A {method.name} fit of {dims} data with K = {cfg.K} and {chains} "
                     f"chain{'s' if chains > 1 else ''}")


def _cmd_run(args) -> int:
    from latentzoo import arviz_adapter as azx
    from latentzoo.checkpoint import CHECKPOINT
    from latentzoo.inference.cavi import checkpointing
    from latentzoo.inference.gibbs import GenericKernelNote
    from latentzoo.priors import ignored_edits, prior_record
    from latentzoo.registry import get_family
    from latentzoo.results import atomic_write_text, remove_stale, writing
    from latentzoo.runs import write_run

    family = get_family(args.model)
    method = family.method(args.method)
    if not method.cli:
        raise ValueError(f"Method {method.name!r} of {family.name} is available from Python only.")
    cfg = _config(args, family)
    if cfg.replicas > 1 and method.name != "gibbs":
        raise ValueError(f"--replicas runs replica exchange over a Gibbs sampler's table; "
                         f"{family.name} --method {method.name} is not one (use --method gibbs).")
    if cfg.distributed:
        _check_distributed(args, family, method, cfg)
    out = _out_folder(args)
    _check_out(out)
    edited = ignored_edits(family.model, method.ignores_priors)
    if edited:  # a maximum-likelihood fit would otherwise run as if nothing had changed
        sites = ", ".join(f"{k} ({v})" for k, v in edited.items())
        readers = [m.name for m in family.methods if m.cli and not set(edited) & set(m.ignores_priors)]
        print(f"note: {family.name} --method {method.name} is maximum likelihood and does not read "
              f"the priors you edited in the model file: {sites}"
              + (f"; --method {readers[0]} uses them." if readers else "."), file=sys.stderr)
    if method.streaming and args.resume is not None:
        raise ValueError(f"Method {method.name!r} streams its data in one pass and keeps no "
                         "checkpoint, so it cannot be resumed; run it again with --out.")
    if method.streaming:
        if args.data and not os.path.isfile(args.data):
            raise ValueError(f"Data file {args.data} does not exist.")
        data = None
    else:
        data = _distributed_data(args, family, cfg) if cfg.distributed else load_data(args, family, cfg)
        _check_memory(data, cfg, method)
    # a row-sharded run keeps no checkpoint (and every process but 0 writes nothing)
    ck = None if method.streaming or cfg.distributed else os.path.join(out, CHECKPOINT)
    writer = not cfg.distributed or _process_index() == 0
    created = not os.path.isdir(out)
    if ck is not None:
        record = _run_record(args, family, method, cfg)
        if args.resume is not None:
            _check_record(ck, out, record)
            remove_stale(ck)
            remove_stale(os.path.join(ck, "mcmc"))
        elif os.path.isdir(ck):
            print(f"note: discarding the checkpoint of an interrupted run in {out} (continue one "
                  "with --resume instead of --out).", file=sys.stderr)
            shutil.rmtree(ck)
        path = os.path.join(ck, "run.json")
        with writing(path, out):
            atomic_write_text(path, json.dumps(record, indent=1, sort_keys=True) + "\n")
        cfg = cfg._replace(checkpoint_dir=ck, resume=args.resume is not None)
        args.resume_hint = out
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(warnings.catch_warnings())
            # a table that leaves sites to NUTS/DiscreteGibbs by design is not news to a user
            warnings.simplefilter("ignore", GenericKernelNote)
            if ck is not None:
                stack.enter_context(_compilation_cache(os.path.join(ck, "xla")))
                stack.enter_context(checkpointing(ck, every=args.checkpoint_every,
                                                  resume=args.resume is not None))
            t0 = time.perf_counter()
            idata = method.run(data, cfg)
            seconds = time.perf_counter() - t0
        getattr(args, "signals", None) and args.signals.check()  # before anything is written
        _check_finite(idata)
        data_name = os.path.basename(args.data) if args.data else "default data"
        if getattr(args, "labels", None):
            data_name += f" (labels {os.path.basename(args.labels)})"
        azx.set_posterior_attrs(idata, **prior_record(family.model, cfg.K))  # the priors as read
        scalers = getattr(args, "standardize_scalers", None)
        # prediction must know whether the columns were transformed (a run without this
        # attribute predates the record, and predict refuses it)
        azx.set_posterior_attrs(idata, latentzoo_standardized=int(scalers is not None))
        if scalers is not None:  # new rows must be standardised as the training rows were
            azx.add_constant_data(idata, {"standardize_centre": scalers[0],
                                          "standardize_scale": scalers[1]})
        if cfg.options:  # the family's own settings travel with the posterior
            azx.set_posterior_attrs(idata, latentzoo_options=json.dumps(_plain_options(cfg),
                                                                        sort_keys=True))
        table = None
        if writer:
            table = write_run(out, idata, family=family, method=method, seconds=seconds,
                              data_name=data_name,
                              requested_draws=cfg.samples if method.kind == "draws" else None)
        if cfg.distributed:  # every process stays until process 0 has written the run
            _barrier("latentzoo run: written")
        getattr(args, "signals", None) and args.signals.disarm()  # the run's files are in place
    except KeyboardInterrupt:
        raise  # the checkpoint stays: --resume continues from it
    except BaseException:
        # a failed fit or write: its checkpoint cannot help, and a folder made for it goes again
        if ck is not None:
            shutil.rmtree(ck, ignore_errors=True)
        if created:
            with contextlib.suppress(OSError):
                os.rmdir(out)
        args.resume_hint = None
        raise
    if ck is not None:
        shutil.rmtree(ck, ignore_errors=True)
    if writer:
        _convergence_warning(idata, table)
        _swap_rate_warning(idata)
    return 0


# ------------------------------------------------------------------- run --distributed
def _check_distributed(args, family, method, cfg) -> None:
    """Refuse, in one sentence and before anything starts, what ``--distributed`` cannot run."""
    from latentzoo.registry import families

    if not method.distributed:
        able = [f"{f.name} --method {m.name}" for f in families().values() for m in f.methods
                if m.distributed and m.cli]
        if method.kind != "draws" or method.name != "gibbs":
            own = [m.name for m in family.methods if m.distributed and m.cli]
            raise ValueError(
                f"--distributed runs a Gibbs sampler's sweeps with the rows split over devices and "
                f"processes; {family.name} --method {method.name} is not one"
                + (f" (use --method {own[0]})." if own else f" (it runs {', '.join(able)}).")
            )
        raise ValueError(f"--distributed is not available for {family.name} --method {method.name}, "
                         f"whose sweep has not been tested row-sharded; it runs {', '.join(able)}.")
    if cfg.replicas > 1:
        raise ValueError("--replicas and --distributed cannot be combined: replica exchange does "
                         "not run row-sharded.")
    if args.resume is not None or args.checkpoint_every is not None:
        raise ValueError("--distributed keeps no checkpoint, so --resume and --checkpoint-every do "
                         "not apply to it.")
    labels = getattr(args, "labels", None)
    if labels and family.data_kind.load_with_labels is not None and args.data \
            and ("{process}" in args.data) != ("{process}" in labels):
        raise ValueError("With --distributed, --data and --labels name each process's part with "
                         "{process} both or neither (the labels of a process's rows are its own).")


def _distributed_data(args, family, cfg):
    """The data of a ``--distributed`` run, on every process.

    Each process reads its own rows: with ``--data`` naming a pattern with ``{process}``, the
    file of its process id (every file the same number of rows); otherwise its block
    ``[p N / P, (p + 1) N / P)`` of the one file (or of the default data). Labelled data (the
    rank SVM's features and labels, from one file or with ``--labels``) are split by rows
    together: a process's block of X and of y are the same rows. A problem any process
    meets is then every process's one sentence (:func:`~latentzoo.inference.distributed.exchange`);
    the blocks are placed on the row mesh (which checks that the devices share them equally) and
    gathered, since the run's start values, log-likelihood and written posterior need every row. Validated and standardised as
    :func:`load_data` does."""
    import jax
    import numpy as np

    from latentzoo.inference.distributed import (
        CollectiveValueError,
        exchange,
        gather,
        initialize_from_env,
        read_process_env,
        row_mesh,
        shard_rows,
    )

    info = read_process_env()
    P, p = info.num_processes, info.process_id
    kind = family.data_kind

    labels = getattr(args, "labels", None)

    def arrays(data):  # one array, or (X, y) of labelled data: split alike
        return tuple(np.asarray(a) for a in data) if isinstance(data, tuple) else np.asarray(data)

    def block(whole):
        n = int(kind.num_rows(whole))
        if n % P:
            raise ValueError(f"The data has {n} rows, which {P} processes cannot share equally; use a "
                        f"row count divisible by {P}.")
        m = n // P
        return jax.tree.map(lambda a: a[p * m : (p + 1) * m], arrays(whole))

    def read(path, labels_path):
        if labels_path is None:
            data = arrays(kind.load(path))
        elif kind.load_with_labels is None:
            raise ValueError(f"--labels applies only to models with labelled data; {family.name} "
                             f"takes {kind.name} data.")
        else:
            data = arrays(kind.load_with_labels(path, labels_path))
        if isinstance(data, tuple):
            if len({np.shape(a)[0] for a in data}) > 1:
                raise ValueError(f"{path} has {np.shape(data[0])[0]} rows and its labels "
                                 f"{np.shape(data[1])[0]}; give one label per row.")
            if data[1].dtype.kind not in "biuf":  # the rows travel through the devices
                raise ValueError(f"--distributed reads numeric labels (such as 0/1 or -1/+1); the "
                                 f"labels of {path} are {data[1].dtype} values.")
        return data

    initialize_from_env()  # (main() has joined them already)
    local, problem = None, None
    try:
        if labels and not args.data:
            raise ValueError("--labels needs --data with the features (one row per label).")
        if args.data and "{process}" in args.data:
            path = args.data.replace("{process}", str(p))
            if not os.path.isfile(path):
                raise ValueError(f"Data file {path} (process {p}'s part of --data {args.data}) "
                                 "does not exist.")
            local = read(path, labels and labels.replace("{process}", str(p)))
        else:
            local = block(read(args.data, labels) if args.data else family.default_data(args.seed))
    except ValueError as err:
        problem = str(err)
    # every process learns of any process's problem, so that all end alike (no one waits)
    for q, said in enumerate(exchange(problem)):
        if said:
            raise CollectiveValueError(said if P == 1 or "processes cannot share" in said
                                       else f"Process {q}: {said}")
    mesh = row_mesh()
    rows = jax.tree.map(lambda a: gather(shard_rows(a, mesh, name="the data")), local)
    return load_data(args, family, cfg, raw=rows)


def _join_processes() -> None:
    """Join the processes of a multi-process ``--distributed`` run (the LATENTZOO_* variables;
    nothing for one process): :func:`~latentzoo.inference.distributed.initialize_from_env`."""
    from latentzoo.inference.distributed import initialize_from_env, read_process_env

    if read_process_env().num_processes > 1:
        initialize_from_env()


def _process_index() -> int:
    import jax

    return jax.process_index()


def _barrier(name: str) -> None:
    import jax

    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


# -------------------------------------------------------------------------- diagnose
def _cmd_diagnose(args) -> int:
    from latentzoo import arviz_adapter as azx
    from latentzoo import arviz_plots as azp
    from latentzoo.registry import families
    from latentzoo.results import staged_run_dir, writing
    from latentzoo.runs import is_point_fit, print_summary, read_run, summarise

    path = os.path.join(args.run_dir, "posterior.nc")
    idata, attrs = read_run(args.run_dir)
    _check_finite(idata, source=path)
    family = families().get(attrs.get("latentzoo_model"))
    sites = family.identified if family else tuple(idata.posterior.data_vars)
    table = summarise(idata, sites)
    title = f"{attrs.get('latentzoo_model', '?')} / {attrs.get('latentzoo_method', '?')}"
    if "latentzoo_data" in attrs:
        title += f" on {attrs['latentzoo_data']}"
    print_summary(table, title, attrs.get("latentzoo_seconds"))
    _convergence_warning(idata, table)
    _swap_rate_warning(idata)
    wrote, left_out = [], []
    present = [s for s in sites if s in idata.posterior.data_vars]
    chains = idata.posterior.sizes.get("chain", 1)
    with staged_run_dir(args.run_dir, role="diagnose") as stage:
        if is_point_fit(idata) or idata.posterior.sizes.get("draw", 1) < 2:
            left_out.append("rank.png: a point fit has one estimate, no draws to rank")
        elif chains < 2:
            left_out.append("rank.png: a rank plot compares chains and this run has one "
                            "(run with --chains 2 or more)")
        elif not present:
            left_out.append("rank.png: posterior.nc stores none of the model's identified quantities")
        else:  # every identified quantity (the widest shown by their worst entries)
            with warnings.catch_warnings(), writing(os.path.join(args.run_dir, "rank.png"), args.run_dir):
                warnings.simplefilter("ignore")
                azp.plot_rank(idata, os.path.join(stage, "rank.png"), var_names=present)
            wrote.append("rank.png")
        groups = azx.group_names(idata)
        if "posterior_predictive" in groups:  # what the run stored (replicates, a classifier's labels)
            sizes = idata.posterior_predictive.sizes
            num = min(100, int(sizes.get("chain", 1) * sizes.get("draw", 1)))
        elif family and family.posterior_predictive and "observed_data" in groups \
                and "X" in idata.observed_data:  # a run written before runs stored them
            try:
                replicated = family.posterior_predictive(idata)
            except KeyError as err:  # a file from elsewhere, or cut down: say what is missing
                replicated = None
                named = re.search(r"named '([^']+)'", str(err)) or re.search(r"'([^']+)'", str(err))
                left_out.append(f"ppc.png: posterior.nc lacks {named.group(1) if named else 'a site'}, "
                                f"which the {family.name} model's replicated data need")
            if replicated is not None:
                azx.add_posterior_predictive(idata, replicated)
            # a point fit has one replicate per draw
            num = 0 if replicated is None else min(100, int(replicated["X"].shape[1]))
        else:
            num = 0
            if family is None:
                left_out.append("ppc.png: posterior.nc names no model of the zoo to replicate data from")
            elif not family.posterior_predictive:
                left_out.append(f"ppc.png: the {family.name} model has no posterior predictive of its "
                                f"data table (see {family.docs})")
            else:
                left_out.append("ppc.png: posterior.nc holds no observed data X to compare with")
        if num:
            with writing(os.path.join(args.run_dir, "ppc.png"), args.run_dir):
                azp.plot_ppc(idata, os.path.join(stage, "ppc.png"), num_pp_samples=num)
            wrote.append("ppc.png")
    for why in left_out:
        print(f"no {why}")
    print(f"\nwrote {', '.join(os.path.join(args.run_dir, w) for w in wrote) or 'no plots'}")
    return 0


# ------------------------------------------------------------------------------ predict
def _cmd_predict(args) -> int:
    from latentzoo.predict import classify, predict, write_predictions

    data, y_true = args.data, None
    if args.labels:
        from latentzoo.data import load_array, load_labels

        data, y_true = load_array(args.data), load_labels(args.labels)
    result = predict(args.run_dir, data, labels_in_last_column=y_true is None, layout=args.layout)
    if result.restored is not None:
        table = write_predictions(args.out, result)
        task = f"inpainted ({result.imputed} missing pixels)" if result.imputed else "denoised"
        print(f"{len(table)} images {task} with {result.posterior_draws} posterior draws of the "
              f"dictionary; inferred noise sd: mean {table['noise_sd'].mean():.4g}")
        print("wrote " + ", ".join(os.path.join(args.out, f) for f in
                                   ("restored.npy", "restored.png", "predictions.nc", "predictions.csv")))
        return 0
    if result.positive_probability is not None:
        y_true = result.labels if y_true is None else y_true
        table = write_predictions(args.out, result, y_true)
        scores = classify(result, y_true)
        counts = ", ".join(f"{(table['predicted'] == v).sum()} as {v!r}" for v in result.label_values)
        line = f"{len(table)} rows classified ({counts}) over {result.posterior_draws} posterior draws"
        if y_true is not None:
            line += f"; accuracy {scores['accuracy']:.4f}, log loss {scores['log_loss']:.4f}"
        print(line)
        print(f"wrote {os.path.join(args.out, 'predictions.nc')}, "
              f"{os.path.join(args.out, 'predictions.csv')}")
        return 0
    table = write_predictions(args.out, result)
    lpd = result.log_predictive_density
    what = "log predictive density" if result.log_lik_kind == "exact" else \
        f"log predictive density ({result.log_lik_kind}: too many sources to sum out exactly)"
    print(f"{len(table)} rows: mean {what} {lpd.mean():.4f} per row "
          f"(sum {lpd.sum():.2f}) over {result.posterior_draws} posterior draws"
          + (f"; {result.imputed} missing entries imputed" if result.imputed else ""))
    print(f"wrote {os.path.join(args.out, 'predictions.nc')}, {os.path.join(args.out, 'predictions.csv')}")
    return 0


def entry() -> None:
    """The console script: :func:`main`, then exit with its status.

    After SIGINT or SIGTERM the process ends with ``os._exit`` once the sentence is out: XLA may
    still be compiling or running on its own threads (the signal arrived inside a compiled
    program or a compilation), and the interpreter's normal shutdown then tears those threads'
    state down under them, which ends in a segmentation fault instead of exit 128 + signal. The
    run's state on disk is already what the sentence says (its checkpoint, or nothing).
    """
    code = main()
    if code and "jax" in sys.modules and sys.modules["jax"].distributed.is_initialized():
        # a failed multi-process run: JAX's shutdown barrier would wait for processes that may
        # be gone (see latentzoo.inference.distributed.run_main)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    if code > 128:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    entry()
