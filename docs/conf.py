"""Sphinx configuration: MyST markdown pages + autodoc API reference (as NumPyro, BlackJAX, ArviZ)."""

import os
import sys

sys.path.insert(0, os.path.abspath(".."))

project = "latentzoo"
author = "latentzoo developers"
copyright = "2026, latentzoo developers"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
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
