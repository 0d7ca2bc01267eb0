import importlib.util
import os
import sys

import pytest

_EXPERIMENTS = os.path.join(os.path.dirname(__file__), "..", "..", "experiments")


def _load(name):
    """Import experiments/<name>.py as a module (the folder is scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, os.path.abspath(os.path.join(_EXPERIMENTS, f"{name}.py")))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # a script's dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def load_experiment():
    return _load

