"""The registry is the only place a family is named: a tiny family defined here (a Normal mean with
one conjugate Gibbs update) runs through `latentzoo run` and `diagnose` and gets the registry-wide
conformance checks, without any change to the CLI or the glue."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

from latentzoo import runs
from latentzoo.cli import main
from latentzoo.data import MATRIX
from latentzoo.inference.checks import geweke_test
from latentzoo.inference.conjugate import normal_mean_posterior
from latentzoo.inference.gibbs import ConjugateGibbs
from latentzoo.inference.updates import GibbsUpdate, prior_params
from latentzoo.registry import Family, FamilyChecks, Method, families, register, unregister


def normal_mean(X=None, *, K=1, N=None, D=None, priors=None):
    """x_nd ~ N(theta_d, 1), theta_d ~ N(0, 1)."""
    N, D = (X.shape if X is not None else (N, D))
    with numpyro.plate("D", D):
        theta = numpyro.sample("theta", dist.Normal(0.0, 1.0))
    with numpyro.plate("N", N):
        numpyro.sample("X", dist.Normal(theta, 1.0).to_event(1), obs=X)


def theta_update():
    def conditional(values, obs, priors):
        X = obs["X"]
        loc0, scale0 = prior_params(priors["theta"], (X.shape[1],), "loc", "scale")
        return {"theta": normal_mean_posterior(loc0, scale0**-2, X.shape[0], X.sum(0))}

    return GibbsUpdate("theta | X", ("theta",), {"theta": (dist.Normal,), "X": (dist.Normal,)},
                       conditional)


def run_gibbs(X, cfg):
    mcmc = runs.run_mcmc(ConjugateGibbs(normal_mean, [theta_update()]), cfg, jnp.asarray(X))
    return runs.mcmc_idata(mcmc)


@pytest.fixture
def registered():
    family = register(Family(
        name="normal-mean", title="Normal mean (test)", paper="-", model=normal_mean,
        data_kind=MATRIX,
        default_data=lambda seed: np.random.default_rng(seed).normal(2.0, 1.0, size=(50, 3)),
        methods=(Method("gibbs", run_gibbs),), identified=("theta",), trace_sites=("theta",),
        default_K=1,
        checks=FamilyChecks(model_kwargs=dict(N=5, D=2), gibbs_table=lambda: [theta_update()],
                            test_functions={"theta": lambda v: v["theta"]}, broken_site="theta"),
    ))
    yield family
    unregister(family.name)


def test_runs_through_the_cli_untouched(registered, tmp_path, capsys):
    assert "normal-mean" in families()
    out = tmp_path / "run"
    argv = ["run", "normal-mean", "--chains", "2", "--samples", "200", "--warmup", "50",
            "--no-progress", "--out", str(out)]
    assert main(argv) == 0
    # the run's files, plus the manifest of what latentzoo wrote there (hidden)
    assert sorted(f for f in os.listdir(out) if not f.startswith(".")) == \
        ["posterior.nc", "summary.csv", "trace.png"]
    assert "theta[0]" in capsys.readouterr().out
    assert main(["diagnose", str(out)]) == 0
    assert main(["list"]) == 0 and "normal-mean" in capsys.readouterr().out


def test_gets_the_geweke_conformance_check(registered):
    kernel = ConjugateGibbs(normal_mean, registered.checks.gibbs_table())
    result = geweke_test(normal_mean, kernel, registered.checks.model_kwargs,
                         registered.checks.test_functions, jax.random.PRNGKey(0),
                         num_steps=2000, num_prior=2048)
    assert result.passed
