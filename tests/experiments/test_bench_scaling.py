"""``experiments/bench_scaling.py``: its data match each family's data kind and size, it reads
the sweep time off NumPyro's progress bar, and bad arguments are one sentence. (Its cells run the
CLI for minutes each; the numbers are in docs/models/rank_factor_svm.md.)"""

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


def test_sweep_time_is_read_off_the_last_finished_bar(load_experiment):
    bench = load_experiment("bench_scaling")
    text = ("warmup: 100%|##| 100/100 [00:40<00:00, 2.5it/s]\rsample:  50%|#| 50/100 [00:05<00:05]"
            "\rsample: 100%|##| 100/100 [01:11<00:00, 1.4it/s]")
    assert bench._elapsed(text, "sample") == (100, 71)
    assert bench._elapsed(text, "warmup") == (100, 40)
    assert bench._elapsed("no bar here", "sample") is None


@pytest.mark.parametrize("argv, phrase", [(["--sweeps", "2"], "--sweeps"), (["--only", "nope"], "unknown")])
def test_bad_arguments_are_one_sentence(load_experiment, argv, phrase, capsys):
    bench = load_experiment("bench_scaling")
    with pytest.raises(SystemExit) as exc:
        bench.main(argv)
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and phrase in err and "\n" not in err
