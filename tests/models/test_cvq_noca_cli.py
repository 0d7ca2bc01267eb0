"""The binary-latent CLI back end: quick fits and clear errors."""

import numpy as np
import pytest

from latentzoo.binary_cli import default_data, fit_binary_model


@pytest.mark.parametrize("name", ["cvq", "noca"])
def test_quick_point_fit(name):
    X = default_data(name)[:200]
    out = fit_binary_model(name, X, method="vem", K=3, seed=0, quick=True, num_samples=10, num_warmup=10, chains=1)
    assert out["kind"] == "point" and np.all(np.diff(-out["losses"]) >= -1e-6 * abs(out["losses"][0]))


def test_quick_gibbs_cvq():
    X = default_data("cvq")[:30, :]
    out = fit_binary_model("cvq", X, method="gibbs", K=2, seed=0, quick=True, num_samples=5, num_warmup=5, chains=1)
    assert out["kind"] == "mcmc" and out["mcmc"].get_samples()["W"].shape == (5, 64, 2)


@pytest.mark.parametrize(
    "name,X,K,method,match",
    [
        ("noca", np.full((4, 5), 0.5), 2, "vem", "binary"),
        ("cvq", np.full((4, 5), np.inf), 2, "vem", "NaN"),
        ("cvq", np.zeros((4, 5)), 5, "vem", "K"),
        ("noca", np.zeros((4, 5)), 2, "bogus", "method"),
        ("pca", np.zeros((4, 5)), 2, "vem", "model"),
        ("noca", np.zeros((2000, 5)), 2, "gibbs", "small problems"),
    ],
)
def test_bad_input(name, X, K, method, match):
    with pytest.raises(ValueError, match=match):
        fit_binary_model(name, X, method=method, K=K, seed=0, quick=True, num_samples=5, num_warmup=5, chains=1)
