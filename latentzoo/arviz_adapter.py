"""Every ArviZ call the project makes, in one place.

ArviZ 0.2x (Python 3.11) and ArviZ 1.x (Python >= 3.12, built on ``arviz-base`` / ``xarray``
``DataTree``) differ in converters, group access and plotting. Code elsewhere calls only the
functions below; a move to 1.x changes this file alone.
"""

from __future__ import annotations

import warnings

import matplotlib

matplotlib.use("Agg")  # files only, no display; set before pyplot is imported

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from latentzoo.results import atomic_savefig, atomic_write  # noqa: E402

with warnings.catch_warnings():
    warnings.simplefilter("ignore", FutureWarning)  # 0.2x announces the 1.x refactor on import
    import arviz as az  # noqa: E402

__all__ = [
    "from_mcmc",
    "from_draws",
    "summary",
    "save",
    "load",
    "plot_trace",
    "plot_rank",
    "plot_ppc",
    "add_posterior_predictive",
    "group_names",
]

_SUMMARY_COLUMNS = ["mean", "sd", "hdi_3%", "hdi_97%", "ess_bulk", "ess_tail", "r_hat"]


def _readable_stats(idata):
    """Rename block diagnostics to readable names (``block_states.2.diverging`` -> ``nuts_diverging``)."""
    if "sample_stats" not in group_names(idata):
        return idata
    renames = {}
    for name in idata.sample_stats.data_vars:
        if name.startswith("block_states."):
            _, index, field = name.split(".", 2)
            renames[name] = f"block{index}_{field.replace('.', '_')}"
    if renames:
        idata.sample_stats = idata.sample_stats.rename(renames)
    return idata


def from_mcmc(mcmc, *, log_likelihood=None, coords=None, dims=None):
    """InferenceData from a finished ``numpyro.infer.MCMC``.

    ``log_likelihood``: optional dict name -> array (chains, draws, N) of pointwise
    log-likelihoods to store instead of NumPyro's (e.g. with the latent factors integrated out).
    """
    idata = az.from_numpyro(mcmc, log_likelihood=log_likelihood is None, coords=coords, dims=dims)
    if log_likelihood is not None:
        ll = az.from_dict(log_likelihood=log_likelihood)
        idata.extend(ll)
    return _readable_stats(idata)


def from_draws(posterior: dict, *, observed_data=None, log_likelihood=None, sample_stats=None):
    """InferenceData from arrays shaped (chains, draws, ...) (variational / EM results)."""
    return az.from_dict(
        posterior=posterior,
        observed_data=observed_data,
        log_likelihood=log_likelihood,
        sample_stats=sample_stats,
    )


def add_posterior_predictive(idata, predictive: dict):
    """Attach a posterior_predictive group (arrays (chains, draws, ...))."""
    idata.extend(az.from_dict(posterior_predictive=predictive))
    return idata


def group_names(idata) -> list[str]:
    return list(idata.groups())


def summary(idata, var_names=None):
    """ArviZ summary (mean, sd, hdi, ess_bulk, ess_tail, r_hat) as a pandas DataFrame."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # r_hat of constant (EM) draws
        table = az.summary(idata, var_names=var_names, hdi_prob=0.94)
    return table[[c for c in _SUMMARY_COLUMNS if c in table.columns]]


def save(idata, path: str) -> None:
    """Write NetCDF atomically (temporary file, then rename)."""
    atomic_write(path, idata.to_netcdf)


def load(path: str):
    return az.from_netcdf(path)


def _savefig(fig, path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # tight_layout on crowded grids
        fig.tight_layout()  # ArviZ's grids otherwise let titles run into tick labels
    atomic_savefig(fig, path, dpi=90, bbox_inches="tight")
    plt.close(fig)


def _figure_of(axes):
    return np.ravel(np.asarray(axes))[0].figure


def plot_trace(idata, path: str, var_names=None, coords=None) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        axes = az.plot_trace(idata, var_names=var_names, coords=coords, compact=True)
    _savefig(_figure_of(axes), path)


def plot_rank(idata, path: str, var_names=None, coords=None) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        axes = az.plot_rank(idata, var_names=var_names, coords=coords)
    _savefig(_figure_of(axes), path)


def plot_ppc(idata, path: str, var_names=None, num_pp_samples=100) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        axes = az.plot_ppc(idata, var_names=var_names, num_pp_samples=num_pp_samples)
    _savefig(_figure_of(axes), path)
