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

pytestmark = pytest.mark.smoke  # prior edits recorded or said, on both ArviZ lines

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


def _edited(prior):
    """The same prior with every parameter moved (x 1.5 + 0.25): a hyperparameter edit."""
    params = getattr(prior, "arg_constraints", None)
    if params is None:
        return float(prior) * 1.5 + 0.25
    kw = {n: getattr(prior, n) * 1.5 + 0.25 for n in params if getattr(prior, n, None) is not None}
    return type(prior)(**kw)


def _site_log_probs(model, kwargs, values):
    """Each sample site's log density at ``values`` (a finite number per site, or -inf)."""
    import jax.numpy as jnp
    from numpyro import handlers

    tr = handlers.trace(handlers.substitute(handlers.seed(model, 0), data=values)).get_trace(**kwargs)
    return {k: float(jnp.sum(v["fn"].log_prob(v["value"]))) for k, v in tr.items()
            if v["type"] == "sample" and not v["is_observed"]}


@pytest.mark.parametrize("name", sorted(families()))
def test_an_edit_of_each_family_s_model_file_is_recorded_and_changes_the_model_or_is_said(
        name, monkeypatch):
    """For every family and every prior of its model file: an edit (each parameter x 1.5 + 0.25)
    is what a run records, it changes the model's density (the Gibbs and NUTS methods read the
    model), or, for a method that does not read it, ignored_edits names it (the command line then
    says so)."""
    import functools
    import inspect
    import warnings

    import jax
    from numpyro import handlers

    family = families()[name]
    module = __import__(getattr(family.model, "func", family.model).__module__, fromlist=["x"])
    shipped = module.default_priors
    takes_k = "K" in inspect.signature(shipped).parameters
    check_kwargs = dict(family.checks.model_kwargs)
    K = check_kwargs.get("K", family.default_K)
    priors = shipped(K=K) if takes_k else shipped()
    changed = []
    for site, prior in priors.items():
        if site == "lam_rate" and prior is None:  # the flat measure: nothing to scale
            continue
        # the check's own priors, less the edited site, which then comes from the model file
        kwargs = {**check_kwargs,
                  "priors": {k: v for k, v in (check_kwargs.get("priors") or {}).items() if k != site}}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tr = handlers.trace(handlers.seed(family.model, jax.random.PRNGKey(0))).get_trace(**kwargs)
            values = {k: v["value"] for k, v in tr.items() if v["type"] == "sample" and not v["is_observed"]}
            before = _site_log_probs(family.model, kwargs, values)
            edited = _edited(prior)
            monkeypatch.setattr(module, "default_priors",
                                functools.wraps(shipped)(lambda *a, _s=site, _e=edited, **kw:
                                                         {**shipped(*a, **kw), _s: _e}))
            assert model_priors(family.model, K)[site] == describe(edited)
            after = _site_log_probs(family.model, kwargs, values)
        monkeypatch.setattr(module, "default_priors", shipped)
        if after != before:
            changed.append(site)
        for method in family.methods:
            monkeypatch.setattr(module, "default_priors",
                                functools.wraps(shipped)(lambda *a, _s=site, _e=edited, **kw:
                                                         {**shipped(*a, **kw), _s: _e}))
            named = ignored_edits(family.model, method.ignores_priors)
            monkeypatch.setattr(module, "default_priors", shipped)
            assert (site in named) == (site in method.ignores_priors), (method.name, named)
    if name == "rank-svm":
        # one variant per check: the hyperparameters of the other variants' sites, and epsilon
        # (the hinge's, in the observed margins), do not enter its latent sites
        assert {"r_a", "s_a", "Phi_shape", "Phi_tilde_shape", "Phi_tilde_rate"} <= set(changed), changed
        return
    # every prior the model samples from changes its density when edited. Left out: TA's pi (the
    # mixture's only); cfa's gamma, whose Gamma(1e-6, 1e-6) draw underflows to 0 at this seed
    # (-inf under either prior)
    unused = {"ta": {"pi"}, "cfa": {"gamma"}}.get(name, set())
    assert set(changed) >= set(priors) - unused, (name, sorted(set(priors) - set(changed)))
