"""Marks shared by the experiment tests."""

import os

import pytest

# The longest quick runs of experiment scripts (40-180 s each on two busy cores, compiling their
# fits) run with LATENTZOO_THOROUGH=1: in the default suite every script is imported and answers
# --help (test_every_script.py), and what they compute is tested in tests/inference.
thorough_run = pytest.mark.skipif(os.environ.get("LATENTZOO_THOROUGH") != "1",
                                  reason="a long experiment run: set LATENTZOO_THOROUGH=1")
