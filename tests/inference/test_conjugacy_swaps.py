"""The verdicts of docs/conjugacy.md's "Prior swaps per family" table, for a handful of swaps:
each builds the family's kernel with its own table on a model with the swapped prior and asserts
what the plan does with the site (hand-written, derived or NUTS), so the table cannot drift."""

from functools import partial

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
import pytest

from latentzoo.inference.checks import simulate
from latentzoo.inference.cvq.gibbs import cvq_updates
from latentzoo.inference.fa.gibbs import fa_updates
from latentzoo.inference.gibbs import ConjugateGibbs
from latentzoo.inference.ta.table import ta_updates
from latentzoo.models.cvq import cvq
from latentzoo.models.factor_analysis import factor_analysis
from latentzoo.models.tensor_analyzer import tensor_analyzer


def fa_variance_noise(X=None, *, K, N=None, D=None):
    """FA with the noise line edited to a variance: sigma2 ~ InverseGamma(3, 1), X ~ N(., sqrt(sigma2))
    (the model of experiments/bench_conjugacy.py)."""
    N, D = (N, D) if X is None else X.shape
    with numpyro.plate("D", D):
        mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
        sigma2 = numpyro.sample("sigma2", dist.InverseGamma(3.0, 1.0))
        W = numpyro.sample("W", dist.Normal(0.0, 1.0).expand([K]).to_event(1))
    with numpyro.plate("N", N):
        z = numpyro.sample("z", dist.Normal(0.0, 1.0).expand([K]).to_event(1))
        numpyro.sample("X", dist.Normal(z @ W.T + mu, jnp.sqrt(sigma2)).to_event(1), obs=X)


FA, CVQ, TA = dict(N=6, D=3, K=2), dict(N=6, D=3, K=2), dict(N=6, D=3, d=(2, 2))

SWAPS = {
    # family, swap: (model, kwargs, table, priors, site, kind, words of the reason or the pair)
    "fa-W-other-scale": (factor_analysis, FA, fa_updates, {"W": dist.Normal(0.0, 0.5)}, "W",
                         "hand-written", "W | z, mu, psi"),
    "fa-mu-laplace": (factor_analysis, FA, fa_updates, {"mu": dist.Laplace(0.0, 10.0)}, "mu",
                      "NUTS", "the prior of 'mu' is Laplace"),
    "fa-psi-invgamma-precision": (factor_analysis, FA, fa_updates, {"psi": dist.InverseGamma(2.0, 1.0)},
                                  "psi", "NUTS", "the variance of child 'X' is not linear in 'psi'"),
    "fa-sigma2-invgamma-variance": (partial(fa_variance_noise), {**FA}, fa_updates, None, "sigma2",
                                    "derived", "InverseGamma–Normal (variance)"),
    "cvq-pi-beta": (cvq, CVQ, cvq_updates, {"pi": dist.Beta(0.5, 2.0)}, "pi", "hand-written", "pi | s"),
    "cvq-tau-lognormal": (cvq, CVQ, cvq_updates, {"tau": dist.LogNormal(1.0, 0.5)}, "tau", "NUTS",
                          "the prior of 'tau' is LogNormal"),
    "ta-Psi-gamma-variance": (tensor_analyzer, TA, ta_updates, {"Psi": dist.Gamma(2.0, 1.0)}, "Psi", "NUTS",
                              "the precision of child 'X' is not linear in 'Psi'"),
}


@pytest.mark.parametrize("name", list(SWAPS))
def test_prior_swap_verdict(name):
    model, kw, table, priors, site, kind, words = SWAPS[name]
    kw = dict(kw) if priors is None else {**kw, "priors": priors}
    _, X = simulate(model, kw, jax.random.PRNGKey(0))
    got = ConjugateGibbs(model, table()).plan(X, **kw).site_kinds()[site]
    assert got[0] == kind and words in got[1], got
