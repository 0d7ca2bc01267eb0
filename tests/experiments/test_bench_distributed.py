"""``experiments/bench_distributed.py``: it reads the all-reduces off a compiled module's HLO,
prints its table from the cells, and bad arguments are one sentence. (The quick run takes about
75 s on 2 busy cores: run with LATENTZOO_THOROUGH=1; its numbers are in docs/distributed.md.)"""

import json

import pytest

from tests.experiments.marks import thorough_run


def test_allreduces_are_read_off_the_hlo(load_experiment):
    bench = load_experiment("bench_distributed")
    hlo = ("%all-reduce.22 = (f64[20,3]{1,0}, f64[3,3]{1,0}, f64[]) all-reduce(%dot.6, %dot.7, %r), "
           "channel_id=1\n  %x = f64[4]{0} add(%a, %b)\n"
           "%all-reduce.3 = f64[3]{0} all-reduce(%reduce.9), channel_id=4\n")
    assert bench.allreduce_shapes(hlo) == [[("f64", (20, 3)), ("f64", (3, 3)), ("f64", ())],
                                           [("f64", (3,))]]
    assert bench.allreduce_shapes("%y = f64[2] multiply(%a, %b)") == []


def test_the_table_has_one_row_per_device_count(load_experiment):
    bench = load_experiment("bench_distributed")
    cell = {"devices": 1, "rows": 10, "gibbs_s": 0.1, "gibbs_rows_per_s": 100.0, "gibbs_allreduces": 0,
            "gibbs_allreduce_s": 0.0, "gibbs_comm_share": 0.0, "em_s": 0.01, "em_rows_per_s": 1000.0,
            "em_allreduces": 0, "em_allreduce_s": 0.0, "em_comm_share": 0.0}
    two = {**cell, "devices": 2, "rows": 20, "gibbs_s": 0.3, "em_s": 0.02}
    text = bench.table([cell, two, {"devices": 4, "error": "boom"}])
    rows = text.splitlines()[2:]
    assert len(rows) == 3 and "3.00" in rows[1] and "2.00" in rows[1] and rows[2].endswith("failed: boom")


@pytest.mark.parametrize("argv, words", [
    (["--devices", "0"], "--devices must name positive device counts"),
    (["--factors", "20", "--features", "20"], "--factors (20) must be smaller than --features (20)"),
    (["--steps", "0"], "--steps must be at least 1"),
])
def test_bad_arguments_are_one_sentence(load_experiment, capsys, argv, words):
    bench = load_experiment("bench_distributed")
    with pytest.raises(SystemExit) as done:
        bench.main(argv)
    assert done.value.code == 2
    assert words in capsys.readouterr().err


@thorough_run
def test_quick_run_writes_the_table_and_json(load_experiment, tmp_path, capsys):
    bench = load_experiment("bench_distributed")
    out = bench.main(["--quick", "--devices", "1,2", "--json", str(tmp_path / "b.json")])
    assert [c["devices"] for c in out["cells"]] == [1, 2]
    assert all("error" not in c for c in out["cells"])
    assert out["cells"][1]["gibbs_allreduces"] >= 1
    assert json.loads((tmp_path / "b.json").read_text())["cells"][0]["rows"] == 500
