"""docs/api.md documents every public module of the package, and nothing that is gone.

A public module is any .py file under the three package folders (latentzoo/, models/,
inference/; the mapping is pyproject.toml's ``[tool.setuptools.package-dir]``) with no path
component starting with ``_`` (package ``__init__``s count, as their package). The modules are
discovered when the test runs, so a new module fails this test until it has an
``.. automodule::`` entry in docs/api.md. Nothing is imported; the Sphinx build (CI:
``sphinx -W``) checks that each entry imports and renders.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
API = ROOT / "docs" / "api.md"
AUTOMODULE = re.compile(r"^\s*\.\.\s+automodule::\s+(\S+)\s*$", re.MULTILINE)


def public_modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted name -> file of every public module of the package folders."""
    with open(root / "pyproject.toml", "rb") as f:
        mapping = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    folders = {prefix: root / folder for prefix, folder in mapping.items() if prefix}
    found: dict[str, Path] = {}
    for prefix, folder in folders.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if "__pycache__" in path.parts or any(p.startswith((".", "_")) for p in parts):
                continue
            # A folder mapped to its own prefix (a nested package-dir) is that prefix's.
            if any(other != folder and folder in other.parents and other in path.parents
                   for other in folders.values()):
                continue
            found[".".join([prefix, *parts])] = path
    return found


def documented_modules(text: str) -> list[str]:
    return AUTOMODULE.findall(text)


def test_discovers_the_package():
    names = public_modules()
    for expected in ("latentzoo", "latentzoo.models", "latentzoo.inference",
                     "latentzoo.inference.gibbs"):
        assert expected in names


def test_every_public_module_is_in_api_md():
    documented = set(documented_modules(API.read_text(encoding="utf-8")))
    missing = {name: path for name, path in public_modules().items() if name not in documented}
    assert not missing, "public modules with no `.. automodule::` entry in docs/api.md:\n  " + \
        "\n  ".join(f"{name}  ({path.relative_to(ROOT)})" for name, path in sorted(missing.items()))


def test_api_md_names_only_existing_modules_once():
    documented = documented_modules(API.read_text(encoding="utf-8"))
    modules = public_modules()
    stale = sorted(set(documented) - set(modules))
    assert not stale, "docs/api.md documents modules that are not (or no longer) public " \
        "modules of the package:\n  " + "\n  ".join(stale)
    twice = sorted({name for name in documented if documented.count(name) > 1})
    assert not twice, "documented more than once in docs/api.md: " + ", ".join(twice)


def test_the_check_sees_a_new_module(tmp_path):
    """The discovery is not a fixed list: a planted module shows up, a private one does not."""
    (tmp_path / "pyproject.toml").write_text(
        '[tool.setuptools.package-dir]\n"latentzoo" = "latentzoo"\n'
        '"latentzoo.inference" = "inference"\n')
    for name in ("latentzoo/__init__.py", "latentzoo/new.py", "latentzoo/_hidden.py",
                 "latentzoo/_priv/__init__.py", "latentzoo/_priv/mod.py",
                 "inference/__init__.py", "inference/ta/__init__.py", "inference/ta/em.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    assert sorted(public_modules(tmp_path)) == [
        "latentzoo", "latentzoo.inference", "latentzoo.inference.ta",
        "latentzoo.inference.ta.em", "latentzoo.new"]
    assert documented_modules(".. automodule:: latentzoo.new\n   :members:\n") == ["latentzoo.new"]


def test_no_page_or_docstring_holds_a_control_character():
    """A backslash lost in an edit (``"\\beta"`` written from a Python string) leaves a backspace
    or bell character in the text, which Markdown and MathJax render as a missing letter
    ("$eta = 1$", "pprox"): two pages had them. Tabs, newlines and carriage returns are fine."""
    bad = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f]")
    files = [*(ROOT / "docs").rglob("*.md"), ROOT / "README.md", *public_modules().values()]
    found = {str(p.relative_to(ROOT)): len(bad.findall(p.read_text(encoding="utf-8"))) for p in files}
    assert {p: n for p, n in found.items() if n} == {}
