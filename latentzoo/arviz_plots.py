"""Every plot the project draws, on both ArviZ lines (see :mod:`latentzoo.arviz_adapter`).

Each function saves one PNG atomically (a temporary file renamed into place) and closes its
figure. Trace and rank plots of sites with many entries show a selection (the rank plot: the
entries with the largest R-hat), so a plot stays readable, and quick to draw, at any dimension.
"""

from __future__ import annotations

import io
import warnings

import numpy as np

from latentzoo import arviz_adapter as azx  # sets matplotlib's file-only backend first
from latentzoo.arviz_adapter import ARVIZ_1, az, group_names, posterior_attrs
from latentzoo.results import atomic_savefig, atomic_write

import matplotlib.pyplot as plt  # noqa: E402  (after the adapter chose the backend)
from matplotlib.collections import LineCollection  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

__all__ = [
    "save_figure",
    "run_title",
    "plot_trace",
    "plot_rank",
    "plot_ppc",
    "plot_predictive_columns",
    "plot_loo_pit",
    "rank_entries",
    "MAX_RANK_PANELS",
]

# Line styles of the chains in 0.2x's compact trace plots (colours tell vector components apart).
_CHAIN_STYLES = ["solid", "dotted", "dashed", "dashdot", (0, (5, 1)), (0, (1, 3)), (0, (3, 1, 1, 1))]
#: Most panels of a rank plot: a site with more scalar entries is shown by its worst ones.
MAX_RANK_PANELS = 12


def save_figure(fig, path, palette: bool = False):
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
    # above the panels (the saved bounding box grows to hold it): at the default height it ran
    # into the first row's panel titles
    if title:
        fig.suptitle(title, y=1.0, va="bottom")


def plot_trace(idata, path: str, var_names=None, coords=None, title: str | None = None) -> None:
    """Trace plot (marginal density and draws per chain, one row per variable) saved as PNG,
    with a legend of the chains (when there are several) and a title: ``title``, else
    "model / method on data" from the run metadata (:func:`run_title`)."""
    names = azx.checked_var_names(idata, var_names)
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
    save_figure(fig, path)


def _num_entries(idata, name: str) -> int:
    post = idata.posterior
    return int(np.prod([post.sizes[d] for d in post[name].dims if d not in ("chain", "draw")]))


def _split_rhat(draws: np.ndarray) -> np.ndarray:
    """Split R-hat of each entry of ``draws`` (chains, draws, entries), without rank
    normalisation: only to order entries for plotting. A constant entry gets 0 (nothing to see);
    chains stuck at different constants get inf."""
    half = draws.shape[1] // 2
    if half < 2:
        return np.zeros(draws.shape[2])
    x = np.concatenate([draws[:, :half], draws[:, -half:]], axis=0)  # (2 chains, half, entries)
    within = x.var(axis=1, ddof=1).mean(axis=0)
    between = half * x.mean(axis=1).var(axis=0, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.sqrt(((half - 1) / half * within + between / half) / within)
    return np.where(within > 0, r, np.where(between > 0, np.inf, 0.0))


def rank_entries(idata, var_names=None, max_panels: int = MAX_RANK_PANELS) -> dict | None:
    """The scalar entries a rank plot of ``var_names`` shows when they have more than
    ``max_panels`` in all: the ``max_panels`` with the largest split R-hat, as
    ``{"site[i,j]": draws (chains, draws)}`` in decreasing R-hat; None when all fit."""
    names = azx.checked_var_names(idata, var_names) or azx.posterior_var_names(idata)
    total = sum(_num_entries(idata, n) for n in names)
    if total <= max_panels:
        return None
    arrays = {n: azx.posterior_array(idata, n) for n in names}
    scored = []
    for n, arr in arrays.items():
        flat = arr.reshape(arr.shape[0], arr.shape[1], -1)
        for e, r in enumerate(_split_rhat(flat)):
            scored.append((-r, n, e, arr.shape[2:]))
    scored.sort(key=lambda t: (t[0], names.index(t[1]), t[2]))  # stable: site order, then entry
    picked = {}
    for _, n, e, shape in scored[:max_panels]:
        index = np.unravel_index(e, shape) if shape else ()
        label = f"{n}[{','.join(str(int(i)) for i in index)}]" if shape else n
        arr = arrays[n]
        picked[label] = arr.reshape(arr.shape[0], arr.shape[1], -1)[:, :, e]
    return picked


def plot_rank(idata, path: str, var_names=None, coords=None,
              max_panels: int = MAX_RANK_PANELS) -> None:
    """Rank plot (chains' rank distributions; uniform when they mix) saved as PNG. Sites with
    more than ``max_panels`` scalar entries in all (and no ``coords`` chosen) are shown by the
    ``max_panels`` entries with the largest split R-hat (:func:`rank_entries`), which the title
    says: at D = 7129 a panel per entry would be unreadable and take minutes to draw."""
    names = azx.checked_var_names(idata, var_names)
    title = None
    if coords is None:
        picked = rank_entries(idata, names, max_panels)
        if picked is not None:
            total = sum(_num_entries(idata, n) for n in names or azx.posterior_var_names(idata))
            title = f"the {len(picked)} of {total} entries with the largest split R-hat"
            idata, names = azx.from_draws(picked), list(picked)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        if ARVIZ_1:
            fig = _figure_of_collection(
                az.plot_rank(idata, var_names=names, coords=coords, backend="matplotlib")
            )
        else:
            fig = _figure_of(az.plot_rank(idata, var_names=names, coords=coords))
    _suptitle(fig, title)
    save_figure(fig, path)


def plot_ppc(idata, path: str, var_names=None, num_pp_samples=100, title: str | None = None) -> None:
    """Posterior predictive check saved as PNG: for data with several columns ((N, D) or an
    image stack), one panel per column (:func:`plot_predictive_columns`: the first 16); else
    ArviZ's density of replicated vs observed data. Titled ``title``, else "model / method on
    data" from the run metadata (:func:`run_title`)."""
    if "posterior_predictive" not in group_names(idata):
        raise ValueError("plot_ppc needs a posterior_predictive group; see add_posterior_predictive.")
    names = [var_names] if isinstance(var_names, str) else var_names
    if names is None:  # what was replicated (observed sites without replicates are skipped)
        names = [str(n) for n in idata.posterior_predictive.data_vars]
    var_names = names
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
    save_figure(fig, path)


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
    save_figure(fig, path, palette=True)


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
    save_figure(fig, path)
