"""The zoo tables in the README and the docs are the registry's (generated, and kept in step)."""

import os

from latentzoo.cli import zoo_table
from latentzoo.registry import families

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _read(*parts):
    with open(os.path.join(ROOT, *parts), encoding="utf-8") as fh:
        return fh.read()


def test_readme_and_docs_zoo_tables_are_the_registry_table():
    table = zoo_table(markdown=True)
    for doc in (("README.md",), ("docs", "zoo.md")):
        assert table in _read(*doc), f"regenerate the zoo table in {os.path.join(*doc)}"


def test_every_family_has_its_docs_page():
    for family in families().values():
        assert family.docs and os.path.exists(os.path.join(ROOT, "docs", family.docs)), family.name
