"""Python run from the repository root finds the whole namespace even when an installed copy is
not editable: the local ``latentzoo/`` folder shadows the installed package there, and it must
still reach ``models/`` and ``inference/``."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CODE = """
import sys
sys.meta_path[:] = [f for f in sys.meta_path if "Editable" not in repr(f)]  # as after `pip install .`
import latentzoo.models.factor_analysis, latentzoo.inference.fa, latentzoo.registry
assert latentzoo.models.factor_analysis.__file__.startswith(sys.argv[1])
print("ok")
"""


def test_imports_from_the_repository_root_without_the_editable_finder():
    proc = subprocess.run([sys.executable, "-c", CODE, ROOT], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
