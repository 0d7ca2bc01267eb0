"""Shared helpers for the experiments and benchmarks: atomic output, argument checks, matching, data."""

from __future__ import annotations

import csv
import io
import json
import sys

import numpy as np
from scipy.optimize import linear_sum_assignment

from latentzoo.results import atomic_savefig, atomic_write_text


def write_text(path: str, text: str) -> None:
    atomic_write_text(path, text)


def write_json(path: str, obj) -> None:
    write_text(path, json.dumps(obj, indent=2) + "\n")


def write_csv(path: str, rows: list[dict]) -> None:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0].keys()))
    w.writeheader()
    w.writerows(rows)
    write_text(path, buf.getvalue())


def usage_error(script: str, message: str):
    """One sentence on stderr, prefixed by the script's name, and exit status 2 (no traceback)."""
    print(f"{script}: {message}", file=sys.stderr)
    raise SystemExit(2)


def check_at_least(script: str, **values) -> None:
    """``name=(value, least)`` pairs: exit with one sentence for the first value below its least."""
    for name, (value, least) in values.items():
        if value < least:
            usage_error(script, f"--{name.replace('_', '-')} must be at least {least}, got {value}.")


def save_figure(fig, path: str) -> None:
    atomic_savefig(fig, path, dpi=110, bbox_inches="tight")


def match_by_correlation(W_true: np.ndarray, W_est: np.ndarray):
    """Hungarian matching of columns by correlation. Returns (est index per true source, corr)."""
    K = W_true.shape[1]
    C = np.corrcoef(W_true.T, W_est.T)[:K, K:]
    C = np.nan_to_num(C, nan=0.0)
    r, c = linear_sum_assignment(-C)
    return c, C[r, c]


def match_by_linf(theta_true: np.ndarray, theta_est: np.ndarray, tol: float = 1.0):
    """Hungarian matching of NOCA sources by the L-inf distance between log failure-probability
    vectors (log(1 - p_ij) = -theta_ij). Returns (est index per true source, distance, matched)."""
    C = np.abs(theta_true[:, None, :] - theta_est[None, :, :]).max(-1)
    r, c = linear_sum_assignment(C)
    d = C[r, c]
    return c, d, d <= tol


def random_binary_sources(K: int, D: int, pixels: int, rng: np.random.Generator) -> np.ndarray:
    """K random binary patterns (K, D) with ``pixels`` ones each (benchmark sources for any K)."""
    S = np.zeros((K, D))
    for i in range(K):
        S[i, rng.choice(D, pixels, replace=False)] = 1.0
    return S


def show_image(ax, img, title=None, **imshow_kwargs):
    """An 8x8 source image on a bare axis (the experiments' source and recovery grids)."""
    ax.imshow(img.reshape(8, 8), cmap="gray_r", **imshow_kwargs)
    ax.set_xticks([])
    ax.set_yticks([])
    if title:
        ax.set_title(title, fontsize=7)
