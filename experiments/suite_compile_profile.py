"""Benchmark: where the test suite's time goes to compiling. Runs pytest with this file as a
plugin that records every XLA compilation and every jaxpr-to-MLIR lowering JAX logs, each with
the test that caused it, then prints the totals by program, by test file and the largest single
programs, and writes JSON.

    python experiments/suite_compile_profile.py [--cold] [--json OUT] [-- PYTEST ARGS ...]
    python experiments/suite_compile_profile.py --report PREFIX [--json OUT]

``--cold`` gives the run an empty compilation cache (a temporary ``XDG_CACHE_HOME``), as a fresh
CI machine has. The pytest arguments default to the whole suite (``tests``); the records go to
``PREFIX.<pid>.json``, one file per test process, and ``--report`` summarises them again.

What is and is not counted: a compilation is JAX's "Finished XLA compilation" line, which
includes a persistent-cache hit's (short) load; a lowering is its "jaxpr to MLIR module
conversion" line, paid on every call that is not in the in-memory cache, hits included. Only the
pytest processes are recorded: the CLI tests' child interpreters compile too, unrecorded.
Measured on 2026-11-29 (docs/scaling.md, "The test suite's time"): a cold 3.11 suite on 2
workers spent 1539 s compiling and 495 s lowering, about half of its 3987 worker-seconds.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import logging
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _binary_common import usage_error, write_json  # noqa: E402

SCRIPT = "suite_compile_profile.py"
ENV_PREFIX = "LATENTZOO_COMPILE_PROFILE"  # where the plugin writes its records
_LINE = re.compile(r"Finished (XLA compilation|jaxpr to MLIR module conversion) (?:of )?(.*?) in ([0-9.eE+-]+) sec")
_KIND = {"XLA compilation": "compile", "jaxpr to MLIR module conversion": "lower"}
_LOGGERS = ("jax._src.dispatch", "jax._src.interpreters.pxla", "jax._src.pjit", "jax._src.compiler")


# ------------------------------------------------------------------------- the recorder
class Recorder(logging.Handler):
    """A logging handler on JAX's loggers: ``rows`` gets ``(test, kind, program, seconds)`` for
    every compilation ("compile") and lowering ("lower") JAX reports; ``test`` is ``current``."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.rows: list[tuple[str, str, str, float]] = []
        self.current = "<collection>"

    def emit(self, record):
        match = _LINE.search(record.getMessage())
        if match:
            self.rows.append((self.current, _KIND[match.group(1)], match.group(2)[:80], float(match.group(3))))


def install() -> Recorder:
    """Turn on JAX's compile log and route it to a new :class:`Recorder` (not to the console)."""
    import jax

    recorder = Recorder()
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        logger.addHandler(recorder)
        logger.propagate = False
    jax.config.update("jax_log_compiles", True)
    return recorder


def uninstall(recorder: Recorder) -> None:
    import jax

    jax.config.update("jax_log_compiles", False)
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        logger.removeHandler(recorder)
        logger.propagate = True


# ---------------------------------------------------------------- pytest plugin hooks
_RECORDER: Recorder | None = None


def pytest_configure(config):
    global _RECORDER
    if os.environ.get(ENV_PREFIX):
        _RECORDER = install()


def pytest_runtest_setup(item):
    if _RECORDER is not None:
        _RECORDER.current = item.nodeid


def pytest_unconfigure(config):
    if _RECORDER is not None and _RECORDER.rows:
        with open(f"{os.environ[ENV_PREFIX]}.{os.getpid()}.json", "w", encoding="utf-8") as f:
            json.dump(_RECORDER.rows, f)


# ----------------------------------------------------------------------------- report
def summarize(rows, top: int = 15) -> dict:
    """Totals by kind, and the top ``top`` programs (compile seconds and count), test files
    (compile and lowering seconds) and single compilations."""
    seconds = collections.Counter()
    program_s, program_n = collections.Counter(), collections.Counter()
    file_compile, file_lower = collections.Counter(), collections.Counter()
    for test, kind, program, s in rows:
        seconds[kind] += s
        path = test.split("::")[0]
        if kind == "compile":
            program_s[program] += s
            program_n[program] += 1
            file_compile[path] += s
        else:
            file_lower[path] += s
    singles = sorted((r for r in rows if r[1] == "compile"), key=lambda r: -r[3])[:top]
    return {
        "compile_s": round(seconds["compile"], 1),
        "lower_s": round(seconds["lower"], 1),
        "compilations": sum(program_n.values()),
        "programs": [{"program": p, "compile_s": round(s, 1), "count": program_n[p]}
                     for p, s in program_s.most_common(top)],
        "files": [{"file": f, "compile_s": round(s, 1), "lower_s": round(file_lower[f], 1)}
                  for f, s in file_compile.most_common(top)],
        "largest": [{"program": p, "compile_s": round(s, 1), "test": t} for t, _, p, s in singles],
    }


def read_rows(prefix: str) -> list:
    paths = sorted(glob.glob(f"{prefix}.*.json"))
    if not paths:
        usage_error(SCRIPT, f"no records found at {prefix}.*.json.")
    rows = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            rows += [tuple(r) for r in json.load(f)]
    return rows


def print_summary(summary: dict) -> None:
    print(f"compiling {summary['compile_s']} s in {summary['compilations']} compilations; "
          f"lowering {summary['lower_s']} s")
    print(f"\n{'compile s':>10} {'count':>6}  program")
    for r in summary["programs"]:
        print(f"{r['compile_s']:>10.1f} {r['count']:>6}  {r['program']}")
    print(f"\n{'compile s':>10} {'lower s':>8}  test file")
    for r in summary["files"]:
        print(f"{r['compile_s']:>10.1f} {r['lower_s']:>8.1f}  {r['file']}")
    print(f"\n{'compile s':>10}  largest single programs")
    for r in summary["largest"]:
        print(f"{r['compile_s']:>10.1f}  {r['program']}  {r['test']}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cold", action="store_true", help="an empty compilation cache for the run")
    p.add_argument("--report", metavar="PREFIX", help="summarise the records at PREFIX.*.json; run nothing")
    p.add_argument("--json", default=os.path.join("runs", "suite_compile_profile.json"))
    p.add_argument("pytest_args", nargs="*", help="after --: pytest's arguments (default: tests)")
    args = p.parse_args(argv)
    if args.report:
        rows = read_rows(args.report)
    else:
        work = tempfile.mkdtemp(prefix="compile-profile-")
        prefix = os.path.join(work, "records")
        here = os.path.dirname(os.path.abspath(__file__))
        env = {**os.environ, ENV_PREFIX: prefix,
               "PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
        if args.cold:
            env["XDG_CACHE_HOME"] = os.path.join(work, "cache")
            env.pop("JAX_COMPILATION_CACHE_DIR", None)
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "suite_compile_profile",
               *(args.pytest_args or ["tests"])]
        code = subprocess.run(cmd, env=env).returncode
        print(f"pytest exited with {code}; records in {prefix}.*.json")
        rows = read_rows(prefix)
    summary = summarize(rows)
    print_summary(summary)
    write_json(args.json, {"script": SCRIPT, "cold": bool(args.cold), **summary})
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
