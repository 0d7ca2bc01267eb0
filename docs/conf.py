"""Sphinx configuration: MyST markdown pages + autodoc API reference (as NumPyro, BlackJAX, ArviZ)."""

import importlib

# No sys.path entry for the repository root: the package is one import namespace over three
# folders (latentzoo/, models/, inference/; see architecture.md "Layout"), which only an
# install provides (CI builds after `pip install -e ".[docs]"`). The root on sys.path would
# let the bare latentzoo/ folder hide the installed package.

project = "latentzoo"
author = "latentzoo developers"
copyright = "2026, latentzoo developers"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx-mathjax-offline",  # MathJax copied into _static: maths renders with no network
    "sphinx.ext.viewcode",
]
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence"]
myst_heading_anchors = 3
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build"]
autodoc_member_order = "bysource"
autodoc_typehints = "none"
napoleon_google_docstring = True
napoleon_use_ivar = True  # NamedTuple fields: avoid duplicate attribute entries
suppress_warnings = ["myst.header"]
html_theme = "furo"
html_title = "latentzoo"


def _list_reexports(app, what, name, obj, options, lines):
    """A package whose ``__init__`` re-exports its submodules' API (``__all__``) gets, after
    its docstring, the list of those names linked to where they are documented (their
    submodule's entry in api.md), instead of a second copy of every docstring."""
    if what != "module" or not hasattr(obj, "__path__") or not hasattr(obj, "__all__"):
        return
    entries = []
    for public in obj.__all__:
        member = getattr(obj, public, None)
        home = getattr(member, "__module__", None)
        if isinstance(home, str) and home.startswith(name + ".") \
                and getattr(importlib.import_module(home), public, None) is member:
            entries.append(f":py:obj:`~{home}.{public}`")
    if entries:
        lines.extend(["", "Re-exported here (import them from this package): "
                      + ", ".join(entries) + ".", ""])


def setup(app):
    app.connect("autodoc-process-docstring", _list_reexports)

