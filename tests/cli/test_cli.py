"""The latentzoo command: the main job end to end, diagnose, and one-sentence errors."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from latentzoo import arviz_adapter as azx
from latentzoo.cli import main


def _visible(folder):
    """The run's files (the folder's manifest and nothing temporary besides: no staging folder,
    no checkpoint once the run finished)."""
    names = sorted(os.listdir(folder))
    assert [n for n in names if n.startswith(".")] == [".latentzoo-files"], names
    return [n for n in names if not n.startswith(".")]


@pytest.fixture(scope="module")
def fa_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "fa"
    assert main(["run", "fa", "--quick", "--no-progress", "--out", str(out)]) == 0
    return out


def test_list_shows_the_zoo(capsys):
    assert main(["list"]) == 0
    text = capsys.readouterr().out
    for name in ("fa", "cvq", "noca", "gibbs"):
        assert name in text


def test_run_fa_quick_writes_the_three_files(fa_run):
    assert _visible(fa_run) == ["posterior.nc", "summary.csv", "trace.png"]
    idata = azx.load(str(fa_run / "posterior.nc"))
    assert {"posterior", "sample_stats", "log_likelihood", "observed_data"} <= set(azx.group_names(idata))
    assert idata.posterior["cov"].shape == (4, 1000, 20, 20)
    assert "lp" in idata.sample_stats
    assert idata.log_likelihood["X"].shape == (4, 1000, 500)
    assert idata.posterior.attrs["latentzoo_thinning"] == 1  # --quick keeps every draw
    table = azx.summary(idata, var_names=["cov"])
    assert table["r_hat"].max() <= 1.01, table["r_hat"].idxmax()


def test_diagnose_writes_rank_and_ppc(fa_run, capsys, monkeypatch):
    from latentzoo import arviz_plots as azp

    ranked = []
    real = azp.plot_rank
    monkeypatch.setattr(azp, "plot_rank", lambda idata, path, **kw: (ranked.append(kw), real(idata, path, **kw)))
    assert main(["diagnose", str(fa_run)]) == 0
    assert (fa_run / "rank.png").stat().st_size > 0
    assert (fa_run / "ppc.png").stat().st_size > 0
    out = capsys.readouterr().out
    assert "psi[0]" in out and "no rank.png" not in out and "no ppc.png" not in out
    # the rank plot is of the identified quantities, the covariance among them (it once showed
    # mu and psi only)
    assert set(ranked[0]["var_names"]) == {"mu", "psi", "cov", "factor_variance"}


def _write(path, text):
    path.write_text(text)
    return str(path)


BAD_INPUTS = {
    "missing file": (lambda d: str(d / "nope.csv"), "does not exist"),
    "ragged csv": (lambda d: _write(d / "r.csv", "1,2,3\n4,5\n6,7,8\n"), "ragged"),
    "non-numeric": (lambda d: _write(d / "n.csv", "a,b,c\n1,2,3\n4,x,6\n"), "non-numeric"),
    "nan": (lambda d: _write(d / "nan.csv", "1,2,3,4\n4,nan,6,7\n1,1,1,1\n"), "NaN"),
    "one row": (lambda d: _write(d / "one.csv", "1,2,3,4,5\n"), "at least 2"),
    "K >= D": (lambda d: _write(d / "k.csv", "1,2\n3,4\n5,7\n"), "smaller than"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_data_is_one_sentence_exit_2_nothing_written(case, tmp_path, capsys):
    make, phrase = BAD_INPUTS[case]
    out = tmp_path / "out"
    code = main(["run", "fa", "--data", make(tmp_path), "--out", str(out), "--quick"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert phrase in err and "\n" not in err and "Traceback" not in err
    assert not out.exists()
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".staging")]


@pytest.mark.parametrize(
    "argv, phrase",
    [
        (["run", "nomodel", "--out", "x"], "Unknown model"),
        (["run", "fa", "--method", "magic", "--out", "x"], "Unknown method"),
        (["run", "fa", "--chains", "0", "--out", "x"], "at least 1"),
        (["run", "fa", "--seed", str(2**64), "--out", "x"], "--seed"),
        (["run", "fa", "--quick", "--out", ""], "empty path"),
        (["diagnose", "/nonexistent/run"], "does not exist"),
    ],
)
def test_bad_arguments(argv, phrase, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert phrase in err and "\n" not in err


def test_console_script_has_no_traceback(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("1,2\n3\n")
    proc = subprocess.run(
        [sys.executable, "-m", "latentzoo.cli", "run", "fa", "--data", str(bad), "--out", str(tmp_path / "o")],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("latentzoo: ") and "Traceback" not in proc.stderr


def test_npy_and_npz_inputs(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, 5))
    np.save(tmp_path / "x.npy", X)
    np.savez(tmp_path / "x.npz", X=X)
    from latentzoo.data import load_matrix

    np.testing.assert_array_equal(load_matrix(str(tmp_path / "x.npy")), X)
    np.testing.assert_array_equal(load_matrix(str(tmp_path / "x.npz")), X)


@pytest.mark.parametrize("method", ["vb", "em"])
def test_run_fa_variational_methods(method, tmp_path):
    out = tmp_path / method
    assert main(["run", "fa", "--method", method, "--quick", "--no-progress", "--out", str(out)]) == 0
    idata = azx.load(str(out / "posterior.nc"))
    assert idata.posterior["cov"].shape[-2:] == (20, 20)
    assert idata.log_likelihood["X"].shape[-1] == 500


@pytest.mark.smoke  # NumPyro's NUTS output through the adapter on both ArviZ lines
def test_run_fa_nuts_small(tmp_path):
    """A NUTS run end to end: its file read back by diagnose and by plain ArviZ calls (the only
    NUTS run of the newest-Python smoke set, see tests/cli/test_every_method.py)."""
    from latentzoo.registry import families
    from tests.cli.test_every_method import plain_arviz_on_the_saved_run

    rng = np.random.default_rng(1)
    X = rng.normal(size=(40, 4)) @ rng.normal(size=(4, 4))
    np.save(tmp_path / "x.npy", X)
    out = tmp_path / "nuts"
    argv = ["run", "fa", "--method", "nuts", "--data", str(tmp_path / "x.npy"), "--K", "1",
            "--chains", "2", "--samples", "50", "--warmup", "50", "--no-progress", "--out", str(out)]
    assert main(argv) == 0
    assert (out / "summary.csv").read_text().count("psi[") == 4
    idata = azx.load(str(out / "posterior.nc"))
    # NumPyro's HMC statistics under ArviZ's names, for az.plot_energy and a look at the sampler
    stats = idata.sample_stats
    for name in ("diverging", "energy", "lp", "n_steps", "acceptance_rate", "step_size"):
        assert name in stats, (name, list(stats.data_vars))
    assert stats["energy"].shape == (2, 50) and np.all(np.isfinite(stats["energy"].values))
    assert np.all((stats["acceptance_rate"].values >= 0) & (stats["acceptance_rate"].values <= 1))
    assert main(["diagnose", str(out)]) == 0
    assert (out / "ppc.png").stat().st_size > 0
    plain_arviz_on_the_saved_run(out / "posterior.nc", families()["fa"])
    import arviz as az
    import matplotlib.pyplot as plt

    az.plot_energy(az.from_netcdf(str(out / "posterior.nc")))
    plt.close("all")


def test_run_fa_online_streams_a_csv(tmp_path):
    rng = np.random.default_rng(2)
    X = rng.normal(size=(300, 6))
    path = tmp_path / "x.csv"
    np.savetxt(path, X, delimiter=",")
    out = tmp_path / "online"
    argv = ["run", "fa", "--method", "online-em", "--data", str(path), "--K", "2",
            "--chunk-size", "64", "--no-progress", "--out", str(out)]
    assert main(argv) == 0
    assert _visible(out) == ["posterior.nc", "summary.csv", "trace.png"]
    idata = azx.load(str(out / "posterior.nc"))
    assert idata.posterior["W"].shape == (1, 1, 6, 2)
    assert idata.sample_stats["objective"].size == 5  # one value per chunk
    assert main(["diagnose", str(out)]) == 0


@pytest.mark.parametrize("model", ["cvq", "noca"])
def test_run_binary_models_point_fit(model, tmp_path):
    out = tmp_path / model
    assert main(["run", model, "--method", "vb", "--K", "3", "--quick", "--no-progress", "--out", str(out)]) == 0
    idata = azx.load(str(out / "posterior.nc"))
    assert "pi" in idata.posterior  # point estimates under their sites' names
    table = (out / "summary.csv").read_text().splitlines()
    assert table[0] == ",estimate"  # estimates only: no sd / ESS / R-hat columns for a point fit


def test_noca_rejects_non_binary_data(tmp_path, capsys):
    path = _write(tmp_path / "x.csv", "0,1,0.5,1\n1,0,0,1\n0,0,1,1\n")
    assert main(["run", "noca", "--data", path, "--K", "2", "--out", str(tmp_path / "o")]) == 2
    assert "binary" in capsys.readouterr().err


def test_out_that_is_a_file_fails_before_fitting(tmp_path, capsys):
    target = tmp_path / "taken"
    target.write_text("x")
    assert main(["run", "fa", "--quick", "--out", str(target)]) == 2
    assert "existing file" in capsys.readouterr().err
    assert target.read_text() == "x"


def test_standardize_refused_for_binary_data(tmp_path, capsys):
    assert main(["run", "noca", "--standardize", "--quick", "--out", str(tmp_path / "o")]) == 2
    assert "does not apply" in capsys.readouterr().err


@pytest.mark.parametrize("scale", [1e200, 1e-200])
def test_standardize_fits_data_on_a_scale_float64_cannot_square(scale, tmp_path, capsys):
    # Refused without --standardize (its squares over- or underflow); with it, the standardised
    # data is fitted, as the refusal's message advises, and gives the fit of the unscaled data.
    X = np.random.default_rng(1).normal(size=(40, 4)) * [1.0, 2.0, 0.5, 3.0]
    np.save(tmp_path / "x.npy", X * scale)
    np.save(tmp_path / "y.npy", X)
    args = ["run", "fa", "--method", "em", "--K", "1", "--no-progress"]
    assert main([*args, "--data", str(tmp_path / "x.npy"), "--out", str(tmp_path / "a")]) == 2
    assert "standardise" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()
    assert main([*args, "--standardize", "--data", str(tmp_path / "x.npy"), "--out", str(tmp_path / "b")]) == 0
    assert main([*args, "--standardize", "--data", str(tmp_path / "y.npy"), "--out", str(tmp_path / "c")]) == 0
    fit, ref = (azx.load(str(tmp_path / d / "posterior.nc")) for d in "bc")
    for site in ("psi", "mu"):
        np.testing.assert_allclose(azx.posterior_array(fit, site), azx.posterior_array(ref, site),
                                   rtol=1e-6, atol=1e-9)


def test_standardize_columns_at_extreme_scales():
    from latentzoo.data import standardize_columns

    X = np.random.default_rng(2).normal(size=(30, 3)) + [0.0, 5.0, -2.0]
    want = (X - X.mean(0)) / X.std(0)
    for scale in (1.0, 1e200, 1e-200, 1e300):
        np.testing.assert_allclose(standardize_columns(X * scale), want, rtol=1e-12, atol=1e-12)


def test_diagnose_on_a_plain_netcdf_without_model(tmp_path, capsys):
    import numpy as np

    idata = azx.from_draws({"a": np.random.default_rng(0).normal(size=(2, 50))})
    run = tmp_path / "plain"
    azx.save(idata, str(run / "posterior.nc"))
    assert main(["diagnose", str(run)]) == 0
    out = capsys.readouterr().out
    assert "a" in out
    assert "no ppc.png: posterior.nc names no model of the zoo" in out  # why, not just missing


def _diagnosed(folder, draws, observed, method, capsys):
    """diagnose's (stdout, stderr) on a saved FA run of these draws."""
    idata = azx.from_draws(draws, observed_data=observed)
    azx.set_posterior_attrs(idata, latentzoo_model="fa", latentzoo_method=method)
    azx.save(idata, str(folder / "posterior.nc"))
    assert main(["diagnose", str(folder)]) == 0
    cap = capsys.readouterr()
    return cap.out, cap.err


def test_diagnose_says_why_a_plot_is_left_out_and_why_r_hat_is_nan(tmp_path, capsys):
    rng = np.random.default_rng(0)
    out, err = _diagnosed(tmp_path / "one", {"psi": rng.gamma(2.0, size=(1, 50, 3))},
                          {"X": rng.normal(size=(10, 3))}, "gibbs", capsys)
    assert "no rank.png: a rank plot compares chains and this run has one" in out
    assert not (tmp_path / "one" / "rank.png").exists()
    assert "R-hat needs two or more chains and this run has one" in err
    # a cut-down file (no mu): a sentence, not a KeyError
    assert "no ppc.png: posterior.nc lacks" in out and "replicated data need" in out

    out, err = _diagnosed(tmp_path / "point", {"psi": rng.gamma(2.0, size=(1, 1, 3))}, None, "em",
                          capsys)
    assert "no rank.png: a point fit has one estimate" in out
    assert "no ppc.png: posterior.nc holds no observed data" in out
    assert "R-hat" not in err  # a point fit has no chains to compare: nothing to say


def test_constant_column_em_fit_is_finite(tmp_path, capsys):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 5))
    X[:, 2] = 0.0  # a constant pixel, as in scikit-learn's digits
    np.save(tmp_path / "x.npy", X)
    out = tmp_path / "o"
    code = main(["run", "fa", "--method", "em", "--K", "1", "--data", str(tmp_path / "x.npy"),
                 "--no-progress", "--out", str(out)])
    # EM's psi start was 2 / var(x_d): infinite for a constant column, the ELBO NaN at sweep 1
    assert code == 0, capsys.readouterr().err
    assert (out / "posterior.nc").exists()


def test_cli_does_not_show_the_note_of_a_table_that_leaves_sites_to_generic_kernels(
        tmp_path, monkeypatch, recwarn):
    # NOCA's Gibbs table leaves theta, theta0 to NUTS by design: that is not
    # news to someone running it (a swapped prior's ConjugacyFallbackWarning still shows)
    import warnings

    from latentzoo.inference.gibbs import GenericKernelNote
    from latentzoo.registry import REGISTRY, Method, get_family

    fa = get_family("fa")
    em = fa.method("em")

    def run(X, cfg):
        warnings.warn("by design", GenericKernelNote)
        return em.run(X, cfg)

    monkeypatch.setitem(REGISTRY, "fa", fa._replace(methods=(Method("em", run, kind="point"),)))
    rng = np.random.default_rng(0)
    np.save(tmp_path / "x.npy", rng.normal(size=(30, 4)))
    argv = ["run", "fa", "--data", str(tmp_path / "x.npy"), "--K", "1", "--sweeps", "5",
            "--no-progress", "--out", str(tmp_path / "o")]
    assert main(argv) == 0
    assert not [w for w in recwarn if issubclass(w.category, GenericKernelNote)]


def test_a_thinned_run_says_so_in_its_summary_and_attributes(tmp_path, capsys):
    """posterior.nc once kept 1000 of 4000 draws per chain without a word: the run now prints
    how many it keeps and records the draws made and the thinning in the attributes."""
    from latentzoo.registry import get_family
    from latentzoo.runs import write_run

    fa = get_family("fa")
    def toy():  # write_run records attributes on the InferenceData it writes: one per run
        rng = np.random.default_rng(0)
        return azx.from_draws({"psi": rng.gamma(2.0, size=(2, 50, 3))},
                              observed_data={"X": rng.normal(size=(10, 3))})

    write_run(str(tmp_path / "run"), toy(), family=fa, method=fa.method("gibbs"), seconds=1.0,
              data_name="toy", requested_draws=200)
    assert "keeps 50 of 200 draws per chain (one in 4" in capsys.readouterr().out
    saved = azx.load(str(tmp_path / "run" / "posterior.nc"))
    assert saved.posterior.attrs["latentzoo_draws_per_chain"] == 200
    assert saved.posterior.attrs["latentzoo_thinning"] == 4
    write_run(str(tmp_path / "all"), toy(), family=fa, method=fa.method("gibbs"), seconds=1.0,
              data_name="toy", requested_draws=50)
    assert "keeps" not in capsys.readouterr().out  # nothing thinned: nothing to say
    # a family that capped the request (--quick: rank-svm, ta, mta, cfa, cvq, noca) recorded the
    # draws it made; 50 kept of 50 made is no thinning, whatever the command line asked for
    capped = azx.set_posterior_attrs(toy(), latentzoo_draws_per_chain=50)
    write_run(str(tmp_path / "capped"), capped, family=fa, method=fa.method("gibbs"), seconds=1.0,
              data_name="toy", requested_draws=1000)
    assert "keeps" not in capsys.readouterr().out
    saved = azx.load(str(tmp_path / "capped" / "posterior.nc"))
    assert saved.posterior.attrs["latentzoo_draws_per_chain"] == 50
    assert saved.posterior.attrs["latentzoo_thinning"] == 1


def test_a_signal_wrapped_by_library_code_is_still_the_signal(monkeypatch, capsys):
    """SIGTERM landing inside JAX's cache lookup: JAX re-raises the handler's Interrupted as its
    own error ("Cache keys should be comparable using __eq__ ..."), seen once in a cold CI run.
    The run ends as interrupted (exit 128 + 15), not as a bad-input sentence (exit 2)."""
    import latentzoo.cli as cli

    def wrapped(args):
        try:
            raise cli.Interrupted(15)
        except cli.Interrupted as e:
            raise ValueError("Cache keys should be comparable using __eq__.") from e

    monkeypatch.setattr(cli, "_cmd_list", wrapped)
    assert cli.main(["list"]) == 128 + 15
    assert "interrupted (SIGTERM)" in capsys.readouterr().err


def test_a_signal_whose_exception_library_code_kept_only_as_text_is_still_the_signal(monkeypatch, capsys):
    """jaxlib's compiled-function cache (jax 0.12, Python 3.13) reports an exception raised in a
    key's ``__eq__`` as a new ValueError that carries the handler's Interrupted only as text, with
    no cause to follow: a cold CI run ended as a bad-input sentence (exit 2) printing a traceback.
    A real SIGTERM is sent here, so that the handler records it as it does in a run."""
    import latentzoo.cli as cli

    def kept_as_text(args):
        caught = []
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1.0)  # the handler runs at the next bytecode boundary
        except cli.Interrupted as e:
            caught.append(repr(e))
        assert caught, "the handler did not run"
        # raised outside the except clause: neither cause nor context leads back to the signal
        raise ValueError(f"Cache keys should be comparable using __eq__. The error was: {caught[0]}")

    monkeypatch.setattr(cli, "_cmd_list", kept_as_text)
    assert cli.main(["list"]) == 128 + signal.SIGTERM
    err = capsys.readouterr().err
    assert "interrupted (SIGTERM)" in err and "Cache keys" not in err, err


def test_the_interrupted_sentence_starts_its_own_line_after_a_progress_bar(monkeypatch, capsys):
    """A run interrupted while a progress bar stands at 0 % (the CAVI driver's bar, drawn with
    a carriage return and no newline) once printed the sentence at the end of the bar's line,
    so a reader of the last line saw the bar; open bars are closed first."""
    from tqdm import tqdm

    import latentzoo.cli as cli

    bars = []  # held, as the interrupted run's frames hold theirs

    def interrupted_under_a_bar(args):
        bars.append(tqdm(total=30, desc="CAVI", file=sys.stderr))
        bars[-1].update(0)
        raise cli.Interrupted(2)

    monkeypatch.setattr(cli, "_cmd_list", interrupted_under_a_bar)
    assert cli.main(["list"]) == 128 + 2
    err = capsys.readouterr().err
    last = [line for line in err.replace("\r", "\n").splitlines() if line.strip()][-1]
    assert last.startswith("latentzoo: interrupted (SIGINT)"), err
