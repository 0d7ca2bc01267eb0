r"""Factor analysis on new rows with missing entries: the log predictive density of each row's
observed entries and the conditional mean of its missing ones, per posterior draw.

For one draw (W, mu, psi) a row x with observed entries O has, with z integrated out,
:math:`x_O \sim \mathcal N(\mu_O, W_O W_O^\top + \mathrm{diag}(1/\psi_O))`. Setting the precision
of a missing entry to zero, :math:`\tilde\psi_d = \psi_d [d \in O]`, gives the same algebra on all
D entries (what :func:`latentzoo.models.factor_analysis.marginal_log_likelihood` does for a full
row, by the Woodbury identity), with a K x K matrix per row instead of one per draw:

.. math::
    P_n = I_K + W^\top \mathrm{diag}(\tilde\psi_n) W, \quad
    m_n = P_n^{-1} W^\top \mathrm{diag}(\tilde\psi_n)(x_n - \mu), \\
    \log p(x_{n,O}) = -\tfrac12\Big(|O|\log 2\pi + \log|P_n| - \sum_{d\in O}\log\psi_d
    + \sum_{d \in O}\psi_d (x_{nd} - \mu_d - w_d^\top m_n)^2 + m_n^\top m_n\Big).

:math:`m_n` is :math:`E[z \mid x_{n,O}]`, so a missing entry's conditional mean is
:math:`E[x_{nd} \mid x_{n,O}] = \mu_d + w_d^\top m_n` (the noise is independent across entries).
A row with nothing missing gives ``marginal_log_likelihood``'s value (tested).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["masked_log_predictive"]


def masked_log_predictive(X, W, mu, psi, *, with_latent_mean: bool = False):
    """Rows X (N, D) with NaN for missing entries, one draw W (D, K), mu (D,), psi (D,) ->
    (log p(x_{n,O}) (N,), E[x_n | x_{n,O}] (N, D): observed entries as given, missing ones at
    their conditional mean). A row with no observed entry has log density 0.
    ``with_latent_mean``: also return m_n = E[z_n | x_{n,O}] (N, K) (a row with nothing
    observed gets the prior mean 0)."""
    observed = ~jnp.isnan(X)
    R = jnp.where(observed, X - mu, 0.0)
    psi_n = jnp.where(observed, psi, 0.0)  # (N, D): a missing entry carries no precision
    K = W.shape[-1]
    P = jnp.eye(K, dtype=W.dtype) + jnp.einsum("dk,nd,dl->nkl", W, psi_n, W)
    L = jnp.linalg.cholesky(P)
    b = (R * psi_n) @ W  # (N, K)
    m = jax.scipy.linalg.cho_solve((L, True), b[..., None])[..., 0]
    fitted = m @ W.T  # (N, D): w_d' m_n
    E = jnp.where(observed, R - fitted, 0.0)
    quad = jnp.sum(psi_n * E * E, -1) + jnp.sum(m * m, -1)
    logdet = 2.0 * jnp.sum(jnp.log(jnp.diagonal(L, axis1=-2, axis2=-1)), -1) \
        - jnp.sum(jnp.where(observed, jnp.log(psi), 0.0), -1)
    count = jnp.sum(observed, -1)
    log_p = -0.5 * (count * jnp.log(2.0 * jnp.pi) + logdet + quad)
    completed = jnp.where(observed, X, mu + fitted)
    if with_latent_mean:
        return log_p, completed, m
    return log_p, completed
