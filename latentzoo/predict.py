"""New data scored with a finished run's posterior, without refitting: ``latentzoo predict``.

:func:`predict` reads only the run folder (``posterior.nc``) and the new rows. It applies the
run's recorded column transform (a run made with ``--standardize`` stores its columns' centre and
scale in the ``constant_data`` group), evaluates the family's ``predict`` (``Family.predict``) on
at most :data:`MAX_DRAWS` evenly spaced posterior draws, and returns:

- ``idata``: an ArviZ ``InferenceData`` with the draws used and a ``predictions`` group:
  ``log_lik`` (chains, draws, M), each new row's log density under each draw, in the units of
  the data as given (the standardisation's Jacobian included), and ``X_completed`` where the
  family imputes missing entries (NaN in the new rows) from each draw's conditional mean;
- ``log_predictive_density`` (M,): log (1/S) Σ_s p(x_n | θ_s), the posterior predictive density
  of each row's observed entries (exact given the draws; a point fit has S = 1: a plug-in value);
- ``imputed_mean`` (M, D): the new rows with each missing entry at its posterior predictive
  mean (the draws' conditional means averaged).

Families without ``predict`` are refused in one sentence that says so.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import numpy as np

__all__ = ["predict", "write_predictions", "Prediction", "MAX_DRAWS", "per_draw", "enumerated_log_lik",
           "MAX_ENUMERATED_K"]

MAX_DRAWS = 200  # posterior draws used (evenly spaced): the predictive's Monte Carlo error is small


class Prediction(NamedTuple):
    """What :func:`predict` returns (see the module docstring)."""

    idata: Any
    log_predictive_density: np.ndarray
    imputed_mean: np.ndarray | None
    posterior_draws: int
    imputed: int


MAX_ENUMERATED_K = 12  # binary sources summed out exactly up to 2^12 states per row


def per_draw(fn, idata, X_new, sites):
    """``fn(X, *one_draw_of_sites)`` under every stored draw, as NumPy arrays shaped (chains,
    draws, ...): one compiled program vmapped over the draws, the rows an argument of it (not a
    constant folded in). ``fn`` returns an array or a tuple of them."""
    import jax
    import jax.numpy as jnp

    arrays = [np.asarray(idata.posterior[s]) for s in sites]
    lead = arrays[0].shape[:2]
    flat = [a.reshape(-1, *a.shape[2:]) for a in arrays]
    out = jax.jit(jax.vmap(fn, in_axes=(None,) + (0,) * len(flat)))(jnp.asarray(X_new), *flat)
    shaped = [np.asarray(a).reshape(*lead, *np.shape(a)[1:]) for a in jax.tree_util.tree_leaves(out)]
    return tuple(shaped) if isinstance(out, tuple) else shaped[0]


def enumerated_log_lik(idata, X_new, sites, log_lik, *, family: str, K: int) -> dict:
    """``{"log_lik": (chains, draws, M)}`` for a binary-source family whose per-row likelihood
    sums its 2^K source states out exactly: ``log_lik(X, *draw_of_sites) -> (M,)`` under each
    stored draw. Complete rows only (the enumeration has no masked form yet), K up to
    :data:`MAX_ENUMERATED_K`; otherwise one ValueError sentence."""
    if np.isnan(X_new).any():
        raise ValueError(f"The {family} model scores complete rows only; the new data have "
                         f"{int(np.isnan(X_new).sum())} missing (NaN) entries.")
    if K > MAX_ENUMERATED_K:
        raise ValueError(f"The {family} run has K = {K} sources; exact scoring sums 2^K states "
                         f"per row and stops at K = {MAX_ENUMERATED_K}.")
    return {"log_lik": per_draw(log_lik, idata, X_new, sites)}


def _new_rows(X_new, D: int) -> np.ndarray:
    from latentzoo.data import load_array

    X = load_array(X_new) if isinstance(X_new, str) else X_new
    try:
        X = np.asarray(X, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError("The new data must be numbers (NaN for a missing entry).") from None
    if X.ndim == 1 and X.size == D:
        X = X[None]
    if X.ndim != 2 or X.shape[0] < 1:
        raise ValueError(f"The new data must be a table of rows, got shape {X.shape}.")
    if X.shape[1] != D:
        raise ValueError(f"The new data have {X.shape[1]} columns; the run was fitted on {D}.")
    if np.isinf(X).any():
        raise ValueError(f"The new data hold {int(np.isinf(X).sum())} infinite value(s); "
                         "use NaN for a missing entry.")
    return X


def _thinned(idata, max_draws: int):
    """The posterior with at most ``max_draws`` draws in all, evenly spaced in each chain."""
    from latentzoo import arviz_adapter as azx

    post = idata.posterior
    chains, draws = post.sizes.get("chain", 1), post.sizes.get("draw", 1)
    keep = max(1, min(draws, max_draws // max(1, chains)))
    pick = np.unique(np.linspace(0, draws - 1, keep).round().astype(int))
    return azx.from_draws({str(k): azx.posterior_array(idata, str(k))[:, pick]
                           for k in post.data_vars})


def predict(run_dir: str, X_new, *, max_draws: int = MAX_DRAWS) -> Prediction:
    """Score new rows (an array, or a file path) with the run in ``run_dir``; see the module
    docstring. ValueError naming the problem for a run or rows it cannot score."""
    from scipy.special import logsumexp

    from latentzoo import arviz_adapter as azx
    from latentzoo.registry import families

    from latentzoo.runs import read_run

    idata, attrs = read_run(run_dir)
    family = families().get(attrs.get("latentzoo_model"))
    if family is None:
        raise ValueError(f"{run_dir}/posterior.nc names no model of the zoo "
                         f"({attrs.get('latentzoo_model')!r}), so there is nothing to predict with.")
    if family.predict is None:
        raise ValueError(f"The {family.name} model cannot score new rows yet (latentzoo predict "
                         "covers fa, mfa, cvq and noca); its docs say what it offers.")
    if "observed_data" not in azx.group_names(idata) or "X" not in idata.observed_data:
        raise ValueError(f"{run_dir}/posterior.nc holds no training data X, so the number of "
                         "columns the run was fitted on is unknown.")
    if "latentzoo_standardized" not in attrs:
        raise ValueError(f"{run_dir}/posterior.nc was written before runs recorded whether their "
                         "columns were standardised, so new rows could be scored on the wrong "
                         "scale; run the fit again with this version to predict from it.")
    D = int(idata.observed_data["X"].shape[-1])
    X = _new_rows(X_new, D)
    centre = scale = None
    if "constant_data" in azx.group_names(idata) and "standardize_scale" in idata.constant_data:
        centre = np.asarray(idata.constant_data["standardize_centre"])
        scale = np.asarray(idata.constant_data["standardize_scale"])
    Z = X if centre is None else (X - centre) / scale
    draws = _thinned(idata, max_draws)
    out = family.predict(draws, Z)
    ll = np.asarray(out["log_lik"], dtype=np.float64)
    if scale is not None:  # densities of the data as given: the transform's Jacobian
        ll = ll - np.where(np.isnan(X), 0.0, np.log(scale)).sum(-1)
        out = {**out, "log_lik": ll}
        if "X_completed" in out:
            out["X_completed"] = np.asarray(out["X_completed"]) * scale + centre
    S = ll.shape[0] * ll.shape[1]
    lpd = logsumexp(ll.reshape(S, -1), axis=0) - np.log(S)
    imputed_mean = None
    if "X_completed" in out:
        imputed_mean = np.asarray(out["X_completed"]).reshape(S, *X.shape).mean(0)
        imputed_mean = np.where(np.isnan(X), imputed_mean, X)
    azx.add_predictions(draws, {k: np.asarray(v) for k, v in out.items()})
    azx.set_posterior_attrs(draws, latentzoo_model=family.name,
                            latentzoo_method=attrs.get("latentzoo_method", ""),
                            latentzoo_predicted_from=os.path.abspath(run_dir))
    return Prediction(draws, lpd, imputed_mean, S, int(np.isnan(X).sum()))


def write_predictions(out_dir: str, result: Prediction):
    """``predictions.nc`` (the InferenceData) and ``predictions.csv`` (one row per new row:
    ``log_predictive_density``, then the completed entries where some were missing) into
    ``out_dir``, together through a staging folder. Returns the table."""
    import pandas as pd

    from latentzoo import arviz_adapter as azx
    from latentzoo.results import atomic_write_text, staged_run_dir, writing

    table = pd.DataFrame({"log_predictive_density": result.log_predictive_density})
    if result.imputed and result.imputed_mean is not None:
        cols = pd.DataFrame(result.imputed_mean,
                            columns=[f"x{d}" for d in range(result.imputed_mean.shape[1])])
        table = pd.concat([table, cols], axis=1)
    with staged_run_dir(out_dir) as stage:
        with writing(os.path.join(out_dir, "predictions.nc"), out_dir):
            azx.save(result.idata, os.path.join(stage, "predictions.nc"))
        with writing(os.path.join(out_dir, "predictions.csv"), out_dir):
            atomic_write_text(os.path.join(stage, "predictions.csv"), table.to_csv(index_label="row"))
    return table
