"""A hand-written update that reads a site the model no longer has is dropped at planning.

The builder keeps an update when the families in its ``requires`` match the model's sites. FA's
z, W and mu updates also read ``psi`` (the noise precision), which their ``requires`` do not
name, since any prior on psi leaves them exact. With the noise swapped for a variance
``sigma2 ~ InverseGamma`` (the model line edited, ``psi`` gone) they were kept and the first
sweep failed with ``KeyError: 'psi'``. Now, whenever a model is not the one its table was
written for (a site without an update, or an update dropped), the plan traces each kept update
once, abstractly, and drops those that look up a name the model lacks, with that reason; the
conjugacy detector then derives their sites.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC

from latentzoo.inference.fa import fa_updates
from latentzoo.inference.gibbs import ConjugateGibbs
from latentzoo.inference.gibbs_plan import missing_reads
from latentzoo.models.factor_analysis import default_fa_data, default_priors


def fa_noise_variance(X=None, *, K, N=None, D=None):
    """``factor_analysis`` with its noise prior swapped as a user would: a variance per column."""
    N, D = X.shape if X is not None else (N, D)
    p = default_priors()
    with numpyro.plate("D", D):
        mu = numpyro.sample("mu", p["mu"])
        sigma2 = numpyro.sample("sigma2", dist.InverseGamma(3.0, 1.0))
        W = numpyro.sample("W", p["W"].expand([K]).to_event(1))
    with numpyro.plate("N", N):
        z = numpyro.sample("z", p["z"].expand([K]).to_event(1))
        numpyro.sample("X", dist.Normal(z @ W.T + mu, jnp.sqrt(sigma2)).to_event(1), obs=X)


def test_updates_reading_a_removed_site_are_dropped_and_their_sites_derived():
    X = jnp.asarray(default_fa_data(0, N=30, D=4, K=2))
    kernel = ConjugateGibbs(fa_noise_variance, fa_updates())
    plan = kernel.plan(X, K=2)
    kinds = plan.site_kinds()
    reasons = dict(plan.dropped)
    for name in ("z | W, mu, psi", "W | z, mu, psi (rows)", "mu | z, W, psi"):
        assert "reads ['psi'], which the model does not have" in reasons[name]
    assert all(kinds[s][0] == "derived" for s in ("z", "W", "mu", "sigma2")), kinds
    mcmc = MCMC(kernel, num_warmup=20, num_samples=20, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), X, K=2)
    assert np.isfinite(np.asarray(mcmc.get_samples()["sigma2"])).all()


def test_the_models_own_table_reads_nothing_it_lacks():
    """The check itself: FA's table on FA reads no missing name; on the variant, the z update's
    look-up of psi is found."""
    from latentzoo.models.factor_analysis import factor_analysis
    from numpyro.handlers import seed, trace

    X = jnp.asarray(default_fa_data(0, N=10, D=3, K=1))
    for model, want in ((factor_analysis, []), (fa_noise_variance, ["psi"])):
        tr = trace(seed(model, 0)).get_trace(X, K=1)
        values = {n: s["value"] for n, s in tr.items() if s["type"] == "sample" and not s["is_observed"]}
        z_update = fa_updates()[0]
        assert missing_reads(z_update, model, values, (X,), {"K": 1}) == want
