"""Shared helpers for the online factor analysis experiments and benchmark.

Algorithm 3 of the thesis (Brownlie 2021, sec. 5.1) generates a factor analysis model whose
covariance conditioning is controlled by a "spectrum" range; the metrics are the relative
Frobenius distance of covariances (Figure 5.1) and the 2-Wasserstein distance between
Gaussians (Figure 5.2).
"""

from __future__ import annotations


import numpy as np

from latentzoo.results import atomic_savefig, atomic_write_text  # noqa: F401  (re-exported)


def generate_fa_model(D: int, K: int, spectrum: tuple[float, float], rng: np.random.Generator):
    """Algorithm 3: c ~ N(0, I); F = top-K eigenvectors of A A^T (A Gaussian D x D), each row d
    scaled by s_d with s_d^2 ~ U(spectrum); psi_d ~ U(0, max s^2). Returns c (D,), F (D,K), psi (D,)."""
    c = rng.standard_normal(D)
    A = rng.standard_normal((D, D))
    _, V = np.linalg.eigh(A @ A.T)
    Vk = V[:, ::-1][:, :K]  # eigh sorts ascending; keep the K largest
    s2 = rng.uniform(spectrum[0], spectrum[1], size=(D, 1))
    F = Vk * np.sqrt(s2)  # broadcasting over rows, as in Algorithm 3 line 8
    psi = rng.uniform(0.0, s2.max(), size=D)
    return c, F, psi


def sample_fa(c, F, psi, n: int, rng: np.random.Generator) -> np.ndarray:
    """n rows of F h + c + eps (eq. 2.1)."""
    h = rng.standard_normal((n, F.shape[1]))
    return h @ F.T + c + rng.standard_normal((n, c.shape[0])) * np.sqrt(psi)


def fa_covariance(F, psi) -> np.ndarray:
    return F @ F.T + np.diag(psi)


def relative_covariance_distance(C_est: np.ndarray, C_true: np.ndarray) -> float:
    """||C_est - C_true||_F / ||C_true||_F (Figure 5.1)."""
    return float(np.linalg.norm(C_est - C_true) / np.linalg.norm(C_true))


def _sqrtm_psd(C):
    w, V = np.linalg.eigh(C)
    return (V * np.sqrt(np.clip(w, 0.0, None))) @ V.T


def wasserstein2(m1, C1, m2, C2, sqrt_C1=None) -> float:
    """2-Wasserstein distance between N(m1, C1) and N(m2, C2) (Figure 5.2):
    W^2 = |m1 - m2|^2 + tr(C1 + C2 - 2 (C1^1/2 C2 C1^1/2)^1/2)."""
    r1 = _sqrtm_psd(C1) if sqrt_C1 is None else sqrt_C1
    cross = _sqrtm_psd(r1 @ C2 @ r1)
    w2 = float(np.sum((m1 - m2) ** 2) + np.trace(C1) + np.trace(C2) - 2.0 * np.trace(cross))
    return float(np.sqrt(max(w2, 0.0)))


def mean_stderr(values) -> tuple[float, float, int]:
    """(mean, standard error, count) of the finite entries; nan where undefined."""
    v = np.asarray(values, float)
    v = v[np.isfinite(v)]
    mean = float(v.mean()) if v.size else float("nan")
    se = float(v.std(ddof=1) / np.sqrt(v.size)) if v.size > 1 else float("nan")
    return mean, se, int(v.size)


def rows_to_csv(rows: list[dict]) -> str:
    if not rows:
        return ""
    keys = list(rows[0].keys())
    out = [",".join(keys)]
    for r in rows:
        out.append(",".join(_fmt(r[k]) for k in keys))
    return "\n".join(out) + "\n"


def _fmt(v):
    if isinstance(v, float):
        return repr(v)
    return str(v)
