"""Every script in ``experiments/`` imports and answers ``--help``: a script whose import broke
(``bench_binary_latent.py`` imported a module that had moved, and nothing noticed) fails here.
The scripts' quick runs are tested beside them where they fit the suite's budget."""

from __future__ import annotations

import contextlib
import io
import os

import pytest

_EXPERIMENTS = os.path.join(os.path.dirname(__file__), "..", "..", "experiments")
SCRIPTS = sorted(f[:-3] for f in os.listdir(_EXPERIMENTS) if f.endswith(".py") and not f.startswith("_"))


def test_the_list_is_not_empty():
    assert len(SCRIPTS) >= 25, SCRIPTS


@pytest.mark.parametrize("name", SCRIPTS)
def test_script_imports_and_answers_help(name, load_experiment):
    mod = load_experiment(name)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
        mod.main(["--help"])
    assert done.value.code == 0
    assert "usage:" in out.getvalue()
