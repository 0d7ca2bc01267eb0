"""Data kinds: one loader and one validator each, used by every entry point.

A :class:`DataKind` turns a file into the arrays a family's runners take and checks them
(:mod:`latentzoo.inference.validation` holds the array checks, so the API's ``fit_*`` functions
and the CLI say the same sentence for the same problem). Kinds:

- :data:`MATRIX`: an (N, D) real matrix from ``.csv`` (optional header line), ``.npy`` or ``.npz``;
- :data:`BINARY_MATRIX`: the same with every entry 0 or 1;
- :data:`LABELLED_MATRIX`: (X (N, D), y (N,)) from a CSV whose last column is the label, or an
  ``.npz`` holding ``X`` and ``y``; or the features from one file and the labels (one value per
  row, ``.csv`` or ``.npy``) from another (:func:`load_labels`, the CLI's ``--labels``);
- :data:`IMAGE_STACK`: (N, H, W) or (N, H, W, C) from ``.npy`` / ``.npz``.

Bad input raises one :class:`ValueError` sentence naming the file and the problem.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np

from latentzoo.inference.validation import check_images, check_labelled, check_matrix

__all__ = [
    "DataKind",
    "MATRIX",
    "BINARY_MATRIX",
    "LABELLED_MATRIX",
    "IMAGE_STACK",
    "load_matrix",
    "load_array",
    "load_labels",
    "standardize_scalers",
    "validate_matrix",
    "iter_matrix_chunks",
    "standardize_columns",
]


# ----------------------------------------------------------------------------- readers
def _numeric(row):
    try:
        return [float(c) for c in row]
    except ValueError:
        return None


def _is_header(row) -> bool:
    """A header has no numeric cell; a first row with some numbers is data (maybe with a typo)."""
    return all(_numeric([c]) is None for c in row)


def _parse_csv(path: str) -> np.ndarray:
    """The whole CSV as one float64 matrix, read by the same reader as the streaming fits."""
    chunks = list(_csv_chunks(path, 1 << 16))
    if not chunks:
        raise ValueError(f"{path} has no data rows.")
    return np.concatenate(chunks)


def load_array(path: str, *, names=("X",), exts=(".csv", ".txt", ".npy", ".npz")):
    """Read ``path``: a CSV as a float matrix, ``.npy``, or ``.npz`` (the arrays ``names``; with
    one name, that array or the file's only array). Returns one array, or a tuple for several
    names. Raises one ValueError sentence for a missing, unreadable or wrongly typed file."""
    if not os.path.exists(path):
        raise ValueError(f"Data file {path} does not exist.")
    if os.path.isdir(path):
        raise ValueError(f"Data path {path} is a directory, not a file.")
    ext = os.path.splitext(path)[1].lower()
    if ext not in exts:
        raise ValueError(f"Data file {path} must be one of {', '.join(exts)}.")
    try:
        if ext == ".npy":
            _check_file_fits(path)
            return _np_load(path)
        if ext == ".npz":
            with _np_load(path) as z:
                have = list(z.keys())
                if len(names) == 1 and names[0] not in have and len(have) == 1:
                    return z[have[0]]
                missing = [n for n in names if n not in have]
                if missing:
                    raise ValueError(
                        f"{path} holds arrays {have}; name the data array(s) {', '.join(names)}."
                    )
                arrays = tuple(z[n] for n in names)
                return arrays[0] if len(names) == 1 else arrays
        return _parse_csv(path)
    except ValueError:
        raise
    except Exception as err:  # corrupt binary files raise many different things
        raise ValueError(f"Data file {path} could not be read ({type(err).__name__}).") from None


def _check_file_fits(path: str) -> None:
    """A ``.npy`` file too large for the memory available is refused from its header, before
    it is read (it is held as float64)."""
    from latentzoo.memory import RUNTIME_BYTES, check_fits

    try:
        header = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception:  # noqa: BLE001 (unreadable: _np_load says so in one sentence)
        return
    shape = " x ".join(str(n) for n in header.shape)
    check_fits(RUNTIME_BYTES + 8 * int(header.size), f"Data file {path} ({shape} values)")


def _np_load(path: str):
    """``np.load`` without pickles; NumPy's own ValueErrors (a corrupt file reads as "pickled
    data", a wrong magic string as a format error) become one sentence naming the file."""
    try:
        return np.load(path, allow_pickle=False)
    except ValueError:
        raise ValueError(
            f"Data file {path} could not be read as a NumPy array of numbers (corrupt, or it "
            "holds Python objects)."
        ) from None


def load_matrix(path: str) -> np.ndarray:
    """An (N, D) matrix from ``.csv`` (optional header line), ``.npy`` or ``.npz``."""
    return check_matrix(load_array(path), name=path)


def validate_matrix(X, *, K: int | None = None, binary: bool = False, name: str = "the data"):
    """Check an (N, D) numeric matrix; return it as float64 (:func:`check_matrix`)."""
    return check_matrix(X, K=K, binary=binary, name=name)


def iter_matrix_chunks(path: str, chunk_size: int) -> Iterator[np.ndarray]:
    """Float64 (n, D) chunks of a CSV (read line by line) or ``.npy`` (memory-mapped) file, for
    streaming fits that never hold the file. Ragged or non-numeric rows, NaN/inf and complex
    data raise one ValueError sentence naming the line or row."""
    if not os.path.isfile(path):
        raise ValueError(f"Data file {path} does not exist.")
    if path.lower().endswith(".npy"):
        yield from _npy_chunks(path, chunk_size)
    else:
        yield from _csv_chunks(path, chunk_size)


def _finite(chunk, first_row, path):
    if not np.all(np.isfinite(chunk)):
        bad = first_row + int(np.argmax(~np.all(np.isfinite(chunk), axis=1)))
        raise ValueError(f"Row {bad} of {path} contains NaN or infinity.")
    return chunk


def _csv_chunks(path: str, chunk_size: int) -> Iterator[np.ndarray]:
    """(n, D) float64 chunks of a CSV read line by line; a first line with no numeric cell is a
    header (a first line with some numbers and a typo is an error, not a header)."""
    width, rows, seen = None, [], 0
    try:
        # utf-8-sig: a byte-order mark (as spreadsheet programs write) is not part of cell 1
        with open(path, newline="", encoding="utf-8-sig") as fh:
            for lineno, fields in enumerate(csv.reader(fh), start=1):
                if not fields or not any(c.strip() for c in fields):
                    continue
                values = _numeric(fields)
                if values is None:
                    if width is None and not rows and seen == 0 and _is_header(fields):
                        width = len(fields)
                        continue
                    bad = next(c for c in fields if _numeric([c]) is None)
                    raise ValueError(f"{path} has a non-numeric cell {bad!r} on line {lineno}.")
                if width is None:
                    width = len(values)
                elif len(values) != width:
                    raise ValueError(
                        f"{path} is ragged: line {lineno} has {len(values)} fields where {width} "
                        "were expected."
                    )
                rows.append(values)
                if len(rows) == chunk_size:
                    yield _finite(np.asarray(rows, dtype=np.float64), seen, path)
                    seen += len(rows)
                    rows = []
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not a readable text CSV file.") from None
    if rows:
        yield _finite(np.asarray(rows, dtype=np.float64), seen, path)


def _npy_chunks(path: str, chunk_size: int) -> Iterator[np.ndarray]:
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as exc:
        raise ValueError(f"{path} is not a numeric .npy array ({exc}).") from None
    if arr.ndim != 2:
        raise ValueError(f"{path} holds a {arr.ndim}-D array; a 2-D (rows, features) array is needed.")
    if np.iscomplexobj(arr):
        raise ValueError(f"{path} is complex; the models need real numbers.")
    if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
        raise ValueError(f"{path} holds dtype {arr.dtype}, not numbers.")
    for lo in range(0, arr.shape[0], chunk_size):
        yield _finite(np.array(arr[lo : lo + chunk_size], dtype=np.float64), lo, path)


def standardize_columns(X: np.ndarray) -> np.ndarray:
    """Centre and scale each column; ValueError when a column is constant. Each column is first
    divided by its largest absolute value, so data at any float64 scale (1e200, 1e-200) is
    standardised without its variance overflowing or underflowing."""
    X = np.asarray(X, dtype=np.float64)
    top = np.abs(X).max(0)
    Y = X / np.where(top > 0, top, 1.0)
    sd = Y.std(0)
    if np.any(sd == 0):
        raise ValueError(
            f"--standardize needs every column to vary; column {int(np.argmin(sd))} is constant."
        )
    return (Y - Y.mean(0)) / sd


def standardize_scalers(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(centre, scale) (D,) with ``(X - centre) / scale`` equal to :func:`standardize_columns`
    (X): what a run standardised with records, so new rows get the training columns' transform."""
    X = np.asarray(X, dtype=np.float64)
    top = np.abs(X).max(0)
    top = np.where(top > 0, top, 1.0)
    Y = X / top
    return top * Y.mean(0), top * Y.std(0)


# ---------------------------------------------------------------------------- data kinds
class DataKind(NamedTuple):
    """How one kind of data is read and checked.

    Attributes:
        name: readable name ("matrix", ...).
        load: ``path -> data`` (unvalidated arrays).
        validate: ``(data, K, name) -> data`` (float64 arrays; one ValueError sentence).
        num_rows: ``data -> N``.
        standardize: ``data -> data`` (centre/scale the real-valued features), or None when it
            does not apply (binary data, images).
        observed: ``data -> {"X": ...}`` for InferenceData's observed_data group.
        load_with_labels: ``(features_path, labels_path) -> data`` for kinds whose labels may
            come from a file of their own (the CLI's ``--labels``), or None.
    """

    name: str
    load: Callable[[str], Any]
    validate: Callable[..., Any]
    num_rows: Callable[[Any], int]
    standardize: Callable[[Any], Any] | None
    observed: Callable[[Any], dict]
    load_with_labels: Callable[[str, str], Any] | None = None


def _matrix_validate(X, K=None, name="the data"):
    return check_matrix(X, K=K, name=name)


def _binary_validate(X, K=None, name="the data"):
    return check_matrix(X, K=K, binary=True, name=name)


def _labelled_load(path):
    if path.lower().endswith(".npz"):
        return load_array(path, names=("X", "y"))
    A = load_array(path, exts=(".csv", ".txt", ".npy"))
    A = np.asarray(A)
    if A.ndim != 2 or A.shape[1] < 2:
        raise ValueError(f"{path} must be a 2-D table with at least two columns: features, then the label last.")
    return A[:, :-1], A[:, -1]


def load_labels(path: str) -> np.ndarray:
    """Labels (N,), one value per row, from a ``.csv``/``.txt`` (one column, optional header) or a
    ``.npy`` of shape (N,) or (N, 1); unvalidated values (the data kind checks them against X)."""
    y = np.asarray(load_array(path, exts=(".csv", ".txt", ".npy")))
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1:
        raise ValueError(f"Label file {path} must hold one label per row (a single column), "
                         f"got shape {y.shape}.")
    return y


def _labelled_load_pair(features_path: str, labels_path: str):
    return load_array(features_path), load_labels(labels_path)


def _labelled_validate(data, K=None, name="the data"):
    if not (isinstance(data, tuple) and len(data) == 2):
        raise ValueError(f"{name} must be a pair (X, y) of features and labels.")
    return check_labelled(data[0], data[1], K=K, name=name)


def _labelled_standardize(data):
    X, y = data
    return standardize_columns(X), y


def _images_validate(X, K=None, name="the images"):
    return check_images(X, name=name)


MATRIX = DataKind(
    "matrix", load_array, _matrix_validate, lambda X: X.shape[0], standardize_columns,
    lambda X: {"X": X},
)
BINARY_MATRIX = DataKind(
    "binary matrix", load_array, _binary_validate, lambda X: X.shape[0], None,
    lambda X: {"X": X},
)
LABELLED_MATRIX = DataKind(
    "labelled matrix", _labelled_load, _labelled_validate, lambda d: d[0].shape[0],
    _labelled_standardize, lambda d: {"X": d[0], "y": d[1]}, _labelled_load_pair,
)
IMAGE_STACK = DataKind(
    "image stack", lambda p: load_array(p, exts=(".npy", ".npz")), _images_validate,
    lambda X: X.shape[0], None, lambda X: {"X": X},
)
