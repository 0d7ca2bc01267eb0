"""Every registered family's MCMC methods run end to end through the CLI at the smallest sizes:
a family's first method as test_conformance's quick run does, every other on the first rows of
the family's default data read from a file (a crash such as a model argument that MCMC traces
shows up here, not in a user's hands). Point fits and FA's samplers have their own CLI
tests (test_cli.py, test_streaming_run.py), NOCA's sampler test_noca_fit.py; these are the rest."""

from __future__ import annotations

import numpy as np
import pytest

from latentzoo import arviz_adapter as azx
from latentzoo.cli import main
from latentzoo.registry import families

PAIRS = [(f.name, m.name) for f in families().values() for m in f.methods
         if m.cli and not m.streaming and m.kind == "draws"
         and (f.name not in ("fa", "noca") or m.name == "gibbs")]

# Marked smoke (also run on the newest Python, ArviZ 1.x): plain ArviZ calls on a saved run of
# every family. The rank SVM's NUTS run is the exception: on the newest Python it took 56 s of the
# smoke set (measured in CI), and what it adds there, NumPyro's NUTS statistics through the
# adapter, FA's small NUTS run checks the same way (tests/cli/test_cli.py::test_run_fa_nuts_small,
# smoke); the rank SVM's stored label replicates go through the adapter in its Gibbs run.
NOT_SMOKE = {("rank-svm", "nuts")}
PARAMS = [pytest.param(m, meth, id=f"{m}-{meth}",
                       marks=() if (m, meth) in NOT_SMOKE else (pytest.mark.smoke,))
          for m, meth in PAIRS]


def plain_arviz_on_the_saved_run(path, family):
    """What a user does with the file and nothing of latentzoo: ArviZ's own calls, under their
    0.2x or 1.x names. Each must run (a KeyError for a missing group fails here)."""
    import arviz as az
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    one = az.__version__.split(".")[0] != "0"
    idata = az.from_netcdf(str(path))
    groups = set(idata.children) if one else set(idata.groups())
    sites = [s for s in family.trace_sites if s in idata.posterior.data_vars][:1]
    assert sites, family.name
    assert len(az.summary(idata, var_names=sites)) >= 1
    az.plot_trace(idata, var_names=sites)
    az.plot_rank(idata, var_names=sites)
    if family.posterior_predictive is not None:
        assert "posterior_predictive" in groups, groups
        if one:
            az.plot_ppc_dist(idata, num_samples=5)
        else:
            az.plot_ppc(idata, num_pp_samples=5)
    # (the rank SVM stores log p(y | u) with the hinge normalised over the two labels: its
    # unnormalised hinge was 0 for every draw with margin, a tail ArviZ 1.x's PSIS refused)
    if "log_likelihood" in groups:
        assert np.isfinite(float(az.loo(idata).elpd_loo if not one else az.loo(idata)["elpd"]))
    plt.close("all")


def _argv(model, method, tmp_path, out):
    """A family's first method runs as a user's first quick run does (its embedded data,
    --quick, 2 chains of 30 + 30; test_conformance leaves these families' quick run to this
    test); every other method reads the first 40 rows of the default data from a file (the
    --data path of each data kind)."""
    family = families()[model]
    if method == family.methods[0].name:
        return ["run", model, "--quick", "--no-progress", "--out", str(out),
                "--chains", "2", "--samples", "30", "--warmup", "30"]
    data = family.default_data(0)
    if isinstance(data, tuple):  # labelled data: features and labels in one .npz
        path = tmp_path / "x.npz"
        np.savez(path, X=np.asarray(data[0])[:40], y=np.asarray(data[1])[:40])
    else:
        path = tmp_path / "x.npy"
        np.save(path, np.asarray(data)[:40])
    return ["run", model, "--method", method, "--data", str(path), "--chains", "2",
            "--samples", "20", "--warmup", "10", "--no-progress", "--out", str(out)]


@pytest.mark.parametrize("model, method", PARAMS)
def test_sampler_runs_through_the_cli(model, method, tmp_path, capsys):
    out = tmp_path / "run"
    code = main(_argv(model, method, tmp_path, out))
    assert code == 0, capsys.readouterr().err
    for name in ("posterior.nc", "summary.csv", "trace.png"):
        assert (out / name).stat().st_size > 0
    # diagnose draws the posterior predictive check wherever there is one to draw: the family's
    # replicated data, or replicates the run stored itself (a classifier's labels)
    assert main(["diagnose", str(out)]) == 0, capsys.readouterr().err
    plain_arviz_on_the_saved_run(out / "posterior.nc", families()[model])
    stored = "posterior_predictive" in azx.group_names(azx.load(str(out / "posterior.nc")))
    if families()[model].posterior_predictive is not None or stored:
        assert (out / "ppc.png").stat().st_size > 0
