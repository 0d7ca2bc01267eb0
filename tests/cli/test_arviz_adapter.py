"""The ArviZ adapter behaves the same on ArviZ 0.2x (Python 3.11) and 1.x (Python >= 3.12).

Synthetic draws only (one tiny NUTS run for ``from_mcmc``), so the file runs in seconds on either
line; `.ci/run` runs it on both Pythons.
"""

import os

import numpy as np
import pytest

from latentzoo import arviz_adapter as azx
from latentzoo import arviz_plots as azp

pytestmark = pytest.mark.smoke

CHAINS, DRAWS, N, D = 2, 200, 30, 3
PNG = b"\x89PNG\r\n\x1a\n"


def _draws(seed=0):
    """Conjugate normal model: X[n] ~ N(mu, I), flat prior -> mu | X ~ N(mean(X), I/N)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(loc=[1.0, -2.0, 0.5], size=(N, D))
    mu = X.mean(0) + rng.normal(size=(CHAINS, DRAWS, D)) / np.sqrt(N)
    W = rng.normal(size=(CHAINS, DRAWS, D, 2))
    sigma = np.exp(0.1 * rng.normal(size=(CHAINS, DRAWS)))
    # Pointwise log-likelihood of each row: log N(x_n; mu, I), summed over features.
    ll = -0.5 * (((X[None, None] - mu[:, :, None]) ** 2).sum(-1) + D * np.log(2 * np.pi))
    return X, {"mu": mu, "W": W, "sigma": sigma}, ll


@pytest.fixture
def parts():
    return _draws()


@pytest.fixture
def idata(parts):
    X, post, ll = parts
    return azx.from_draws(
        post,
        observed_data={"X": X},
        log_likelihood={"X": ll},
        sample_stats={"lp": ll.sum(-1)},
    )


def _is_png(path):
    with open(path, "rb") as fh:
        return os.path.getsize(path) > 2000 and fh.read(8) == PNG


def test_version_flag_matches_installed_arviz():
    import arviz

    assert azx.ARVIZ_VERSION == arviz.__version__
    assert azx.ARVIZ_1 == (int(arviz.__version__.split(".")[0]) >= 1)


def test_from_draws_groups_names_and_arrays(idata, parts):
    X, post, ll = parts
    assert set(azx.group_names(idata)) == {"posterior", "observed_data", "log_likelihood", "sample_stats"}
    assert azx.posterior_var_names(idata) == ["mu", "W", "sigma"]
    for name, value in post.items():
        np.testing.assert_array_equal(azx.posterior_array(idata, name), value)
    assert azx.posterior_array(idata, "W").shape == (CHAINS, DRAWS, D, 2)
    assert idata.posterior.sizes["chain"] == CHAINS and idata.posterior.sizes["draw"] == DRAWS
    np.testing.assert_array_equal(np.asarray(idata.observed_data["X"]), X)
    assert idata.log_likelihood["X"].shape == (CHAINS, DRAWS, N)
    assert "lp" in idata.sample_stats.data_vars


def test_from_draws_only_posterior():
    idata = azx.from_draws({"a": np.zeros((1, 5))})
    assert azx.group_names(idata) == ["posterior"]
    assert azx.loo(idata) is None


@pytest.mark.parametrize(
    "kwargs, phrase",
    [
        (dict(posterior={"a": np.zeros(5)}), "fewer than two"),
        (dict(posterior={"a": np.zeros((2, 5)), "b": np.zeros((2, 4))}), "disagree"),
        (dict(posterior={"a": np.zeros((2, 5))}, sample_stats={"lp": np.zeros((1, 5))}), "disagree"),
    ],
)
def test_from_draws_rejects_unshaped_arrays(kwargs, phrase):
    with pytest.raises(ValueError, match=phrase):
        azx.from_draws(**kwargs)


def test_posterior_array_unknown_name(idata):
    with pytest.raises(KeyError, match="nope"):
        azx.posterior_array(idata, "nope")


def test_posterior_attrs_round_trip(idata, tmp_path):
    assert azx.posterior_attrs(idata) == {}  # ArviZ's own bookkeeping is left out
    assert azx.set_posterior_attrs(idata, latentzoo_model="fa", K=3, scale=0.5, tags=["a", "b"]) is idata
    want = {"latentzoo_model": "fa", "K": 3, "scale": 0.5, "tags": ["a", "b"]}
    assert azx.posterior_attrs(idata) == want
    azx.set_posterior_attrs(idata, K=4)
    want["K"] = 4
    path = str(tmp_path / "p.nc")
    azx.save(idata, path)
    loaded = azx.posterior_attrs(azx.load(path))
    assert loaded == want
    assert type(loaded["K"]) is int and type(loaded["scale"]) is float


@pytest.mark.parametrize("value", [True, None, {"a": 1}, [], [1, "a"], [[1, 2]], [True]])
def test_set_posterior_attrs_rejects_what_netcdf_cannot_store(idata, value):
    with pytest.raises(TypeError, match="bad"):
        azx.set_posterior_attrs(idata, ok=1, bad=value)
    assert azx.posterior_attrs(idata) == {}  # nothing half-set


def test_set_posterior_attrs_keeps_arviz_names(idata):
    with pytest.raises(ValueError, match="created_at"):
        azx.set_posterior_attrs(idata, created_at="today")


def test_summary_columns_rows_and_values(idata, parts):
    _, post, _ = parts
    table = azx.summary(idata)
    assert list(table.columns) == ["mean", "sd", "hdi_3%", "hdi_97%", "ess_bulk", "ess_tail", "r_hat"]
    assert list(table.index[:4]) == ["mu[0]", "mu[1]", "mu[2]", "W[0, 0]"]
    assert table.index[-1] == "sigma" and len(table) == D + 2 * D + 1
    assert all(dtype == np.float64 for dtype in table.dtypes)
    mu = post["mu"].reshape(-1, D)
    np.testing.assert_allclose(table.loc[["mu[0]", "mu[1]", "mu[2]"], "mean"], mu.mean(0), atol=1e-3)
    np.testing.assert_allclose(table.loc[["mu[0]", "mu[1]", "mu[2]"], "sd"], mu.std(0), rtol=0.01, atol=1e-3)
    lo, hi = table.loc["mu[0]", ["hdi_3%", "hdi_97%"]]
    assert lo < mu[:, 0].mean() < hi
    inside = np.mean((mu[:, 0] >= lo) & (mu[:, 0] <= hi))
    assert 0.92 <= inside <= 0.96
    assert table["r_hat"].max() <= 1.05  # independent draws
    assert (table["ess_bulk"] > 100).all() and (table["ess_tail"] > 100).all()
    # Rounded as ArviZ 0.2x shows it: 3 decimals, r_hat 2, whole ESS.
    np.testing.assert_array_equal(table["ess_bulk"], np.round(table["ess_bulk"]))
    np.testing.assert_array_equal(table["r_hat"], np.round(table["r_hat"], 2))


def test_summary_var_names_filter(idata):
    assert list(azx.summary(idata, var_names="sigma").index) == ["sigma"]
    table = azx.summary(idata, var_names=["sigma", "mu"])
    assert sorted(table.index) == ["mu[0]", "mu[1]", "mu[2]", "sigma"]
    with pytest.raises(KeyError, match="nope"):
        azx.summary(idata, var_names=["mu", "nope"])


def test_summary_of_point_estimates_and_constant_draws():
    # EM / VI point fits: one chain, one draw; EM draws from a delta guide: constant.
    point = azx.from_draws({"pi": np.full((1, 1, 3), 0.2)}, sample_stats={"objective": np.ones((1, 1))})
    table = azx.summary(point)
    np.testing.assert_allclose(table["mean"], 0.2)
    const = azx.summary(azx.from_draws({"m": np.ones((1, 50, 2))}))
    np.testing.assert_allclose(const["mean"], 1.0)
    np.testing.assert_allclose(const["sd"], 0.0)


def test_save_load_round_trip(idata, tmp_path):
    path = str(tmp_path / "run" / "posterior.nc")
    azx.save(idata, path)
    assert os.path.getsize(path) > 0
    assert [p for p in os.listdir(tmp_path / "run")] == ["posterior.nc"]  # no temporary left
    back = azx.load(path)
    assert set(azx.group_names(back)) == set(azx.group_names(idata))
    for name in azx.posterior_var_names(idata):
        np.testing.assert_array_equal(azx.posterior_array(back, name), azx.posterior_array(idata, name))
    np.testing.assert_array_equal(np.asarray(back.log_likelihood["X"]), np.asarray(idata.log_likelihood["X"]))
    np.testing.assert_array_equal(np.asarray(back.observed_data["X"]), np.asarray(idata.observed_data["X"]))
    assert azx.summary(back).equals(azx.summary(idata))
    # Loaded fully: the file can be replaced and removed while the data stays usable.
    azx.save(back, path)
    os.remove(path)
    assert azx.posterior_array(back, "mu").shape == (CHAINS, DRAWS, D)


def test_load_rejects_a_non_netcdf_file(tmp_path):
    bad = tmp_path / "bad.nc"
    bad.write_text("not a netcdf file\n")
    with pytest.raises(Exception):
        azx.load(str(bad))


def test_add_posterior_predictive_adds_then_replaces(idata, parts):
    X = parts[0]
    rng = np.random.default_rng(1)
    assert azx.add_posterior_predictive(idata, {"X": rng.normal(size=(1, 40, N, D))}) is idata
    assert "posterior_predictive" in azx.group_names(idata)
    assert idata.posterior_predictive["X"].shape == (1, 40, N, D)
    azx.add_posterior_predictive(idata, {"X": rng.normal(size=(1, 20, N, D)) + X})
    assert idata.posterior_predictive["X"].shape == (1, 20, N, D)
    assert {"posterior", "observed_data", "log_likelihood"} <= set(azx.group_names(idata))
    with pytest.raises(ValueError, match="fewer than two"):
        azx.add_posterior_predictive(idata, {"X": np.zeros(3)})


def test_loo_matches_importance_sampling(idata, parts):
    _, _, ll = parts
    res = azx.loo(idata)
    assert set(res) == {"elpd_loo", "se", "p_loo", "max_pareto_k", "n_data_points"}
    assert res["n_data_points"] == N
    # Well-behaved weights: PSIS ~ plain importance sampling, log 1 / mean(1 / p(x_n | draw)).
    flat = ll.reshape(-1, N)
    m = (-flat).max(0)
    is_elpd = -(m + np.log(np.mean(np.exp(-flat - m), axis=0)))
    assert res["elpd_loo"] == pytest.approx(is_elpd.sum(), abs=0.5)
    assert 0 < res["p_loo"] < 2 * D
    assert 0 < res["se"] < 50
    assert res["max_pareto_k"] < 0.7


def test_loo_needs_var_name_when_several(idata, parts):
    _, post, ll = parts
    two = azx.from_draws(post, log_likelihood={"X": ll, "Y": ll[..., :10]})
    with pytest.raises(ValueError, match="var_name"):
        azx.loo(two)
    assert azx.loo(two, var_name="Y")["n_data_points"] == 10


@pytest.mark.parametrize("chains, draws", [(1, 1), (1, 29), (2, 14)])
def test_loo_needs_enough_draws(chains, draws):
    rng = np.random.default_rng(6)
    few = azx.from_draws({"a": rng.normal(size=(chains, draws))},
                         log_likelihood={"X": rng.normal(size=(chains, draws, 10))})
    with pytest.raises(ValueError, match="at least 30 draws"):
        azx.loo(few)


def test_loo_at_the_fewest_draws():
    rng = np.random.default_rng(7)
    idata = azx.from_draws({"a": rng.normal(size=(2, 15))},
                           log_likelihood={"X": rng.normal(scale=0.1, size=(2, 15, 10)) - 1})
    res = azx.loo(idata)
    assert np.isfinite(res["elpd_loo"]) and np.isfinite(res["max_pareto_k"])


def test_plots_write_pngs(idata, parts, tmp_path):
    X = parts[0]
    rng = np.random.default_rng(2)
    azp.plot_trace(idata, str(tmp_path / "trace.png"), var_names=["sigma", "mu"])
    azp.plot_rank(idata, str(tmp_path / "rank.png"), var_names=["sigma", "mu"])
    with pytest.raises(ValueError, match="posterior_predictive"):
        azp.plot_ppc(idata, str(tmp_path / "ppc.png"))
    pp = X.mean(0) + rng.normal(size=(1, 60, N, D))
    azx.add_posterior_predictive(idata, {"X": pp})
    azp.plot_ppc(idata, str(tmp_path / "ppc.png"), num_pp_samples=20)
    for name in ("trace.png", "rank.png", "ppc.png"):
        assert _is_png(tmp_path / name), name
    assert sorted(os.listdir(tmp_path)) == ["ppc.png", "rank.png", "trace.png"]
    import matplotlib.pyplot as plt

    assert plt.get_fignums() == []  # figures closed


def test_plot_trace_of_point_estimates(tmp_path):
    # The CLI plots the trace of one-draw point fits (CVQ / NOCA variational EM).
    point = azx.from_draws({"pi": np.array([0.2, 0.5, 0.3])[None, None], "b": np.ones((1, 1))})
    azp.plot_trace(point, str(tmp_path / "trace.png"))
    assert _is_png(tmp_path / "trace.png")


def test_drop_posterior_vars_keeps_the_rest(idata, tmp_path):
    azx.set_posterior_attrs(idata, K=2)
    assert azx.drop_posterior_vars(idata, ["W", "absent"]) is idata
    assert azx.posterior_var_names(idata) == ["mu", "sigma"]
    azx.drop_posterior_vars(idata, "sigma")
    assert azx.posterior_var_names(idata) == ["mu"]
    assert azx.posterior_attrs(idata) == {"K": 2}
    assert {"posterior", "observed_data", "log_likelihood", "sample_stats"} <= set(azx.group_names(idata))
    azx.save(idata, str(tmp_path / "p.nc"))
    assert azx.posterior_var_names(azx.load(str(tmp_path / "p.nc"))) == ["mu"]


def test_added_variables_have_coordinates_and_a_rank_plot_of_unmixed_chains_draws(tmp_path):
    """Variables computed from the draws (MFA's sorted weights, ...) get an integer coordinate on
    every axis, as the sampled sites have. Without one, ArviZ 1.x's rank plot of chains that had
    not mixed (it marks them, selecting by coordinate) failed, so ``diagnose`` of an unconverged
    run did: "those variables don't exist: {'weights_sorted_dim_0'}"."""
    rng = np.random.default_rng(0)
    idata = azx.from_draws({"mu": rng.normal(size=(2, 20, 2))})
    apart = rng.normal(size=(2, 20, 2)) + np.array([0.0, 5.0])[:, None, None]  # chain 1 far off
    azx.add_posterior_vars(idata, {"weights_sorted": apart})
    assert np.array_equal(np.asarray(idata.posterior["weights_sorted_dim_0"]), [0, 1])
    azp.plot_rank(idata, str(tmp_path / "rank.png"), var_names=["weights_sorted", "mu"])
    assert os.path.getsize(tmp_path / "rank.png") > 0


# ------------------------------------------------------------------ from NumPyro MCMC
@pytest.fixture(scope="module")
def mcmc():
    import jax
    import numpyro
    import numpyro.distributions as dist
    from numpyro.infer import MCMC, NUTS

    def model(X):
        mu = numpyro.sample("mu", dist.Normal(0.0, 10.0).expand([X.shape[1]]).to_event(1))
        with numpyro.plate("n", X.shape[0]):
            numpyro.sample("X", dist.Normal(mu, 1.0).to_event(1), obs=X)

    X = np.random.default_rng(3).normal(size=(20, 2))
    run = MCMC(NUTS(model), num_warmup=30, num_samples=40, num_chains=2,
               chain_method="sequential", progress_bar=False)
    run.run(jax.random.PRNGKey(0), X, extra_fields=("potential_energy",))
    return run


def test_from_mcmc_with_numpyro_log_likelihood(mcmc):
    idata = azx.from_mcmc(mcmc)
    assert {"posterior", "sample_stats", "log_likelihood", "observed_data"} <= set(azx.group_names(idata))
    assert azx.posterior_var_names(idata) == ["mu"]
    np.testing.assert_allclose(
        azx.posterior_array(idata, "mu"), np.asarray(mcmc.get_samples(group_by_chain=True)["mu"])
    )
    assert idata.log_likelihood["X"].shape == (2, 40, 20)
    assert {"lp", "diverging"} <= set(idata.sample_stats.data_vars)
    assert azx.loo(idata)["n_data_points"] == 20
    assert list(azx.summary(idata).index) == ["mu[0]", "mu[1]"]


def test_from_mcmc_with_custom_log_likelihood(mcmc):
    custom = np.random.default_rng(4).normal(size=(2, 40, 7))
    idata = azx.from_mcmc(mcmc, log_likelihood={"X": custom})
    assert list(idata.log_likelihood.data_vars) == ["X"]
    np.testing.assert_array_equal(np.asarray(idata.log_likelihood["X"]), custom)
    assert "observed_data" in azx.group_names(idata)
    with pytest.raises(ValueError, match="fewer than two"):
        azx.from_mcmc(mcmc, log_likelihood={"X": np.zeros(7)})


def test_from_mcmc_names_custom_log_likelihood_and_replicates_like_the_observations(mcmc, tmp_path):
    # ArviZ names the observed axes after NumPyro's plates (its own way on each line); the
    # per-row log-likelihood and the replicated data get the same axis names, which 1.x's
    # posterior predictive plot needs.
    rng = np.random.default_rng(5)
    idata = azx.from_mcmc(mcmc, log_likelihood={"X": rng.normal(size=(2, 40, 20))})
    observed = idata.observed_data["X"]
    assert observed.shape == (20, 2)
    assert idata.log_likelihood["X"].dims[2:] == observed.dims[:1]
    azx.add_posterior_predictive(idata, {"X": rng.normal(size=(2, 40, 20, 2))})
    assert idata.posterior_predictive["X"].dims[2:] == observed.dims
    azp.plot_ppc(idata, str(tmp_path / "ppc.png"), num_pp_samples=10)
    assert _is_png(tmp_path / "ppc.png")
    assert azx.loo(idata)["n_data_points"] == 20



# ------------------------------------------------- titles, per-column PPC grid, LOO-PIT
@pytest.fixture
def saved_figures(monkeypatch):
    """The figures the adapter saves (their text checked before they are closed)."""
    seen = []
    original = azp.save_figure

    def keep(fig, path, **kwargs):
        texts = [t.get_text() for ax in fig.axes for t in [ax.title]]
        legends = [t.get_text() for ax in fig.axes if ax.get_legend()
                   for t in ax.get_legend().get_texts()]
        legends += [t.get_text() for leg in fig.legends for t in leg.get_texts()]
        seen.append({"suptitle": fig._suptitle.get_text() if fig._suptitle else None,
                     "titles": texts, "legend": legends, "panels": sum(ax.get_visible() for ax in fig.axes)})
        original(fig, path, **kwargs)

    monkeypatch.setattr(azp, "save_figure", keep)
    return seen


def test_trace_plot_has_the_run_title_and_a_chain_legend(idata, tmp_path, saved_figures):
    azx.set_posterior_attrs(idata, latentzoo_model="toy", latentzoo_method="gibbs",
                            latentzoo_data="default data")
    assert azp.run_title(idata) == "toy / gibbs on default data"
    azp.plot_trace(idata, str(tmp_path / "trace.png"), var_names=["sigma", "mu"])
    fig = saved_figures[-1]
    assert fig["suptitle"] == "toy / gibbs on default data"
    # one entry per chain, and nothing else (not one per vector component: mu has D of them)
    assert sorted(fig["legend"]) == ["0", "1"]
    azp.plot_trace(idata, str(tmp_path / "trace2.png"), var_names=["sigma"], title="mine")
    assert saved_figures[-1]["suptitle"] == "mine"
    assert _is_png(tmp_path / "trace.png")


def test_rank_plot_of_a_wide_site_shows_its_worst_entries(tmp_path, saved_figures):
    # 300 entries (a per-feature site at D = 300): a panel each would be unreadable and take
    # minutes; the plot shows MAX_RANK_PANELS of them, those with the largest R-hat first. Entry
    # 217 has chains stuck apart and entry 5 drifts: both must be among the panels, 217 first.
    rng = np.random.default_rng(3)
    draws = rng.normal(size=(2, 100, 300))
    draws[1, :, 217] += 5.0
    draws[:, :, 5] += np.linspace(0.0, 3.0, 100)
    wide = azx.from_draws({"psi": draws, "sigma": rng.normal(size=(2, 100))})
    picked = azp.rank_entries(wide, ["psi", "sigma"])
    assert len(picked) == azp.MAX_RANK_PANELS
    assert list(picked)[:2] == ["psi[217]", "psi[5]"]
    np.testing.assert_array_equal(picked["psi[217]"], draws[:, :, 217])
    azp.plot_rank(wide, str(tmp_path / "rank.png"), var_names=["psi", "sigma"])
    fig = saved_figures[-1]
    assert fig["panels"] <= 2 * azp.MAX_RANK_PANELS  # 0.2x: one axis per entry; 1.x may add one
    assert "12 of 301 entries" in fig["suptitle"]
    assert any("psi[217]" in t for t in fig["titles"])
    assert _is_png(tmp_path / "rank.png")
    # few entries: every one is drawn, as ArviZ does
    assert azp.rank_entries(wide, ["sigma"]) is None


def test_ppc_is_one_panel_per_column(idata, parts, tmp_path, saved_figures):
    X = parts[0]
    rng = np.random.default_rng(8)
    azx.add_posterior_predictive(idata, {"X": X.mean(0) + rng.normal(size=(CHAINS, 30, N, D))})
    azx.set_posterior_attrs(idata, latentzoo_model="toy", latentzoo_method="vb")
    azp.plot_ppc(idata, str(tmp_path / "ppc.png"), num_pp_samples=10)
    fig = saved_figures[-1]
    assert fig["panels"] == D and fig["titles"][:D] == [f"column {c}" for c in range(D)]
    assert fig["suptitle"] == "toy / vb" and "observed" in fig["legend"]
    assert _is_png(tmp_path / "ppc.png")


def test_plot_predictive_columns_picks_columns_and_handles_binary_data(tmp_path, saved_figures):
    rng = np.random.default_rng(9)
    obs = rng.normal(size=(40, 30))
    rep = rng.normal(size=(25, 40, 30))
    azp.plot_predictive_columns(obs, rep, str(tmp_path / "a.png"))
    assert saved_figures[-1]["panels"] == 16  # the first 16 of 30 columns
    azp.plot_predictive_columns(obs, rep, str(tmp_path / "b.png"), columns=[29, 3],
                                annotations={29: "p: max 0.01"}, title="t")
    fig = saved_figures[-1]
    assert fig["titles"][:2] == ["column 29\np: max 0.01", "column 3"] and fig["suptitle"] == "t"
    binary = (rng.random((40, 5)) < 0.3).astype(float)
    azp.plot_predictive_columns(binary, (rng.random((25, 40, 5)) < 0.3).astype(float),
                                str(tmp_path / "c.png"))
    assert "observed frequency" in saved_figures[-1]["legend"]
    images = rng.random((10, 3, 4))  # image stacks: one panel per pixel
    azp.plot_predictive_columns(images, rng.random((5, 10, 3, 4)), str(tmp_path / "d.png"))
    assert saved_figures[-1]["panels"] == 12
    with pytest.raises(ValueError, match="Columns"):
        azp.plot_predictive_columns(obs, rep, str(tmp_path / "e.png"), columns=[30])
    with pytest.raises(ValueError, match="shaped"):
        azp.plot_predictive_columns(obs, rep[:, :, :3], str(tmp_path / "e.png"))
    assert not (tmp_path / "e.png").exists()
    for name in "abcd":
        assert _is_png(tmp_path / f"{name}.png")


def test_loo_pointwise_pareto_k(idata):
    res = azx.loo(idata, pointwise=True)
    assert res["pareto_k"].shape == (N,) and res["max_pareto_k"] == pytest.approx(res["pareto_k"].max())


def _pit_idata(rng, binary=False):
    """Draws of mu | X (conjugate, flat prior) and one replicate per draw, per-row log-likelihood."""
    X = rng.normal(size=(N, D)) + 1.0
    mu = X.mean(0) + rng.normal(size=(CHAINS, DRAWS, D)) / np.sqrt(N)
    rep = mu[:, :, None, :] + rng.normal(size=(CHAINS, DRAWS, N, D))
    ll = -0.5 * ((X[None, None] - mu[:, :, None]) ** 2).sum(-1)
    if binary:
        X, rep = (X > 1.0).astype(float), (rep > 1.0).astype(float)
    idata = azx.from_draws({"mu": mu}, observed_data={"X": X}, log_likelihood={"X": ll})
    return azx.add_posterior_predictive(idata, {"X": rep})


@pytest.mark.parametrize("binary", [False, True])
def test_loo_pit_is_uniform_for_the_right_model(binary, tmp_path):
    pit = np.concatenate([azx.loo_pit(_pit_idata(np.random.default_rng(s), binary)).ravel()
                          for s in range(4)])
    assert pit.shape == (4 * N * D,) and np.all((pit >= 0) & (pit <= 1))
    # Uniform: mean 1/2, sd 1/sqrt(12) = 0.289. Discrete data need ties spread at random (without
    # it the PIT of 0/1 data piles up at two values, sd ~ 0.4 or less).
    assert abs(pit.mean() - 0.5) < 0.04 and abs(pit.std() - 0.289) < 0.03
    azp.plot_loo_pit(pit, str(tmp_path / "pit.png"), title="t")
    assert _is_png(tmp_path / "pit.png")


def test_loo_pit_sees_too_narrow_predictions():
    idata = _pit_idata(np.random.default_rng(10))
    X = np.asarray(idata.observed_data["X"])
    mu = azx.posterior_array(idata, "mu")
    narrow = mu[:, :, None, :] + 0.3 * np.random.default_rng(11).normal(size=(CHAINS, DRAWS, N, D))
    azx.add_posterior_predictive(idata, {"X": narrow})
    pit = azx.loo_pit(idata)
    assert np.mean((pit < 0.05) | (pit > 0.95)) > 0.4  # U-shaped: most values near 0 or 1
    assert X.shape == pit.shape


def test_loo_pit_refuses_what_it_cannot_use():
    idata = _pit_idata(np.random.default_rng(12))
    few = azx.from_draws({"mu": np.zeros((1, 10, D))}, observed_data={"X": np.zeros((N, D))},
                         log_likelihood={"X": np.zeros((1, 10, N))})
    with pytest.raises(ValueError, match="posterior_predictive"):
        azx.loo_pit(few)
    azx.add_posterior_predictive(few, {"X": np.zeros((1, 10, N, D))})
    with pytest.raises(ValueError, match="at least 30 draws"):
        azx.loo_pit(few)
    wrong = azx.from_draws({"mu": np.zeros((CHAINS, DRAWS, D))}, observed_data={"X": np.zeros((N, D))},
                           log_likelihood={"X": np.zeros((CHAINS, DRAWS, N))})
    azx.add_posterior_predictive(wrong, {"X": np.zeros((1, 5, N, D))})
    with pytest.raises(ValueError, match="replicates shaped"):
        azx.loo_pit(wrong)
    assert azx.loo_pit(idata).shape == (N, D)


def test_plain_az_from_numpyro_works_on_a_conjugate_gibbs_run():
    """ArviZ 1.x's ``az.from_numpyro`` reads ``numpyro.infer.initialization``, which NumPyro
    does not import itself: the docs' quickstart raised AttributeError until ``import latentzoo``
    imported it. A fresh process, so no other test's import hides the fault."""
    import subprocess
    import sys

    code = (
        "import jax, arviz as az\n"
        "from numpyro.infer import MCMC\n"
        "from latentzoo.models.factor_analysis import factor_analysis, default_fa_data\n"
        "from latentzoo.inference.gibbs import ConjugateGibbs\n"
        "from latentzoo.inference.fa import fa_updates\n"
        "X = default_fa_data(0, N=40, D=4, K=1)\n"
        "mcmc = MCMC(ConjugateGibbs(factor_analysis, fa_updates()), num_warmup=5, num_samples=5,\n"
        "            num_chains=1, progress_bar=False)\n"
        "mcmc.run(jax.random.PRNGKey(0), X, K=1)\n"
        "idata = az.from_numpyro(mcmc)\n"
        "assert 'psi' in idata.posterior and 'X' in idata.observed_data, idata\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
