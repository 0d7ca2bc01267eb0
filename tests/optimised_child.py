"""Run-bound checks in a child interpreter that compiles with XLA's optimisation on.

The test session compiles at XLA's optimisation level 0 (tests/conftest.py): most tests are
compile-bound, and level 0 compiles faster. A check that runs hundreds of compiled steps (EM
sweeps, online steps) is run-bound instead, and level-0 code made such checks 2-5x slower
(measured: NOCA's 40-row MAP-EM check 38 s in the session's process, 17 s in a child; online
convolutional FA 164 s against 35 s). ``run_optimised`` runs Python source in a fresh interpreter
from the repository root, with the suite's other settings (its JAX cache among them) and XLA's
default optimisation, and returns the JSON its code printed after ``RESULT``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def optimised_env() -> dict:
    """The test session's environment without its XLA optimisation level."""
    flags = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split()
                     if "xla_backend_optimization_level" not in f)
    return {**os.environ, "XLA_FLAGS": flags, "LATENTZOO_TEST_XLA_OPT": "1"}


def run_optimised(code: str, timeout: float = 900) -> tuple[object, str]:
    """Run ``code`` (it prints ``RESULT <json>`` once) in a child interpreter compiled with XLA's
    optimisation on; returns (the parsed JSON, the child's stdout). A child that fails or prints
    no result fails the calling test with its stderr's tail."""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=optimised_env(), cwd=ROOT, timeout=timeout)
    lines = [line for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    assert r.returncode == 0 and lines, r.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):]), r.stdout
