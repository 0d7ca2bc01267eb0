r"""Noisy-OR component analyzer (NOCA): binary sources that switch binary findings on
(lecture "Noisy-OR Component Analyzer"; Singliar & Hauskrecht, JMLR 2006).

.. math::

    s_{ni} \sim \mathrm{Bernoulli}(\pi_i), \qquad
    P(x_{nj} = 0 \mid s_n) = (1 - p_{0j}) \prod_{i=1}^K (1 - p_{ij})^{s_{ni}}
                           = \exp\big(-\theta_{0j} - \textstyle\sum_i \theta_{ij} s_{ni}\big),

with the lecture's parameterisation :math:`\theta_{ij} = -\log(1 - p_{ij}) \ge 0` and a leak
:math:`\theta_{0j} > 0` (the leak keeps :math:`P(x_{nj}=1\mid s)` positive, so a finding that is on
with no active source has finite log-probability; every bound below needs it).

Priors for the Bayesian version (:func:`default_priors`): :math:`\pi_i \sim \mathrm{Beta}`,
:math:`\theta_{ij} \sim \mathrm{Gamma}`, :math:`\theta_{0j} \sim \mathrm{Gamma}`. Variational EM and
exact EM (:mod:`latentzoo.inference.noca.em`) are maximum-likelihood, as in the lecture.

Shapes: ``pi`` (K,), ``theta`` (K, D) (row i = source i, as :math:`\theta_{ij}`), ``theta0`` (D,),
``s`` (N, K) in nested plates ``N`` (dim -2) x ``K`` (dim -1) (``DiscreteGibbs`` cannot sample
``to_event`` Bernoulli sites), ``X`` (N, D) in plates ``N`` (dim -2) x ``D`` (dim -1).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

from latentzoo.models.shapes import data_sizes

__all__ = [
    "default_priors",
    "noca",
    "noisy_or_logits",
    "shape_sources",
    "simulate_noca",
    "default_noca_data",
]


# ------------------------------------------------------------------------------- priors
def default_priors() -> dict[str, dist.Distribution]:
    """The model's priors, elementwise. Edit here (or pass ``priors={...}`` to :func:`noca`)."""
    return {
        "pi": dist.Beta(1.0, 1.0),  # source probabilities pi_i
        "theta": dist.Gamma(1.0, 0.5),  # theta_ij = -log(1 - p_ij): mean 2 (p ~ 0.86)
        "theta0": dist.Gamma(1.0, 20.0),  # leak theta_0j: mean 0.05
    }


# -------------------------------------------------------------------------------- model
def noisy_or_logits(z):
    """logit P(x = 1) = log(e^z - 1) for the total inhibition z = theta0 + s theta >= 0, stable
    for small z (expm1) and large z (z + log1p(-e^-z)). With these logits a Bernoulli's
    log_prob is exactly x log(1 - e^-z) - (1 - x) z."""
    big = z > 20.0
    return jnp.where(big, z + jnp.log1p(-jnp.exp(-jnp.where(big, z, 20.0))), jnp.log(jnp.expm1(jnp.where(big, 1.0, z))))


def noca(X=None, *, K: int, N: int | None = None, D: int | None = None, priors=None):
    """Bayesian NOCA as a NumPyro program.

    Args:
        X: binary data, shape (N, D), or None to draw from the prior predictive.
        K: number of binary sources.
        N, D: sizes, needed only when ``X`` is None.
        priors: optional dict overriding entries of :func:`default_priors`.
    """
    N, D = data_sizes(X, N, D, "noca")
    p = {**default_priors(), **(priors or {})}
    with numpyro.plate("K", K, dim=-1):
        pi = numpyro.sample("pi", p["pi"])
    with numpyro.plate("D", D, dim=-1):
        theta0 = numpyro.sample("theta0", p["theta0"])
    with numpyro.plate("Ksrc", K, dim=-2), numpyro.plate("D", D, dim=-1):
        theta = numpyro.sample("theta", p["theta"])
    with numpyro.plate("N", N, dim=-2), numpyro.plate("K", K, dim=-1):
        s = numpyro.sample("s", dist.Bernoulli(probs=pi))
    with numpyro.plate("N", N, dim=-2), numpyro.plate("D", D, dim=-1):
        numpyro.sample("X", dist.Bernoulli(logits=noisy_or_logits(theta0 + s @ theta)), obs=X)


# ------------------------------------------------------------------- synthetic test set
_SHAPES_8x8 = [
    # 8 shapes on an 8x8 grid (row strings); overlapping a little, as in the lecture's figure
    ["XXX.....", "XXX.....", "XXX....."],  # filled square, top left
    [".....X..", "....XXX.", ".....X.."],  # plus, top right
    ["X.......", ".X......", "..X.....", "...X....", "....X..."],  # diagonal
    ["........", "........", "........", "........", "XXXXXXXX"],  # horizontal line
    ["........", "........", "........", "........", "........", "......X.", "......X.", "....XXX."],  # L
    ["........", "........", "........", "........", "........", "XXX.....", "X.X.....", "XXX....."],  # ring
    ["........", "........", "......XX", "......XX", "........", "........", "........", "......X."],  # blob + dot
    ["...X....", "...X....", "...X....", "........", "........", "...X....", "...X....", "...X...."],  # broken bar
]


def shape_sources(side: int = 8) -> np.ndarray:
    """The 8 binary source patterns (8, side*side) of the structure-recovery experiment."""
    if side != 8:
        raise ValueError("The shape sources are drawn on an 8x8 grid.")
    out = np.zeros((len(_SHAPES_8x8), side * side))
    for i, rows in enumerate(_SHAPES_8x8):
        img = np.zeros((side, side))
        for r, line in enumerate(rows):
            img[r] = [c == "X" for c in line]
        out[i] = img.ravel()
    return out


def simulate_noca(theta, theta0, pi, N: int, rng: np.random.Generator):
    """Draw (X (N, D), s (N, K)) from NOCA with fixed parameters theta (K, D), theta0 (D,), pi (K,)."""
    K, D = theta.shape
    s = (rng.random((N, K)) < np.broadcast_to(pi, (K,))).astype(np.float64)
    p_off = np.exp(-(theta0 + s @ theta))
    X = (rng.random((N, D)) >= p_off).astype(np.float64)
    return X, s


DEFAULT_DATA = {"N": 2000, "pi": 0.25, "p_on": 0.9, "leak": 0.001}


def true_parameters(p_on: float = 0.9, leak: float = 0.001, prior: float = 0.25):
    """(theta (8, 64), theta0 (64,), pi (8,)) for the shape sources: p_ij = p_on inside shape i."""
    S = shape_sources()
    theta = -np.log1p(-p_on) * S
    theta0 = np.full(S.shape[1], -np.log1p(-leak))
    return theta, theta0, np.full(S.shape[0], prior)


def default_noca_data(seed: int = 0, N: int | None = None):
    """The default synthetic set: 8 shapes on 8x8, prior 0.25, p = 0.9 inside a shape, leak 0.001.
    Returns (X (N, 64), theta_true (8, 64), theta0_true (64,), s_true (N, 8))."""
    theta, theta0, pi = true_parameters(DEFAULT_DATA["p_on"], DEFAULT_DATA["leak"], DEFAULT_DATA["pi"])
    X, s = simulate_noca(theta, theta0, pi, N or DEFAULT_DATA["N"], np.random.default_rng(seed))
    return X, theta, theta0, s
