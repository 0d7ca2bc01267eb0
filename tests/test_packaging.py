"""A regular install (`pip install .`) ships every subpackage: setuptools installs only the
packages pyproject.toml lists, and an editable install would hide a missing one."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDERS = {"latentzoo": "latentzoo", "models": "latentzoo.models", "inference": "latentzoo.inference"}


def _listed():
    text = open(os.path.join(ROOT, "pyproject.toml")).read()
    block = re.search(r"^packages = \[(.*?)\]", text, re.S | re.M).group(1)
    return set(re.findall(r'"([\w.]+)"', block))


def test_every_package_folder_is_listed_in_pyproject():
    found = set()
    for folder, name in FOLDERS.items():
        for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
            if "__init__.py" in files and "__pycache__" not in dirpath:
                rel = os.path.relpath(dirpath, os.path.join(ROOT, folder))
                found.add(name if rel == "." else f"{name}.{rel.replace(os.sep, '.')}")
    assert found - _listed() == set(), "add these to [tool.setuptools] packages"
