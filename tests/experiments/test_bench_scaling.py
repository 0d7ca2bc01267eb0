"""``experiments/bench_scaling.py``: its data match each family's data kind and size, it sums
JAX's logged compile seconds and counts the sweeps a point fit ran, and bad arguments are one
sentence. (Its cells run the CLI for minutes each; the numbers are in docs/scaling.md.)"""

import numpy as np
import pytest


def test_data_of_every_kind_has_the_cells_size(load_experiment, tmp_path):
    bench = load_experiment("bench_scaling")
    X = np.load(bench.make_data("fa", (30, 7), str(tmp_path)))
    assert X.shape == (30, 7) and np.all(X[:, 0] == X[0, 0])  # a constant column
    B = np.load(bench.make_data("noca", (40, 9), str(tmp_path)))
    assert B.shape == (40, 9) and set(np.unique(B)) <= {0, 1} and B.sum(0).min() > 0
    L = np.load(bench.make_data("rank-svm", (20, 5), str(tmp_path)))
    assert L.shape == (20, 6) and set(np.unique(L[:, -1])) == {0, 1}
    assert np.load(bench.make_data("cfa", (2, 8, 9), str(tmp_path))).shape == (2, 8, 9)


def test_compile_seconds_are_summed_from_jax_s_log(load_experiment):
    bench = load_experiment("bench_scaling")
    text = ("WARNING:jax._src.dispatch:Finished tracing + transforming jit(f) for pjit in 0.5 sec\n"
            "WARNING:jax._src.interpreters.pxla:Finished jaxpr to MLIR module conversion "
            "jit(f) in 0.25 sec\n"
            "WARNING:jax._src.dispatch:Finished XLA compilation of jit(_fori_collect_loop) in "
            "12.0 sec\nsample: 100%|##| 100/100 [01:11<00:00, 1.4it/s]\nfitted in 80.0 s")
    assert bench.compile_seconds(text) == pytest.approx(12.75)
    assert bench.compile_seconds("no log here") == 0.0


def test_a_point_fit_s_sweeps_are_read_off_its_bar(load_experiment):
    """A fit that converged early ran fewer sweeps than it was allowed: the cost per sweep is
    over those it ran (tqdm draws bars with carriage returns)."""
    bench = load_experiment("bench_scaling")
    text = "CAVI:  10%|#| 20/200 [00:01<00:09]\rCAVI:  37%|###| 74/200 [00:03<00:05, ELBO=-3.2]"
    assert bench._sweeps_run(text, 200) == 74
    assert bench._sweeps_run("MCEM: 100%|##| 10/10 [00:04<00:00]", 99) == 10
    assert bench._sweeps_run("no bar", 200) == 200


@pytest.mark.parametrize("argv, phrase", [(["--sweeps", "2"], "--sweeps"), (["--only", "nope"], "unknown")])
def test_bad_arguments_are_one_sentence(load_experiment, argv, phrase, capsys):
    bench = load_experiment("bench_scaling")
    with pytest.raises(SystemExit) as exc:
        bench.main(argv)
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and phrase in err and "\n" not in err


def test_the_quick_budget_covers_every_family_and_method(load_experiment, capsys):
    """``bench_quick.py`` times every (family, command-line method) the registry has; an unknown
    family is one sentence."""
    from latentzoo.registry import families

    quick = load_experiment("bench_quick")
    want = {(f.name, m) for f in families().values() for m in f.cli_methods}
    assert set(quick.cells()) == want and len(want) >= 20
    with pytest.raises(SystemExit) as exc:
        quick.main(["--only", "nope"])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and "unknown" in err and "\n" not in err
