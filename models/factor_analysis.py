r"""Bayesian factor analysis (the base model of the zoo; thesis ch. 2, eqs. 2.1-2.3).

.. math::

    z_n \sim \mathcal N(0, I_K), \qquad
    x_n \mid z_n \sim \mathcal N(W z_n + \mu,\ \mathrm{diag}(1/\psi)), \qquad n = 1..N

with loadings :math:`W \in \mathbb R^{D\times K}`, mean :math:`\mu \in \mathbb R^D` and noise
*precisions* :math:`\psi \in \mathbb R_+^D`. Marginally :math:`x_n \sim \mathcal N(\mu, W W^\top +
\mathrm{diag}(1/\psi))`; ``cov`` is recorded as a deterministic site because, unlike ``W``
(identified only up to rotation), it is identifiable and is what diagnostics should look at. It
has D^2 entries per draw, so above :data:`COV_SITE_MAX_DIM` features it is not recorded (at
D = 7129 one draw of it is 400 MB); ``factor_variance`` (K,), the eigenvalues of
:math:`W^\top W`, is recorded at every size: rotation-invariant, it says how much variance each
factor carries.

Priors live in :func:`default_priors` right below: edit them there, or pass ``priors={...}`` to
override some for one call. Every prior is an elementwise (scalar) distribution, expanded over
the plates. Editing a hyperparameter keeps the conjugate Gibbs updates (they read the values from
the model); changing a family (``Normal`` -> ``Laplace`` for ``W``) makes the Gibbs builder sample
that site with NUTS instead and say so.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.scipy.linalg
import numpy as np
import numpyro
import numpyro.distributions as dist

from latentzoo.models.shapes import data_sizes

#: Largest number of features D for which the model records the D x D deterministic ``cov``.
COV_SITE_MAX_DIM = 100


# ------------------------------------------------------------------------------- priors
def default_priors() -> dict[str, dist.Distribution]:
    """The model's priors, elementwise. Edit here."""
    return {
        "W": dist.Normal(0.0, 1.0),  # loadings W_dk, iid
        "z": dist.Normal(0.0, 1.0),  # factors z_nk (the model fixes N(0, I); edit with care)
        "mu": dist.Normal(0.0, 10.0),  # mean mu_d
        "psi": dist.Gamma(2.0, 1.0),  # noise precisions psi_d (shape, rate)
    }


# -------------------------------------------------------------------------------- model
def factor_analysis(X=None, *, K: int, N: int | None = None, D: int | None = None, priors=None):
    """Bayesian FA as a NumPyro program.

    Args:
        X: data, shape (N, D), or None to draw from the prior predictive.
        K: number of factors.
        N, D: sizes, needed only when ``X`` is None.
        priors: optional dict overriding entries of :func:`default_priors`.

    Sites: ``mu`` (D,), ``psi`` (D,), ``W`` (D, K), ``z`` (N, K), observed ``X`` (N, D) with one
    log-likelihood term per row; deterministic ``factor_variance`` (K,), the eigenvalues of Wᵀ W
    in descending order, and, for D <= :data:`COV_SITE_MAX_DIM`, ``cov`` (D, D) = W Wᵀ + diag(1/psi).
    """
    N, D = data_sizes(X, N, D, "factor_analysis")
    p = {**default_priors(), **(priors or {})}
    with numpyro.plate("D", D):
        mu = numpyro.sample("mu", p["mu"])
        psi = numpyro.sample("psi", p["psi"])
        W = numpyro.sample("W", p["W"].expand([K]).to_event(1))
    if D <= COV_SITE_MAX_DIM:
        numpyro.deterministic("cov", W @ W.T + jnp.diag(1.0 / psi))
    numpyro.deterministic("factor_variance", factor_variances(W))
    with numpyro.plate("N", N):
        z = numpyro.sample("z", p["z"].expand([K]).to_event(1))
        numpyro.sample(
            "X", dist.Normal(z @ W.T + mu, 1.0 / jnp.sqrt(psi)).to_event(1), obs=X
        )


def factor_variances(W):
    """Eigenvalues of Wᵀ W in descending order: W (..., D, K) -> (..., K). They are the non-zero
    eigenvalues of W Wᵀ (the variance each factor adds along its direction), unchanged by the
    rotations W -> W R that leave the likelihood unchanged, so they are identified."""
    gram = jnp.swapaxes(W, -1, -2) @ W
    return jnp.linalg.eigvalsh(gram)[..., ::-1]


def marginal_log_likelihood(X, W, mu, psi, *, per_row: bool = False):
    r"""log p(X | W, mu, psi) with z integrated out: x_n ~ N(mu, C), C = W Wᵀ + diag(1/psi).

    No D x D matrix. With :math:`\Psi = \mathrm{diag}(\psi)` (precisions),
    :math:`P = I_K + W^\top\Psi W = LL^\top` and :math:`m = P^{-1}W^\top\Psi r` (the posterior
    mean of z for the residual :math:`r = x - \mu`), the Woodbury identity gives
    :math:`r^\top C^{-1} r = r^\top\Psi r - m^\top W^\top\Psi r
    = (r - Wm)^\top\Psi(r - Wm) + m^\top m`, and the matrix determinant lemma
    :math:`\log|C| = \log|P| - \sum_d \log\psi_d`. So a draw costs O(N D K + D K^2) instead of
    the O(D^3) of a dense Gaussian. The last form is the one computed: it is a sum of squares, so
    nothing cancels when the noise is tiny next to the signal (where the first form subtracts two
    nearly equal numbers), and m is a minimiser, so its round-off enters only to second order.

    X (N, D), W (..., D, K), mu (..., D), psi (..., D) -> (...) summed over rows, or (..., N)
    with ``per_row=True`` (pointwise, as LOO / WAIC need).
    """
    D, K = W.shape[-2:]
    R = X - mu[..., None, :]  # (..., N, D)
    WP = W * psi[..., :, None]  # Psi W, (..., D, K)
    eye = jnp.eye(K, dtype=W.dtype)
    L = jnp.linalg.cholesky(eye + jnp.swapaxes(W, -1, -2) @ WP)
    # P^-1 from the K x K triangular inverse, applied as a product: XLA's CPU triangular solve
    # with N right-hand sides is ~100x slower (and m's round-off enters only to second order)
    L_inv = jax.scipy.linalg.solve_triangular(L, jnp.broadcast_to(eye, L.shape), lower=True)
    M = (R @ WP) @ (jnp.swapaxes(L_inv, -1, -2) @ L_inv)  # (..., N, K) rows m_n = P^-1 W' Psi r_n
    E = R - M @ jnp.swapaxes(W, -1, -2)  # (..., N, D): r - W m per row
    quad = jnp.sum(E * E * psi[..., None, :], axis=-1) + jnp.sum(M * M, axis=-1)
    logdet = 2.0 * jnp.sum(jnp.log(jnp.diagonal(L, axis1=-2, axis2=-1)), axis=-1) - jnp.sum(
        jnp.log(psi), axis=-1
    )
    ll = -0.5 * (quad + (logdet + D * jnp.log(2.0 * jnp.pi))[..., None])
    return ll if per_row else ll.sum(-1)


# --------------------------------------------------------------------------- default data
def default_fa_data(seed: int = 0, N: int = 500, D: int = 20, K: int = 3) -> np.ndarray:
    """The embedded default: N draws from an FA model with a fixed, well-conditioned truth:
    loadings N(0, 1), noise variances in [0.2, 1], means N(0, 1) (the FA benchmark's setting)."""
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(D, K))
    psi_var = rng.uniform(0.2, 1.0, size=D)
    mu = rng.normal(size=D)
    z = rng.normal(size=(N, K))
    return z @ W.T + mu + rng.normal(size=(N, D)) * np.sqrt(psi_var)
