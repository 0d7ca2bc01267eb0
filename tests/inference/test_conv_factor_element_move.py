"""The element birth/death move of convolutional FA (:mod:`latentzoo.inference.conv_factor.element_move`).

Deterministic: the Normal-Gamma marginal against SciPy's Student t; the atom proposal's density
against a direct sum over patches.
Exact, statistical (fixed seeds): with one 1x1 atom on three one-pixel images, the posterior
mass of each state the move connects (no image uses the element, or image n alone does) is a
ratio of 2-D integrals over (atom, map), computed by quadrature. Chains started from those masses
and run with the move and the exact updates that keep b fixed must keep them; the move without any
one of its terms (the image choice's log N, what is left of pi's Beta prior, the atom's or the
map's Student t, the atom proposal's density) must not. The values a birth or death draws,
which the ratio does not read, against their stated laws (probability integral transform).
The default table with the move passes Geweke, and without the map's Student t fails it; its
SBC (about 45 s) runs with LATENTZOO_THOROUGH=1, since the registry's table has no move.
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from numpyro.primitives import Messenger
import pytest
from scipy import stats
from scipy.special import betaln

from latentzoo.families.conv_factor import CFA_CHECK_PRIORS, CFA_TEST_FUNCTIONS
from latentzoo.inference.calibration import SBC_COMPILER_OPTIONS
from latentzoo.inference.checks import geweke_tests, sbc, simulate
from latentzoo.inference.conjugate import beta_bernoulli_update
from latentzoo.inference.conv_factor import (
    W_update,
    alpha_update,
    beta_update,
    cfa_updates,
    d_update,
)
from latentzoo.inference.conv_factor.element_move import (
    atom_proposal_log_density,
    element_move,
    log_student,
)
from latentzoo.inference.gibbs import ConjugateGibbs, read_model, sweep_values
from latentzoo.inference.updates import Move, unwrap
from latentzoo.models.conv_factor import conv_factor


def test_the_normal_gamma_marginal_is_scipy_s_student_t():
    x = np.linspace(-7.0, 9.0, 41)
    for loc, shape, rate in [(0.0, 1.0, 1e-3), (0.5, 2.5, 1.2), (-1.0, 0.5, 3.0)]:
        ref = stats.t.logpdf(x, df=2 * shape, loc=loc, scale=np.sqrt(rate / shape))
        np.testing.assert_allclose(log_student(x, loc, shape, rate), ref, rtol=1e-10, atol=1e-10)


def test_the_atom_proposal_density_sums_over_every_patch():
    rng = np.random.default_rng(0)
    C, H, Wd, h, w, scale = 2, 4, 5, 2, 3, 0.7
    R = rng.normal(size=(C, H, Wd))
    R[:, :2, :3] = 0.0  # one patch of zeros: its centre is 0
    d = rng.normal(size=(C, h, w)) * 0.3
    tau = scale / (4.0 * np.sqrt(C * h * w))
    terms = []
    for i in range(H - h + 1):
        for j in range(Wd - w + 1):
            p = R[:, i:i + h, j:j + w]
            n = np.linalg.norm(p)
            c = scale * p / n if n > 0 else 0 * p
            terms.append(stats.norm.logpdf(d, c, tau).sum())
    ref = np.logaddexp.reduce(terms) - np.log(len(terms))
    np.testing.assert_allclose(atom_proposal_log_density(jnp.asarray(d), jnp.asarray(R), scale),
                               ref, rtol=1e-10)


# --------------------------------------------------------------- exact state frequencies
A, B0, E, F, G, H = 0.7, 2.5, 1.5, 2.0, 2.5, 1.2  # pi ~ Beta(a, b), alpha ~ Ga(e, f), beta ~ Ga(g, h)
PRIORS = {"pi": dist.Beta(A, B0), "gamma": dist.Gamma(2.0, 1.0), "alpha": dist.Gamma(E, F),
          "beta": dist.Gamma(G, H)}
PIXELS, GAMMA = np.array([1.4, -0.3, 2.2]), np.array([2.0, 1.0, 3.0])
ONE_PIXEL = dict(K=1, atom_shape=(1, 1), N=3, image_shape=(1, 1, 1), priors=PRIORS)


def _log_t(z, shape, rate):
    return stats.t.logpdf(z, df=2 * shape, scale=np.sqrt(rate / shape))


def _log_evidence_on(x, gamma, n=2001, half_width=10.0):
    """log of the integral over atom d and map w of t(d) t(w) N(x; w d, 1/gamma), on a grid
    uniform in asinh of each (the likelihood's ridge w d = x then has a constant width there)."""
    s = np.linspace(-half_width, half_width, n)
    v, log_jac = np.sinh(s), np.log(np.cosh(s))
    terms = (_log_t(v, G, H) + log_jac)[:, None] + (_log_t(v, E, F) + log_jac)[None, :] \
        + stats.norm.logpdf(x, v[:, None] * v[None, :], 1 / np.sqrt(gamma))
    return np.logaddexp.reduce(terms.ravel()) + 2 * np.log(s[1] - s[0])


def _state_masses():
    """Posterior mass of: no image uses the element, image 0 alone, 1 alone, 2 alone."""
    N = len(PIXELS)
    off = stats.norm.logpdf(PIXELS, 0.0, 1 / np.sqrt(GAMMA))
    logw = [betaln(A, B0 + N) + off.sum()]
    logw += [betaln(A + 1, B0 + N - 1) + off.sum() - off[n] + _log_evidence_on(PIXELS[n], GAMMA[n])
             for n in range(N)]
    p = np.exp(np.array(logw) - max(logw))
    return p / p.sum()


def test_the_quadrature_of_the_state_masses_has_converged():
    finer = _log_evidence_on(PIXELS[2], GAMMA[2], n=4001, half_width=12.0)
    assert abs(finer - _log_evidence_on(PIXELS[2], GAMMA[2])) < 1e-6


TERMS = ("log_n", "atom_prior", "pi", "map_prior", "log_q_atom")


def _state_frequency_z(weights, chains=2000, settle=20, sweeps=60, seed=3):
    """z-scores of the four states' frequencies after ``sweeps`` sweeps of [move, W, d, alpha,
    beta, pi] (the updates after the move never change b), from starts whose state is drawn from
    the exact masses and whose other values settled for ``settle`` sweeps without the move; one
    array per row of ``weights``. A row has one weight per name in TERMS (1 keeps that term of the
    move's ratio, 0 drops it) and is an argument of the compiled program: the right move and its
    controls compile once."""
    p = _state_masses()
    N = len(PIXELS)
    X = jnp.asarray(PIXELS.reshape(N, 1, 1, 1))

    def sweeps_of(updates, v, key, count):
        def one(v, k):
            return sweep_values(conv_factor, updates, v, jax.random.split(k, len(updates)), (X,),
                                ONE_PIXEL), None

        return jax.lax.scan(one, v, jax.random.split(key, count))[0]

    def chain(key, state, w):
        table = [element_move(drop=dict(zip(TERMS, w))), W_update(), d_update(), alpha_update(),
                 beta_update(), beta_bernoulli_update("pi", "b")]
        v, _ = simulate(conv_factor, ONE_PIXEL, key)
        on = (jnp.arange(N) == state - 1).astype(v["b"].dtype)[:, None]
        v = {**v, "b": on, "gamma": jnp.asarray(GAMMA)}
        v = sweeps_of(table[1:], v, jax.random.fold_in(key, 1), settle)
        v = sweeps_of(table, v, jax.random.fold_in(key, 2), sweeps)
        return v["b"][:, 0]

    start = np.random.default_rng(seed).choice(N + 1, size=chains, p=p)
    keys = jax.random.split(jax.random.PRNGKey(seed), chains)
    # one long-running program: XLA's optimised code, as for SBC (the suite compiles at level 0)
    program = jax.jit(jax.vmap(chain, in_axes=(0, 0, None)), compiler_options=SBC_COMPILER_OPTIONS)
    out = []
    for w in np.atleast_2d(weights):
        b = np.asarray(program(keys, jnp.asarray(start), jnp.asarray(w, jnp.float64)))
        used = b.sum(1)
        assert np.all(used <= 1)  # the move never reaches two images on
        state = np.where(used == 0, 0, 1 + b.argmax(1))
        count = np.bincount(state, minlength=N + 1)
        out.append((count - chains * p) / np.sqrt(chains * p * (1 - p)))
    return out


def _without(*names):
    return [0.0 if t in names else 1.0 for t in TERMS]


DEFAULT_CONTROLS = ("log_n", "atom_prior")


def test_the_move_keeps_the_exact_masses_and_fails_without_a_term():
    """Four z-scores of 2000 independent chains, each N(0, 1) for a right move: threshold 4.
    Measured max |z| 1.3. Each control, from the same compiled program, must exceed 6: measured
    17.8 without the image choice's log N, 8.6 without the atom's Student t (and, below, 10.1
    without the pi term, 11.2 without the map's Student t, 32.6 without the atom proposal's
    density)."""
    right, *controls = _state_frequency_z([_without(), *(_without(t) for t in DEFAULT_CONTROLS)])
    assert np.max(np.abs(right)) < 4, np.round(right, 1)
    for name, z in zip(DEFAULT_CONTROLS, controls):
        assert np.max(np.abs(z)) > 6, (name, np.round(z, 1))


THOROUGH = pytest.mark.skipif(os.environ.get("LATENTZOO_THOROUGH") != "1",
                              reason="set LATENTZOO_THOROUGH=1")


@pytest.mark.slow
@THOROUGH
@pytest.mark.parametrize("drop", ["pi", "map_prior", "log_q_atom"])
def test_the_move_without_a_term_misses_the_masses(drop):
    """The other three terms run with LATENTZOO_THOROUGH=1 (the Geweke test below also catches
    the map's Student t); threshold 6, as above."""
    (z,) = _state_frequency_z([_without(drop)])
    assert np.max(np.abs(z)) > 6, np.round(z, 1)


# -------------------------------------------------------------------------------- Geweke
SMALL = dict(K=2, atom_shape=(2, 2), N=3, image_shape=(1, 5, 5), priors=CFA_CHECK_PRIORS)


@pytest.mark.slow
def test_the_table_with_the_move_passes_geweke_and_fails_without_the_map_s_student_t():
    """One compiled chain program, the map's Student t weighted by a traced knob: 1 is the right
    move, 0 the control. Measured: the right table max |z| 1.8 against 3.55 at these sizes; the
    control fails on the fraction of elements on (z = 6.5) and pi's sum (6.6). (Without the
    image choice's log N or the pi term the table still passes here: the other updates dilute
    the move; the exact masses above catch them.)"""

    def kernel_of(knob):
        move = element_move(drop={"map_prior": knob})
        return ConjugateGibbs(conv_factor, [move if isinstance(u, Move) and u.sites[0] == "pi" else u
                                            for u in cfa_updates(element_move=True)])

    good, bad = geweke_tests(conv_factor, kernel_of, [1.0, 0.0], SMALL, CFA_TEST_FUNCTIONS,
                             jax.random.PRNGKey(1), num_steps=3000, num_prior=4096)
    assert good.passed, dict(zip(good.labels, np.round(good.z_scores, 1)))
    assert not bad.passed, dict(zip(bad.labels, np.round(bad.z_scores, 1)))


@pytest.mark.slow
@THOROUGH
def test_the_table_with_the_move_passes_sbc():
    """SBC of the default table with the move at the registry's informative sizes (3 images of
    6x6, K = 2) and warm-up (100 sweeps, thinning 4): passes in about 45 s on 2 cores, so behind
    LATENTZOO_THOROUGH (the move is off in the registry's table, whose SBC runs by default)."""
    table = cfa_updates(element_move=True)
    r = sbc(conv_factor, ConjugateGibbs(conv_factor, table),
            dict(SMALL, image_shape=(1, 6, 6)), CFA_TEST_FUNCTIONS, jax.random.PRNGKey(5),
            num_simulations=100, num_warmup=100, num_draws=49, thin=4, num_bins=5)
    assert r.passed, dict(zip(r.labels, np.round(r.p_values, 4)))


# ------------------------------------------------------------- what the move draws
ATOM_MEAN, MAP_MEAN = 0.4, 0.7


class _WithMeans(Messenger):
    """The model with prior means on the atoms and maps (the shipped model has 0)."""

    def process_message(self, msg):
        if msg["name"] in ("d", "W"):
            normal = unwrap(msg["fn"])
            mean = ATOM_MEAN if msg["name"] == "d" else MAP_MEAN
            msg["fn"] = dist.Normal(normal.loc + mean, normal.scale).to_event(
                4 if msg["name"] == "d" else 3)


def test_the_move_draws_its_new_values_from_the_stated_laws():
    """One move on 40000 copies (half where no image uses the element, half where image 0 alone
    does). After an accepted birth, beta' and alpha' must follow their Gamma conditionals given
    the new atom and map, and pi' Beta(a + 1, b + N - 1); after an accepted death, beta, alpha,
    the atom and the map their priors, and pi Beta(a, b + N). None of these draws enters the
    ratio, so the exact masses above barely see them (a wrong beta' draw survived them): each is
    checked here by the probability integral transform, Kolmogorov-Smirnov p > 1e-3 (8 tests; a
    right move fails one with probability < 0.01). A rejected move must change nothing."""
    N, copies = len(PIXELS), 40000
    X = jnp.asarray(PIXELS.reshape(N, 1, 1, 1))
    move = element_move()

    # The move's subject is element 1. Element 0 is used by every image, with an atom of 2.5: the
    # proposal's scale s is then 2.5, so that (d' - m)^2 and |d' - m| differ (with s = 1 a dropped
    # square passed). The maps' precisions have a rate per element (3 and F), so that reading
    # another element's prior shows.
    # The atoms' and maps' priors have means (0.4 and 0.7, where the model has 0), as a user's
    # edit of the model file would give them: a draw that drops the mean shows.
    kw = dict(ONE_PIXEL, K=2, priors={**PRIORS, "alpha": dist.Gamma(E, jnp.array([3.0, F])[:, None, None])})
    model = _WithMeans(conv_factor)

    def one(key, on):
        v, _ = simulate(model, kw, key)
        b = jnp.zeros_like(v["b"]).at[:, 0].set(1).at[0, 1].set(on.astype(v["b"].dtype))
        v = {**v, "b": b, "d": v["d"].at[0].set(2.5), "gamma": jnp.asarray(GAMMA)}
        priors, _, _ = read_model(model, v, (X,), kw)
        return v, move.sample(jax.random.fold_in(key, 1), v, {"X": X}, priors)

    on = jnp.asarray(np.arange(copies) % 2)
    # in batches of 2000 copies (all 40000 at once asked XLA for 27 GB)
    batches = jax.jit(lambda keys, on: jax.lax.map(lambda a: one(*a), (keys, on), batch_size=2000))
    before, after = batches(jax.random.split(jax.random.PRNGKey(11), copies), on)
    full = [{k: np.asarray(v).reshape(copies, -1) for k, v in s.items()} for s in (before, after)]
    # a rejected move (no switch changed) leaves every value as it was
    kept = np.all(full[0]["b"] == full[1]["b"], axis=1)
    for site in full[1]:  # the sites the move returns
        assert np.array_equal(full[0][site][kept], full[1][site][kept]), site
    # element 1 in image 0: entry 1 of every site flattened per copy
    before, after = ({k: v[:, 1] for k, v in s.items()} for s in full)
    born = (before["b"] == 0) & (after["b"] == 1)
    died = (before["b"] == 1) & (after["b"] == 0)
    assert born.sum() > 600 and died.sum() > 600, (born.sum(), died.sum())
    d, w = after["d"] - ATOM_MEAN, after["W"] - MAP_MEAN
    pits = {
        "beta after a birth": stats.gamma.cdf(after["beta"][born], G + 0.5, scale=1 / (H + d[born] ** 2 / 2)),
        "alpha after a birth": stats.gamma.cdf(after["alpha"][born], E + 0.5, scale=1 / (F + w[born] ** 2 / 2)),
        "pi after a birth": stats.beta.cdf(after["pi"][born], A + 1, B0 + N - 1),
        "beta after a death": stats.gamma.cdf(after["beta"][died], G, scale=1 / H),
        "atom after a death": stats.norm.cdf(d[died] * np.sqrt(after["beta"][died])),
        "alpha after a death": stats.gamma.cdf(after["alpha"][died], E, scale=1 / F),
        "map after a death": stats.norm.cdf(w[died] * np.sqrt(after["alpha"][died])),
        "pi after a death": stats.beta.cdf(after["pi"][died], A, B0 + N),
    }
    p = {name: stats.kstest(u, "uniform").pvalue for name, u in pits.items()}
    assert min(p.values()) > 1e-3, {k: round(v, 5) for k, v in p.items()}
