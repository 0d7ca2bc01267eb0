"""The priors a run used are recorded, and a maximum-likelihood fit says when it ignores an
edited prior (CVQ's default vb once ran unchanged, summary byte-identical, after an edit of W's
prior in models/cvq.py)."""

from __future__ import annotations

import json

import numpy as np
import numpyro.distributions as dist
import pytest

from latentzoo import arviz_adapter as azx
from latentzoo.cli import main
from latentzoo.priors import SHIPPED_PRIORS, describe, ignored_edits, model_priors
from latentzoo.registry import families


def test_the_shipped_table_matches_the_model_files():
    """SHIPPED_PRIORS is what ignored_edits compares with: it must say what the files say."""
    for module_name, shipped in SHIPPED_PRIORS.items():
        users = [f for f in families().values()
                 if getattr(getattr(f.model, "func", f.model), "__module__", "") == module_name]
        assert users, module_name
        assert model_priors(users[0].model) == shipped


def test_every_method_that_ignores_priors_has_its_model_in_the_table():
    for family in families().values():
        for method in family.methods:
            if method.ignores_priors:
                name = getattr(family.model, "func", family.model).__module__
                assert set(method.ignores_priors) <= set(SHIPPED_PRIORS[name]), (family.name, method.name)


def test_describe_names_the_family_and_its_parameters():
    assert describe(dist.Normal(0.0, 2.0)) == "Normal(loc=0.0, scale=2.0)"
    assert describe(dist.Gamma(2.0, 0.5)) == "Gamma(concentration=2.0, rate=0.5)"
    assert describe(1.0) == "1.0"
    assert describe(dist.Normal(np.zeros(10), 1.0)).startswith("Normal(loc=array(10,) mean 0")


@pytest.fixture
def cvq_with_w_edited(monkeypatch):
    import latentzoo.models.cvq as cvq_module

    shipped = cvq_module.default_priors

    def edited():
        return {**shipped(), "W": dist.Normal(0.0, 3.0)}

    monkeypatch.setattr(cvq_module, "default_priors", edited)
    return edited


def test_an_ignored_edit_is_found_and_said(cvq_with_w_edited, tmp_path, capsys):
    cvq = families()["cvq"]
    assert ignored_edits(cvq.model, cvq.method("vb").ignores_priors) == {"W": "Normal(loc=0.0, scale=3.0)"}
    assert ignored_edits(cvq.model, cvq.method("gibbs").ignores_priors) == {}
    out = tmp_path / "run"
    assert main(["run", "cvq", "--method", "vb", "--K", "2", "--sweeps", "3", "--no-progress",
                 "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "maximum likelihood and does not read the priors you edited" in err
    assert "W (Normal(loc=0.0, scale=3.0))" in err and "--method gibbs uses them" in err
    attrs = azx.posterior_attrs(azx.load(str(out / "posterior.nc")))
    assert json.loads(attrs["latentzoo_priors"])["W"] == "Normal(loc=0.0, scale=3.0)"
    assert len(attrs["latentzoo_model_sha256"]) == 64


def test_an_unedited_model_says_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "cvq", "--method", "vb", "--K", "2", "--sweeps", "3", "--no-progress",
                 "--out", str(out)]) == 0
    assert "does not read the priors" not in capsys.readouterr().err
    attrs = azx.posterior_attrs(azx.load(str(out / "posterior.nc")))
    assert json.loads(attrs["latentzoo_priors"]) == SHIPPED_PRIORS["latentzoo.models.cvq"]
