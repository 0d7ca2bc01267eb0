"""Every ArviZ call the project makes, in one place (its plots in :mod:`latentzoo.arviz_plots`).

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

import numbers
import warnings

import matplotlib

matplotlib.use("Agg")  # files only, no display; set before ArviZ imports pyplot

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from latentzoo.results import atomic_write  # noqa: E402

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
    "loo_pit",
    "add_posterior_predictive",
    "add_observed_data",
    "group_names",
    "posterior_attrs",
    "set_posterior_attrs",
    "posterior_var_names",
    "posterior_array",
    "drop_posterior_vars",
    "add_posterior_vars",
    "add_constant_data",
    "add_predictions",
    "checked_var_names",
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
    log-likelihoods to store instead of NumPyro's (e.g. with the latent factors integrated out);
    False stores none (a model whose marginal likelihood has no closed form, with the per-row
    latents left out of the draws, has no meaningful pointwise log-likelihood to store).
    """
    if log_likelihood is False:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return _readable_stats(az.from_numpyro(mcmc, log_likelihood=False, coords=coords, dims=dims))
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


def _merged_group(idata, name: str, data: dict):
    """Group ``name`` (arrays with no chain/draw axes) with ``data`` added to what is there."""
    merged = {}
    if name in group_names(idata):
        group = getattr(idata, name)
        merged = {str(k): np.asarray(group[k].values) for k in group.data_vars}
    merged.update({k: np.asarray(v) for k, v in data.items()})
    _set_group(idata, name, _from_groups(**{name: merged}))
    return idata


def add_observed_data(idata, observed: dict):
    """Add arrays (no chain/draw axes) to the observed_data group, keeping what is there (a
    label the model takes as an argument, not as an observed site); returns ``idata``."""
    return _merged_group(idata, "observed_data", observed)


def add_constant_data(idata, data: dict):
    """Add arrays (no chain/draw axes) to the constant_data group, keeping what is there;
    returns ``idata`` (changed in place)."""
    return _merged_group(idata, "constant_data", data)


def add_predictions(idata, predictions: dict):
    """Attach a ``predictions`` group (arrays (chains, draws, ...)), replacing any already there;
    returns ``idata`` (changed in place)."""
    _check_sampled("predictions", predictions)
    _set_group(idata, "predictions", _from_groups(predictions=predictions))
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


def add_posterior_vars(idata, draws: dict):
    """Add posterior variables computed from the draws (arrays (chains, draws, ...), their other
    axes named ``<name>_dim_<i>``), replacing any of the same name; returns ``idata`` (changed in
    place). The posterior's attributes are kept."""
    _check_sampled("posterior", draws)
    ds = idata["posterior"].to_dataset() if ARVIZ_1 else idata.posterior
    new = {name: (("chain", "draw", *[f"{name}_dim_{i}" for i in range(np.ndim(v) - 2)]),
                  np.asarray(v)) for name, v in draws.items()}
    # every new axis gets an integer coordinate, as ArviZ gives the sampled sites' axes: ArviZ
    # 1.x's rank plot selects entries by coordinate, and an axis without one made ``diagnose``
    # fail ("those variables don't exist: {'weights_sorted_dim_0'}") once a run had not mixed
    coords = {dim: np.arange(n) for name, (dims, v) in new.items()
              for dim, n in zip(dims[2:], np.shape(v)[2:])}
    ds = ds.assign(new).assign_coords(coords)
    if ARVIZ_1:
        idata["posterior"] = ds
    else:
        idata.posterior = ds
    return idata


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
def checked_var_names(idata, var_names) -> list[str] | None:
    """``var_names`` (a name or a list of names) as a list, or None for all; KeyError naming any
    that the posterior does not have, and the ones it has."""
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
    names = checked_var_names(idata, var_names)
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
