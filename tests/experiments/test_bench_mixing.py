"""experiments/bench_mixing.py: what it cannot run is one sentence and exit 2, and the child
process really switches a table's moves off (the variant the ratios are taken against)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.parametrize("argv, phrase", [
    # cfa has no variants there; a family that has them would run at the defaults (noca's
    # two took 45 minutes before this case named cfa)
    (["--only", "cfa"], "without variants here"),
    (["--chains", "1"], "--chains must be at least 2"),
])
def test_bad_input_is_one_sentence(load_experiment, capsys, argv, phrase, tmp_path):
    mod = load_experiment("bench_mixing")
    with pytest.raises(SystemExit) as done:
        mod.main([*argv, "--json", str(tmp_path / "out.json")])
    err = capsys.readouterr().err.strip()
    assert done.value.code == 2 and phrase in err and "\n" not in err
    assert not (tmp_path / "out.json").exists()


def test_the_child_switches_the_moves_off(load_experiment):
    # the child's patch, run without the command line: the table it leaves has no moves
    mod = load_experiment("bench_mixing")
    code = mod._CHILD.split("from latentzoo.cli import main")[0] + (
        "import latentzoo.inference.mfa as m\n"
        "print(json.dumps([u.name for u in m.mfa_updates()]))\n")
    plain = json.dumps(["latentzoo.inference.mfa", "mfa_updates", {"interweave": False}])
    names = json.loads(subprocess.run([sys.executable, "-c", code, "[]", plain], capture_output=True,
                                      text=True, check=True).stdout)
    assert names and not any("interweaving" in n for n in names), names
    names = json.loads(subprocess.run([sys.executable, "-c", code, "[]", "null"], capture_output=True,
                                      text=True, check=True).stdout)
    assert sum("interweaving" in n for n in names) == 2, names
