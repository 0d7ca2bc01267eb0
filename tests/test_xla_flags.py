"""`import latentzoo` asks XLA for its classic CPU emitters only where that is safe: the jaxlib
accepts the flag (an unknown XLA flag aborts the process), the user has not set it or opted
out; the answer is asked once per jaxlib version and remembered."""

import os
import subprocess
import sys

import pytest

from latentzoo import xla_flags


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path


def test_an_unknown_flag_is_refused_and_the_answer_is_remembered(fresh_cache, monkeypatch):
    assert xla_flags.xla_accepts("--xla_no_such_flag_in_any_jaxlib=1") is False
    calls = []
    real = subprocess.run
    monkeypatch.setattr(xla_flags.subprocess, "run", lambda *a, **k: calls.append(a) or real(*a, **k))
    assert xla_flags.xla_accepts("--xla_no_such_flag_in_any_jaxlib=1") is False
    assert calls == []  # read from the cache file, no second interpreter
    (path,) = (fresh_cache / "latentzoo").glob("xla-flags-jaxlib-*.json")
    assert "xla_no_such_flag_in_any_jaxlib" in path.read_text()


def test_a_known_flag_is_accepted(fresh_cache):
    assert xla_flags.xla_accepts("--xla_backend_optimization_level=1") is True


@pytest.mark.parametrize("env, expect_flag", [
    ({"LATENTZOO_XLA_CLASSIC_EMITTERS": "0"}, False),  # opted out: XLA_FLAGS untouched
    ({"XLA_FLAGS": "--xla_cpu_use_fusion_emitters=true"}, False),  # the user's own choice stays
])
def test_the_users_choice_wins(fresh_cache, monkeypatch, env, expect_flag):
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    monkeypatch.delenv("LATENTZOO_XLA_CLASSIC_EMITTERS", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    before = os.environ.get("XLA_FLAGS")
    assert xla_flags.use_classic_cpu_emitters() is expect_flag
    assert os.environ.get("XLA_FLAGS") == before


def test_import_sets_the_flag_exactly_when_the_jaxlib_accepts_it(fresh_cache):
    """A fresh interpreter (the suite's own XLA_FLAGS removed): after `import latentzoo` the flag
    is in XLA_FLAGS iff a probe accepts it, and computing works either way (never an abort)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("XLA_FLAGS", "LATENTZOO_XLA_CLASSIC_EMITTERS")}
    env["XDG_CACHE_HOME"] = str(fresh_cache)
    code = ("import os, latentzoo, jax.numpy as jnp; float(jnp.ones(3).sum()); "
            "print('FLAGS', os.environ.get('XLA_FLAGS', ''))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    flags = [line for line in out.stdout.splitlines() if line.startswith("FLAGS")][-1]
    assert (xla_flags.CLASSIC_EMITTERS in flags) == xla_flags.xla_accepts(xla_flags.CLASSIC_EMITTERS)
