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
  mean (the draws' conditional means averaged);
- ``latent_mean``: the density models' per-row latents, ``{name: (M, ...)}``: each row's
  conditional mean of the latent given its observed entries (FA ``z`` (M, K); MFA the
  component probabilities ``c`` (M, J) and ``z`` given each component (M, J, K); TA/MTA each
  group ``z_j`` and, for MTA, ``c`` (M, C)), averaged over the first chain's draws. The
  ``predictions`` group holds them per draw as ``<name>_mean`` (chains, draws, M, ...): chains
  may rotate or relabel the latents differently (only the draws of one chain are averaged), and
  a rotation-invariant posterior (FA's W and z) drifts within a chain too, which shrinks the
  average towards 0; the per-draw values are exact given each draw.

The binary-source families (CVQ, NOCA) sum their K sources out exactly up to
:data:`MAX_ENUMERATED_K`; above it each row's density is the mean-field lower bound at that draw
(``log_lik_kind`` says which, and so does the predictions table's column name), and the
``predictions`` group adds ``source_prob`` (chains, draws, M, K), each row's posterior
p(s_k = 1 | x) (exact, or the mean-field marginals), whose mean over the first chain's draws is
``source_probability`` (chains of a sampler may label the sources differently).

A classifier (the rank SVM) returns class probabilities instead of densities: ``prob``
(chains, draws, M) in the ``predictions`` group, p(y = +1 | θ_s, x) per draw, and
``positive_probability`` (M,), their mean over draws (the posterior predictive), with
``label_values``, the run's two labels in the user's own values (negative class first);
:func:`classify` turns them into labels and, given true labels, accuracy and log loss.

Families without ``predict`` are refused in one sentence that says so.

The module is also callable: ``import latentzoo; latentzoo.predict(run_dir, X_new)`` returns
just ``idata`` (ArviZ's ``InferenceData`` with the ``predictions`` group), for ``az.plot_*``.
"""

from __future__ import annotations

import json
import os
import sys
import types
from typing import Any, NamedTuple

import numpy as np

__all__ = ["predict", "write_predictions", "Prediction", "MAX_DRAWS", "per_draw", "binary_source_scores",
           "MAX_ENUMERATED_K", "LOWER_BOUND", "classify",
           "density_column"]

MAX_DRAWS = 200  # posterior draws used (evenly spaced): the predictive's Monte Carlo error is small


class Prediction(NamedTuple):
    """What :func:`predict` returns (see the module docstring)."""

    idata: Any
    log_predictive_density: np.ndarray | None  # None for a classifier
    imputed_mean: np.ndarray | None
    posterior_draws: int
    imputed: int
    positive_probability: np.ndarray | None = None  # a classifier's p(y = +1 | x), (M,)
    label_values: tuple | None = None  # a classifier's labels, negative class first
    labels: np.ndarray | None = None  # true labels read from the new data's last column
    restored: dict | None = None  # an image model's {"image", "noise_sd" (N,), "missing" (N,)}
    log_predictive_density_stderr: np.ndarray | None = None  # where the densities are estimates
    log_lik_kind: str = "exact"  # or LOWER_BOUND: the densities are bounds, and so is their mean
    source_probability: np.ndarray | None = None  # binary sources: p(s_k = 1 | x) (M, K), chain 0
    latent_mean: dict | None = None  # density models: {latent: E[latent | x] (M, ...)}, chain 0


MAX_ENUMERATED_K = 12  # binary sources summed out exactly up to 2^12 states per row
LOWER_BOUND = "mean-field lower bound"  # what a binary-source family scores above that K


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


def binary_source_scores(idata, X_new, sites, exact_rows, bound_rows, *, family: str, K: int) -> dict:
    """A binary-source family's scores of new complete rows under each stored draw:

    - ``log_lik`` (chains, draws, M): log p(x_n | draw), the 2^K source states summed out exactly
      (``exact_rows``) up to K = :data:`MAX_ENUMERATED_K`; above it, the mean-field lower bound
      (``bound_rows``), labelled by ``log_lik_kind``;
    - ``source_prob`` (chains, draws, M, K): each row's posterior p(s_nk = 1 | x_n, draw), exact
      with the enumeration, the mean-field marginals with the bound.

    ``exact_rows`` / ``bound_rows``: ``(X, *draw_of_sites) -> (loglik (M,), probs (M, K))``.
    ValueError for missing entries (neither path has a masked form)."""
    if np.isnan(X_new).any():
        raise ValueError(f"The {family} model scores complete rows only; the new data have "
                         f"{int(np.isnan(X_new).sum())} missing (NaN) entries.")
    exact = K <= MAX_ENUMERATED_K
    ll, probs = per_draw(exact_rows if exact else bound_rows, idata, X_new, sites)
    return {"log_lik": ll, "source_prob": probs, "log_lik_kind": "exact" if exact else LOWER_BOUND}


def _new_rows(X_new, D: int | None) -> np.ndarray:
    """The new rows as a float64 (M, D) array (D None: any number of columns)."""
    from latentzoo.data import load_array

    X = load_array(X_new) if isinstance(X_new, str) else X_new
    try:
        X = np.asarray(X, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError("The new data must be numbers (NaN for a missing entry).") from None
    if X.ndim == 1 and D is not None and X.size == D:
        X = X[None]
    if X.ndim != 2 or X.shape[0] < 1:
        raise ValueError(f"The new data must be a table of rows, got shape {X.shape}.")
    if D is not None and X.shape[1] != D:
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


def predict(run_dir: str, X_new, *, max_draws: int = MAX_DRAWS,
            labels_in_last_column: bool = False, layout: str | None = None) -> Prediction:
    """Score new rows (an array, or a file path) with the run in ``run_dir``; see the module
    docstring. ``labels_in_last_column``: for a classifier, new data with one column more than
    the run's hold the true labels last (returned as ``labels``). ``layout``: an image model's
    axes of a 4-D stack (NHWC / NCHW). ValueError naming the problem for a run or rows it cannot
    score."""
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
                         "covers every family but this one); its docs say what it offers.")
    meta = dict(latentzoo_model=family.name, latentzoo_method=attrs.get("latentzoo_method", ""),
                latentzoo_predicted_from=os.path.abspath(run_dir))
    if family.data_kind.name == "image stack":  # restore new images with the run's dictionary
        from latentzoo.data import load_array

        images = load_array(X_new, exts=(".npy", ".npz")) if isinstance(X_new, str) else X_new
        out = family.predict(idata, images, idata, layout=layout)
        draws = azx.from_draws({"noise_sd": out["noise_sd"]})
        azx.add_predictions(draws, {"noise_sd": out["noise_sd"]})
        azx.set_posterior_attrs(draws, **meta)
        restored = {"image": out["image"], "noise_sd": out["noise_sd"].mean((0, 1)),
                    "missing": out["missing"]}
        return Prediction(draws, None, None, out["noise_sd"].shape[1], int(out["missing"].sum()),
                          restored=restored)
    D = _fitted_columns(idata, run_dir)
    if "latentzoo_standardized" not in attrs:
        raise ValueError(f"{run_dir}/posterior.nc was written before runs recorded whether their "
                         "columns were standardised, so new rows could be scored on the wrong "
                         "scale; run the fit again with this version to predict from it.")
    in_last = labels_in_last_column and family.data_kind.load_with_labels is not None
    X = _new_rows(X_new, None if in_last else D)
    labels = None
    if in_last and X.shape[1] == D + 1:
        X, labels = X[:, :-1], X[:, -1]
    X = _new_rows(X, D)
    centre = scale = None
    if "constant_data" in azx.group_names(idata) and "standardize_scale" in idata.constant_data:
        centre = np.asarray(idata.constant_data["standardize_centre"])
        scale = np.asarray(idata.constant_data["standardize_scale"])
    Z = X if centre is None else (X - centre) / scale
    draws = _thinned(idata, max_draws)
    out = dict(family.predict(draws, Z, idata))
    index = out.pop("draw_index", None)
    if index is not None:  # the family used these draws of each chain instead
        draws = azx.from_draws({str(k): azx.posterior_array(idata, str(k))[:, index]
                                for k in idata.posterior.data_vars})
    if "prob" in out:  # a classifier
        prob = np.asarray(out["prob"], dtype=np.float64)
        S = prob.shape[0] * prob.shape[1]
        azx.add_predictions(draws, {"prob": prob})
        values = tuple(json.loads(attrs.get("latentzoo_label_values", "[-1, 1]")))
        azx.set_posterior_attrs(draws, **meta, latentzoo_label_values=json.dumps(list(values)))
        return Prediction(draws, None, None, S, 0, prob.reshape(S, -1).mean(0), values, labels)
    kind = out.pop("log_lik_kind", "exact")
    latents = {name: np.asarray(v) for name, v in (out.pop("latents", None) or {}).items()}
    latent_mean = {name: v[0].mean(0) for name, v in latents.items()} or None
    out.update({f"{name}_mean": v for name, v in latents.items()})
    sources = None
    if "source_prob" in out:  # the first chain's draws: sources may be relabelled between chains
        sources = np.asarray(out["source_prob"])[0].mean(0)
    ll = np.asarray(out["log_lik"], dtype=np.float64)
    if scale is not None:  # densities of the data as given: the transform's Jacobian
        ll = ll - np.where(np.isnan(X), 0.0, np.log(scale)).sum(-1)
        out = {**out, "log_lik": ll}
        if "X_completed" in out:
            out["X_completed"] = np.asarray(out["X_completed"]) * scale + centre
    S = ll.shape[0] * ll.shape[1]
    lpd = logsumexp(ll.reshape(S, -1), axis=0) - np.log(S)
    lpd_se = None
    if "log_lik_stderr" in out:  # estimated densities: the delta method through the mean
        weight = np.exp(ll.reshape(S, -1) - logsumexp(ll.reshape(S, -1), axis=0))
        lpd_se = np.sqrt(np.sum((weight * np.asarray(out["log_lik_stderr"]).reshape(S, -1)) ** 2, 0))
    imputed_mean = None
    if "X_completed" in out:
        imputed_mean = np.asarray(out["X_completed"]).reshape(S, *X.shape).mean(0)
        imputed_mean = np.where(np.isnan(X), imputed_mean, X)
    azx.add_predictions(draws, {k: np.asarray(v) for k, v in out.items()})
    azx.set_posterior_attrs(draws, **meta, latentzoo_log_lik=kind)
    return Prediction(draws, lpd, imputed_mean, S, int(np.isnan(X).sum()),
                      log_predictive_density_stderr=lpd_se, log_lik_kind=kind,
                      source_probability=sources, latent_mean=latent_mean)


def _fitted_columns(idata, run_dir: str) -> int:
    """The number of columns the run was fitted on: its observed ``X`` (or, for a family whose
    observed sites are derived from the data, the recorded ``constant_data.X_model``)."""
    from latentzoo import arviz_adapter as azx

    groups = azx.group_names(idata)
    if "observed_data" in groups and "X" in idata.observed_data:
        return int(idata.observed_data["X"].shape[-1])
    if "constant_data" in groups and "X_model" in idata.constant_data:
        return int(idata.constant_data["X_model"].shape[-1])
    raise ValueError(f"{run_dir}/posterior.nc holds no training data X, so the number of "
                     "columns the run was fitted on is unknown (a run written before runs "
                     "recorded it: fit again with this version to predict from it).")


def classify(result: Prediction, y_true=None) -> dict:
    """A classifier's predictions: ``predicted`` (M,) in the run's label values (the more
    probable class; ties go to the negative class) and, with true labels ``y_true`` (M,) in
    the same values, ``accuracy`` and ``log_loss`` (mean negative log posterior predictive
    probability of the true label, probabilities clipped to [1e-15, 1 - 1e-15]). ValueError for
    labels that are not the run's two."""
    p = result.positive_probability
    if p is None:
        raise ValueError("These predictions are densities, not class probabilities.")
    values = np.asarray(result.label_values)
    out = {"predicted": values[(p > 0.5).astype(int)]}
    if y_true is None:
        return out
    y = np.asarray(y_true).reshape(-1)
    if y.shape[0] != p.shape[0]:
        raise ValueError(f"{y.shape[0]} labels were given for {p.shape[0]} new rows.")
    try:
        y = y.astype(values.dtype)
    except (TypeError, ValueError):
        raise ValueError(f"The labels must be the run's label values {values.tolist()}.") from None
    other = sorted(set(np.unique(y).tolist()) - set(values.tolist()))
    if other:
        raise ValueError(f"The labels hold {other[:3]}, which are not the run's label values "
                         f"{values.tolist()}.")
    positive = y == values[1]
    q = np.clip(np.where(positive, p, 1.0 - p), 1e-15, 1.0)
    return {**out, "accuracy": float(np.mean(out["predicted"] == y)),
            "log_loss": float(-np.mean(np.log(q)))}


def write_predictions(out_dir: str, result: Prediction, y_true=None):
    """``predictions.nc`` (the InferenceData) and ``predictions.csv`` (one row per new row:
    ``log_predictive_density`` (``..._lower_bound`` where the family scored a bound), the
    sources' posterior ``p_source_k`` (binary-source families), the latents' posterior means
    ``<latent>_mean_<index>`` (density models), then the completed entries where some were missing; for a
    classifier ``probability_of_<positive label>``, ``predicted`` and, given ``y_true``, the
    ``label``, with accuracy and log loss in the attributes) into ``out_dir``, together
    through a staging folder. Returns the table."""
    import pandas as pd

    from latentzoo import arviz_adapter as azx
    from latentzoo.results import atomic_write_text, staged_run_dir, writing

    if result.restored is not None:
        return _write_images(out_dir, result)
    if result.positive_probability is not None:
        scores = classify(result, y_true)
        table = pd.DataFrame({f"probability_of_{_label_text(result.label_values[1])}":
                              result.positive_probability, "predicted": scores["predicted"]})
        if y_true is not None:
            table["label"] = np.asarray(y_true).reshape(-1)
            azx.set_posterior_attrs(result.idata, latentzoo_accuracy=scores["accuracy"],
                                    latentzoo_log_loss=scores["log_loss"])
    else:
        table = pd.DataFrame({density_column(result): result.log_predictive_density})
        if result.log_predictive_density_stderr is not None:
            table["stderr"] = result.log_predictive_density_stderr
        if result.source_probability is not None:
            for k in range(result.source_probability.shape[1]):
                table[f"p_source_{k}"] = result.source_probability[:, k]
        for name, mean in (result.latent_mean or {}).items():
            flat = mean.reshape(mean.shape[0], -1)
            index = np.stack(np.unravel_index(np.arange(flat.shape[1]), mean.shape[1:]), -1)
            for j, at in enumerate(index):
                table[f"{name}_mean_" + "_".join(map(str, at))] = flat[:, j]
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


def density_column(result: Prediction) -> str:
    """The name of the predictions table's density column: ``log_predictive_density``, or
    ``log_predictive_density_lower_bound`` where the family scored a bound."""
    return "log_predictive_density" + ("" if result.log_lik_kind == "exact" else "_lower_bound")


def _write_images(out_dir: str, result: Prediction):
    """An image model's predictions: ``restored.npy`` (the clean images, in the input's
    layout), ``restored.png`` (the first 16, each on its own grey scale), ``predictions.csv``
    (per image: noise sd, missing pixels) and ``predictions.nc``. Returns the table."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    from latentzoo import arviz_adapter as azx
    from latentzoo.results import atomic_savefig, atomic_write, atomic_write_text, staged_run_dir, writing

    images = np.asarray(result.restored["image"])
    table = pd.DataFrame({"noise_sd": result.restored["noise_sd"],
                          "missing_pixels": result.restored["missing"]})
    shown = images[:16]
    cols = min(4, len(shown))
    rows = -(-len(shown) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.2 * cols, 2.2 * rows), squeeze=False)
    for ax, img in zip(axes.flat, shown):
        if img.ndim == 3 and img.shape[-1] in (3, 4):  # channels last: a colour image
            lo, hi = float(img.min()), float(img.max())
            ax.imshow((img - lo) / max(hi - lo, 1e-12))
        else:
            ax.imshow(img if img.ndim == 2 else img.mean(0), cmap="gray")
    for ax in axes.flat:
        ax.set_axis_off()
    fig.tight_layout()
    with staged_run_dir(out_dir) as stage:
        for name, write in (
            ("restored.npy", lambda p: atomic_write(p, lambda tmp: _save_npy(tmp, images))),
            ("restored.png", lambda p: atomic_savefig(fig, p)),
            ("predictions.nc", lambda p: azx.save(result.idata, p)),
            ("predictions.csv", lambda p: atomic_write_text(p, table.to_csv(index_label="image"))),
        ):
            with writing(os.path.join(out_dir, name), out_dir):
                write(os.path.join(stage, name))
    plt.close(fig)
    return table


def _save_npy(path: str, array) -> None:
    with open(path, "wb") as fh:  # a file object: np.save would add ".npy" to a bare name
        np.save(fh, array)


def _label_text(value) -> str:
    """A label value as a column name's suffix: 1.0 -> "1", "cat" -> "cat"."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


class _CallableModule(types.ModuleType):
    """This module, callable: ``latentzoo.predict(run_dir, X_new, **options)`` is
    ``predict(run_dir, X_new, **options).idata``, the ArviZ InferenceData with the
    ``predictions`` group (the per-draw values) that ``az.plot_*`` and ``az.summary`` read. The
    function :func:`predict` returns the full :class:`Prediction` (densities, imputations,
    class probabilities) that the command line writes."""

    def __call__(self, run_dir, X_new, **options):
        return predict(run_dir, X_new, **options).idata


sys.modules[__name__].__class__ = _CallableModule
