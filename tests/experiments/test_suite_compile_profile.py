"""experiments/suite_compile_profile.py: its recorder reads JAX's own compile log (so a change of
that log's wording shows up here, not as an empty profile), its summary adds and ranks what it
read, and a report with no records is one sentence."""

import json

import jax
import jax.numpy as jnp
import pytest


def test_the_recorder_reads_a_compilation_and_a_lowering_from_jax_s_log(load_experiment):
    mod = load_experiment("suite_compile_profile")
    recorder = mod.install()
    try:
        recorder.current = "tests/x.py::t"

        def profiled_program(x):
            return jnp.sin(x) * 3.0 + 0.123456  # a program no other test compiles

        jax.jit(profiled_program)(jnp.arange(7.0)).block_until_ready()
    finally:
        mod.uninstall(recorder)
    kinds = {kind for test, kind, name, s in recorder.rows if "profiled_program" in name}
    assert kinds == {"compile", "lower"}, recorder.rows
    assert all(test == "tests/x.py::t" and s >= 0 for test, _, _, s in recorder.rows)
    assert not jax.config.jax_log_compiles


def test_the_summary_adds_by_program_and_by_file_and_ranks_them(load_experiment, tmp_path):
    mod = load_experiment("suite_compile_profile")
    rows = [("a.py::t1", "compile", "jit(f)", 2.0), ("a.py::t2", "compile", "jit(f)", 1.0),
            ("b.py::t", "compile", "jit(g)", 4.0), ("a.py::t1", "lower", "jit(f)", 0.5)]
    for i, part in enumerate((rows[:2], rows[2:])):
        (tmp_path / f"r.{i}.json").write_text(json.dumps(part))
    s = mod.summarize(mod.read_rows(str(tmp_path / "r")))
    assert (s["compile_s"], s["lower_s"], s["compilations"]) == (7.0, 0.5, 3)
    assert s["programs"][0] == {"program": "jit(g)", "compile_s": 4.0, "count": 1}
    assert s["programs"][1] == {"program": "jit(f)", "compile_s": 3.0, "count": 2}
    assert s["files"] == [{"file": "b.py", "compile_s": 4.0, "lower_s": 0.0},
                          {"file": "a.py", "compile_s": 3.0, "lower_s": 0.5}]
    assert s["largest"][0]["test"] == "b.py::t"


def test_a_report_without_records_is_one_sentence(load_experiment, tmp_path, capsys):
    mod = load_experiment("suite_compile_profile")
    with pytest.raises(SystemExit) as done:
        mod.main(["--report", str(tmp_path / "none"), "--json", str(tmp_path / "out.json")])
    assert done.value.code == 2
    assert "no records found" in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists()
