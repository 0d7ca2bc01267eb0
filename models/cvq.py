r"""Cooperative vector quantizer (CVQ): binary sources that add up (lecture "CVQ - Model Description").

.. math::

    s_{nk} \sim \mathrm{Bernoulli}(\pi_k), \qquad
    x_n \mid s_n \sim \mathcal N(W s_n,\ \sigma^2 I_D), \qquad n = 1..N,\ k = 1..K

with source images (columns) :math:`w_k` of :math:`W \in \mathbb R^{D\times K}` and isotropic
noise. The lecture writes the covariance as :math:`\sigma I` and its density with
:math:`2^{-d/2}\sigma^{-d/2}`; here ``sigma`` is the noise *standard deviation* and the density is
the usual :math:`(2\pi\sigma^2)^{-D/2}\exp(-\lVert x - Ws\rVert^2 / 2\sigma^2)`.

For the Bayesian version the parameters get the priors in :func:`default_priors`:
:math:`\pi_k \sim \mathrm{Beta}`, :math:`W_{dk} \sim \mathcal N`, and the noise precision
:math:`\tau = 1/\sigma^2 \sim \mathrm{Gamma}` (site ``tau``; ``sigma`` is recorded as a
deterministic site). Variational EM and exact EM (:mod:`latentzoo.inference.cvq.em`) are
maximum-likelihood methods as in the lecture and ignore these priors; the Gibbs sampler
(:mod:`latentzoo.inference.cvq.gibbs`) uses them.

Plates: the binary sources sit in nested plates ``N`` (dim -2) x ``K`` (dim -1) because NumPyro's
``DiscreteGibbs`` cannot sample ``to_event`` Bernoulli sites; ``X`` sits in ``N`` (dim -2) x ``D``
(dim -1) so that ``N`` has one dim everywhere.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

from latentzoo.models.shapes import data_sizes

__all__ = [
    "default_priors",
    "cvq",
    "complete_log_likelihood",
    "bar_sources",
    "simulate_cvq",
    "default_cvq_data",
]


# ------------------------------------------------------------------------------- priors
def default_priors() -> dict[str, dist.Distribution]:
    """The model's priors, elementwise. Edit here (or pass ``priors={...}`` to :func:`cvq`)."""
    return {
        "pi": dist.Beta(1.0, 1.0),  # source probabilities pi_k
        "W": dist.Normal(0.0, 1.0),  # source images W_dk, iid
        "tau": dist.Gamma(2.0, 0.5),  # noise precision 1/sigma^2 (shape, rate): mean 4
    }


# -------------------------------------------------------------------------------- model
def cvq(X=None, *, K: int, N: int | None = None, D: int | None = None, priors=None):
    """Bayesian CVQ as a NumPyro program.

    Args:
        X: data, shape (N, D), or None to draw from the prior predictive.
        K: number of binary sources.
        N, D: sizes, needed only when ``X`` is None.
        priors: optional dict overriding entries of :func:`default_priors`.

    Sites: ``pi`` (K,), ``W`` (D, K), ``tau`` () = 1/sigma^2, deterministic ``sigma`` (),
    ``pi_sorted`` (K,) and ``source_norms`` (K,) (the probabilities and the column norms of W in
    increasing order: invariant to relabelling the sources), ``s`` (N, K) binary, observed ``X``
    (N, D) (one term per entry).
    """
    N, D = data_sizes(X, N, D, "cvq")
    p = {**default_priors(), **(priors or {})}
    with numpyro.plate("K", K, dim=-1):
        pi = numpyro.sample("pi", p["pi"])
    with numpyro.plate("D", D, dim=-1):
        W = numpyro.sample("W", p["W"].expand([K]).to_event(1))
    tau = numpyro.sample("tau", p["tau"])
    sigma = numpyro.deterministic("sigma", 1.0 / jnp.sqrt(tau))
    # what a run can compare across chains: sources are exchangeable, so their labels differ
    # between chains; sorted, their probabilities and image norms do not
    numpyro.deterministic("pi_sorted", jnp.sort(pi))
    numpyro.deterministic("source_norms", jnp.sort(jnp.sqrt(jnp.sum(W * W, axis=0))))
    with numpyro.plate("N", N, dim=-2), numpyro.plate("K", K, dim=-1):
        s = numpyro.sample("s", dist.Bernoulli(probs=pi))
    with numpyro.plate("N", N, dim=-2), numpyro.plate("D", D, dim=-1):
        numpyro.sample("X", dist.Normal(s @ W.T, sigma), obs=X)


def complete_log_likelihood(X, s, W, pi, sigma):
    """log p(X, s | W, pi, sigma) summed over rows (lecture: "Joint for one instance").

    Shapes: X (N, D), s (..., N, K), W (D, K), pi (K,), sigma () -> (...).
    """
    D = X.shape[-1]
    r = X - s @ W.T
    ll = -0.5 * (r * r).sum((-1, -2)) / sigma**2 - 0.5 * X.shape[0] * D * jnp.log(2 * jnp.pi * sigma**2)
    lp = (s * jnp.log(pi) + (1 - s) * jnp.log1p(-pi)).sum((-1, -2))
    return ll + lp


# ------------------------------------------------------------------- synthetic test set
def bar_sources(side: int = 8, num_bars: int | None = None) -> np.ndarray:
    """The lecture's image-separation sources: horizontal and vertical bars on a side x side grid.

    Returns W (side*side, K) with K = num_bars (default 8: 4 horizontal, 4 vertical, every other
    row/column so that no two bars of one orientation touch), pixel value 1 on the bar.
    """
    num_bars = 8 if num_bars is None else num_bars
    idx = np.arange(0, side, max(1, side // (num_bars // 2)))[: num_bars // 2]
    srcs = []
    for r in idx:
        img = np.zeros((side, side))
        img[r, :] = 1.0
        srcs.append(img.ravel())
    for c in idx:
        img = np.zeros((side, side))
        img[:, c] = 1.0
        srcs.append(img.ravel())
    return np.stack(srcs, axis=1)


def simulate_cvq(W, pi, sigma, N: int, rng: np.random.Generator):
    """Draw (X (N, D), s (N, K)) from the CVQ with fixed parameters."""
    K = W.shape[1]
    s = (rng.random((N, K)) < np.broadcast_to(pi, (K,))).astype(np.float64)
    X = s @ W.T + sigma * rng.standard_normal((N, W.shape[0]))
    return X, s


DEFAULT_DATA = {"N": 500, "pi": 0.3, "sigma": 0.5}  # the default synthetic set (bars, 8x8)


def default_cvq_data(seed: int = 0):
    """The default synthetic set: 8 bar sources on 8x8, pi = 0.3, sigma = 0.5, N = 500.
    Returns (X (N, 64), W_true (64, 8), s_true (N, 8))."""
    W = bar_sources(8, 8)
    X, s = simulate_cvq(W, DEFAULT_DATA["pi"], DEFAULT_DATA["sigma"], DEFAULT_DATA["N"], np.random.default_rng(seed))
    return X, W, s
