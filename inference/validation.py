"""One validator per data kind, called once at each boundary (the ``fit_*`` functions, the CLI's
loaders). Each returns the data as float64 arrays or raises one :class:`ValueError` sentence
naming the problem.

Data kinds: a real **matrix** (N, D); a **binary matrix** (entries 0/1); a **labelled matrix**
(X (N, D) with labels y (N,)); an **image stack** (N, H, W) or (N, H, W, C).
"""

from __future__ import annotations

import numpy as np

__all__ = ["check_K", "check_matrix", "check_labelled", "check_images"]


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
    """An (N, D) real (or 0/1, ``binary=True``) matrix with N >= 2, finite; K in 1..D-1 if given."""
    X = _as_float(X, name)
    if X.ndim != 2:
        raise ValueError(f"{name} must be a 2-D matrix (rows = observations), got shape {X.shape}.")
    if X.shape[0] < 2:
        raise ValueError(f"{name} has {X.shape[0]} row(s); at least 2 are needed.")
    _check_finite(X, name)
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
    return X
