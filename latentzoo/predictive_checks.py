"""Prior and posterior predictive checks: test statistics, Bayesian p-values and their table.

A test statistic is a plain function ``T(X) -> array``: ``X`` is (..., N, D) (any leading axes:
one data set or a stack of replicated ones; image stacks are flattened to (N, H*W*C) first) and
the result is (...) for a scalar statistic or (..., m) for a vector of ``m`` values (one per
column, or per pair of columns). A family declares its statistics in the registry
(:attr:`latentzoo.registry.Family.test_statistics`, a ``{name: function}`` dict); left as None,
it gets the defaults of its data kind (:data:`DEFAULT_STATISTICS`):

- matrix (and the X of a labelled matrix): per-column mean, variance, max and min; mean and
  max absolute correlation over column pairs (all pairs up to D = 64, a fixed random subset of
  :data:`MAX_PAIRS` pairs above) and the correlations of :data:`NUM_SHOWN_PAIRS` fixed pairs;
- binary matrix: mean, variance and max of the row sums; per-column frequency; mean and max
  co-occurrence rate P(x_i = 1, x_j = 1) over pairs and the mean of
  ``|P(x_i x_j) - P(x_i) P(x_j)|`` (dependence beyond the marginals);
- image stack: per-pixel mean, variance, max and min.

The Bayesian p-value of a statistic is ``P(T(x_rep) >= T(x_obs))`` over the replicated data
sets, ties counted half (Gelman, Meng & Stern 1996; the half keeps a discrete statistic that is
always tied, e.g. the frequency of a column that is never on, at p = 0.5 rather than 1). Values
near 0 or 1 mean the model rarely replicates what was observed. :func:`check_table` summarises a
vector statistic by the fraction of its values with an extreme p (< 0.05 or > 0.95) and its
worst value, named in the row's ``about`` column (the observed value, replicated mean and p of the
row are that value's), with the number of replicated data sets behind each p-value;
:func:`column_table` keeps the per-column p-values.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

import numpy as np
import pandas as pd

__all__ = [
    "Statistic",
    "column_pairs",
    "MAX_PAIRS",
    "NUM_SHOWN_PAIRS",
    "EXTREME",
    "column_mean",
    "column_var",
    "column_max",
    "column_min",
    "corr_mean_abs",
    "corr_max_abs",
    "corr_pairs",
    "shown_pairs",
    "row_sum_mean",
    "row_sum_var",
    "row_sum_max",
    "cooccurrence_mean",
    "cooccurrence_max",
    "dependence_mean",
    "MATRIX_STATISTICS",
    "BINARY_STATISTICS",
    "IMAGE_STATISTICS",
    "DEFAULT_STATISTICS",
    "statistics_for",
    "as_columns",
    "evaluate",
    "bayesian_p_value",
    "StatisticResult",
    "run_checks",
    "check_table",
    "column_table",
    "extreme_columns",
    "format_table",
]

Statistic = Callable[[np.ndarray], np.ndarray]

#: Pairs of columns that the pairwise summaries look at: all of them up to D = 64, a fixed random
#: subset of this many above (the cost stays O(N * MAX_PAIRS) per data set at any D).
MAX_PAIRS = 2016
#: Fixed pairs whose correlations are checked one by one (:func:`corr_pairs`).
NUM_SHOWN_PAIRS = 16
#: A p-value below this or above 1 - this counts as extreme.
EXTREME = 0.05


# ------------------------------------------------------------------------------ pairs
def column_pairs(D: int, max_pairs: int = MAX_PAIRS) -> tuple[np.ndarray, np.ndarray]:
    """Column pairs (i, j), i < j: all of them when there are at most ``max_pairs``, else a fixed
    random subset (seeded by D, so observed and replicated data see the same pairs)."""
    i, j = np.triu_indices(D, k=1)
    if i.size > max_pairs:
        pick = np.sort(np.random.default_rng(D).choice(i.size, size=max_pairs, replace=False))
        i, j = i[pick], j[pick]
    return i, j


def _pair_means(A: np.ndarray, B: np.ndarray, i, j) -> np.ndarray:
    """mean_n A[..., n, i_p] * B[..., n, j_p] for each pair p: (..., P). One matrix product when
    the pairs are all of them; a loop over blocks of pairs otherwise (memory O(N * block))."""
    N, D = A.shape[-2:]
    if i.size == D * (D - 1) // 2:
        G = np.swapaxes(A, -1, -2) @ B / N
        return G[..., i, j]
    out = []
    for lo in range(0, i.size, 256):
        out.append(np.mean(A[..., i[lo : lo + 256]] * B[..., j[lo : lo + 256]], axis=-2))
    return np.concatenate(out, axis=-1)


def _standardised(X: np.ndarray) -> np.ndarray:
    """Columns centred and scaled to unit variance (a constant column becomes 0)."""
    Z = X - X.mean(-2, keepdims=True)
    sd = np.sqrt(np.mean(Z**2, axis=-2, keepdims=True))
    return np.divide(Z, sd, out=np.zeros_like(Z), where=sd > 0)


def _correlations(X: np.ndarray, max_pairs: int = MAX_PAIRS) -> np.ndarray:
    Z = _standardised(X)
    i, j = column_pairs(X.shape[-1], max_pairs)
    return _pair_means(Z, Z, i, j)


# ----------------------------------------------------------------------- statistics
def column_mean(X):
    """Per-column mean: (..., N, D) -> (..., D) (for binary data: each column's frequency)."""
    return X.mean(-2)


def column_var(X):
    """Per-column variance: (..., N, D) -> (..., D)."""
    return X.var(-2)


def column_max(X):
    """Per-column maximum: (..., N, D) -> (..., D) (heavy upper tails)."""
    return X.max(-2)


def column_min(X):
    """Per-column minimum: (..., N, D) -> (..., D) (heavy lower tails)."""
    return X.min(-2)


def corr_mean_abs(X):
    """Mean absolute correlation over column pairs (see :data:`MAX_PAIRS`): (..., N, D) -> (...).
    A model with too few factors replicates weaker correlations than observed (p near 1)."""
    return np.mean(np.abs(_correlations(X)), axis=-1)


def corr_max_abs(X):
    """Largest absolute correlation over column pairs (see :data:`MAX_PAIRS`): (..., N, D) -> (...)."""
    return np.max(np.abs(_correlations(X)), axis=-1)


def corr_pairs(X):
    """Correlations of :data:`NUM_SHOWN_PAIRS` fixed column pairs (:func:`shown_pairs`):
    (..., N, D) -> (..., P)."""
    return _correlations(X, NUM_SHOWN_PAIRS)


def shown_pairs(D: int) -> list[str]:
    """Labels ``"(i, j)"`` of the pairs :func:`corr_pairs` looks at, for D columns."""
    i, j = column_pairs(D, NUM_SHOWN_PAIRS)
    return [f"({a}, {b})" for a, b in zip(i.tolist(), j.tolist())]


corr_pairs.labels = shown_pairs


def row_sum_mean(X):
    """Mean over rows of the row sums (binary: active findings per row): (..., N, D) -> (...)."""
    return X.sum(-1).mean(-1)


def row_sum_var(X):
    """Variance over rows of the row sums: (..., N, D) -> (...). Sources that switch many
    findings on together make it larger than independent columns would."""
    return X.sum(-1).var(-1)


def row_sum_max(X):
    """Largest row sum: (..., N, D) -> (...)."""
    return X.sum(-1).max(-1)


def _cooccurrence(X):
    i, j = column_pairs(X.shape[-1])
    return _pair_means(X, X, i, j), i, j


def cooccurrence_mean(X):
    """Mean over column pairs of the co-occurrence rate mean_n x_ni x_nj: (..., N, D) -> (...)."""
    return np.mean(_cooccurrence(X)[0], axis=-1)


def cooccurrence_max(X):
    """Largest co-occurrence rate over column pairs: (..., N, D) -> (...)."""
    return np.max(_cooccurrence(X)[0], axis=-1)


def dependence_mean(X):
    """Mean over column pairs of ``|P(x_i = 1, x_j = 1) - P(x_i = 1) P(x_j = 1)|`` (the empirical
    covariance of binary columns): (..., N, D) -> (...). Zero for independent columns; shared
    sources raise it."""
    co, i, j = _cooccurrence(X)
    f = X.mean(-2)
    return np.mean(np.abs(co - f[..., i] * f[..., j]), axis=-1)


MATRIX_STATISTICS: dict[str, Statistic] = {
    "col_mean": column_mean,
    "col_var": column_var,
    "col_max": column_max,
    "col_min": column_min,
    "corr_mean_abs": corr_mean_abs,
    "corr_max_abs": corr_max_abs,
    "corr_pairs": corr_pairs,
}
BINARY_STATISTICS: dict[str, Statistic] = {
    "row_sum_mean": row_sum_mean,
    "row_sum_var": row_sum_var,
    "row_sum_max": row_sum_max,
    "col_freq": column_mean,
    "cooc_mean": cooccurrence_mean,
    "cooc_max": cooccurrence_max,
    "dependence_mean": dependence_mean,
}
IMAGE_STATISTICS: dict[str, Statistic] = {
    "pixel_mean": column_mean,
    "pixel_var": column_var,
    "pixel_max": column_max,
    "pixel_min": column_min,
}
#: Default statistics per data kind (keyed by :attr:`latentzoo.data.DataKind.name`).
DEFAULT_STATISTICS: dict[str, dict[str, Statistic]] = {
    "matrix": MATRIX_STATISTICS,
    "binary matrix": BINARY_STATISTICS,
    "labelled matrix": MATRIX_STATISTICS,
    "image stack": IMAGE_STATISTICS,
}


def statistics_for(family) -> Mapping[str, Statistic]:
    """The family's declared ``test_statistics``, else its data kind's defaults; ValueError
    when neither exists."""
    declared = getattr(family, "test_statistics", None)
    if declared:
        return dict(declared)
    kind = family.data_kind.name
    if kind not in DEFAULT_STATISTICS:
        raise ValueError(
            f"Data kind {kind!r} of {family.name} has no default test statistics; declare "
            "test_statistics in its registry entry."
        )
    return DEFAULT_STATISTICS[kind]


# ------------------------------------------------------------------------ evaluation
def as_columns(X, event_ndim: int) -> np.ndarray:
    """``(..., N, *event) -> (..., N, prod(event))`` float64: image stacks as one column per pixel."""
    X = np.asarray(X, dtype=np.float64)
    if event_ndim == 1:
        return X
    lead = X.shape[: X.ndim - event_ndim]
    return X.reshape(*lead, int(np.prod(X.shape[X.ndim - event_ndim :])))


def evaluate(statistic: Statistic, X_rep: np.ndarray, max_elements: int = 1 << 24) -> np.ndarray:
    """``statistic`` of each replicated data set of ``X_rep`` (S, N, D) -> (S, ...), a block of
    replicates at a time so the working memory stays about ``max_elements`` floats."""
    S, N, D = X_rep.shape
    per = N * D + min(D * D, N * MAX_PAIRS)  # the data plus a pairwise intermediate
    block = max(1, max_elements // per)
    return np.concatenate(
        [np.asarray(statistic(X_rep[lo : lo + block])) for lo in range(0, S, block)], axis=0
    )


def bayesian_p_value(t_rep: np.ndarray, t_obs: np.ndarray) -> np.ndarray:
    """P(T(x_rep) >= T(x_obs)) with ties counted half: ``t_rep`` (S, ...), ``t_obs`` (...) ->
    (...). NaN where the observed value is NaN."""
    t_rep, t_obs = np.asarray(t_rep, dtype=float), np.asarray(t_obs, dtype=float)
    p = np.mean(t_rep > t_obs, axis=0) + 0.5 * np.mean(t_rep == t_obs, axis=0)
    return np.where(np.isnan(t_obs), np.nan, p)


class StatisticResult(NamedTuple):
    """One statistic's check: observed value (...), replicated mean (...), p-value (...) and
    labels of the values of a vector statistic (None: "column j")."""

    name: str
    observed: np.ndarray
    replicated_mean: np.ndarray
    p_value: np.ndarray
    labels: list[str] | None = None
    replicates: int = 0  # replicated data sets behind each p-value


def run_checks(X_obs, X_rep, statistics: Mapping[str, Statistic]) -> list[StatisticResult]:
    """Every statistic on the observed data (N, ...) and the replicated sets (S, N, ...)."""
    X_obs = np.asarray(X_obs)
    event = X_obs.ndim - 1
    obs = as_columns(X_obs, event)
    rep = as_columns(X_rep, event)
    if rep.shape[1:] != obs.shape:
        raise ValueError(
            f"Replicated data sets are shaped {np.shape(X_rep)[1:]}, the data {X_obs.shape}."
        )
    results = []
    for name, fn in statistics.items():
        t_obs = np.asarray(fn(obs), dtype=float)
        t_rep = evaluate(fn, rep)
        labels_of = getattr(fn, "labels", None)
        labels = labels_of(obs.shape[1]) if labels_of is not None and t_obs.ndim else None
        results.append(StatisticResult(name, t_obs, np.nanmean(t_rep, axis=0),
                                       bayesian_p_value(t_rep, t_obs), labels, int(rep.shape[0])))
    return results


def _label(result: StatisticResult, index: int) -> str:
    return result.labels[index] if result.labels else f"column {index}"


def check_table(results: list[StatisticResult], check: str = "posterior") -> pd.DataFrame:
    """One row per statistic: ``check, statistic, about, observed, replicated_mean, p_value,
    replicates, n_values, frac_extreme``. ``about`` names the value the row's numbers are about:
    ``"whole data"`` for a scalar statistic; for a vector statistic its worst value (p farthest
    from 0.5, e.g. ``"column 2"``), whose observed value, replicated mean and p the row shows, with
    the fraction of all its values that have an extreme p. ``replicates``: the replicated data
    sets behind each p-value (its resolution is 1 / replicates)."""
    rows = []
    for r in results:
        p = np.ravel(r.p_value)
        row = dict(check=check, statistic=r.name, replicates=int(r.replicates))
        if np.ndim(r.observed) == 0:
            row.update(observed=float(r.observed), replicated_mean=float(r.replicated_mean),
                       p_value=float(r.p_value), n_values=1, frac_extreme=np.nan, about="whole data")
        else:
            score = np.where(np.isnan(p), -1.0, np.abs(p - 0.5))
            k = int(np.argmax(score))
            extreme = np.mean((p < EXTREME) | (p > 1 - EXTREME))
            row.update(observed=float(np.ravel(r.observed)[k]),
                       replicated_mean=float(np.ravel(r.replicated_mean)[k]), p_value=float(p[k]),
                       n_values=int(p.size), frac_extreme=float(extreme), about=_label(r, k))
        rows.append(row)
    return pd.DataFrame(rows, columns=["check", "statistic", "about", "observed", "replicated_mean",
                                       "p_value", "replicates", "n_values", "frac_extreme"])


def column_table(results: list[StatisticResult], check: str = "posterior") -> pd.DataFrame:
    """Every value of the vector statistics: ``check, statistic, index, label, observed,
    replicated_mean, p_value`` (O(D) rows per statistic; no D x D arrays)."""
    frames = []
    for r in results:
        if np.ndim(r.observed) == 0:
            continue
        p = np.ravel(r.p_value)
        frames.append(pd.DataFrame(dict(
            check=check, statistic=r.name, index=np.arange(p.size),
            label=[_label(r, k) for k in range(p.size)], observed=np.ravel(r.observed),
            replicated_mean=np.ravel(r.replicated_mean), p_value=p,
        )))
    if not frames:
        return pd.DataFrame(columns=["check", "statistic", "index", "label", "observed",
                                     "replicated_mean", "p_value"])
    return pd.concat(frames, ignore_index=True)


def extreme_columns(results: list[StatisticResult], num_columns: int, limit: int = 16) -> list[int]:
    """Up to ``limit`` columns, most extreme first: ordered by the smallest min(p, 1 - p) over the
    per-column statistics (vector statistics with one value per column, no labels), ties (p = 0
    is common with few replicates) broken by the mean of min(p, 1 - p). The first columns when
    there is no per-column statistic."""
    per_column = [np.ravel(r.p_value) for r in results
                  if np.ndim(r.observed) == 1 and r.labels is None and r.observed.size == num_columns]
    if not per_column:
        return list(range(min(limit, num_columns)))
    p = np.stack(per_column)
    tail = np.where(np.isnan(p), 0.5, np.minimum(p, 1 - p))
    order = np.lexsort((tail.mean(0), tail.min(0)))  # last key first
    return [int(c) for c in order[:limit]]


def format_table(table: pd.DataFrame) -> str:
    """The check table as aligned text (4 significant digits)."""
    shown = table.copy()
    shown["frac_extreme"] = shown["frac_extreme"].map(lambda v: "" if np.isnan(v) else f"{v:.2f}")
    shown["p_value"] = shown["p_value"].map(lambda v: f"{v:.3f}")
    for col in ("observed", "replicated_mean"):
        shown[col] = shown[col].map(lambda v: f"{v:.4g}")
    return shown.to_string(index=False)
