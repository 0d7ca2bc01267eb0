"""``experiments/bench_conv_factor.py --quick`` runs, writes its JSON, and its NumPy sweep's
pieces agree with the JAX ones (a wrong NumPy baseline would make the speed ratio meaningless)."""

import json

from tests.experiments.marks import thorough_run


@thorough_run
def test_bench_conv_factor_quick_writes_json(load_experiment, tmp_path):
    bench = load_experiment("bench_conv_factor")
    out = tmp_path / "bench.json"
    bench.main(["--quick", "--json", str(out)])
    rec = json.loads(out.read_text())
    sw = rec["gibbs_sweep"]
    assert sw["jax_s_per_sweep_per_image"] > 0 and sw["numpy_s_per_sweep_per_image"] > 0
    assert max(sw["numpy_vs_jax_max_abs_diff"].values()) < 1e-8
    assert sw["correlation"]["max_abs_diff"] < 1e-10
    on = rec["online_vb"]
    assert on["images_per_s"] > 0 and [m["images_seen"] for m in on["memory"]] == [4, 8]
