"""One validator per data kind, called once at each boundary (the ``fit_*`` functions, the CLI's
loaders). Each returns the data as float64 arrays or raises one :class:`ValueError` sentence
naming the problem.

Data kinds: a real **matrix** (N, D); a **binary matrix** (entries 0/1); a **labelled matrix**
(X (N, D) with labels y (N,)); an **image stack** (N, H, W) or (N, H, W, C).
"""

from __future__ import annotations

import numpy as np

__all__ = ["check_K", "check_matrix", "check_labelled", "check_images", "check_scale", "ScaleError",
           "MAX_ABS_VALUE", "MIN_ABS_SCALE"]

# The models square the data (second moments, residual sums of squares, noise variances) and
# sum those over rows and columns. With |x| <= 1e100 a square is at most 1e200, so such sums stay
# far below float64's overflow (1.8e308) for any array that fits in memory; the smallest
# non-zero scale is the mirror image, so that squares do not underflow to zero.
MAX_ABS_VALUE = 1e100
MIN_ABS_SCALE = 1e-100


class ScaleError(ValueError):
    """Data that is well formed but on a scale float64 second moments cannot hold
    (:func:`check_scale`): standardising its columns first is a remedy, which callers that
    offer one (the CLI's ``--standardize``) catch this to apply."""


def _as_float(X, name):
    X = np.asarray(X)
    if np.iscomplexobj(X):
        raise ValueError(f"{name} is complex; the models need real numbers.")
    if X.dtype == object or not (np.issubdtype(X.dtype, np.number) or X.dtype == bool):
        raise ValueError(f"{name} must be numeric, got dtype {X.dtype}.")
    return X.astype(np.float64)


def _check_finite(X, name):
    if not np.all(np.isfinite(X)):
        n_bad = int(np.sum(~np.isfinite(X)))
        raise ValueError(f"{name} contains {n_bad} NaN or infinite value(s).")


def _max_abs(X, chunk_elems: int = 1 << 20) -> float:
    """The largest absolute value without a full-size temporary (chunks of rows; a 1-D array is one row)."""
    X2 = X.reshape(1, -1) if X.ndim < 2 else X.reshape(X.shape[0], -1)
    if X2.size == 0:
        return 0.0
    rows = max(1, chunk_elems // max(X2.shape[1], 1))
    top = 0.0
    for i in range(0, X2.shape[0], rows):
        block = X2[i : i + rows]
        top = max(top, float(block.max()), -float(block.min()))
    return top


def check_scale(X, name: str = "the data") -> None:
    """Refuse finite data whose scale would overflow (or underflow) float64 second moments:
    largest absolute value above :data:`MAX_ABS_VALUE` (1e100), or non-zero but below
    :data:`MIN_ABS_SCALE` (1e-100). One ValueError sentence naming the value and the remedy."""
    top = _max_abs(np.asarray(X))
    if top > MAX_ABS_VALUE:
        raise ScaleError(
            f"{name} has values as large as {top:.3g} in magnitude: their second moments would "
            f"overflow float64 (the limit is {MAX_ABS_VALUE:.0e}); rescale the data (e.g. divide it "
            f"by {10.0 ** np.floor(np.log10(top)):.0e}) or standardise its columns first."
        )
    if 0.0 < top < MIN_ABS_SCALE:
        raise ScaleError(
            f"{name} has no value larger than {top:.3g} in magnitude: its second moments would "
            f"underflow float64 (the limit is {MIN_ABS_SCALE:.0e}); rescale the data (e.g. "
            f"multiply it by {10.0 ** -np.floor(np.log10(top)):.0e}) or standardise its columns first."
        )


def check_K(K, D: int, what: str = "K") -> int:
    """K an integer with 1 <= K < D."""
    if isinstance(K, bool) or not isinstance(K, (int, np.integer)):
        raise ValueError(f"{what} must be an integer, got {K!r}.")
    if K < 1:
        raise ValueError(f"{what} must be at least 1, got {K}.")
    if K >= D:
        raise ValueError(f"{what}={K} must be smaller than the number of columns D={D}.")
    return int(K)


def check_matrix(X, *, K=None, binary: bool = False, name: str = "the data") -> np.ndarray:
    """An (N, D) real (or 0/1, ``binary=True``) matrix with N >= 2, finite, on a scale whose
    second moments float64 holds (:func:`check_scale`); K in 1..D-1 if given."""
    X = _as_float(X, name)
    if X.ndim != 2:
        raise ValueError(f"{name} must be a 2-D matrix (rows = observations), got shape {X.shape}.")
    if X.shape[0] < 2:
        raise ValueError(f"{name} has {X.shape[0]} row(s); at least 2 are needed.")
    _check_finite(X, name)
    check_scale(X, name)
    if K is not None:
        check_K(K, X.shape[1])
    if binary and not np.all((X == 0) | (X == 1)):
        raise ValueError(f"{name} must be binary (every entry 0 or 1) for this model.")
    return X


def check_labelled(X, y, *, K=None, name: str = "the data") -> tuple[np.ndarray, np.ndarray]:
    """A matrix X (N, D) and finite labels y (N,) (class labels or real targets)."""
    X = check_matrix(X, K=K, name=name)
    y = _as_float(y, f"the labels of {name}")
    if y.ndim != 1 or y.shape[0] != X.shape[0]:
        raise ValueError(
            f"the labels of {name} must be one value per row ({X.shape[0]}), got shape {y.shape}."
        )
    _check_finite(y, f"the labels of {name}")
    return X, y


def check_images(X, *, name: str = "the images") -> np.ndarray:
    """An image stack (N, H, W) or (N, H, W, C), N >= 1, finite."""
    X = _as_float(X, name)
    if X.ndim not in (3, 4):
        raise ValueError(f"{name} must be an image stack (N, H, W) or (N, H, W, C), got shape {X.shape}.")
    if min(X.shape) < 1:
        raise ValueError(f"{name} has an empty axis (shape {X.shape}).")
    _check_finite(X, name)
    check_scale(X, name)
    return X
