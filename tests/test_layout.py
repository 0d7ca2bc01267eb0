"""The package layout rules of docs/architecture.md ("Layout"), enforced by reading the source.

Nothing here imports the modules it checks: every rule is read off the syntax tree (``ast``),
so a rule that is broken is reported even when the offending import would fail or be slow.

One import namespace over three folders (``[tool.setuptools.package-dir]`` in pyproject.toml)::

    latentzoo/  -> latentzoo            the glue
    models/     -> latentzoo.models     the NumPyro programs
    inference/  -> latentzoo.inference  the core (top-level files and the subpackages of
                                        CORE_SUBPACKAGES, grouped by kind) and one subpackage
                                        per family

Floors, bottom up: models <- inference core <- inference families <- glue <- experiments.

The rules:

1. No module imports another module's ``_private`` names: neither ``from X import _name`` nor
   ``X._name`` (nor ``getattr(X, "_name")``) where X is another latentzoo module. A private
   *module* (``pkg/_impl.py``) may be imported only from inside ``pkg``. The package folders,
   ``experiments/`` and ``tests/`` are all checked; nothing is exempt.
2. No import cycle among latentzoo modules. The graph has one edge per ``import``/``from``
   statement anywhere in a module (function-level imports included), relative imports
   resolved. Importing ``a.b.c`` is an edge to ``a.b.c`` only, not to the parent packages that
   Python also runs, so a package ``__init__`` that imports its own submodules makes no cycle
   unless a submodule imports the package back. Imports by computed name
   (``importlib.import_module(f"...")``, as the registry does for its entries) are not seen.
3. Floors: nothing under ``inference/`` or ``models/`` imports the glue (any ``latentzoo.X``
   with X not ``models``/``inference``; the bare ``latentzoo`` package is allowed);
   ``models/`` imports nothing from ``inference/``; the inference core (the top-level files of
   ``inference/``) imports no family subpackage; no family subpackage imports another.
4. ``jax_enable_x64`` is set in exactly one place, ``latentzoo/__init__.py`` (searched in the
   package folders, ``experiments/`` and ``tests/``), and no module in the package folders has a
   bare ``import latentzoo`` for its side effect (every one of them is inside ``latentzoo``,
   whose ``__init__`` has already run).

The checker takes the repository root as an argument; the ``test_checker_*`` tests at the
bottom plant each kind of violation in a small synthetic tree and make sure it is caught.
"""

from __future__ import annotations

import ast
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOP = "latentzoo"

# Folders that are not part of the import namespace but whose files are still checked by the
# rules that apply to any code (1: private names, 4: jax_enable_x64). Module names are given
# with these prefixes only so that messages can name them; they are never import targets.
OTHER_DIRS = {"experiments": "experiments", "tests": "tests"}


# --------------------------------------------------------------------------------------------
# Reading the tree


@dataclass
class Module:
    name: str                 # dotted import name, e.g. latentzoo.inference.fa.vb
    path: Path
    is_package: bool          # an __init__.py
    in_namespace: bool        # under latentzoo/, models/ or inference/ (not tests/experiments)
    root: Path = field(repr=False)
    tree: ast.Module = field(repr=False)
    lines: list[str] = field(repr=False)

    @property
    def package(self) -> str:
        return self.name if self.is_package else self.name.rpartition(".")[0]


@dataclass
class Import:
    module: Module
    lineno: int
    target: str               # the module the statement imports (resolved, dotted)
    name: str | None          # for `from target import name`: the name (None for `import x`)
    binds: str | None         # the local name bound to a module, if any
    bound_module: str | None  # ... and the module it is bound to


def package_dirs(root: Path) -> dict[str, Path]:
    """``[tool.setuptools.package-dir]`` of pyproject.toml: import prefix -> folder."""
    with open(root / "pyproject.toml", "rb") as f:
        conf = tomllib.load(f)
    mapping = conf["tool"]["setuptools"]["package-dir"]
    return {prefix: root / folder for prefix, folder in mapping.items() if prefix}


def _module_name(prefix: str, base: Path, path: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(base).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    if is_package:
        parts = parts[:-1]
    return ".".join([prefix, *parts]) if parts else prefix, is_package


def _py_files(folder: Path):
    for path in sorted(folder.rglob("*.py")):
        rel = path.relative_to(folder).parts
        if any(p.startswith(".") or p == "__pycache__" for p in rel):
            continue
        yield path


def load_modules(root: Path) -> dict[str, Module]:
    """Every .py file of the three package folders (and of experiments/, tests/), parsed."""
    roots = [(prefix, folder, True) for prefix, folder in package_dirs(root).items()]
    roots += [(prefix, root / folder, False) for prefix, folder in OTHER_DIRS.items()]
    # A package folder nested inside another one's folder belongs to the inner mapping only.
    inner = {folder for _, folder, _ in roots}
    modules: dict[str, Module] = {}
    for prefix, folder, in_namespace in roots:
        if not folder.is_dir():
            continue
        for path in _py_files(folder):
            if any(f != folder and f in path.parents and folder in f.parents for f in inner):
                continue
            name, is_package = _module_name(prefix, folder, path)
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source, filename=str(path))
            modules[name] = Module(name, path, is_package, in_namespace, root, tree,
                                   source.splitlines())
    return modules


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def resolve_from(module: Module, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    parts = module.package.split(".")
    if node.level - 1 > len(parts) - 1:
        raise ValueError(f"{rel(module)}:{node.lineno}: relative import beyond the top package")
    base = parts[: len(parts) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: Module, namespace: set[str]) -> list[Import]:
    """Every import statement of a module, anywhere in it, with its target resolved.

    ``namespace`` is the set of latentzoo module names: ``from pkg import x`` targets the
    submodule ``pkg.x`` when that is a module, the package ``pkg`` otherwise.
    """
    out: list[Import] = []
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    binds, bound = alias.asname, alias.name
                else:  # `import a.b.c` binds `a` to the top package
                    binds = alias.name.split(".")[0]
                    bound = binds
                out.append(Import(module, node.lineno, alias.name, None, binds, bound))
        elif isinstance(node, ast.ImportFrom):
            base = resolve_from(module, node)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in namespace:
                    out.append(Import(module, node.lineno, sub, alias.name,
                                      alias.asname or alias.name, sub))
                else:
                    out.append(Import(module, node.lineno, base, alias.name, None, None))
    return out


def rel(module: Module) -> str:
    return module.path.relative_to(module.root).as_posix()


def _ours(name: str) -> bool:
    return name == TOP or name.startswith(TOP + ".")


def _private_module_violation(target: str, importer: str) -> str | None:
    """A dotted module path with a ``_private`` segment, used from outside its package."""
    parts = target.split(".")
    for i, part in enumerate(parts):
        if _is_private(part):
            owner = ".".join(parts[:i])
            if importer != owner and not importer.startswith(owner + "."):
                return ".".join(parts[: i + 1])
    return None


# --------------------------------------------------------------------------------------------
# The rules; each returns a list of "file:line: message" strings


def private_name_violations(root: Path) -> list[str]:
    modules = load_modules(root)
    namespace = {m.name for m in modules.values() if m.in_namespace}
    found: list[str] = []
    for module in modules.values():
        imports = imports_of(module, namespace)
        bindings: dict[str, str] = {}
        for imp in imports:
            if not _ours(imp.target):
                continue
            where = f"{rel(module)}:{imp.lineno}"
            bad = _private_module_violation(imp.target, module.name)
            if bad:
                found.append(f"{where}: imports private module {bad}")
            elif imp.name is not None and imp.bound_module is None and _is_private(imp.name) \
                    and imp.target != module.name:
                found.append(f"{where}: imports private name {imp.name} from {imp.target}")
            if imp.binds and imp.bound_module and _ours(imp.bound_module):
                bindings[imp.binds] = imp.bound_module

        def module_of(expr: ast.expr) -> str | None:
            """The latentzoo module an expression like ``a.b.c`` names, if any."""
            if isinstance(expr, ast.Name):
                return bindings.get(expr.id)
            if isinstance(expr, ast.Attribute):
                base = module_of(expr.value)
                if base is not None and f"{base}.{expr.attr}" in namespace:
                    return f"{base}.{expr.attr}"
            return None

        for node in ast.walk(module.tree):
            owner = attr = None
            if isinstance(node, ast.Attribute) and _is_private(node.attr):
                owner, attr = module_of(node.value), node.attr
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id in {"getattr", "setattr", "hasattr", "delattr"}
                  and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
                  and isinstance(node.args[1].value, str) and _is_private(node.args[1].value)):
                owner, attr = module_of(node.args[0]), node.args[1].value
            if owner is None or owner == module.name:
                continue
            sub = f"{owner}.{attr}"
            if sub in namespace:
                bad = _private_module_violation(sub, module.name)
                if bad:
                    found.append(f"{rel(module)}:{node.lineno}: uses private module {bad}")
            else:
                found.append(f"{rel(module)}:{node.lineno}: uses private name {attr} of {owner}")
    return sorted(set(found))


def import_graph(root: Path) -> tuple[dict[str, Module], dict[str, dict[str, int]]]:
    """Edges module -> imported module (latentzoo modules only), with the first line number."""
    modules = {n: m for n, m in load_modules(root).items() if m.in_namespace}
    namespace = set(modules)
    graph: dict[str, dict[str, int]] = {name: {} for name in modules}
    for module in modules.values():
        for imp in imports_of(module, namespace):
            if imp.target in namespace and imp.target != module.name:
                edges = graph[module.name]
                edges[imp.target] = min(edges.get(imp.target, imp.lineno), imp.lineno)
    return modules, graph


def _strongly_connected(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan; the module graph is small, recursion is fine
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            components.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [c for c in components if len(c) > 1]


def _a_cycle(graph: dict[str, dict[str, int]], component: list[str]) -> list[str]:
    """One concrete cycle through the first module of a strongly connected component."""
    members = set(component)
    start = component[0]
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:  # breadth-first: the shortest cycle back to start
        nxt = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w not in members:
                    continue
                if w == start:  # walk back from v to start (no self-loops in the graph)
                    path = [v]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return [*reversed(path), start]
                if w not in parent:
                    parent[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError("a strongly connected component without a cycle")


def cycle_violations(root: Path) -> list[str]:
    modules, graph = import_graph(root)
    found = []
    for component in _strongly_connected(graph):
        cycle = _a_cycle(graph, component)
        steps = [f"{rel(modules[a])}:{graph[a][b]} ({a} -> {b})" for a, b in zip(cycle, cycle[1:])]
        found.append(f"import cycle among {', '.join(component)}: " + " ; ".join(steps))
    return found


#: Subpackages of ``inference/`` that belong to the core, grouped by kind as BlackJAX groups its
#: code (samplers built from the Gibbs tables, the conjugacy detector, data parallelism): they
#: import no family, and the core's top-level files may import them.
CORE_SUBPACKAGES = frozenset({"samplers", "conjugacy", "distributed"})


def _floor(name: str, families: set[str]) -> tuple[str, str | None]:
    """(floor, family) of a latentzoo module name."""
    parts = name.split(".")
    if len(parts) >= 2 and parts[1] == "models":
        return "models", None
    if len(parts) >= 2 and parts[1] == "inference":
        if len(parts) >= 3 and parts[2] in families:
            return "family", parts[2]
        return "core", None
    if name == TOP:
        return "top", None
    return "glue", None


def floor_violations(root: Path) -> list[str]:
    modules = {n: m for n, m in load_modules(root).items() if m.in_namespace}
    namespace = set(modules)
    inference = package_dirs(root)[f"{TOP}.inference"]
    families = {p.parent.relative_to(inference).parts[0] for p in _py_files(inference)
                if len(p.relative_to(inference).parts) > 1} - CORE_SUBPACKAGES
    found = []
    for module in modules.values():
        floor, family = _floor(module.name, families)
        if floor in {"glue", "top"}:
            continue
        for imp in imports_of(module, namespace):
            if not _ours(imp.target):
                continue
            target_floor, target_family = _floor(imp.target, families)
            where = f"{rel(module)}:{imp.lineno}"
            if target_floor == "glue":
                found.append(f"{where}: {floor} module {module.name} imports the glue "
                             f"({imp.target})")
            elif floor == "models" and target_floor in {"core", "family"}:
                found.append(f"{where}: models module {module.name} imports inference "
                             f"({imp.target})")
            elif floor == "core" and target_floor == "family":
                found.append(f"{where}: inference core module {module.name} imports family "
                             f"{target_family} ({imp.target})")
            elif floor == "family" and target_floor == "family" and target_family != family:
                found.append(f"{where}: family {family} ({module.name}) imports family "
                             f"{target_family} ({imp.target})")
    return sorted(found)


_X64 = "jax_enable_x64"
_SETTERS = {"update", "setdefault", "putenv", "__setitem__", "enable_x64", "disable_x64"}


def _is_x64(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) \
        and node.value.lower() == _X64


def x64_settings(root: Path) -> list[str]:
    """Every place that sets ``jax_enable_x64``: ``config.update("jax_enable_x64", ...)``,
    ``jax.config.jax_enable_x64 = ...``, ``os.environ["JAX_ENABLE_X64"] = ...`` (or
    ``setdefault``/``putenv``), and the ``jax.experimental.enable_x64``/``disable_x64``
    context managers. Reading the flag is not setting it."""
    found = []
    for module in load_modules(root).values():
        for node in ast.walk(module.tree):
            hit = False
            if isinstance(node, ast.Call):
                fn = node.func
                fname = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", None)
                if fname in {"enable_x64", "disable_x64"}:
                    hit = True
                elif fname in _SETTERS and node.args and _is_x64(node.args[0]):
                    hit = True
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    if isinstance(t, ast.Attribute) and t.attr.lower() == _X64:
                        hit = True
                    if isinstance(t, ast.Subscript) and _is_x64(t.slice):
                        hit = True
            if hit:
                found.append(f"{rel(module)}:{node.lineno}")
    return sorted(set(found))


def bare_import_violations(root: Path) -> list[str]:
    """``import latentzoo`` in a package module, kept only for its side effect: marked
    ``# noqa``, or the name ``latentzoo`` never used afterwards."""
    found = []
    for module in load_modules(root).values():
        if not module.in_namespace:
            continue
        used = {n.id for n in ast.walk(module.tree) if isinstance(n, ast.Name)}
        for node in ast.walk(module.tree):
            if not isinstance(node, ast.Import):
                continue
            for alias in node.names:
                if alias.name == TOP and alias.asname is None:
                    line = module.lines[node.lineno - 1]
                    if re.search(r"#\s*noqa", line) or TOP not in used:
                        found.append(f"{rel(module)}:{node.lineno}: {line.strip()}")
    return sorted(found)


# --------------------------------------------------------------------------------------------
# The tests on the repository


_NOT_PACKAGE = tuple(f"{folder}/" for folder in OTHER_DIRS.values())


def _report(found: list[str]) -> str:
    return "\n  " + "\n  ".join(found)


def test_no_private_names_across_package_modules():
    found = [f for f in private_name_violations(ROOT) if not f.startswith(_NOT_PACKAGE)]
    assert not found, "a package module uses another module's _private names:" + _report(found)


def test_no_private_names_in_tests_or_experiments():
    # Tests and experiments are held to the same rule (no exemption): a white-box test that
    # needs a helper should get it public (or test it through the public update it belongs to).
    found = [f for f in private_name_violations(ROOT) if f.startswith(_NOT_PACKAGE)]
    assert not found, "a test or experiment uses a latentzoo module's _private names:" \
        + _report(found)


def test_no_import_cycles():
    found = cycle_violations(ROOT)
    assert not found, "import cycles:" + _report(found)


def test_floors():
    found = floor_violations(ROOT)
    assert not found, "imports that break the floors (models <- core <- families <- glue):" \
        + _report(found)


def test_x64_set_once_in_package_init():
    found = x64_settings(ROOT)
    assert len(found) == 1 and found[0].startswith("latentzoo/__init__.py:"), \
        "jax_enable_x64 must be set exactly once, in latentzoo/__init__.py; set at:" \
        + _report(found or ["(nowhere)"])


def test_no_bare_import_latentzoo_in_package():
    found = bare_import_violations(ROOT)
    assert not found, "side-effect `import latentzoo` in package modules (the package " \
        "__init__ has already run):" + _report(found)


def test_layout_sees_the_package():
    """Guard against the checker silently scanning nothing (a moved folder, a renamed key)."""
    names = set(load_modules(ROOT))
    for expected in (TOP, f"{TOP}.models", f"{TOP}.inference", f"{TOP}.inference.gibbs"):
        assert expected in names


# --------------------------------------------------------------------------------------------
# The checker on planted violations


PYPROJECT = """\
[tool.setuptools.package-dir]
"latentzoo" = "latentzoo"
"latentzoo.models" = "models"
"latentzoo.inference" = "inference"
"""

CLEAN = {
    "latentzoo/__init__.py": 'import jax\njax.config.update("jax_enable_x64", True)\n',
    "latentzoo/data.py": "from latentzoo.inference.fa import fit\n",
    "latentzoo/cli.py": "def main():\n    from latentzoo import data\n    return data.x\n",
    "models/__init__.py": "",
    "models/shapes.py": "def _helper():\n    pass\n\ndef plate():\n    _helper()\n",
    "models/fa.py": "from .shapes import plate\nimport latentzoo.models.shapes as s\ns.plate\n",
    "inference/__init__.py": "",
    "inference/gibbs.py": "from latentzoo.models.fa import plate\n",
    "inference/_linalg.py": "def solve():\n    pass\n",
    "inference/updates.py": "from latentzoo.inference._linalg import solve\n",
    "inference/fa/__init__.py": "from latentzoo.inference.fa.em import fit\n",
    "inference/fa/em.py": "from ..gibbs import plate\nfrom . import vb\ndef fit():\n    pass\n",
    "inference/fa/vb.py": "from latentzoo.inference import gibbs\n",
    "inference/cvq/__init__.py": "",
    "inference/cvq/em.py": "import latentzoo\nprint(latentzoo.__version__)\n",
    "tests/__init__.py": "",
    "tests/test_x.py": "import latentzoo  # noqa: F401\nfrom latentzoo.inference.fa import em\n",
}


def _tree(tmp_path: Path) -> Path:
    (tmp_path / "pyproject.toml").write_text(PYPROJECT)
    for name, text in CLEAN.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def _plant(tmp_path: Path, path: str, text: str) -> Path:
    root = _tree(tmp_path)
    target = root / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    return root


def test_checker_passes_the_clean_tree(tmp_path):
    root = _tree(tmp_path)
    assert private_name_violations(root) == []
    assert cycle_violations(root) == []
    assert floor_violations(root) == []
    assert x64_settings(root) == ["latentzoo/__init__.py:2"]
    assert bare_import_violations(root) == []


@pytest.mark.parametrize("path,text", [
    ("latentzoo/cli.py", "from latentzoo.models.shapes import _helper\n"),
    ("tests/test_x.py", "def test():\n    from latentzoo.models.shapes import _helper\n"),
    ("inference/fa/vb.py", "from ..gibbs import plate as _p, _x\n"),
    ("latentzoo/data.py", "import latentzoo.models.shapes\nlatentzoo.models.shapes._helper()\n"),
    ("latentzoo/data.py", "from latentzoo.models import shapes as s\ns._helper()\n"),
    ("latentzoo/data.py", "from latentzoo import models\ngetattr(models.shapes, '_helper')\n"),
    ("latentzoo/data.py", "from latentzoo.inference._linalg import solve\n"),
    ("models/fa.py", "from latentzoo.inference import _linalg\n"),
])
def test_checker_catches_private_names(tmp_path, path, text):
    assert private_name_violations(_plant(tmp_path, path, text))


@pytest.mark.parametrize("path,text", [
    ("inference/fa/vb.py", "def f():\n    from latentzoo.inference.fa import fit\n"),
    ("inference/gibbs.py", "from latentzoo.inference.updates import solve\n"),
    ("inference/_linalg.py", "from .updates import solve as s\n"),
    ("models/shapes.py", "from .fa import plate\n"),
])
def test_checker_catches_cycles(tmp_path, path, text):
    root = _plant(tmp_path, path, text)
    if path == "inference/gibbs.py":  # updates -> _linalg; close the loop _linalg -> gibbs
        (root / "inference/_linalg.py").write_text("from latentzoo.inference import gibbs\n")
    assert cycle_violations(root)


@pytest.mark.parametrize("path,text", [
    ("models/fa.py", "from latentzoo import data\n"),
    ("models/fa.py", "from .. import data\n"),
    ("inference/gibbs.py", "def f():\n    import latentzoo.cli\n"),
    ("inference/fa/em.py", "from latentzoo.families.fa import ENTRY\n"),
    ("models/fa.py", "from latentzoo.inference.gibbs import x\n"),
    ("inference/updates.py", "from latentzoo.inference import fa\n"),
    ("inference/gibbs.py", "from .cvq.em import x\n"),
    ("inference/fa/em.py", "from latentzoo.inference.cvq import em\n"),
    ("inference/cvq/em.py", "from ..fa.vb import x\n"),
])
def test_checker_catches_floor_breaks(tmp_path, path, text):
    assert floor_violations(_plant(tmp_path, path, text))


@pytest.mark.parametrize("path,text", [
    ("inference/gibbs.py", 'import jax\njax.config.update("jax_enable_x64", True)\n'),
    ("experiments/run.py", 'import os\nos.environ["JAX_ENABLE_X64"] = "1"\n'),
    ("tests/test_x.py", "import jax\njax.config.jax_enable_x64 = True\n"),
    ("latentzoo/cli.py", "from jax.experimental import enable_x64\nwith enable_x64():\n    pass\n"),
    ("latentzoo/__init__.py", "import jax\n"),  # set nowhere
])
def test_checker_catches_x64_elsewhere(tmp_path, path, text):
    assert x64_settings(_plant(tmp_path, path, text)) != ["latentzoo/__init__.py:2"]


@pytest.mark.parametrize("path,text", [
    ("models/fa.py", "import latentzoo  # noqa: F401\n"),
    ("inference/gibbs.py", "import jax\nimport latentzoo\n"),
])
def test_checker_catches_bare_import(tmp_path, path, text):
    assert bare_import_violations(_plant(tmp_path, path, text))
