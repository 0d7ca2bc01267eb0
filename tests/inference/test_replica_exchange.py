"""Replica exchange (latentzoo.inference.samplers.replica_exchange): the swap move, the kernel on
the beta = 1 chain (Geweke, SBC), a bimodal posterior plain Gibbs cannot cross, the ladder's
adaptation, and bad input.

Two toys whose tempered conditionals are one line each:

- ``normal_gamma``: x_i ~ N(mu, 1/tau), mu | tau ~ N(m0, 1/(k0 tau)), tau ~ Gamma(a0, b0). Its
  tempered posterior p(mu, tau) p(x | mu, tau)^beta is again Normal-Gamma (the data count and
  sums scaled by beta), so every rung can be drawn exactly: the Geweke test refreshes the hot
  copies from their exact targets after each new data draw, which makes the successive-conditional
  chain stationary for a correct kernel (stale hot copies would not be).
- ``bilinear``: x_i ~ N(a b, s^2), a, b ~ N(0, 1): the posterior has two modes, (a, b) and
  (-a, -b), which single-site Gibbs cannot cross once the data pin a b away from 0.

The controls are two wrong swap ratios: a dropped factor, beta_m (l_{m+1} - l_m) in place of
(beta_m - beta_{m+1}) (l_{m+1} - l_m), and a lost accept step (every swap taken).
"""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC
from scipy import stats

from latentzoo.inference.calibration import of_data, sbc, sbc_runs
from latentzoo.inference.gibbs import ConjugateGibbs
from latentzoo.inference.samplers import (
    ReplicaExchange,
    adapt_ladder,
    geometric_ladder,
    observed_log_likelihood,
    swap_log_ratio,
    swap_step,
)
from latentzoo.inference.samplers.replica_exchange import adaptation_ends
from latentzoo.inference.tempering import temperature
from latentzoo.inference.updates import GibbsUpdate, unwrap


def dropped_beta_ratio(betas, log_lik):
    """Wrong: the next rung's beta dropped from the ratio."""
    return betas[:-1] * (log_lik[1:] - log_lik[:-1])


def accept_step_lost(betas, log_lik):
    """Wrong: every proposed swap accepted (the ratio of each copy's own tempered density to
    itself, i.e. no exchange in the ratio)."""
    return jnp.zeros_like(log_lik[1:])


def with_ratio(kernel, knob, broken=dropped_beta_ratio):
    """``kernel`` with the correct swap ratio at knob 0 and ``broken`` at knob 1 (a traced
    choice, so one compiled program runs both)."""
    kernel.swap_log_ratio = lambda b, l: jnp.where(knob > 0.5, broken(b, l), swap_log_ratio(b, l))
    return kernel


# ----------------------------------------------------------------------------- the swap move
def test_swap_step_keeps_the_product_of_tempered_targets_and_the_dropped_beta_does_not():
    """Exact draws from prod_m pi_m on a 6-state space, one swap step at each parity: every
    rung's frequencies must stay pi_m (chi-square over 4e5 draws); the broken ratio must not.
    The states' log-likelihoods are far apart, so the broken ratio's bias is large."""
    rng = np.random.default_rng(0)
    S, n = 6, 400_000
    log_prior = np.log(rng.dirichlet(np.ones(S)))
    ell = rng.normal(0.0, 3.0, S)
    betas = np.array([1.0, 0.5, 0.2, 0.05])
    targets = [np.exp(log_prior + b * ell - np.logaddexp.reduce(log_prior + b * ell)) for b in betas]
    states = np.stack([rng.choice(S, size=n, p=t) for t in targets], axis=1)  # (n, M)

    def one(key, s, parity, ratio):
        out, _, _ = swap_step(key, {"s": s}, jnp.asarray(ell)[s], jnp.asarray(betas), parity, ratio)
        return out["s"]

    def pvalues(ratio):
        ps = []
        for parity in (0, 1):
            keys = jax.random.split(jax.random.PRNGKey(parity), n)
            out = np.asarray(jax.jit(jax.vmap(partial(one, parity=parity, ratio=ratio)))(keys, jnp.asarray(states)))
            for m, t in enumerate(targets):
                counts = np.bincount(out[:, m], minlength=S)
                ps.append(stats.chisquare(counts, n * t).pvalue)
        return np.array(ps)

    good, bad = pvalues(swap_log_ratio), pvalues(dropped_beta_ratio)
    assert good.min() > 1e-3 / good.size, good
    assert bad.min() < 1e-12, bad


def test_swap_step_moves_disjoint_pairs_of_one_parity():
    ell = jnp.array([0.0, 10.0, 20.0, 30.0])  # every swap proposal is accepted (ratio > 1)
    betas = jnp.array([1.0, 0.5, 0.25, 0.125])
    ids = {"i": jnp.arange(4)}
    even, ll, acc = swap_step(jax.random.PRNGKey(0), ids, ell, betas, 0)
    assert even["i"].tolist() == [1, 0, 3, 2] and ll.tolist() == [10.0, 0.0, 30.0, 20.0]
    odd, _, _ = swap_step(jax.random.PRNGKey(0), ids, ell, betas, 1)
    assert odd["i"].tolist() == [0, 2, 1, 3]
    assert np.allclose(acc, 1.0)


# ------------------------------------------------------------------------------ two toys
M0, K0, A0, B0 = 0.4, 0.7, 3.0, 2.0  # non-default hyperparameters of the Normal-Gamma toy


def normal_gamma(X, n=8):
    tau = numpyro.sample("tau", dist.Gamma(A0, B0))
    mu = numpyro.sample("mu", dist.Normal(M0, 1.0 / jnp.sqrt(K0 * tau)))
    with numpyro.plate("n", n):
        numpyro.sample("X", dist.Normal(mu, 1.0 / jnp.sqrt(tau)), obs=X)


def _ng_mu(values, obs, priors):
    beta, x, tau = temperature(priors["X"]), obs["X"], values["tau"]
    k = K0 + beta * x.shape[0]
    return {"mu": dist.Normal((K0 * M0 + beta * x.sum()) / k, 1.0 / jnp.sqrt(k * tau))}


def _ng_tau(values, obs, priors):
    beta, x, mu = temperature(priors["X"]), obs["X"], values["mu"]
    shape = A0 + 0.5 + 0.5 * beta * x.shape[0]
    rate = B0 + 0.5 * K0 * (mu - M0) ** 2 + 0.5 * beta * jnp.sum((x - mu) ** 2)
    return {"tau": dist.Gamma(shape, rate)}


NG_TABLE = [
    GibbsUpdate("mu | tau", ("mu",), {"mu": (dist.Normal,), "X": (dist.Normal,)}, _ng_mu, tempered=True),
    GibbsUpdate("tau | mu", ("tau",), {"tau": (dist.Gamma,), "X": (dist.Normal,)}, _ng_tau, tempered=True),
]


def ng_exact(key, x, beta):
    """One draw of (mu, tau) from p(mu, tau) p(x | mu, tau)^beta (Normal-Gamma, counts x beta)."""
    n, xbar = x.shape[0], x.mean()
    k = K0 + beta * n
    m = (K0 * M0 + beta * n * xbar) / k
    a = A0 + 0.5 * beta * n
    b = B0 + 0.5 * beta * jnp.sum((x - xbar) ** 2) + 0.5 * K0 * beta * n * (xbar - M0) ** 2 / k
    k1, k2 = jax.random.split(key)
    tau = jax.random.gamma(k1, a) / b
    return {"mu": m + jax.random.normal(k2) / jnp.sqrt(k * tau), "tau": tau}


SIGMA = 0.3


def bilinear(X, n=10):
    a = numpyro.sample("a", dist.Normal(0.0, 1.0))
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    with numpyro.plate("n", n):
        numpyro.sample("X", dist.Normal(a * b, SIGMA), obs=X)


def _bilinear_update(site, other):
    def conditional(values, obs, priors):
        beta, x, w = temperature(priors["X"]), obs["X"], values[other]
        prior, lik = unwrap(priors[site]), unwrap(priors["X"])
        prec = 1.0 / prior.scale**2 + beta * w**2 * x.shape[0] / lik.scale**2
        mean = (prior.loc / prior.scale**2 + beta * w * x.sum() / lik.scale**2) / prec
        return {site: dist.Normal(mean, 1.0 / jnp.sqrt(prec))}

    return GibbsUpdate(f"{site} | {other}", (site,), {site: (dist.Normal,), "X": (dist.Normal,)},
                       conditional, tempered=True)


BILINEAR_TABLE = [_bilinear_update("a", "b"), _bilinear_update("b", "a")]


# ------------------------------------------------------------- the kernel on the beta = 1 chain
def _geweke_z(prior, chain):
    from numpyro.diagnostics import effective_sample_size

    z = []
    for f_prior, f_chain in ((prior, chain), (prior**2, chain**2)):
        ess = np.clip(np.asarray(effective_sample_size(f_chain[None])), 1.0, len(f_chain))
        se = np.sqrt(f_prior.var(0) / len(f_prior) + f_chain.var(0) / ess)
        z.append((f_chain.mean(0) - f_prior.mean(0)) / se)
    return np.abs(np.concatenate(z))


def test_geweke_on_the_beta_one_chain_passes_and_the_dropped_beta_fails():
    """Successive-conditional chain: new data from the first copy, the hot copies redrawn from
    their exact tempered posteriors, then one replica-exchange step (two-block Gibbs on every
    copy, then swaps), the data drawn from the first copy. 20000 steps; the threshold is
    Bonferroni at 1 % over 8 moments
    (|z| < 3.22): measured max |z| 1.4 for the kernel, 7.3 for the dropped-beta ratio (on
    tau (xbar - mu)^2, the tie between the first copy and the data)."""
    n, steps = 8, 20_000
    betas = np.array([1.0, 0.35, 0.1])
    kwargs = dict(n=n)

    def prior_draw(key):
        k1, k2 = jax.random.split(key)
        tau = jax.random.gamma(k1, A0) / B0
        return jnp.stack([M0 + jax.random.normal(k2) / jnp.sqrt(K0 * tau), tau])

    def g(theta, x):
        """Test functions of the parameters *and* the data they were drawn with: the parameters'
        marginal alone is the prior whichever rung a copy came from (a hot copy given data from
        the prior predictive is nearly a prior draw), its tie to the data is not."""
        mu, tau = theta
        return jnp.stack([mu, tau, tau * (x.mean() - mu) ** 2, mu * x.mean()])

    def joint_draw(key):
        k1, k2 = jax.random.split(key)
        theta = prior_draw(k1)
        return g(theta, theta[0] + jax.random.normal(k2, (n,)) / jnp.sqrt(theta[1]))

    G_prior = np.asarray(jax.vmap(joint_draw)(jax.random.split(jax.random.PRNGKey(1), 40_000)))

    @jax.jit
    def run(knob, key):
        kernel = with_ratio(ReplicaExchange(normal_gamma, NG_TABLE, betas=betas, adapt=False), knob)
        k0, k_x, k_run = jax.random.split(key, 3)
        start = dict(zip(("mu", "tau"), prior_draw(k0)))
        x0 = start["mu"] + jax.random.normal(k_x, (n,)) / jnp.sqrt(start["tau"])
        state = kernel.init(k_run, 0, start, (x0,), kwargs)

        def body(state, k):
            k_x, k_hot = jax.random.split(k)
            z = state.z
            x = z["mu"] + jax.random.normal(k_x, (n,)) / jnp.sqrt(z["tau"])
            hot = jax.vmap(lambda kk, b: ng_exact(kk, x, b))(jax.random.split(k_hot, len(betas) - 1),
                                                             jnp.asarray(betas[1:]))
            replicas = {s: jnp.concatenate([z[s][None], hot[s]]) for s in ("mu", "tau")}
            state = kernel.sample(state._replace(replicas=replicas), (x,), kwargs)
            return state, g((state.z["mu"], state.z["tau"]), x)

        return jax.lax.scan(body, state, jax.random.split(key, steps))[1]

    threshold = 3.22  # Bonferroni, 1 % over 8 moments
    good = _geweke_z(G_prior, np.asarray(run(0.0, jax.random.PRNGKey(2))))
    bad = _geweke_z(G_prior, np.asarray(run(1.0, jax.random.PRNGKey(2))))
    assert good.max() < threshold, good
    assert bad.max() > threshold, bad


def _bilinear_tests():
    return {"a": lambda v: v["a"], "ab": lambda v: v["a"] * v["b"],
            "log_lik": of_data(lambda v, x: -jnp.sum((x - v["a"] * v["b"]) ** 2))}


def test_sbc_on_a_bimodal_posterior_passes_where_plain_gibbs_fails():
    """SBC on the bilinear toy; each simulation's chain starts at an independent prior draw,
    so half start in the other mode. Plain Gibbs keeps its start's sign: a's ranks pile up at
    the ends (p ~ 1e-14). Replica exchange over 6 rungs down to beta = 0.01 crosses and passes at
    the Bonferroni level (p >= 0.2 at this seed); a swap whose accept step is lost fails it.

    The dropped-beta ratio of the Geweke test below is not this test's control: it only makes
    swaps into the first copy rarer than they should be, and its bias on that copy is below
    what ranks resolve (measured here: p >= 0.2 with 200 or 1000 simulations, with or without
    the data-dependent log_lik). The Geweke test, whose hot copies are exact every step, sees it.
    """
    kwargs = dict(n=10)
    opts = dict(num_simulations=200, num_warmup=100, num_draws=99, thin=5)
    plain = sbc(bilinear, ConjugateGibbs(bilinear, BILINEAR_TABLE), kwargs, _bilinear_tests(),
                jax.random.PRNGKey(1), **opts)
    good, bad = sbc_runs(
        bilinear,
        lambda knob: with_ratio(ReplicaExchange(bilinear, BILINEAR_TABLE, num_replicas=6, min_beta=0.01),
                                knob, accept_step_lost),
        [0.0, 1.0], kwargs, _bilinear_tests(), jax.random.PRNGKey(1), **opts)
    assert not plain.passed and plain.p_values[0] < 1e-6, plain.p_values
    assert good.passed, good.p_values
    assert not bad.passed, bad.p_values


def test_both_modes_in_equal_proportions_where_plain_gibbs_is_stuck():
    """Data with a b = 1.5 (modes at a = +-1.22, separated by a likelihood drop of ~500 nats):
    four chains started in the a > 0 mode. Plain Gibbs never leaves it; replica exchange spends
    half its draws in each (symmetry: the exact share is 1/2), within 0.1."""
    X = 1.5 + SIGMA * jax.random.normal(jax.random.PRNGKey(3), (10,))
    init = {"a": jnp.full(4, 1.2), "b": jnp.full(4, 1.2)}

    def share_positive(kernel):
        mcmc = MCMC(kernel, num_warmup=300, num_samples=2000, num_chains=4, chain_method="vectorized",
                    progress_bar=False)
        mcmc.run(jax.random.PRNGKey(4), X, n=10, init_params=init,
                 extra_fields=("swap_accept_prob",) if isinstance(kernel, ReplicaExchange) else ())
        return float(np.mean(np.asarray(mcmc.get_samples()["a"]) > 0)), mcmc

    stuck, _ = share_positive(ConjugateGibbs(bilinear, BILINEAR_TABLE))
    share, mcmc = share_positive(ReplicaExchange(bilinear, BILINEAR_TABLE, num_replicas=6, min_beta=0.01))
    assert stuck == 1.0
    assert abs(share - 0.5) < 0.1, share
    rates = np.asarray(mcmc.get_extra_fields()["swap_accept_prob"]).mean(0)
    assert rates.shape == (5,) and rates.min() > 0.2, rates


# ----------------------------------------------------------------------------- the ladder
def test_adapted_ladder_equalises_the_rejection_rates_and_keeps_its_ends():
    """With rejection rate proportional to the log-gap of each pair (a stand-in for a target
    whose barrier is uniform in log beta), adaptation of a linear ladder moves it to the
    geometric one, whose rates are all equal; the ends stay."""
    betas = jnp.linspace(1.0, 0.01, 6)
    for _ in range(30):
        rejection = 0.2 * jnp.log(betas[:-1] / betas[1:])
        betas = adapt_ladder(betas, rejection)
    rates = 0.2 * np.log(np.asarray(betas[:-1] / betas[1:]))
    assert np.ptp(rates) < 0.01 * rates.mean(), rates
    assert betas[0] == 1.0 and abs(betas[-1] - 0.01) < 1e-12
    assert np.allclose(betas, geometric_ladder(6, 0.01), rtol=0.02)


def test_a_pair_that_never_rejects_still_keeps_a_valid_ladder():
    """All rates 0 (a flat target): the floor on the rates keeps Lambda increasing, so the
    ladder stays a strictly decreasing one with its ends, never NaN."""
    betas = jnp.asarray(geometric_ladder(5, 0.05))
    new = adapt_ladder(betas, jnp.zeros(4))
    assert np.all(np.isfinite(new)) and np.all(np.diff(new) < 0)
    assert new[0] == 1.0 and abs(new[-1] - 0.05) < 1e-12


def test_observed_log_likelihood_sums_every_observed_site_with_its_scale():
    def two_sites(X, Y=None):
        a = numpyro.sample("a", dist.Normal(0.0, 1.0))
        numpyro.sample("X", dist.Normal(a, 1.0), obs=X)
        with numpyro.handlers.scale(scale=3.0):
            numpyro.sample("Y", dist.Normal(2 * a, 0.5), obs=Y)

    X, Y, a = jnp.array([0.3, -1.0]), jnp.array([1.5]), 0.4
    expected = dist.Normal(a, 1.0).log_prob(X).sum() + 3.0 * dist.Normal(2 * a, 0.5).log_prob(Y).sum()
    got = observed_log_likelihood(two_sites, {"a": a}, (X, Y), {})
    assert np.isclose(got, expected)
    only_x = observed_log_likelihood(two_sites, {"a": a}, (X, Y), {}, sites=("X",))
    assert np.isclose(only_x, dist.Normal(a, 1.0).log_prob(X).sum())


def test_the_ladder_changes_in_the_first_half_of_warmup_only():
    X = 1.5 + SIGMA * jax.random.normal(jax.random.PRNGKey(3), (10,))
    assert adaptation_ends(300).tolist() == [18, 37, 75, 150]
    assert adaptation_ends(32).tolist() == [16]  # a round of MIN_ADAPT_ROUND steps is allowed
    assert adaptation_ends(31).tolist() == []
    kernel = ReplicaExchange(bilinear, BILINEAR_TABLE, num_replicas=5, min_beta=0.01)
    mcmc = MCMC(kernel, num_warmup=300, num_samples=200, progress_bar=False)
    mcmc.warmup(jax.random.PRNGKey(0), X, n=10, extra_fields=("betas",), collect_warmup=True)
    warm = np.asarray(mcmc.get_extra_fields()["betas"])  # (300, 5)
    mcmc.post_warmup_state = mcmc.last_state
    # the continued run starts from that state: NumPyro must not initialise the kernel again
    # (it did for every checkpoint segment, re-planning the table and warning about a prior start)
    inits = []
    kernel.init = lambda *a, **k: inits.append(1) or ReplicaExchange.init(kernel, *a, **k)
    mcmc.run(mcmc.post_warmup_state.rng_key, X, n=10, extra_fields=("betas",))
    assert not inits
    ladders = np.concatenate([warm, np.asarray(mcmc.get_extra_fields()["betas"])])  # (500, 5)
    assert not np.allclose(ladders[0], ladders[160])  # adapted
    assert np.all(ladders[150:] == ladders[150])  # then fixed for the rest of the run
    assert ladders[-1, 0] == 1.0 and abs(ladders[-1, -1] - 0.01) < 1e-12


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("kwargs, message", [
    (dict(num_replicas=1), "at least 2 temperatures"),
    (dict(min_beta=0.0), r"min_beta.*\(0, 1\)"),
    (dict(min_beta=1.5), r"min_beta.*\(0, 1\)"),
    (dict(betas=[1.0]), "at least 2 temperatures"),
    (dict(betas=[1.0, 1.2]), r"lie in \(0, 1\]"),
    (dict(betas=[1.0, 0.0]), r"lie in \(0, 1\]"),
    (dict(betas=[0.9, 0.5]), "start at 1 and strictly decrease"),
    (dict(betas=[1.0, 0.2, 0.5]), "start at 1 and strictly decrease"),
])
def test_a_bad_ladder_is_one_sentence(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ReplicaExchange(bilinear, BILINEAR_TABLE, **kwargs)


def test_a_table_without_a_tempered_form_is_refused():
    X = jnp.ones(10)
    untempered = [u._replace(tempered=False) for u in BILINEAR_TABLE]
    mcmc = MCMC(ReplicaExchange(bilinear, untempered), num_warmup=1, num_samples=1, progress_bar=False)
    with pytest.raises(ValueError, match="no tempered form"):
        mcmc.run(jax.random.PRNGKey(0), X, n=10)
    partial_table = BILINEAR_TABLE[:1]
    mcmc = MCMC(ReplicaExchange(bilinear, partial_table), num_warmup=1, num_samples=1, progress_bar=False)
    with pytest.raises(ValueError, match=r"\['b'\] would fall back"):
        mcmc.run(jax.random.PRNGKey(0), X, n=10)
