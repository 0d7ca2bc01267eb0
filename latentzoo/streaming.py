"""Back end of ``latentzoo run fa --method online-em|online-sga``: stream a data file through
:class:`latentzoo.inference.fa.online.OnlineFactorAnalysis` one chunk at a time.

Only one chunk of rows is ever held in memory: CSV files are parsed line by line, ``.npy``
files are memory-mapped and sliced. Outputs are written atomically (temporary file in the
same folder, then ``os.replace``).
"""

from __future__ import annotations

import os
import time
from typing import Iterator

import numpy as np

from latentzoo.results import atomic_write

__all__ = ["run_streaming_fa"]

_METHODS = {"em": "em", "sga": "sga", "online-em": "em", "online-sga": "sga"}


# ----------------------------------------------------------------------------- readers
def _csv_chunks(path: str, chunk_size: int) -> Iterator[np.ndarray]:
    """Yield float64 (n, D) chunks of a comma-separated file; an optional non-numeric header
    line is skipped. Ragged or non-numeric rows raise ValueError naming the line."""
    width = None
    rows: list[list[float]] = []
    with open(path, "r", newline="") as f:
        for lineno, line in enumerate(f, start=1):
            line = line.strip()
            if not line:
                continue
            fields = [x.strip() for x in line.split(",")]
            try:
                values = [float(x) for x in fields]
            except ValueError:
                if width is None and lineno == 1:  # header
                    width = len(fields)
                    continue
                raise ValueError(f"Line {lineno} of {path} contains a non-numeric value.") from None
            if width is None:
                width = len(values)
            elif len(values) != width:
                raise ValueError(
                    f"Line {lineno} of {path} has {len(values)} fields where {width} were expected."
                )
            rows.append(values)
            if len(rows) == chunk_size:
                yield np.asarray(rows, dtype=np.float64)
                rows = []
    if rows:
        yield np.asarray(rows, dtype=np.float64)


def _npy_chunks(path: str, chunk_size: int) -> Iterator[np.ndarray]:
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as exc:
        raise ValueError(f"{path} is not a numeric .npy array ({exc}).") from None
    if arr.ndim != 2:
        raise ValueError(f"{path} holds a {arr.ndim}-D array; a 2-D (n_samples, n_features) array is needed.")
    if not np.issubdtype(arr.dtype, np.number):
        raise ValueError(f"{path} holds dtype {arr.dtype}, not numbers.")
    for lo in range(0, arr.shape[0], chunk_size):
        yield np.array(arr[lo : lo + chunk_size], dtype=np.float64)


def _synthetic_chunks(chunk_size: int, quick: bool, n_components: int) -> Iterator[np.ndarray]:
    """Default data: a fixed factor analysis model (D=50, K=5, seed 12345) sampled chunkwise."""
    rng = np.random.default_rng(12345)
    D, K = 50, 5
    n_total = 2000 if quick else 20000
    F = 0.6 * rng.standard_normal((D, K))
    psi = rng.uniform(0.5, 1.5, size=D)
    c = rng.standard_normal(D)
    for lo in range(0, n_total, chunk_size):
        n = min(chunk_size, n_total - lo)
        yield rng.standard_normal((n, K)) @ F.T + c + rng.standard_normal((n, D)) * np.sqrt(psi)


def _chunks(path, chunk_size, quick, n_components):
    """(chunk iterator, total rows or None when unknown before reading, as for CSV)."""
    if path is None:
        return _synthetic_chunks(chunk_size, quick, n_components), (2000 if quick else 20000)
    if not os.path.isfile(path):
        raise ValueError(f"Data file {path!r} does not exist.")
    if path.endswith(".npy"):
        try:
            n = int(np.load(path, mmap_mode="r", allow_pickle=False).shape[0])
        except Exception:
            n = None
        return _npy_chunks(path, chunk_size), n
    return _csv_chunks(path, chunk_size), None


# ----------------------------------------------------------------------------- writers
def _summary_csv(mean, F, psi) -> str:
    """One row per feature: mean, noise variance, communality (diag F F^T), total variance,
    share of variance explained by the factors, then the loadings."""
    K = F.shape[1]
    comm = np.sum(F * F, axis=1)
    total = comm + psi
    head = ["feature", "mean", "noise_variance", "communality", "total_variance", "explained_fraction"]
    head += [f"loading_{k}" for k in range(K)]
    lines = [",".join(head)]
    for d in range(F.shape[0]):
        vals = [mean[d], psi[d], comm[d], total[d], comm[d] / total[d], *F[d]]
        lines.append(",".join([str(d)] + [f"{v:.10g}" for v in vals]))
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- entry point
def run_streaming_fa(
    path: str | None,
    *,
    method: str,
    n_components: int,
    out_dir: str,
    chunk_size: int = 1000,
    seed: int = 0,
    quick: bool = False,
) -> dict:
    """Fit an online factor analysis model to a CSV / ``.npy`` file read in chunks.

    Parameters
    ----------
    path : CSV (comma-separated, optional header line) or ``.npy`` file of shape (n, D);
        ``None`` streams a built-in synthetic FA data set (fixed seed).
    method : "em" / "online-em" or "sga" / "online-sga".
    n_components : K, smaller than the number of columns D.
    out_dir : folder that receives ``params.npz`` (mean (D,), components (K,D),
        noise_variance (D,)) and ``summary.csv`` (one row per feature).
    chunk_size : rows held in memory at a time.
    seed : seeds the initial factors.
    quick : only for the synthetic default: 2000 rows instead of 20000.

    Returns a dict summary (rows, features, method, average log-likelihood of the last chunk
    under the final model, seconds, output paths). Raises ValueError with one sentence for a
    missing file, ragged or non-numeric CSV, NaN/inf, n_components >= D or fewer than 2 rows.
    """
    from tqdm import tqdm

    from latentzoo.inference.fa.online import OnlineFactorAnalysis

    if method not in _METHODS:
        raise ValueError(f"method must be one of {sorted(_METHODS)}, got {method!r}.")
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}.")
    chunks, total = _chunks(path, chunk_size, quick, n_components)
    model = OnlineFactorAnalysis(n_components, method=_METHODS[method], random_state=seed)
    t0 = time.perf_counter()
    n_rows, last = 0, None
    bar = tqdm(total=total, unit="rows", desc="online FA", disable=None)  # silent off a terminal
    try:
        for chunk in chunks:
            if not np.all(np.isfinite(chunk)):
                bad = n_rows + int(np.argmax(~np.all(np.isfinite(chunk), axis=1)))
                raise ValueError(f"Row {bad} of the data contains NaN or infinity.")
            model.partial_fit(chunk)
            n_rows += chunk.shape[0]
            last = chunk
            bar.update(chunk.shape[0])
    finally:
        bar.close()
    if n_rows < 2:
        raise ValueError(f"At least 2 rows are needed to fit a factor analysis model, got {n_rows}.")
    seconds = time.perf_counter() - t0

    mean = model.mean_
    F = model.components_.T
    psi = model.noise_variance_
    os.makedirs(out_dir, exist_ok=True)
    params_path = os.path.join(out_dir, "params.npz")
    summary_path = os.path.join(out_dir, "summary.csv")

    def _write_npz(tmp):
        with open(tmp, "wb") as f:
            np.savez(f, mean=mean, components=F.T, noise_variance=psi)

    def _write_csv(tmp):
        with open(tmp, "w") as f:
            f.write(_summary_csv(mean, F, psi))

    atomic_write(params_path, _write_npz)
    atomic_write(summary_path, _write_csv)
    return {
        "path": path,
        "method": _METHODS[method],
        "n_samples": int(n_rows),
        "n_features": int(F.shape[0]),
        "n_components": int(n_components),
        "chunk_size": int(chunk_size),
        "avg_loglik_last_chunk": float(model.score(last)),
        "mean_noise_variance": float(np.mean(psi)),
        "mean_explained_fraction": float(np.mean(np.sum(F * F, 1) / (np.sum(F * F, 1) + psi))),
        "seconds": float(seconds),
        "params_path": params_path,
        "summary_path": summary_path,
    }
