"""`latentzoo run MODEL --method gibbs --replicas M`: replica exchange over the family's tempered
Gibbs table from the command line, its swap rates in the run's sample_stats, and one sentence
for every setting it cannot honour."""

import warnings
from types import SimpleNamespace

import numpy as np
import pytest

from latentzoo import arviz_adapter as azx
from latentzoo.cli import main
from latentzoo.runs import swap_rate_warning


# every family whose table reads the likelihood's temperature (MTA's once lacked the flag on its
# label-only pi update, and was refused); NOCA on 40 baskets of 6 items at K = 2 (its default
# data, 2000 x 64 at K = 8 with a MAP-EM start, made this run take 73 s), CVQ on 40 x 5 at K = 2
# (its default data at K = 8, with the sources' split-merge move, took 62 s against 8-14 s for
# the others)
SMALL_DATA = {"noca": lambda rng: (rng.random((40, 6)) < 0.3).astype(float),
              "cvq": lambda rng: rng.normal(size=(40, 5))}


@pytest.mark.parametrize("model, site", [("ta", "Psi"), ("mta", "Psi_mean"), ("mfa", "psi"), ("cvq", "sigma"),
                                         ("noca", "theta0")])
def test_a_tempered_table_runs_as_replica_exchange_and_stores_the_swap_rates(model, site, tmp_path):
    out = tmp_path / model
    data = []
    if model in SMALL_DATA:
        np.save(tmp_path / "data.npy", SMALL_DATA[model](np.random.default_rng(0)))
        data = ["--data", str(tmp_path / "data.npy"), "--K", "2"]
    assert main(["run", model, *data, "--method", "gibbs", "--replicas", "3", "--min-beta", "0.2", "--chains", "2",
                 "--warmup", "20", "--samples", "20", "--no-progress", "--out", str(out)]) == 0
    idata = azx.load(str(out / "posterior.nc"))
    rates = np.asarray(idata.sample_stats["swap_accept_prob"])
    assert rates.shape == (2, 20, 2) and np.all((rates >= 0) & (rates <= 1))
    assert idata.posterior[site].shape[:2] == (2, 20)


@pytest.mark.parametrize("argv, phrase", [
    (["run", "fa", "--method", "vb", "--replicas", "4"], "fa --method vb is not one (use --method gibbs)"),
    (["run", "fa", "--method", "nuts", "--replicas", "4"], "fa --method nuts is not one"),
    (["run", "ta", "--replicas", "0"], "--replicas must be at least 1"),
    (["run", "ta", "--replicas", "4", "--min-beta", "1.5"], "--min-beta must lie strictly between 0 and 1"),
    (["run", "ta", "--replicas", "4", "--min-beta", "0"], "--min-beta must lie strictly between 0 and 1"),
    # FA's table tempers the latents only (what AIS needs), not W, mu and psi
    (["run", "fa", "--replicas", "4"], "no tempered form for replica exchange"),
])
def test_what_replica_exchange_cannot_run_is_one_sentence_and_nothing_written(argv, phrase, tmp_path, capsys):
    out = tmp_path / "o"
    assert main([*argv, "--quick", "--no-progress", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert phrase in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def test_the_rank_svm_runs_as_replica_exchange_from_the_command_line(tmp_path):
    """The rank SVM's table is tempered in every variant (tests/inference/test_rank_svm_tempered.py);
    here the CLI's path: its data tables (labels, rank pairs) as arguments, its per-pair λ's left
    out of the stored draws, the swap rates stored. Small data: the compile is the cost."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(24, 4))
    np.save(tmp_path / "F.npy", X)
    np.save(tmp_path / "y.npy", (X[:, 0] + 0.5 * rng.normal(size=24) > 0).astype(int))
    out = tmp_path / "rank-svm"
    assert main(["run", "rank-svm", "--data", str(tmp_path / "F.npy"), "--labels", str(tmp_path / "y.npy"),
                 "--K", "2", "--replicas", "3", "--min-beta", "0.2", "--chains", "2", "--warmup", "10",
                 "--samples", "10", "--no-progress", "--out", str(out)]) == 0
    idata = azx.load(str(out / "posterior.nc"))
    rates = np.asarray(idata.sample_stats["swap_accept_prob"])
    assert rates.shape == (2, 10, 2) and np.all((rates >= 0) & (rates <= 1))
    assert idata.posterior["Phi_beta"].shape[:2] == (2, 10)
    assert "lam_rank" not in idata.posterior


def test_convolutional_fa_runs_as_replica_exchange_on_a_small_stack(tmp_path):
    # its switches, maps, atoms and both birth/death moves read the temperature
    # (tests/inference/test_conv_factor_tempered.py); two 8 x 8 images keep the compile short
    rng = np.random.default_rng(0)
    np.save(tmp_path / "imgs.npy", rng.normal(size=(2, 8, 8, 1)))
    out = tmp_path / "cfa"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["run", "cfa", "--data", str(tmp_path / "imgs.npy"), "--K", "2", "--atom", "2",
                     "--method", "gibbs", "--replicas", "3", "--min-beta", "0.2", "--chains", "2",
                     "--warmup", "10", "--samples", "10", "--no-progress", "--out", str(out)]) == 0
    # the placeholder start NumPyro asks for when a run continues from a state is a prior draw,
    # whose noise precision Ga(1e-6, 1e-6) underflows to 0: no warning about it reaches the user
    assert not [w for w in caught if "Out-of-support" in str(w.message)]
    idata = azx.load(str(out / "posterior.nc"))
    rates = np.asarray(idata.sample_stats["swap_accept_prob"])
    assert rates.shape == (2, 10, 2) and np.all((rates >= 0) & (rates <= 1))
    assert idata.posterior["gamma"].shape[:2] == (2, 10)


def test_a_ladder_whose_copies_do_not_swap_is_warned_of(tmp_path, capsys):
    """A pair of adjacent copies under 0.05 mean swap probability (found: 4 copies over 2000 x
    500 baskets, every pair at 0.000) is one warning naming the pair, in run's and diagnose's
    output; rates above it, or a run without replicas, say nothing."""
    rates = np.full((2, 30, 3), 0.4)
    rates[:, :, 1] = 0.01  # copies 1 and 2
    sentence = swap_rate_warning(SimpleNamespace(sample_stats={"swap_accept_prob": rates}))
    assert sentence.startswith("warning: replica exchange: tempered copies 1 and 2 ")
    assert "0.010" in sentence and "1 of the 3 adjacent pairs" in sentence and "--replicas" in sentence
    assert swap_rate_warning(SimpleNamespace(sample_stats={"swap_accept_prob": np.full((2, 30, 3), 0.06)})) is None
    assert swap_rate_warning(SimpleNamespace(sample_stats={"diverging": np.zeros((2, 30))})) is None
    assert swap_rate_warning(SimpleNamespace()) is None
    # through the CLI: a saved replica-exchange run whose copies never swapped
    np.save(tmp_path / "X.npy", np.random.default_rng(0).normal(size=(30, 3)))
    out = tmp_path / "mfa"
    assert main(["run", "mfa", "--data", str(tmp_path / "X.npy"), "--K", "1", "--J", "2", "--method", "gibbs",
                 "--replicas", "2", "--min-beta", "0.5", "--chains", "2", "--warmup", "5", "--samples", "5",
                 "--no-progress", "--out", str(out)]) == 0
    idata = azx.load(str(out / "posterior.nc"))
    ran = np.asarray(idata.sample_stats["swap_accept_prob"]).mean()
    assert ("replica exchange: tempered copies" in capsys.readouterr().err) == (ran < 0.05)
    idata.sample_stats["swap_accept_prob"][...] = 0.0
    azx.save(idata, str(out / "posterior.nc"))
    assert main(["diagnose", str(out)]) == 0
    assert "replica exchange: tempered copies 0 and 1 (copy 0 is the beta = 1 chain) swapped with mean " \
           "probability 0.000" in capsys.readouterr().err
