"""`latentzoo run ... --labels FILE` and the families' own options (`Family.options`), through a
throwaway labelled family registered here, so that nothing depends on a real family's entry."""

import json
import os

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

from latentzoo import arviz_adapter as azx
from latentzoo import runs
from latentzoo.checkpoint import file_digest
from latentzoo.cli import main
from latentzoo.data import LABELLED_MATRIX, MATRIX
from latentzoo.inference.conjugate import normal_mean_posterior
from latentzoo.inference.gibbs import ConjugateGibbs
from latentzoo.inference.updates import GibbsUpdate, prior_params
from latentzoo.registry import Family, Method, Option, register, unregister

SEEN = []  # (X, y, options) of each run of the throwaway family's runner


def labelled_mean(X=None, *, N=None, D=None, priors=None):
    """x_nd ~ N(theta_d, 1), theta_d ~ N(0, 1) (the labels ride along)."""
    N, D = (X.shape if X is not None else (N, D))
    with numpyro.plate("D", D):
        theta = numpyro.sample("theta", dist.Normal(0.0, 1.0))
    with numpyro.plate("N", N):
        numpyro.sample("X", dist.Normal(theta, 1.0).to_event(1), obs=X)


def _theta_update():
    def conditional(values, obs, priors):
        X = obs["X"]
        loc0, scale0 = prior_params(priors["theta"], (X.shape[1],), "loc", "scale")
        return {"theta": normal_mean_posterior(loc0, scale0**-2, X.shape[0], X.sum(0))}

    return GibbsUpdate("theta | X", ("theta",), {"theta": (dist.Normal,), "X": (dist.Normal,)},
                       conditional)


def _run(data, cfg):
    X, y = data
    SEEN.append((X, y, dict(cfg.options)))
    mcmc = runs.run_mcmc(ConjugateGibbs(labelled_mean, [_theta_update()]), cfg, jnp.asarray(X))
    return runs.mcmc_idata(mcmc)


OPTIONS = (Option("flavour", "which flavour", choices=("sweet", "sour"), default="sweet"),
           Option("depth", "how deep", type=int, default=5))


@pytest.fixture
def labelled():
    family = register(Family(
        name="labelled-mean", title="Labelled mean (test)", paper="-", model=labelled_mean,
        data_kind=LABELLED_MATRIX,
        default_data=lambda seed: (np.random.default_rng(seed).normal(size=(30, 3)),
                                   np.tile([-1.0, 1.0], 15)),
        methods=(Method("gibbs", _run),), identified=("theta",), trace_sites=("theta",),
        default_K=1, options=OPTIONS,
    ))
    plain = register(Family(
        name="plain-mean", title="Plain mean (test)", paper="-", model=labelled_mean,
        data_kind=MATRIX, default_data=lambda seed: np.zeros((5, 2)),
        methods=(Method("gibbs", lambda d, c: None),), identified=("theta",), default_K=1,
    ))
    SEEN.clear()
    yield family
    unregister(family.name)
    unregister(plain.name)


@pytest.fixture
def files(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(12, 3))
    y = np.where(rng.random(12) < 0.5, -1.0, 1.0)
    np.savetxt(tmp_path / "X.csv", X, delimiter=",")
    (tmp_path / "y.csv").write_text("label\n" + "\n".join(f"{v:g}" for v in y) + "\n")
    np.save(tmp_path / "y.npy", y)
    return X, y, tmp_path


def _argv(model, out, *more):
    return ["run", model, "--chains", "1", "--samples", "30", "--warmup", "5", "--no-progress",
            "--out", str(out), *more]


def _refused(capsys, argv, phrase, out=None):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert phrase in err and "\n" not in err and "Traceback" not in err, err
    if out is not None:
        assert not os.path.exists(out)


def test_labels_from_their_own_file_reach_the_runner_with_the_options(labelled, files):
    X, y, d = files
    out = d / "run"
    assert main(_argv("labelled-mean", out, "--data", str(d / "X.csv"), "--labels",
                      str(d / "y.csv"), "--depth", "7")) == 0
    Xs, ys, options = SEEN[-1]
    np.testing.assert_allclose(Xs, X)
    np.testing.assert_array_equal(ys, y)
    assert options == {"flavour": "sweet", "depth": 7}  # a default, and an int from the text
    attrs = azx.posterior_attrs(azx.load(str(out / "posterior.nc")))
    assert json.loads(attrs["latentzoo_options"]) == {"depth": 7, "flavour": "sweet"}
    assert "labels y.csv" in attrs["latentzoo_data"]
    # labels as .npy, and a choice
    assert main(_argv("labelled-mean", d / "run2", "--data", str(d / "X.csv"), "--labels",
                      str(d / "y.npy"), "--flavour", "sour")) == 0
    np.testing.assert_array_equal(SEEN[-1][1], y)
    assert SEEN[-1][2] == {"flavour": "sour", "depth": 5}


def test_label_file_problems_are_one_sentence(labelled, files, capsys):
    X, y, d = files
    out = d / "out"
    base = _argv("labelled-mean", out, "--data", str(d / "X.csv"), "--labels")
    (d / "short.csv").write_text("\n".join(f"{v:g}" for v in y[:-1]) + "\n")
    _refused(capsys, base + [str(d / "short.csv")], "must be one value per row (12)", out)
    (d / "two.csv").write_text("1,2\n" * 12)
    _refused(capsys, base + [str(d / "two.csv")], "one label per row", out)
    (d / "nan.csv").write_text("1\n" * 11 + "nan\n")
    _refused(capsys, base + [str(d / "nan.csv")], "NaN", out)
    _refused(capsys, base + [str(d / "missing.csv")], "does not exist", out)
    _refused(capsys, _argv("labelled-mean", out, "--labels", str(d / "y.csv")),
             "--labels needs --data", out)
    assert SEEN == []


def test_labels_for_a_family_without_labels_is_refused(labelled, files, capsys):
    _, _, d = files
    _refused(capsys, _argv("plain-mean", d / "out", "--data", str(d / "X.csv"), "--labels",
                           str(d / "y.csv")), "--labels applies only to models with labelled data",
             d / "out")


def test_option_values_and_owners_are_checked(labelled, files, capsys):
    _, _, d = files
    out = d / "out"
    _refused(capsys, _argv("labelled-mean", out, "--flavour", "salty"),
             "--flavour must be one of sweet, sour, got 'salty'.", out)
    _refused(capsys, _argv("labelled-mean", out, "--depth", "deep"),
             "--depth must be an int, got 'deep'.", out)
    _refused(capsys, _argv("plain-mean", out, "--depth", "3"),
             "--depth does not apply to plain-mean (it has no options of its own).", out)
    with pytest.raises(SystemExit) as stop:  # argparse's own refusal, one sentence too
        main(_argv("labelled-mean", out, "--nonsense", "3"))
    assert stop.value.code == 2 and "nrecognized arguments" in capsys.readouterr().err
    assert SEEN == []


def test_an_option_that_shadows_a_run_flag_is_refused_for_its_family(labelled, files, capsys):
    register(labelled._replace(name="shadow", options=(Option("K", type=int, default=2),)))
    try:
        _refused(capsys, _argv("shadow", files[2] / "out"), "declares an option --K")
        assert main(_argv("labelled-mean", files[2] / "ok")) == 0  # other families unaffected
    finally:
        unregister("shadow")


def test_resume_refuses_other_labels_or_options(labelled, files, capsys):
    _, y, d = files
    out = d / "run"
    record = out / ".checkpoint" / "run.json"
    record.parent.mkdir(parents=True)
    same = {"model": "labelled-mean", "method": "gibbs",
            "data": "sha256:" + file_digest(str(d / "X.csv")), "K": 1, "J": None, "seed": 0,
            "chains": 1, "samples": 30, "warmup": 5, "sweeps": None, "restarts": None,
            "quick": False, "standardize": False,
            "labels": "sha256:" + file_digest(str(d / "y.csv")),
            "options": {"flavour": "sweet", "depth": 5}}
    argv = ["run", "labelled-mean", "--chains", "1", "--samples", "30", "--warmup", "5",
            "--no-progress", "--data", str(d / "X.csv"), "--labels", str(d / "y.csv"),
            "--resume", str(out)]
    record.write_text(json.dumps({**same, "options": {"flavour": "sour", "depth": 5}}))
    _refused(capsys, argv, "was made with --flavour sour, not sweet")
    record.write_text(json.dumps({**same, "labels": "sha256:0"}))
    _refused(capsys, argv, "on other data (the --labels file's contents differ)")
    assert record.exists() and SEEN == []


def test_rank_svm_takes_any_two_labels_and_records_their_values(tmp_path, capsys):
    """The CLI refused labels 3/5 (`The labels must be -1/+1 or 0/1`) where RankFactorSVC takes
    any two: the larger is the model's +1, and the run records both values."""
    import numpy as np

    from latentzoo import arviz_adapter as azx
    from latentzoo.inference.rank_svm.fit import binary_labels

    np.testing.assert_array_equal(binary_labels([3, 5, 5, 3]), [-1.0, 1.0, 1.0, -1.0])
    np.testing.assert_array_equal(binary_labels([0, 1]), [-1.0, 1.0])
    np.testing.assert_array_equal(binary_labels([1, -1]), [1.0, -1.0])
    rng = np.random.default_rng(0)
    X = rng.normal(size=(20, 3))
    y = np.where(X[:, 0] > 0, 5.0, 3.0)
    np.savetxt(tmp_path / "X.csv", X, delimiter=",")
    np.savetxt(tmp_path / "y.csv", y)
    out = tmp_path / "run"
    argv = ["run", "rank-svm", "--method", "vb", "--K", "1", "--sweeps", "3", "--no-progress",
            "--data", str(tmp_path / "X.csv"), "--labels", str(tmp_path / "y.csv"), "--out", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    attrs = azx.posterior_attrs(azx.load(str(out / "posterior.nc")))
    assert json.loads(attrs["latentzoo_label_values"]) == [3.0, 5.0]
    np.savetxt(tmp_path / "y3.csv", np.arange(20) % 3)
    argv[argv.index(str(tmp_path / "y.csv"))] = str(tmp_path / "y3.csv")
    assert main([*argv[:-1], str(tmp_path / "run3")]) == 2
    assert "exactly two classes, got 3" in capsys.readouterr().err
    assert not (tmp_path / "run3").exists()
