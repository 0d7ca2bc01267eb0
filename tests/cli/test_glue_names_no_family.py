"""The registry is the only place a family is named: the glue modules (CLI, runs, data kinds,
results, the ArviZ adapter, the registry itself) hold no family name and no site name of any
registered family in their string literals (the data site "X" is the zoo's convention)."""

import ast
import os

from latentzoo.registry import families

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GLUE = ["cli.py", "runs.py", "data.py", "results.py", "arviz_adapter.py", "arviz_plots.py", "registry.py"]


def _literals(path):
    tree = ast.parse(open(path, encoding="utf-8").read())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and node.body
        and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
    }
    return {
        (n.value, n.lineno) for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
    }


def test_glue_names_no_family_and_no_site():
    forbidden = set()
    for f in families().values():
        forbidden |= {f.name, *f.identified, *f.trace_sites}
    forbidden.discard("X")
    found = []
    for name in GLUE:
        path = os.path.join(ROOT, "latentzoo", name)
        found += [f"{name}:{line}: {value!r}" for value, line in _literals(path) if value in forbidden]
    assert found == []
