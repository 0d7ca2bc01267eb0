"""FA numerics: constant columns, data on extreme scales, and the marginal log-likelihood.

Digit images (scikit-learn's ``load_digits``: 1797 rows, 64 pixels, 3 of them always 0 and
others 0 for long runs of rows) are the test case for constant columns: every FA fit must stay
finite there, give a constant column no loading and a tiny noise variance, and fit the other
columns as well as scikit-learn's batch FA does.
"""

import numpy as np
import pytest

import latentzoo  # noqa: F401
from latentzoo.inference.fa import OnlineFactorAnalysis, fit_fa_variational
from latentzoo.inference.validation import check_matrix
from latentzoo.models.factor_analysis import marginal_log_likelihood


@pytest.fixture(scope="module")
def digits():
    from sklearn.datasets import load_digits

    X = load_digits().data
    return X, X.std(0) > 0


def _standardised(X):
    sd = X.std(0)
    return (X - X.mean(0)) / np.where(sd > 0, sd, 1.0)


def _sklearn_score(X, K):
    from sklearn.decomposition import FactorAnalysis
    from threadpoolctl import threadpool_limits

    # one BLAS thread: next to JAX's threads a 1797 x 61 fit took 25 s instead of 0.3 s
    with threadpool_limits(1):
        return FactorAnalysis(K, random_state=0).fit(X).score(X)


def _stream(model, X, chunk=200):
    for lo in range(0, X.shape[0], chunk):
        model.partial_fit(X[lo : lo + chunk])
    return model


# ------------------------------------------------------------------ online EM, constant columns
@pytest.mark.parametrize("standardise", [False, True])
def test_online_em_on_digits_with_constant_columns(digits, standardise):
    X, varies = digits
    X = _standardised(X) if standardise else X
    fa = _stream(OnlineFactorAnalysis(5, random_state=0), X)
    psi, F = fa.noise_variance_, fa.components_.T
    # Before: every noise variance NaN (a zero floor on a zero variance, then 0 * inf).
    assert np.all(np.isfinite(psi)) and np.all(psi > 0)
    assert np.all(np.isfinite(fa.score_samples(X)))
    scale = X.var(0).mean()
    assert np.all(F[~varies] == 0.0)  # a constant column has no loading...
    assert np.all(psi[~varies] <= 1e-10 * scale)  # ...and a tiny noise variance (1e-12 x scale)
    # The other columns are fitted as batch FA fits them. One streaming pass is within 1.4 %
    # (raw) and 3.3 % (standardised) of scikit-learn's log-likelihood on the 61 varying pixels;
    # on those pixels alone, seeds 0-3 give 2.4-4.1 % (standardised), so the constant columns
    # cost nothing. A fit without factors (diagonal Gaussian) is 13.5 % below.
    ll = np.mean(marginal_log_likelihood(
        X[:, varies], F[varies], fa.mean_[varies], 1.0 / psi[varies], per_row=True))
    ref = _sklearn_score(X[:, varies], 5)
    assert ll > 1.05 * ref, (ll, ref)


def test_online_em_column_constant_over_the_first_batches(digits):
    X, varies = digits
    X = X[:, varies]
    j = 39  # a pixel that is 0 in 642 of the 1797 images: put those first in the stream
    Xo = X[np.argsort(X[:, j] != 0, kind="stable")]
    assert np.all(Xo[:640, j] == 0) and Xo[:, j].var() > 10.0
    fa = _stream(OnlineFactorAnalysis(5, random_state=0), Xo)
    psi = fa.noise_variance_
    # Before: NaN from the first batch after warm-up (the column's variance, 0 so far, floored
    # at 1e-6 x 0).
    assert np.all(np.isfinite(psi)) and np.all(np.isfinite(fa.score_samples(Xo)))
    # Once it varies it gets an ordinary noise variance and a loading, not the floor.
    var = Xo[:, j].var()
    assert 0.1 * var < psi[j] < var, (psi[j], var)
    assert np.abs(fa.components_[:, j]).max() > 0.1 * np.sqrt(var)
    assert fa.score(Xo) > 1.05 * _sklearn_score(Xo, 5)


def test_noise_floor_is_relative_to_the_data_scale(digits):
    """The floor of a constant column scales with the data: fitting 1000 X gives it 1e6 times the
    noise variance of fitting X (an absolute floor would give the same number for both)."""
    X, _ = digits
    X = X[:600]
    const = X.std(0) == 0
    psi1 = _stream(OnlineFactorAnalysis(3, random_state=0), X).noise_variance_
    psi2 = _stream(OnlineFactorAnalysis(3, random_state=0), 1e3 * X).noise_variance_
    # (the other columns are not compared: the start, psi = 1 and orthonormal F, is not scaled)
    np.testing.assert_allclose(psi2[const], 1e6 * psi1[const], rtol=1e-8)
    assert np.all(psi1[const] < 1e-10 * X.var(0).mean())


# -------------------------------------------------------------- batch EM / VB, constant columns
@pytest.mark.parametrize("method", ["em", "vb"])
def test_batch_em_and_vb_on_digits_with_constant_columns(digits, method):
    X, _ = digits
    X = X[:400]  # more pixels are constant in fewer rows: 7 of 64 here
    varies = X.std(0) > 0
    assert (~varies).sum() >= 3
    # Before: the start psi = 2 / var (EM) or the Gamma rate var / 2 (VB) of a constant column is
    # infinite or zero, and the first sweep's objective is NaN (the driver raised).
    fit = fit_fa_variational(X, 4, method=method, num_steps=150)
    assert np.all(np.isfinite(np.asarray(fit.losses)))
    p = {k: np.asarray(v) for k, v in fit.params.items()}
    psi = p["psi_loc"] if method == "em" else p["psi_concentration"] / p["psi_rate"]
    assert np.all(np.isfinite(psi)) and np.all(psi > 0)
    assert np.all(np.abs(p["W_loc"][~varies]) < 1e-8)
    # Not a collapsed fit: on the varying pixels within 2 % of scikit-learn's log-likelihood
    # (measured 0.3 %; the diagonal-only fit, no factors, is 25 % below).
    ll = np.mean(marginal_log_likelihood(
        X[:, varies], p["W_loc"][varies], p["mu_loc"][varies], psi[varies], per_row=True))
    ref = _sklearn_score(X[:, varies], 4)
    assert ll > 1.02 * ref, (ll, ref)


# ------------------------------------------------------------------------------ extreme scales
@pytest.mark.smoke
@pytest.mark.parametrize("scale", [1e200, 1e308 / 4, 1e-150])
def test_matrix_validator_refuses_data_whose_squares_overflow(scale):
    X = np.random.default_rng(0).normal(size=(20, 4)) * scale
    word = "underflow" if scale < 1 else "overflow"
    with pytest.raises(ValueError, match=word) as err:
        check_matrix(X)
    assert "rescale" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ValueError, match=word):
        fit_fa_variational(X, 2, method="em", num_steps=2)


def test_matrix_validator_keeps_large_but_safe_scales_and_zeros():
    X = np.random.default_rng(0).normal(size=(20, 4))
    check_matrix(1e90 * X)
    check_matrix(1e-90 * X)
    check_matrix(np.zeros((5, 3)))  # all constant: not a scale problem


def test_csv_on_the_edge_of_float64_is_refused(tmp_path):
    from latentzoo.data import load_matrix

    path = tmp_path / "huge.csv"
    path.write_text("1e308,2e307,-1e308\n3e307,1e308,5e307\n1e306,-2e307,1e308\n")
    with pytest.raises(ValueError, match="overflow"):
        load_matrix(str(path))


def test_partial_fit_checks_every_chunk():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(64, 5))
    fa = OnlineFactorAnalysis(2, random_state=0)
    with pytest.raises(ValueError, match="overflow"):
        fa.partial_fit(X * 1e200)
    fa.partial_fit(X)
    psi = fa.noise_variance_.copy()
    for bad in (X * 1e200, X[0] * 1e200, X * 1e-200):
        with pytest.raises(ValueError, match="rescale"):
            fa.partial_fit(bad)
    assert fa.n_samples_seen_ == 64  # a refused chunk leaves the fit as it was
    np.testing.assert_array_equal(fa.noise_variance_, psi)
    fa.partial_fit(X * 1e90)  # large but safe: finite
    assert np.all(np.isfinite(fa.noise_variance_))


# ------------------------------------------------------------------- storing and evaluating draws
@pytest.mark.smoke
def test_chunked_log_likelihood_equals_all_draws_at_once():
    import jax
    from functools import partial

    from latentzoo import runs

    rng = np.random.default_rng(0)
    C, S, N, D, K = 3, 7, 11, 6, 2
    X = rng.normal(size=(N, D))
    W, mu = rng.normal(size=(C, S, D, K)), rng.normal(size=(C, S, D))
    psi = rng.gamma(2.0, size=(C, S, D))
    fn = partial(marginal_log_likelihood, per_row=True)
    dense = np.asarray(jax.vmap(jax.vmap(fn, (None, 0, 0, 0)), (None, 0, 0, 0))(X, W, mu, psi))
    # chunks of 4 draws: 21 draws = five full chunks and one padded
    chunked = runs.map_draws(fn, W, mu, psi, shared=(X,), bytes_per_draw=1000, budget=4000)
    assert chunked.shape == (C, S, N)
    np.testing.assert_allclose(chunked, dense, rtol=1e-14, atol=0)
    one = runs.map_draws(fn, W, mu, psi, shared=(X,), bytes_per_draw=1000, budget=1)  # 1 per chunk
    np.testing.assert_allclose(one, dense, rtol=1e-14, atol=0)


def test_thinning_keeps_posterior_nc_bounded():
    from latentzoo import runs
    from latentzoo.families.fa import stored_bytes_per_draw, stored_sites

    # the command's default run (500 x 20, 4 chains x 4000): every 4th draw, 1000 per chain
    per_draw = stored_bytes_per_draw(500, 20, 3)
    assert runs.storage_thinning(4, 4000, per_draw) == 4
    assert 4 * (4000 // 4) * per_draw <= runs.MAX_STORED_BYTES
    assert runs.storage_thinning(4, 1000, per_draw) == 1  # --quick: nothing thinned
    # gene-expression shape (72 x 7129): no cov, the minimum of 50 draws per chain, < 100 MB
    assert "cov" not in stored_sites(7129, 3) and "cov" in stored_sites(100, 3)
    per_draw = stored_bytes_per_draw(72, 7129, 3)
    for samples in (4000, 4001, 977):
        keep = samples // runs.storage_thinning(4, samples, per_draw)
        assert runs.MIN_STORED_DRAWS <= keep <= runs.MIN_STORED_DRAWS + 1
        assert 4 * keep * per_draw < 100 * 2**20
    assert runs.storage_thinning(4, 30, per_draw) == 1  # never fewer than were drawn


@pytest.mark.parametrize("method", ["gibbs", pytest.param("em", marks=pytest.mark.smoke)])
def test_runner_above_the_cov_limit_stores_no_d_by_d_site(method):
    from latentzoo.models.factor_analysis import COV_SITE_MAX_DIM, default_fa_data
    from latentzoo.registry import RunConfig, get_family

    N, D, K = 12, COV_SITE_MAX_DIM + 5, 2
    X = default_fa_data(0, N=N, D=D, K=K)
    cfg = RunConfig(K=K, chains=1, samples=60, warmup=20, sweeps=5)
    idata = get_family("fa").method(method).run(X, cfg)
    post = idata.posterior
    assert set(post.data_vars) == {"W", "mu", "psi", "factor_variance"}
    draws = post.sizes["chain"] * post.sizes["draw"]
    W, mu, psi = (np.asarray(post[v]).reshape(draws, *post[v].shape[2:]) for v in ("W", "mu", "psi"))
    ll = np.asarray(idata.log_likelihood["X"]).reshape(draws, N)
    np.testing.assert_allclose(ll, np.asarray(marginal_log_likelihood(X, W, mu, psi, per_row=True)),
                               rtol=1e-12)
    assert np.all(np.isfinite(np.asarray(post["factor_variance"])))


def test_mixture_log_likelihood_equals_the_dense_mixture():
    from scipy.special import logsumexp
    from scipy.stats import multivariate_normal

    from latentzoo.families.mfa import mfa_marginal_log_likelihood

    rng = np.random.default_rng(1)
    N, D, K, J = 8, 5, 2, 3
    X = rng.normal(size=(N, D))
    pi = rng.dirichlet(np.ones(J))
    W, mu, psi = rng.normal(size=(J, D, K)), rng.normal(size=(J, D)), rng.gamma(2.0, size=D)
    dense = logsumexp([np.log(pi[j]) + multivariate_normal(mu[j], W[j] @ W[j].T + np.diag(1 / psi))
                       .logpdf(X) for j in range(J)], axis=0)
    np.testing.assert_allclose(np.asarray(mfa_marginal_log_likelihood(X, pi, W, mu, psi)), dense,
                               rtol=1e-12)


def test_streaming_run_refuses_a_huge_csv_unless_standardised(tmp_path, capsys):
    from latentzoo.cli import main

    rng = np.random.default_rng(0)
    X = (rng.normal(size=(200, 2)) @ rng.normal(size=(2, 5)) + rng.normal(size=(200, 5))) * 1e200
    path = tmp_path / "huge.csv"
    np.savetxt(path, X, delimiter=",")
    argv = ["run", "fa", "--method", "online-em", "--data", str(path), "--K", "2",
            "--chunk-size", "64", "--no-progress", "--out"]
    assert main(argv + [str(tmp_path / "raw")]) == 2
    err = capsys.readouterr().err.strip()
    assert "huge.csv" in err and "overflow" in err and "\n" not in err
    assert not (tmp_path / "raw").exists()
    # the column moments are computed in a unit that follows the data: no overflow
    assert main(argv + [str(tmp_path / "std"), "--standardize"]) == 0
    from latentzoo import arviz_adapter as azx

    idata = azx.load(str(tmp_path / "std" / "posterior.nc"))
    for name in idata.posterior.data_vars:
        assert np.all(np.isfinite(np.asarray(idata.posterior[name])))
    np.testing.assert_allclose(np.asarray(idata.posterior["mu"])[0, 0], 0.0, atol=0.1)
