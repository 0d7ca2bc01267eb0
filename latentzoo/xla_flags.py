"""XLA's classic CPU emitters, where the installed jaxlib still offers them.

XLA's CPU backend compiles fused loops with its MLIR fusion emitters by default; jaxlib 0.10
still has the classic elemental emitters behind ``--xla_cpu_use_fusion_emitters=false`` (jaxlib
0.12 dropped the flag and its alternative). On this zoo's programs the classic ones compile
faster and run faster, measured on 2 cores: online FA at D = 10^6 streams 187 rows/s against
110, ``latentzoo run rank-svm --method gibbs --quick`` takes 44 s against 51, and the test suite
compiles 35-40 % faster. The arithmetic is IEEE either way.

:func:`use_classic_cpu_emitters` adds the flag to ``XLA_FLAGS`` when that is safe: the flag is
not set already, ``LATENTZOO_XLA_CLASSIC_EMITTERS`` is not ``0``, and this jaxlib accepts it. An
unknown flag in ``XLA_FLAGS`` aborts the process, so acceptance is asked of a throwaway
interpreter once per jaxlib version and remembered in the user's cache folder
(``$XDG_CACHE_HOME/latentzoo``, by default ``~/.cache/latentzoo``). XLA reads ``XLA_FLAGS`` when
JAX first creates its CPU client, so the flag takes effect only if nothing has computed with JAX
before ``import latentzoo`` (and then it applies to the whole process, as any XLA flag does).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

__all__ = ["CLASSIC_EMITTERS", "use_classic_cpu_emitters", "xla_accepts"]

CLASSIC_EMITTERS = "--xla_cpu_use_fusion_emitters=false"


def _cache_file(name: str) -> str:
    home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(home, "latentzoo", name)


def _jaxlib_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("jaxlib")
    except PackageNotFoundError:
        return "unknown"


def xla_accepts(flag: str) -> bool:
    """Whether this jaxlib's XLA knows ``flag`` (e.g. ``--xla_cpu_use_fusion_emitters=false``):
    a throwaway interpreter computes one array under it, once per jaxlib version; the answer is
    kept in the cache folder (not kept where that folder cannot be written)."""
    path = _cache_file(f"xla-flags-jaxlib-{_jaxlib_version()}.json")
    try:
        with open(path, encoding="utf-8") as fh:
            known = json.load(fh)
    except (OSError, ValueError):
        known = {}
    if not isinstance(known, dict):
        known = {}
    if flag in known:
        return bool(known[flag])
    code = "import jax.numpy as jnp; jnp.zeros(1).block_until_ready()"
    env = {**os.environ, "XLA_FLAGS": flag, "JAX_PLATFORMS": "cpu",
           "LATENTZOO_XLA_CLASSIC_EMITTERS": "0"}
    try:
        ok = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            timeout=120).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False  # not remembered: the next import asks again
    known[flag] = ok
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(known, fh)
        os.replace(tmp, path)
    except OSError:
        pass
    return ok


def use_classic_cpu_emitters() -> bool:
    """Add :data:`CLASSIC_EMITTERS` to ``XLA_FLAGS`` where safe (module docstring); returns
    whether ``XLA_FLAGS`` now asks for the classic emitters."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_cpu_use_fusion_emitters" in flags:
        return CLASSIC_EMITTERS in flags.split()
    if os.environ.get("LATENTZOO_XLA_CLASSIC_EMITTERS") == "0" or not xla_accepts(CLASSIC_EMITTERS):
        return False
    os.environ["XLA_FLAGS"] = f"{flags} {CLASSIC_EMITTERS}".strip()
    return True
