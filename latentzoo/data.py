"""Loading and validating user data, and the embedded default data sets.

Every user-facing entry point (the CLI, ``fit`` helpers) validates through :func:`validate_matrix`,
so bad input ends in one :class:`ValueError` sentence naming the problem.
"""

from __future__ import annotations

import csv
import os

import numpy as np

from latentzoo.inference.validation import check_matrix

__all__ = ["load_matrix", "validate_matrix", "default_fa_data"]


def _parse_csv(path: str) -> np.ndarray:
    try:
        with open(path, newline="") as fh:
            rows = [r for r in csv.reader(fh) if r and any(c.strip() for c in r)]
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not a readable text CSV file.") from None
    if not rows:
        raise ValueError(f"{path} is empty.")

    def numeric(row):
        try:
            return [float(c) for c in row]
        except ValueError:
            return None

    if numeric(rows[0]) is None:  # a header line
        rows = rows[1:]
        if not rows:
            raise ValueError(f"{path} has a header but no data rows.")
    width = len(rows[0])
    out = []
    for i, row in enumerate(rows, start=1):
        if len(row) != width:
            raise ValueError(
                f"{path} is ragged: data row {i} has {len(row)} columns where the first has {width}."
            )
        values = numeric(row)
        if values is None:
            bad = next(c for c in row if numeric([c]) is None)
            raise ValueError(f"{path} has a non-numeric cell {bad!r} in data row {i}.")
        out.append(values)
    return np.asarray(out, dtype=np.float64)


def load_matrix(path: str) -> np.ndarray:
    """Read an (N, D) matrix from ``.csv`` (optional header line), ``.npy`` or ``.npz``
    (the array named ``X``, or the only array)."""
    if not os.path.exists(path):
        raise ValueError(f"Data file {path} does not exist.")
    if os.path.isdir(path):
        raise ValueError(f"Data path {path} is a directory, not a file.")
    ext = os.path.splitext(path)[1].lower()
    try:
        if ext == ".npy":
            X = np.load(path, allow_pickle=False)
        elif ext == ".npz":
            with np.load(path, allow_pickle=False) as z:
                names = list(z.keys())
                if "X" in names:
                    X = z["X"]
                elif len(names) == 1:
                    X = z[names[0]]
                else:
                    raise ValueError(f"{path} holds arrays {names}; name the data array 'X'.")
        elif ext in (".csv", ".txt"):
            X = _parse_csv(path)
        else:
            raise ValueError(f"Data file {path} must be .csv, .npy or .npz.")
    except ValueError:
        raise
    except Exception as err:  # corrupt binary files raise many different things
        raise ValueError(f"Data file {path} could not be read ({type(err).__name__}).") from None
    return validate_matrix(X, name=path)


def validate_matrix(X, *, K: int | None = None, binary: bool = False, name: str = "the data"):
    """Check an (N, D) numeric matrix; return it as float64 (:func:`check_matrix`)."""
    return check_matrix(X, K=K, binary=binary, name=name)

def default_fa_data(seed: int = 0, N: int = 500, D: int = 20, K: int = 3) -> np.ndarray:
    """The embedded default: N draws from an FA model with a fixed, well-conditioned truth.

    Loadings N(0, 1), noise variances in [0.2, 1], means N(0, 1): the setting of the FA benchmark.
    """
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(D, K))
    psi_var = rng.uniform(0.2, 1.0, size=D)
    mu = rng.normal(size=D)
    z = rng.normal(size=(N, K))
    return z @ W.T + mu + rng.normal(size=(N, D)) * np.sqrt(psi_var)
