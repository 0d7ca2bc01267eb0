"""Prediction for new samples (latentzoo.inference.rank_svm.predict): the new samples' rank
insertion, the z* conditional against brute-force quadrature of the joint (K = 1 and K = 2, all
four variants), exact invariance of the R variants to monotone transforms, right answers on a
separable toy set, and the Predictive route.

The "posterior draws" are made by hand: prediction only needs draws of θ, and hand-made ones
with known structure make the right answer known without a fit."""

import numpy as np
import pytest
from scipy import stats

from latentzoo.inference.rank_svm.predict import (
    insert_ranks,
    label_probability,
    new_sample_states,
    posterior_predictive,
    predict_proba,
)
from latentzoo.models.rank_factor_svm import rank_pairs, stick_weights

EPS = 1.0  # the default rank margin


def _toy(seed=0, N=40):
    """Training features monotone in a score s (three differently warped copies), labels
    sign(s), and new samples with known scores (one outside the training range)."""
    rng = np.random.default_rng(seed)
    s = rng.uniform(-2.0, 2.0, N)
    warp = lambda v: np.stack([v, v**3, np.exp(v)], 1)  # noqa: E731
    s_new = np.array([-1.5, -0.4, 0.4, 1.7, 3.0])
    return warp(s), np.sign(s), warp(s_new), s, s_new


def _draws(variant, s, S=6, seed=1, T=3):
    """Hand-made posterior draws, K = 1: training z = s (R), loadings that make adjacent
    training samples at least ε apart in w (R) or x = s exactly (G), β = 3."""
    rng = np.random.default_rng(seed)
    D, N = 3, len(s)
    d = {"beta": np.full((S, T if variant.endswith("NL") else 1, 1), 3.0)}
    if variant.startswith("R"):
        d["A"] = 30.0 + rng.normal(0.0, 1.0, (S, D, 1))
        d["z"] = s[None, :, None] + 0.01 * rng.normal(size=(S, N, 1))
    else:
        d["A"] = np.ones((S, D, 1))
        d["tau"] = np.full((S, D), 100.0)
    if variant.endswith("NL"):
        d.update(mu=np.zeros((S, T, 1)), psi=np.ones((S, T)), nu=np.full((S, T - 1), 0.5))
    return d


@pytest.mark.smoke
def test_insert_ranks_pairs_with_the_nearest_strictly_lower_and_upper_samples():
    X = np.array([[0.0], [1.0], [0.0], [2.0], [1.0], [2.0]])  # stable order: 0 2 | 1 4 | 3 5
    new = np.array([[1.0], [0.5], [-1.0], [2.0], [7.0]])
    r = insert_ranks(X, new)
    # x* = 1 ties the 1-group: below is the last 0 (sample 2), above the first 2 (sample 3)
    assert (r.lo[0, 0], r.hi[0, 0], r.has_lo[0, 0], r.has_hi[0, 0]) == (2, 3, True, True)
    assert (r.lo[1, 0], r.hi[1, 0]) == (2, 1)  # between the groups: last 0, first 1
    assert not r.has_lo[2, 0] and r.has_hi[2, 0] and r.hi[2, 0] == 0
    assert r.has_lo[3, 0] and not r.has_hi[3, 0] and r.lo[3, 0] == 4
    assert r.has_lo[4, 0] and not r.has_hi[4, 0] and r.lo[4, 0] == 5
    # the same stable order as the training pairs: the neighbours are adjacent groups there
    p = rank_pairs(X)
    assert {(int(a), int(b)) for a, b in zip(p.lo, p.hi)} == {(0, 1), (2, 4), (1, 3), (4, 5)}


def test_small_cholesky_and_solves_match_lapack():
    """The jnp-only K x K algebra the draws use (LAPACK's batched Cholesky inside the vmapped
    sweeps has hung XLA's CPU runtime) against NumPy."""
    from latentzoo.inference.rank_svm.predict import backward_solve, small_cholesky, forward_solve

    rng = np.random.default_rng(0)
    B = rng.normal(size=(4, 3, 5, 5))
    P = B @ np.swapaxes(B, -1, -2) + 0.3 * np.eye(5)
    b = rng.normal(size=(4, 3, 5))
    L = np.asarray(small_cholesky(P))
    np.testing.assert_allclose(L, np.linalg.cholesky(P), atol=1e-12)
    np.testing.assert_allclose(backward_solve(L, forward_solve(L, b)), np.linalg.solve(P, b[..., None])[..., 0],
                               atol=1e-10)


def test_small_gaussian_draw_has_the_precisions_inverse_as_covariance():
    """40000 draws with a strongly correlated 3 x 3 precision: mean P⁻¹h and covariance P⁻¹
    within 4% of the largest entry (noise through L⁻¹ instead of L⁻ᵀ is off by ~50%)."""
    import jax

    from latentzoo.inference.rank_svm.predict import small_gaussian_draw

    P = np.array([[2.0, 1.5, 0.2], [1.5, 3.0, -1.0], [0.2, -1.0, 1.0]])
    h = np.array([0.5, -1.0, 2.0])
    x = np.asarray(jax.vmap(lambda k: small_gaussian_draw(k, P, h))(jax.random.split(jax.random.PRNGKey(0), 40000)))
    cov = np.linalg.inv(P)
    np.testing.assert_allclose(x.mean(0), cov @ h, atol=0.04 * np.abs(cov).max())
    np.testing.assert_allclose(np.cov(x.T), cov, atol=0.04 * np.abs(cov).max())


def test_label_probability_is_the_normalised_hinge():
    u = np.array([-3.0, -1.0, -0.2, 0.0, 0.5, 1.0, 4.0])
    h = lambda c: np.exp(-2.0 * np.maximum(0.0, c))  # noqa: E731
    np.testing.assert_allclose(label_probability(u), h(1 - u) / (h(1 - u) + h(1 + u)), rtol=1e-12)


@pytest.mark.parametrize("variant", ["R-L", "R-NL", "G-L", "G-NL"])
def test_separable_toy_set_is_predicted_right(variant):
    X, y, X_new, s, s_new = _toy()
    p = predict_proba(_draws(variant, s), X, X_new if variant[0] == "R" else np.stack([s_new] * 3, 1),
                      variant=variant)
    # scores -1.5, -0.4 are class -1, 0.4, 1.7, 3.0 class +1, and the far ones are sure
    assert np.all((p > 0.5) == (s_new > 0)), p
    assert p[0] < 0.01 and p[3] > 0.99 and p[4] > 0.99, p
    if variant[0] == "R":  # the new z* land between their neighbours' scores
        z = np.asarray(new_sample_states(_draws(variant, s), X, X_new, variant=variant)["z_new"])
        np.testing.assert_allclose(z[..., :4, 0].mean((0, 1)), s_new[:4], atol=0.2)


@pytest.mark.parametrize("variant", ["R-L", "R-NL"])
def test_rank_variants_are_exactly_invariant_to_monotone_transforms(variant):
    X, y, X_new, s, s_new = _toy()
    draws = _draws(variant, s)
    base = predict_proba(draws, X, X_new, variant=variant, seed=3)
    # a random rank warp: piecewise linear through random increasing knots, strictly increasing
    # over the whole range of the data
    rng = np.random.default_rng(0)
    knots = np.concatenate([[-1e3], np.sort(rng.uniform(-30.0, 30.0, 200)), [1e3]])
    heights = np.cumsum(rng.gamma(0.5, size=202))
    warp = lambda v: np.interp(v, knots, heights)  # noqa: E731
    for f in (np.exp, lambda v: v**3, lambda v: np.arctan(v) * 5.0 - 2.0, warp):
        np.testing.assert_array_equal(predict_proba(draws, f(X), f(X_new), variant=variant, seed=3), base)
    # a transform that is not monotone (it swaps the order) changes them
    assert not np.array_equal(predict_proba(draws, -X, -X_new, variant=variant, seed=3), base)


def test_gaussian_variant_is_not_invariant():
    X, y, X_new, s, s_new = _toy()
    Xg = np.stack([s_new] * 3, 1)
    draws = _draws("G-L", s)
    assert not np.allclose(predict_proba(draws, None, np.exp(Xg), variant="G-L"),
                           predict_proba(draws, None, Xg, variant="G-L"), atol=0.05)


# --------------------------------------------------------- the conditional against quadrature
def _one_draw(variant, K, rng, N=30, D=3, T=3):
    """A single non-trivial draw: loadings with mixed signs, NL components far apart."""
    d = {"A": rng.normal(0.0, 1.0, (D, K)) + np.array([1.0, -0.8, 0.6])[:D, None],
         "beta": rng.normal(size=(T if variant.endswith("NL") else 1, K))}
    if variant.startswith("R"):
        d["z"] = rng.normal(size=(N, K))
    else:
        d["tau"] = np.array([2.0, 0.5, 4.0])[:D]
    if variant.endswith("NL"):
        d.update(mu=np.linspace(-1.5, 2.0, T)[:, None] * np.ones(K), psi=np.array([4.0, 1.0, 2.0]),
                 nu=np.array([0.3, 0.6]))
    return d


def _log_joint(variant, d, X_train, x_new, zs):
    """log p(t, z* | x*, θ) on a grid zs (G, K), for each t: (T, G) (without the label)."""
    mixture = variant.endswith("NL")
    A = d["A"]
    w = zs @ A.T  # (G, D)
    if variant.startswith("R"):
        r = insert_ranks(X_train, x_new[None])
        cols = np.arange(A.shape[0])
        wt = d["z"] @ A.T
        w_lo, w_hi = wt[r.lo[0], cols], wt[r.hi[0], cols]
        like = -2.0 * (r.has_lo[0] * np.maximum(0.0, EPS - (w - w_lo))
                       + r.has_hi[0] * np.maximum(0.0, EPS - (w_hi - w))).sum(-1)
    else:
        like = -0.5 * (d["tau"] * (x_new - w) ** 2).sum(-1)
    if not mixture:
        return (like - 0.5 * (zs**2).sum(-1))[None]
    q = np.asarray(stick_weights(d["nu"]))
    K = zs.shape[1]
    prior = (np.log(q)[:, None] + 0.5 * K * np.log(d["psi"])[:, None]
             - 0.5 * d["psi"][:, None] * ((zs[None] - d["mu"][:, None]) ** 2).sum(-1))
    return prior + like[None]


def _states(variant, d, X_train, x_new, chains, sweeps=80):
    tiled = {k: np.broadcast_to(v, (chains,) + np.shape(v)) for k, v in d.items()}
    st = new_sample_states(tiled, X_train, x_new[None], variant=variant, seed=11,
                           num_sweeps=sweeps, burn_in=sweeps - 1)
    return np.asarray(st["z_new"][:, 0, 0]), np.asarray(st["t_new"][:, 0, 0])


@pytest.mark.parametrize("variant", ["R-L", "R-NL", "G-L", "G-NL"])
def test_z_conditional_matches_quadrature_of_the_joint_k1(variant):
    """K = 1: the distribution of z* (independent chains, last state after 79 sweeps from the
    ridge start) against the CDF of the joint on a fine grid by KS, and t* frequencies (NL)
    against the grid's marginal by chi-square. A flipped sign in a linear term, a swapped
    neighbour or a dropped prior term moves the mean by a sizeable fraction of an s.d., which
    4000 draws detect (the KS p-value falls below 1e-6); the right one passes at 1e-3."""
    rng = np.random.default_rng(5)
    d = _one_draw(variant, 1, rng)
    X_train = rng.normal(size=(30, 3))
    x_new = np.array([0.3, -0.2, 0.1]) if variant[0] == "R" else np.array([0.9, -0.4, 0.5])
    grid = np.linspace(-8.0, 8.0, 40001)[:, None]
    logp = _log_joint(variant, d, X_train, x_new, grid)
    dens = np.exp(logp - logp.max())
    z, t = _states(variant, d, X_train, x_new, chains=4000)
    cdf = np.cumsum(dens.sum(0))
    cdf /= cdf[-1]
    p = stats.kstest(z[:, 0], lambda v: np.interp(v, grid[:, 0], cdf)).pvalue
    assert p > 1e-3, p
    if variant.endswith("NL"):
        pt = dens.sum(1) / dens.sum()
        counts = np.bincount(t, minlength=3)
        keep = pt * len(t) > 5
        chi = stats.chisquare(counts[keep], pt[keep] / pt[keep].sum() * counts[keep].sum()).pvalue
        assert chi > 1e-3, (counts, pt * len(t))


@pytest.mark.parametrize("variant", ["R-L", "G-NL"])
def test_z_conditional_matches_quadrature_of_the_joint_k2(variant):
    """K = 2 (the loadings' two columns mix, so a transposed A or a wrong einsum shows): mean
    and covariance of z* against a 2-D grid, within 5 Monte Carlo standard errors."""
    rng = np.random.default_rng(8)
    d = _one_draw(variant, 2, rng)
    X_train = rng.normal(size=(30, 3))
    x_new = np.array([0.3, -0.2, 0.1]) if variant[0] == "R" else np.array([0.9, -0.4, 0.5])
    g = np.linspace(-6.0, 6.0, 601)
    zs = np.stack(np.meshgrid(g, g, indexing="ij"), -1).reshape(-1, 2)
    logp = _log_joint(variant, d, X_train, x_new, zs)
    w = np.exp(logp - logp.max()).sum(0)
    w /= w.sum()
    mean = w @ zs
    cov = (zs - mean).T @ ((zs - mean) * w[:, None])
    z, _ = _states(variant, d, X_train, x_new, chains=4000)
    se = np.sqrt(np.diag(cov) / len(z))
    assert np.all(np.abs(z.mean(0) - mean) < 5 * se), (z.mean(0), mean, se)
    emp = np.cov(z.T)
    np.testing.assert_allclose(emp, cov, atol=0.12 * np.sqrt(np.outer(np.diag(cov), np.diag(cov))).max())


# ------------------------------------------------------------------------------ Predictive
@pytest.mark.smoke
@pytest.mark.parametrize("variant", ["R-L", "R-NL", "G-NL"])
def test_predictive_returns_probabilities_and_labels(variant):
    """Predictive's program and predict_proba pick β_{t*} and average in their own code: they
    must agree to round-off (NL components get different β, so picking the wrong one shows)."""
    X, y, X_new, s, s_new = _toy()
    draws = _draws(variant, s)
    if variant.endswith("NL"):
        draws["beta"] = draws["beta"] * np.array([1.0, -0.3, 0.5])[None, :, None]
        draws["mu"] = np.array([0.0, 1.5, -1.5])[None, :, None] * np.ones_like(draws["mu"])
    X_new = X_new if variant[0] == "R" else np.stack([s_new] * 3, 1)
    out = posterior_predictive(draws, X, X_new, variant=variant, seed=2)
    S, M = 6, len(s_new)
    assert out["prob"].shape == (S, M) and out["y"].shape == (S, M)
    assert set(np.unique(np.asarray(out["y"]))) <= {-1, 1}
    np.testing.assert_allclose(np.asarray(out["prob"]).mean(0),
                               predict_proba(draws, X, X_new, variant=variant, seed=2), rtol=1e-12)
    if variant.endswith("NL"):  # the states visit several components
        t = np.asarray(new_sample_states(draws, X, X_new, variant=variant, seed=2)["t_new"])
        assert len(np.unique(t)) > 1
    sure = np.asarray(out["prob"]).mean(0)
    assert np.all(np.asarray(out["y"])[:, sure > 0.999] == 1)
    assert np.all(np.asarray(out["y"])[:, sure < 0.001] == -1)


def test_bad_inputs_are_one_sentence():
    X, y, X_new, s, s_new = _toy()
    draws = _draws("R-L", s)
    for bad, phrase in [(X_new[:, :2], "3 columns"), (np.where(X_new > 2, np.nan, X_new), "NaN"),
                        (X_new[0], "3 columns")]:
        with pytest.raises(ValueError, match=phrase):
            predict_proba(draws, X, bad, variant="R-L")
    with pytest.raises(ValueError, match="lack tau"):
        predict_proba(draws, X, X_new, variant="G-L")
    with pytest.raises(ValueError, match="Unknown variant"):
        predict_proba(draws, X, X_new, variant="R-X")
    with pytest.raises(ValueError, match="burn_in"):
        predict_proba(draws, X, X_new, variant="R-L", num_sweeps=5, burn_in=5)
    with pytest.raises(ValueError, match="training features"):
        predict_proba(draws, X[:, :2], X_new, variant="R-L")
