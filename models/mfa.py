r"""Bayesian mixture of factor analysers (MFA; Ghahramani & Hinton 1996, eqs. 5-6; the baseline
of the tensor-analysers supplement, Table 1).

.. math::

    \pi \sim \mathrm{Dirichlet}(\alpha 1_J), \qquad
    c_n \mid \pi \sim \mathrm{Categorical}(\pi), \qquad
    z_n \sim \mathcal N(0, I_K),

.. math::

    x_n \mid c_n = j, z_n \sim \mathcal N(W_j z_n + \mu_j,\ \mathrm{diag}(1/\psi)),
    \qquad n = 1..N,

with per-component loadings :math:`W_j \in \mathbb R^{D\times K}` and means
:math:`\mu_j \in \mathbb R^D`, and noise *precisions* :math:`\psi \in \mathbb R_+^D` shared by the
components (as in Ghahramani & Hinton's MFA). Marginally each component is a factor analyser,
:math:`x_n \sim \sum_j \pi_j \mathcal N(\mu_j, W_j W_j^\top + \mathrm{diag}(1/\psi))`.

Identifiability: ``W_j`` is identified only up to rotation (as in FA) and the components only up
to relabelling. The deterministic site ``cov`` (J, D, D), the per-component marginal covariance,
is invariant to rotations of ``W_j``; it and ``mu`` are identified up to a permutation of the
component axis, so sort or match components before comparing chains.

Priors live in :func:`default_priors` right below: edit them there, or pass ``priors={...}`` for
one call. ``W``, ``mu``, ``z`` and ``psi`` take elementwise (scalar) distributions expanded over
the plates; ``pi`` takes the Dirichlet concentration :math:`\alpha` (a float for a symmetric
Dirichlet, or a length-J array). Editing a hyperparameter keeps every conjugate Gibbs update (they
read the values from the model traced at the current state); changing a family makes the Gibbs
builder sample that site generically (NUTS, or DiscreteGibbs for ``c``) and say so.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist

from latentzoo.models.shapes import data_sizes

__all__ = ["default_priors", "mfa", "component_means", "default_mfa_data"]


# ------------------------------------------------------------------------------- priors
def default_priors() -> dict:
    """The model's priors, elementwise (``pi``: the Dirichlet concentration). Edit here."""
    return {
        "pi": 1.0,  # Dirichlet concentration alpha (float: symmetric; or a (J,) array)
        "W": dist.Normal(0.0, 1.0),  # loadings W_jdk, iid
        "z": dist.Normal(0.0, 1.0),  # factors z_nk (the model fixes N(0, I); edit with care)
        "mu": dist.Normal(0.0, 10.0),  # component means mu_jd
        "psi": dist.Gamma(2.0, 1.0),  # shared noise precisions psi_d (shape, rate)
    }


# -------------------------------------------------------------------------------- model
def component_means(W, mu, z, c):
    """E[x_n | c_n, z_n] = W_{c_n} z_n + mu_{c_n}. Shapes: W (J, D, K), mu (J, D), z (N, K),
    c (N,) -> (N, D). Gathers per row rather than forming all J means, so it costs N*D*K."""
    return jnp.einsum("ndk,nk->nd", W[c], z) + mu[c]


def mfa(X=None, *, K: int, J: int, N: int | None = None, D: int | None = None, priors=None):
    """Bayesian MFA as a NumPyro program.

    Args:
        X: data, shape (N, D), or None to draw from the prior predictive.
        K: number of factors per component.
        J: number of mixture components.
        N, D: sizes, needed only when ``X`` is None.
        priors: optional dict overriding entries of :func:`default_priors`.

    Sites: ``pi`` (J,), ``psi`` (D,), ``mu`` (J, D), ``W`` (J, D, K), ``c`` (N,) integer labels in
    plate ``N`` (so a generic ``DiscreteGibbs`` can take it), ``z`` (N, K), observed ``X``
    (N, D) with one log-likelihood term per row, deterministic ``cov`` (J, D, D) =
    W_j W_jᵀ + diag(1/psi).
    """
    N, D = data_sizes(X, N, D, "mfa")
    p = {**default_priors(), **(priors or {})}
    alpha = jnp.broadcast_to(jnp.asarray(p["pi"], dtype=jnp.result_type(float)), (J,))
    pi = numpyro.sample("pi", dist.Dirichlet(alpha))
    with numpyro.plate("D", D, dim=-1):
        psi = numpyro.sample("psi", p["psi"])
        with numpyro.plate("J", J, dim=-2):
            mu = numpyro.sample("mu", p["mu"])
            W = numpyro.sample("W", p["W"].expand([K]).to_event(1))
    numpyro.deterministic(
        "cov", jnp.einsum("jdk,jek->jde", W, W) + jnp.diag(1.0 / psi)
    )
    with numpyro.plate("N", N, dim=-1):
        c = numpyro.sample("c", dist.Categorical(pi))
        z = numpyro.sample("z", p["z"].expand([K]).to_event(1))
        numpyro.sample(
            "X",
            dist.Normal(component_means(W, mu, z, c), 1.0 / jnp.sqrt(psi)).to_event(1),
            obs=X,
        )


# --------------------------------------------------------------------------- default data
def default_mfa_data(seed: int = 0, N: int = 300, D: int = 6, J: int = 2, K: int = 1):
    """The embedded default: N rows from J well-separated clusters (means 6 apart), each a
    K-factor Gaussian with loadings N(0, 1) and noise s.d. 0.3. Returns X (N, D)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    centres = 6.0 * rng.normal(size=(J, D)) / np.sqrt(D) * np.sqrt(2.0)
    labels = rng.integers(J, size=N)
    W = rng.normal(size=(J, D, K))
    z = rng.normal(size=(N, K))
    return centres[labels] + np.einsum("ndk,nk->nd", W[labels], z) + 0.3 * rng.normal(size=(N, D))
