"""A regular install (`pip install .`) ships every subpackage: setuptools installs only the
packages it is given, an editable install would hide a missing one, and setup.py is what finds
them below the three mapped folders."""

import os
import runpy
from unittest import mock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDERS = {"latentzoo": "latentzoo", "models": "latentzoo.models", "inference": "latentzoo.inference"}


def _packages_setup_gives():
    with mock.patch("setuptools.setup") as setup:
        cwd = os.getcwd()
        os.chdir(ROOT)
        try:
            runpy.run_path(os.path.join(ROOT, "setup.py"))
        finally:
            os.chdir(cwd)
    return set(setup.call_args.kwargs["packages"])


def test_setup_finds_every_package_folder():
    found = set()
    for folder, name in FOLDERS.items():
        for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
            if "__init__.py" in files and "__pycache__" not in dirpath:
                rel = os.path.relpath(dirpath, os.path.join(ROOT, folder))
                found.add(name if rel == "." else f"{name}.{rel.replace(os.sep, '.')}")
    assert "latentzoo.inference.fa" in found and "latentzoo.families" in found
    assert found == _packages_setup_gives()
