"""Every ArviZ call the project makes, in one place.

ArviZ 0.2x (Python 3.11) and ArviZ 1.x (Python >= 3.12, built on ``arviz-base`` / ``arviz-stats``
/ ``arviz-plots`` and ``xarray.DataTree``) differ in converters, group access, summary column
names, LOO results and plotting. Code elsewhere calls only the functions below, which behave the
same on both lines; the object they pass around ("idata") is an ``arviz.InferenceData`` on 0.2x
and an ``xarray.DataTree`` on 1.x. Both give ``idata.posterior`` (with ``.data_vars``, ``.sizes``,
``.attrs`` and ``["name"]``), but not the same methods: for groups, attributes, arrays and
variable names use :func:`group_names`, :func:`posterior_attrs`, :func:`posterior_array` and
:func:`posterior_var_names` rather than the objects' own methods.
"""

from __future__ import annotations

import io
import numbers
import warnings

import matplotlib

matplotlib.use("Agg")  # files only, no display; set before pyplot is imported

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.collections import LineCollection  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from latentzoo.results import atomic_savefig, atomic_write  # noqa: E402

with warnings.catch_warnings():
    warnings.simplefilter("ignore", FutureWarning)  # 0.2x announces the 1.x refactor on import
    import arviz as az  # noqa: E402

__all__ = [
    "ARVIZ_VERSION",
    "ARVIZ_1",
    "from_mcmc",
    "from_draws",
    "summary",
    "save",
    "load",
    "plot_trace",
    "plot_rank",
    "plot_ppc",
    "plot_predictive_columns",
    "plot_loo_pit",
    "loo_pit",
    "run_title",
    "add_posterior_predictive",
    "group_names",
    "posterior_attrs",
    "set_posterior_attrs",
    "posterior_var_names",
    "posterior_array",
    "drop_posterior_vars",
    "loo",
]

ARVIZ_VERSION: str = az.__version__
#: True on the ArviZ 1.x line (``xarray.DataTree`` based), False on 0.2x.
ARVIZ_1: bool = int(ARVIZ_VERSION.split(".")[0]) >= 1

if ARVIZ_1:
    import xarray as xr

_SUMMARY_COLUMNS = ["mean", "sd", "hdi_3%", "hdi_97%", "ess_bulk", "ess_tail", "r_hat"]
# 1.x names the 94% HDI bounds after the probability; 0.2x after the tail masses.
_SUMMARY_RENAMES_1X = {"hdi94_lb": "hdi_3%", "hdi94_ub": "hdi_97%"}
# ArviZ 0.2x's default display rounding, applied on both lines to raw numbers.
_SUMMARY_DECIMALS = {"mean": 3, "sd": 3, "hdi_3%": 3, "hdi_97%": 3, "ess_bulk": 0, "ess_tail": 0,
                     "r_hat": 2}
# Line styles of the chains in 0.2x's compact trace plots (colours tell vector components apart).
_CHAIN_STYLES = ["solid", "dotted", "dashed", "dashdot", (0, (5, 1)), (0, (1, 3)), (0, (3, 1, 1, 1))]
# Fewest draws (chains x draws) for PSIS-LOO: below 30, 1.x's Pareto tail (20% of the draws)
# is too short to fit and it returns NaN shape estimates or raises.
_LOO_MIN_DRAWS = 30
# Attributes ArviZ writes on every group by itself (0.2x and 1.x); not run metadata.
_ARVIZ_ATTRS = frozenset({
    "created_at", "arviz_version", "arviz_language", "inference_library",
    "inference_library_version", "creation_library", "creation_library_version",
    "creation_library_language", "sample_dims", "modeling_interface",
    "modeling_interface_version", "sampling_time", "tuning_steps",
})


# ------------------------------------------------------------------------ building
def _from_groups(*, coords=None, dims=None, **groups):
    """``az.from_dict`` over the groups given (dicts of arrays); None groups left out."""
    groups = {name: _plain_arrays(data) for name, data in groups.items() if data is not None}
    if ARVIZ_1:
        return az.from_dict(groups, coords=coords, dims=dims)
    return az.from_dict(**groups, coords=coords, dims=dims)


def _dims_of_observed(idata, data: dict, *, leading: bool):
    """(dims, coords) naming the non-sample axes of ``data``'s arrays (chains, draws, ...) after
    the observed variable of the same name: all of its axes (replicated data) or, with
    ``leading``, its first ones (pointwise log-likelihood of rows). ArviZ names observed axes
    from NumPyro's plates, differently on 0.2x and 1.x; 1.x's plots need them to agree."""
    dims, coords = {}, {}
    if "observed_data" not in group_names(idata):
        return dims, coords
    observed = idata.observed_data
    for name, value in data.items():
        event = tuple(np.shape(value)[2:])
        if name not in observed.data_vars or not event:
            continue
        obs = observed[name]
        if tuple(obs.shape[: len(event)] if leading else obs.shape) != event:
            continue
        dims[name] = [str(d) for d in obs.dims[: len(event)]]
        for d in dims[name]:
            if d in obs.coords:
                coords[d] = np.asarray(obs.coords[d].values)
    return dims, coords


def _plain_arrays(data: dict) -> dict:
    return {name: np.asarray(value) for name, value in data.items()}


def _set_group(idata, name: str, source) -> None:
    """Put group ``name`` of ``source`` into ``idata``, replacing one already there."""
    if ARVIZ_1:
        idata[name] = source[name]
    else:
        idata.extend(source, join="right")


def _check_sampled(group: str, data: dict) -> None:
    shapes = {name: np.shape(value) for name, value in data.items()}
    bad = [name for name, shape in shapes.items() if len(shape) < 2]
    if bad:
        raise ValueError(
            f"{group} arrays must be shaped (chains, draws, ...); {', '.join(bad)} "
            f"has fewer than two dimensions."
        )
    lead = {shape[:2] for shape in shapes.values()}
    if len(lead) > 1:
        raise ValueError(
            f"{group} arrays disagree on (chains, draws): "
            + ", ".join(f"{n} {s[:2]}" for n, s in shapes.items()) + "."
        )


def _readable_stats(idata):
    """Rename block diagnostics to readable names (``block_states.2.diverging`` -> ``block2_diverging``)."""
    if "sample_stats" not in group_names(idata):
        return idata
    renames = {}
    for name in idata.sample_stats.data_vars:
        if name.startswith("block_states."):
            _, index, field = name.split(".", 2)
            renames[name] = f"block{index}_{field.replace('.', '_')}"
    if renames:
        if ARVIZ_1:
            idata["sample_stats"] = idata["sample_stats"].to_dataset().rename(renames)
        else:
            idata.sample_stats = idata.sample_stats.rename(renames)
    return idata


def from_mcmc(mcmc, *, log_likelihood=None, coords=None, dims=None):
    """InferenceData from a finished ``numpyro.infer.MCMC``.

    ``log_likelihood``: optional dict name -> array (chains, draws, N) of pointwise
    log-likelihoods to store instead of NumPyro's (e.g. with the latent factors integrated out).
    """
    if log_likelihood is not None:
        _check_sampled("log_likelihood", log_likelihood)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # 1.x: dims it cannot infer from plates
        idata = az.from_numpyro(
            mcmc, log_likelihood=log_likelihood is None, coords=coords, dims=dims
        )
    if log_likelihood is not None:
        # Axes named as the observations' rows (NumPyro's plate), so both lines agree.
        ll_dims, ll_coords = _dims_of_observed(idata, log_likelihood, leading=True)
        _set_group(idata, "log_likelihood",
                   _from_groups(log_likelihood=log_likelihood, coords=ll_coords, dims=ll_dims))
    return _readable_stats(idata)


def from_draws(posterior: dict, *, observed_data=None, log_likelihood=None, sample_stats=None):
    """InferenceData from arrays shaped (chains, draws, ...) (variational / EM results).

    ``observed_data`` arrays have no chain/draw dimensions. Raises ValueError when a sampled
    array has fewer than two dimensions or the groups disagree on (chains, draws).
    """
    sampled = {"posterior": posterior, "log_likelihood": log_likelihood, "sample_stats": sample_stats}
    for group, data in sampled.items():
        if data is not None:
            _check_sampled(group, data)
    leads = {np.shape(v)[:2] for data in sampled.values() if data for v in data.values()}
    if len(leads) > 1:
        raise ValueError(f"posterior, log_likelihood and sample_stats disagree on (chains, draws): {sorted(leads)}.")
    return _from_groups(
        posterior=posterior,
        observed_data=observed_data,
        log_likelihood=log_likelihood,
        sample_stats=sample_stats,
    )


def add_posterior_predictive(idata, predictive: dict):
    """Attach a posterior_predictive group (arrays (chains, draws, ...)), replacing any already
    there; returns ``idata`` (changed in place)."""
    _check_sampled("posterior_predictive", predictive)
    dims, coords = _dims_of_observed(idata, predictive, leading=False)
    _set_group(idata, "posterior_predictive",
               _from_groups(posterior_predictive=predictive, coords=coords, dims=dims))
    return idata


# ----------------------------------------------------------------------- accessing
def group_names(idata) -> list[str]:
    """Names of the groups present: ``posterior``, ``sample_stats``, ``log_likelihood``, ..."""
    if ARVIZ_1:
        return [name for name, node in idata.children.items() if node.has_data or node.attrs]
    return list(idata.groups())


def _plain_attr(value):
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, tuple):
        return list(value)
    return value


def posterior_attrs(idata) -> dict:
    """Run metadata on the posterior group, without ArviZ's own bookkeeping (creation time,
    library versions); values as plain Python str / int / float / lists."""
    return {
        key: _plain_attr(value)
        for key, value in idata.posterior.attrs.items()
        if key not in _ARVIZ_ATTRS
    }


def _storable(value) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return False  # NetCDF has no boolean attributes
    if isinstance(value, (str, numbers.Real)):
        return True
    if isinstance(value, (list, tuple)) and value:
        kinds = {isinstance(v, str) for v in value}
        scalars = all(isinstance(v, (str, numbers.Real)) and _storable(v) for v in value)
        return len(kinds) == 1 and scalars
    return False


def set_posterior_attrs(idata, **attrs):
    """Store run metadata on the posterior group (saved in the NetCDF file); returns ``idata``.

    Values must be str, int, float or non-empty lists of one of them (no bools, None or dicts:
    NetCDF cannot store them); anything else raises TypeError before anything is changed.
    """
    bad = [key for key, value in attrs.items() if not _storable(value)]
    if bad:
        raise TypeError(
            f"Posterior attributes must be str, int, float or lists of them; "
            f"got {', '.join(f'{k}={attrs[k]!r}' for k in bad)}."
        )
    clash = sorted(set(attrs) & _ARVIZ_ATTRS)
    if clash:
        raise ValueError(f"{', '.join(clash)}: reserved by ArviZ.")
    idata.posterior.attrs.update({k: _plain_attr(v) for k, v in attrs.items()})
    return idata


def posterior_var_names(idata) -> list[str]:
    """Names of the posterior variables, in stored order."""
    return [str(name) for name in idata.posterior.data_vars]


def posterior_array(idata, name: str) -> np.ndarray:
    """Posterior draws of ``name`` as a NumPy array shaped (chains, draws, ...)."""
    if name not in idata.posterior.data_vars:
        raise KeyError(
            f"No posterior variable {name!r}; the posterior has {', '.join(posterior_var_names(idata))}."
        )
    da = idata.posterior[name]
    return np.asarray(da.transpose("chain", "draw", ...).values)


def drop_posterior_vars(idata, names):
    """Remove posterior variables (a name or list; names not present are ignored); returns
    ``idata`` (changed in place). The posterior's attributes are kept."""
    names = [names] if isinstance(names, str) else list(names)
    names = [n for n in names if n in idata.posterior.data_vars]
    if names:
        if ARVIZ_1:
            idata["posterior"] = idata["posterior"].to_dataset().drop_vars(names)
        else:
            idata.posterior = idata.posterior.drop_vars(names)
    return idata


# ---------------------------------------------------------------------- statistics
def _var_list(idata, var_names) -> list[str] | None:
    if var_names is None:
        return None
    names = [var_names] if isinstance(var_names, str) else list(var_names)
    have = set(posterior_var_names(idata))
    missing = [v for v in names if v not in have]
    if missing:
        raise KeyError(
            f"No posterior variable {', '.join(map(repr, missing))}; the posterior has "
            f"{', '.join(posterior_var_names(idata))}."
        )
    return names


def summary(idata, var_names=None) -> pd.DataFrame:
    """ArviZ summary of the posterior as a pandas DataFrame.

    Columns ``mean, sd, hdi_3%, hdi_97%, ess_bulk, ess_tail, r_hat`` (those ArviZ computes;
    94% HDI), rows ``name`` / ``name[i, j]``, rounded as ArviZ 0.2x displays them (3 decimals,
    r_hat 2, ESS whole numbers). ``var_names``: a name or list of names (default: all).
    """
    names = _var_list(idata, var_names)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # r_hat of constant (EM) draws
        warnings.simplefilter("ignore", UserWarning)
        if ARVIZ_1:
            table = az.summary(idata, var_names=names, ci_prob=0.94, ci_kind="hdi", round_to="none")
            table = pd.DataFrame(table).rename(columns=_SUMMARY_RENAMES_1X)
        else:
            table = az.summary(idata, var_names=names, hdi_prob=0.94, round_to="none")
    table = pd.DataFrame(table[[c for c in _SUMMARY_COLUMNS if c in table.columns]]).astype(float)
    table.index = [str(i) for i in table.index]
    return table.round({c: d for c, d in _SUMMARY_DECIMALS.items() if c in table.columns})


def _log_likelihood_name(idata, var_name):
    """The log-likelihood variable to use (the only one when ``var_name`` is None), or None."""
    if "log_likelihood" not in group_names(idata):
        return None
    names = [str(n) for n in idata.log_likelihood.data_vars]
    if not names:
        return None
    if var_name is None:
        if len(names) > 1:
            raise ValueError(f"Several log-likelihoods ({', '.join(names)}); pass var_name.")
        return names[0]
    if var_name not in names:
        raise KeyError(f"No log-likelihood {var_name!r}; there are {', '.join(names)}.")
    return var_name


def loo(idata, var_name: str | None = None, *, pointwise: bool = False) -> dict | None:
    """PSIS-LOO from the pointwise log-likelihood: ``{"elpd_loo", "se", "p_loo", "max_pareto_k",
    "n_data_points"}`` (with ``pointwise``, also ``"pareto_k"``: the Pareto k of each data point,
    a flat array), or None when ``idata`` has no log_likelihood group.

    ``var_name`` picks the log-likelihood variable; needed only when there are several
    (ValueError otherwise). Needs at least 30 draws in all (ValueError otherwise; point fits
    have one). Pareto k above 0.7 means the estimate is unreliable.
    """
    var_name = _log_likelihood_name(idata, var_name)
    if var_name is None:
        return None
    sizes = idata.log_likelihood[var_name].sizes
    n_draws = sizes.get("chain", 1) * sizes.get("draw", 1)
    if n_draws < _LOO_MIN_DRAWS:
        # 1.x's Pareto fit fails on fewer; 0.2x answers with k = inf or an IndexError.
        raise ValueError(
            f"PSIS-LOO needs at least {_LOO_MIN_DRAWS} draws (chains x draws); got {n_draws}."
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # large Pareto k: reported in the result
        warnings.simplefilter("ignore", RuntimeWarning)
        result = az.loo(idata, pointwise=True, var_name=var_name)
    if ARVIZ_1:
        elpd, p = result.elpd, result.p
    else:
        elpd, p = result["elpd_loo"], result["p_loo"]
    k = np.asarray(result["pareto_k"] if not ARVIZ_1 else result.pareto_k)
    out = {
        "elpd_loo": float(elpd),
        "se": float(result["se"] if not ARVIZ_1 else result.se),
        "p_loo": float(p),
        "max_pareto_k": float(np.nanmax(k)),
        "n_data_points": int(k.size),
    }
    if pointwise:
        out["pareto_k"] = np.ravel(k).astype(float)
    return out


def loo_pit(idata, var_name: str = "X", *, seed: int = 0) -> np.ndarray:
    """LOO-PIT values ``P(x_rep_i <= x_i | x_-i)``, shaped like the observed ``var_name``, by ArviZ's
    ``loo_pit`` with PSIS weights from the pointwise log-likelihood.

    ``idata`` needs observed_data, log_likelihood and a posterior_predictive group whose draw
    (c, d) was simulated from posterior draw (c, d) (the weights are per draw). The
    log-likelihood may be per observation or per row (its axes the observed array's first
    ones, e.g. (N,) for (N, D) data with one term per row): each value of a row then gets that
    row's leave-one-out weights. At least 30 draws (ValueError otherwise).
    """
    for group in ("observed_data", "posterior_predictive"):
        if group not in group_names(idata) or var_name not in getattr(idata, group).data_vars:
            raise ValueError(f"loo_pit needs {var_name!r} in the {group} group.")
    if _log_likelihood_name(idata, var_name) is None:
        raise ValueError(f"loo_pit needs a pointwise log-likelihood {var_name!r}.")
    obs = np.asarray(idata.observed_data[var_name])
    ll = np.asarray(idata.log_likelihood[var_name].transpose("chain", "draw", ...).values)
    pp = np.asarray(idata.posterior_predictive[var_name].transpose("chain", "draw", ...).values)
    if pp.shape[:2] != ll.shape[:2] or pp.shape[2:] != obs.shape:
        raise ValueError(
            f"loo_pit needs replicates shaped (chains, draws) + {obs.shape} on the log-likelihood's "
            f"draws {ll.shape[:2]}; got {pp.shape}."
        )
    event = ll.shape[2:]
    if obs.shape[: len(event)] != event:
        raise ValueError(f"The log-likelihood's axes {event} are not the leading axes of the data {obs.shape}.")
    n_draws = ll.shape[0] * ll.shape[1]
    if n_draws < _LOO_MIN_DRAWS:
        raise ValueError(f"LOO-PIT needs at least {_LOO_MIN_DRAWS} draws (chains x draws); got {n_draws}.")
    extra = (1,) * (obs.ndim - len(event))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # large Pareto k: LOO reports it
        warnings.simplefilter("ignore", RuntimeWarning)
        if ARVIZ_1:
            ratios = xr.DataArray(-ll.reshape(n_draws, -1), dims=("draw", "point"))
            lw, k = ratios.azstats.psislw(dim="draw", r_eff=1.0)
            lw = np.asarray(lw.transpose("point", "draw").values).reshape(*event, *extra, n_draws)
            k = np.asarray(k.values).reshape(*event, *extra)
            dims = ("chain", "draw", *(f"pit_dim_{i}" for i in range(obs.ndim)))
            # 1.x reads the number of draws (and an r_eff it does not need once the weights are
            # given) from a posterior group: i.i.d. placeholder draws, r_eff = 1 as above.
            placeholder = np.random.default_rng(seed).normal(size=ll.shape[:2])
            tree = az.from_dict({
                "posterior": {"draws": placeholder},
                "posterior_predictive": {var_name: pp},
                "log_likelihood": {var_name: np.broadcast_to(ll.reshape(*ll.shape, *extra), pp.shape)},
                "observed_data": {var_name: obs},
            }, dims={var_name: list(dims[2:])})
            weights = np.moveaxis(np.broadcast_to(lw, (*obs.shape, n_draws)), -1, 0)
            weights = xr.DataArray(weights.reshape(ll.shape[0], ll.shape[1], *obs.shape), dims=dims)
            k = xr.DataArray(np.broadcast_to(k, obs.shape), dims=dims[2:])
            pit = az.loo_pit(tree, var_names=var_name, log_weights=xr.Dataset({var_name: weights}),
                             pareto_k=xr.Dataset({var_name: k}), random_state=seed)
            return np.asarray(pit[var_name].values).reshape(obs.shape)
        lw, _ = az.psislw(-ll.reshape(n_draws, -1).T, reff=1.0)
        lw = np.broadcast_to(np.asarray(lw).reshape(*event, *extra, n_draws), (*obs.shape, n_draws))
        y_hat = np.moveaxis(pp.reshape(n_draws, *obs.shape), 0, -1)
        upper = np.asarray(az.loo_pit(y=obs, y_hat=y_hat, log_weights=lw)).reshape(obs.shape)
        if not np.all(obs == np.round(obs)):
            return upper
        # Integer data: 0.2x returns P(x_rep <= x); 1.x (and the PIT's uniformity) needs ties
        # spread uniformly, P(x_rep < x) + u P(x_rep = x).
        lower = np.asarray(az.loo_pit(y=obs - 0.5, y_hat=y_hat, log_weights=lw)).reshape(obs.shape)
        u = np.random.default_rng(seed).random(obs.shape)
        return lower + u * (upper - lower)


# --------------------------------------------------------------------------- files
def _netcdf_encoding(ds) -> dict:
    """zlib for numeric variables, as ArviZ 0.2x's ``to_netcdf(compress=True)``."""
    return {
        name: {"zlib": True}
        for name, var in ds.variables.items()
        if np.issubdtype(var.dtype, np.number) or var.dtype == np.bool_
    }


def save(idata, path: str) -> None:
    """Write NetCDF (HDF5) atomically (temporary file, then rename)."""
    if ARVIZ_1:
        encoding = {node.path: _netcdf_encoding(node.dataset) for node in idata.subtree if node.has_data}

        def write(tmp):
            idata.to_netcdf(tmp, engine="h5netcdf", encoding=encoding)
    else:

        def write(tmp):
            idata.to_netcdf(tmp, engine="h5netcdf")

    atomic_write(path, write)


def load(path: str):
    """Read a file written by :func:`save` (either ArviZ line), fully into memory; the file is
    closed on return."""
    if ARVIZ_1:
        return xr.load_datatree(path, engine="h5netcdf")
    with az.rc_context({"data.load": "eager"}):
        return az.from_netcdf(path, engine="h5netcdf")


# --------------------------------------------------------------------------- plots
def _savefig(fig, path, palette: bool = False):
    """Save and close ``fig`` (atomically). ``palette``: a PNG of 128 colours, for plots of many
    anti-aliased curves (a quarter of the size, no visible change)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # tight_layout on crowded grids
        fig.tight_layout()  # ArviZ's grids otherwise let titles run into tick labels
        if palette and path.lower().endswith(".png"):
            from PIL import Image  # matplotlib's own dependency

            buffer = io.BytesIO()
            fig.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
            buffer.seek(0)
            image = Image.open(buffer).convert("RGB").quantize(colors=128)
            atomic_write(path, lambda tmp: image.save(tmp, format="png", optimize=True))
        else:
            atomic_savefig(fig, path, dpi=90, bbox_inches="tight")
    plt.close(fig)


def _figure_of(axes):
    return np.ravel(np.asarray(axes))[0].figure


def _figure_of_collection(plot_collection):
    """The matplotlib Figure of an arviz-plots PlotCollection (bare, or in a 0-d DataArray)."""
    fig = plot_collection.get_viz("figure")
    fig = getattr(fig, "values", fig)
    return fig.item() if isinstance(fig, np.ndarray) else fig


def run_title(idata) -> str | None:
    """"model / method on data" from the run metadata on the posterior (as ``latentzoo run``
    stores it), or None when there is none."""
    if "posterior" not in group_names(idata):
        return None
    attrs = posterior_attrs(idata)
    model, method = attrs.get("latentzoo_model"), attrs.get("latentzoo_method")
    if model is None and method is None:
        return None
    title = f"{model or '?'} / {method or '?'}"
    return f"{title} on {attrs['latentzoo_data']}" if "latentzoo_data" in attrs else title


def _suptitle(fig, title):
    if title:
        fig.suptitle(title)


def plot_trace(idata, path: str, var_names=None, coords=None, title: str | None = None) -> None:
    """Trace plot (marginal density and draws per chain, one row per variable) saved as PNG,
    with a legend of the chains (when there are several) and a title: ``title``, else
    "model / method on data" from the run metadata (:func:`run_title`)."""
    names = _var_list(idata, var_names)
    title = title or run_title(idata)
    chains = idata.posterior.sizes.get("chain", 1) > 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        if ARVIZ_1:
            collection = az.plot_trace_dist(
                idata, var_names=names, coords=coords, compact=True, backend="matplotlib"
            )
            if chains:
                collection.add_legend("chain")
            fig = _figure_of_collection(collection)
        else:
            # 0.2x's legend=True also lists every vector component (dozens of entries for a
            # per-feature site): chains get known line styles and a legend of their own instead.
            n_chains = idata.posterior.sizes.get("chain", 1)
            styles = [_CHAIN_STYLES[c % len(_CHAIN_STYLES)] for c in range(n_chains)]
            axes = np.atleast_2d(az.plot_trace(idata, var_names=names, coords=coords, compact=True,
                                               chain_prop={"linestyle": styles}))
            fig = axes[0, 0].figure
            if chains:
                handles = [Line2D([], [], color="0.3", linestyle=style, label=str(c))
                           for c, style in enumerate(styles)]
                axes[0, -1].legend(handles=handles, title="chain", fontsize=7, title_fontsize=7,
                                   loc="upper right")
    _suptitle(fig, title)
    _savefig(fig, path)


def plot_rank(idata, path: str, var_names=None, coords=None) -> None:
    """Rank plot (chains' rank distributions; uniform when they mix) saved as PNG."""
    names = _var_list(idata, var_names)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        if ARVIZ_1:
            fig = _figure_of_collection(
                az.plot_rank(idata, var_names=names, coords=coords, backend="matplotlib")
            )
        else:
            fig = _figure_of(az.plot_rank(idata, var_names=names, coords=coords))
    _savefig(fig, path)


def plot_ppc(idata, path: str, var_names=None, num_pp_samples=100, title: str | None = None) -> None:
    """Posterior predictive check saved as PNG: for data with several columns ((N, D) or an
    image stack), one panel per column (:func:`plot_predictive_columns`: the first 16); else
    ArviZ's density of replicated vs observed data. Titled ``title``, else "model / method on
    data" from the run metadata (:func:`run_title`)."""
    if "posterior_predictive" not in group_names(idata):
        raise ValueError("plot_ppc needs a posterior_predictive group; see add_posterior_predictive.")
    names = [var_names] if isinstance(var_names, str) else var_names
    if names is None:
        names = [str(n) for n in idata.posterior_predictive.data_vars]
    title = title or run_title(idata)
    if len(names) == 1 and "observed_data" in group_names(idata) \
            and names[0] in idata.observed_data.data_vars:
        observed = np.asarray(idata.observed_data[names[0]])
        if observed.ndim >= 2 and np.prod(observed.shape[1:]) > 1:
            replicated = idata.posterior_predictive[names[0]].transpose("chain", "draw", ...).values
            replicated = np.asarray(replicated).reshape(-1, *observed.shape)
            plot_predictive_columns(observed, replicated, path, num_samples=num_pp_samples,
                                    title=title)
            return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        if ARVIZ_1:
            n_draws = idata.posterior_predictive.sizes["chain"] * idata.posterior_predictive.sizes["draw"]
            fig = _figure_of_collection(az.plot_ppc_dist(
                idata, var_names=var_names, kind="kde", num_samples=min(num_pp_samples, n_draws),
                backend="matplotlib",
            ))
        else:
            fig = _figure_of(az.plot_ppc(idata, var_names=var_names, num_pp_samples=num_pp_samples))
    _suptitle(fig, title)
    _savefig(fig, path)


def _smoothed_density(x, edges):
    """Gaussian kernel density of ``x`` on the bins ``edges`` (Scott's bandwidth), by smoothing
    a fine histogram: O(len(x) + bins) per curve, for the dozens of curves of a PPC grid."""
    width = edges[1] - edges[0]
    counts, _ = np.histogram(x, bins=edges)
    sd = np.std(x)
    h = 1.06 * sd * x.size ** -0.2 if sd > 0 else width
    sigma = max(h / width, 0.5)
    half = int(min(4 * sigma, (counts.size - 1) // 2))  # a kernel no wider than the grid
    kernel = np.exp(-0.5 * (np.arange(-half, half + 1) / sigma) ** 2)
    smooth = np.convolve(counts, kernel / kernel.sum(), mode="same")
    return smooth / (x.size * width)


def plot_predictive_columns(observed, replicated, path: str, *, columns=None, max_columns: int = 16,
                            num_samples: int = 50, title: str | None = None, annotations=None,
                            label: str = "replicated") -> None:
    """Predictive check per column, saved as PNG: one panel per column (a grid of up to
    ``max_columns``), not one density pooled over all columns.

    ``observed`` (N, ...) and ``replicated`` (S, N, ...) (posterior or prior predictive data sets);
    image stacks count one column per pixel. ``columns``: which columns, in order (default the
    first ``max_columns``). Real-valued columns show the observed column's density over the
    densities of up to ``num_samples`` replicated ones; 0/1 data show the histogram of the
    replicated column frequencies with the observed frequency as a line. ``annotations``:
    optional ``{column: text}`` added under a panel's title (e.g. its p-values).
    """
    observed = np.asarray(observed, dtype=float)
    replicated = np.asarray(replicated, dtype=float)
    if replicated.shape[1:] != observed.shape:
        raise ValueError(f"Replicated data shaped {replicated.shape[1:]}, observed {observed.shape}.")
    obs = observed.reshape(observed.shape[0], -1)
    rep = replicated.reshape(replicated.shape[0], *obs.shape)
    num = obs.shape[1]
    columns = list(range(min(max_columns, num))) if columns is None else list(columns)[:max_columns]
    if not columns or min(columns) < 0 or max(columns) >= num:
        raise ValueError(f"Columns must be between 0 and {num - 1}, got {columns}.")
    binary = bool(np.all((obs == 0) | (obs == 1)))
    pick = np.linspace(0, rep.shape[0] - 1, min(num_samples, rep.shape[0])).round().astype(int)
    ncols = min(4, len(columns))
    nrows = -(-len(columns) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.2 * ncols, 2.4 * nrows + 0.6), squeeze=False)
    for ax in axes.ravel()[len(columns):]:
        ax.set_visible(False)
    for ax, c in zip(axes.ravel(), columns):
        if binary:
            freq = rep[:, :, c].mean(1)
            ax.hist(freq, bins=20, color="C0", alpha=0.6, label=f"{label} frequency")
            ax.axvline(obs[:, c].mean(), color="k", lw=2, label="observed frequency")
            ax.set_xlabel("frequency of 1")
        else:
            pooled = rep[pick][:, :, c]
            lo = min(obs[:, c].min(), np.quantile(pooled, 0.005))
            hi = max(obs[:, c].max(), np.quantile(pooled, 0.995))
            if not hi > lo:
                lo, hi = lo - 0.5, hi + 0.5
            edges = np.linspace(lo, hi, 201)
            mids = 0.5 * (edges[1:] + edges[:-1])
            # one LineCollection per panel: dozens of separate lines make layout and saving slow
            curves = [np.column_stack([mids, _smoothed_density(rep[s, :, c], edges)]) for s in pick]
            # opaque light lines: translucent ones blend into many colours, and PNGs 4x larger
            ax.add_collection(LineCollection(curves, colors="#a9c6e3", lw=0.7, label=label))
            ax.plot(mids, _smoothed_density(obs[:, c], edges), color="k", lw=1.6, label="observed")
            ax.autoscale_view()
        text = f"column {c}"
        if annotations and c in annotations:
            text += f"\n{annotations[c]}"
        ax.set_title(text, fontsize=9)
        ax.tick_params(labelsize=7)
    axes.ravel()[0].legend(fontsize=7, loc="best")
    _suptitle(fig, title)
    _savefig(fig, path, palette=True)


def plot_loo_pit(pit, path: str, title: str | None = None) -> None:
    """LOO-PIT values (:func:`loo_pit`) saved as PNG: their ECDF minus the uniform CDF, with the
    pointwise 95% band of independent uniform values, and their histogram. A calibrated model
    stays inside the band; a U shape in the histogram (ECDF dipping then rising) means
    predictions too narrow, a hump too wide, a slope a shift."""
    u = np.sort(np.ravel(np.asarray(pit, dtype=float)))
    u = u[np.isfinite(u)]
    if u.size == 0:
        raise ValueError("plot_loo_pit needs at least one finite LOO-PIT value.")
    grid = np.linspace(0.0, 1.0, 201)
    ecdf = np.searchsorted(u, grid, side="right") / u.size
    band = 1.96 * np.sqrt(grid * (1 - grid) / u.size)
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4))
    left.fill_between(grid, -band, band, color="0.85", label="95% band (uniform)")
    left.plot(grid, ecdf - grid, color="C0", label="LOO-PIT ECDF - uniform")
    left.axhline(0.0, color="k", lw=0.6)
    left.set_xlabel("u")
    left.legend(fontsize=7)
    right.hist(u, bins=20, range=(0, 1), density=True, color="C0", alpha=0.7)
    right.axhline(1.0, color="k", lw=0.8)
    right.set_xlabel("LOO-PIT value")
    right.set_ylabel("density")
    _suptitle(fig, title)
    _savefig(fig, path)
