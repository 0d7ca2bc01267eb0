"""The README's Python snippet runs as written (with fewer draws), from the repository root."""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _snippets():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    return re.findall(r"```python\n(.*?)```", text, re.S)


def test_readme_mcmc_snippet_runs_from_the_repository_root(tmp_path):
    code = next(s for s in _snippets() if "ConjugateGibbs" in s)
    code = code.replace("num_warmup=500, num_samples=1000, num_chains=4",
                        "num_warmup=20, num_samples=20, num_chains=2")
    code = "import matplotlib\nmatplotlib.use('Agg')\n" + code
    code = code.replace('"trace.png"', repr(str(tmp_path / "trace.png")))
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
