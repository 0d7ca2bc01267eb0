r"""A rotation move for the rank SVM's factors: the likelihood sees the factors only through
w_n = A z_n and u_n = β_{t(n)}ᵀ z_n, so rotating every factor vector by one orthogonal matrix R,

.. math::

    z_n \to R z_n,\quad A_{i\cdot} \to R A_{i\cdot},\quad \beta_t \to R \beta_t,
    \quad \mu_t \to R \mu_t \ (\text{NL}),

leaves every hinge and Gaussian term unchanged, and so does the prior of z (N(0, I), or NL's
N(μ_t, ψ_t⁻¹ I) with μ_t's isotropic prior). Only the shrinkage priors of A and β, whose
variances ξ_{ik} and b_{tk} differ between factors, change. Gibbs moves the factors' roles slowly:
which factors carry the classifier and which the features (measured on the default digits run:
the three smallest coefficients β_k in absolute value have ESS 15-18, see docs/models/rank_factor_svm.md). Not in the paper.
Measured there, it does not mix those faster (ESS 15-25 with it, same seed and budget): the angle
is drawn given the shrinkage variances, which pin a coefficient whose variance is tiny. Opt-in.

It assumes what the model file has: zero-mean Normal priors on A and β (their variances may
differ entry by entry) and an isotropic prior on z (and μ). A swapped prior that breaks either
(a non-zero mean, a per-factor scale on z) is not rotation-invariant in the way used here, and
the move must then be left off.

**The draw.** One sweep of the move visits every plane (k, l), k < l, and rotates by a Givens
angle θ drawn from its exact conditional. SO(2) is compact and a rotation has unit Jacobian, so
drawing θ from :math:`\pi(\theta) \propto p(g_\theta(x))` against the uniform (Haar) measure
leaves p invariant (Liu & Sabatti 2000). With (a, b) the k-th and l-th entries of one row of A
(variances (v, w) = (ξ_{ik}, ξ_{il})) or of β_t ((b_{tk}, b_{tl})), rotated to
(a cos θ - b sin θ, a sin θ + b cos θ), summing over the rows of A and of β:

.. math::

    \log \pi(\theta) = -\tfrac12 \sum \Bigl[\frac{(a c - b s)^2}{v} + \frac{(a s + b c)^2}{w}\Bigr]
    = \tfrac{Q - P}{4} \cos 2\theta - \tfrac{S}{2} \sin 2\theta + \text{const},

:math:`P = \sum (a^2/v + b^2/w)`, :math:`Q = \sum (b^2/v + a^2/w)`,
:math:`S = \sum a b\,(1/w - 1/v)` (c = cos θ, s = sin θ; c² = (1 + cos 2θ)/2, s² = (1 - cos 2θ)/2,
2cs = sin 2θ). So 2θ is von Mises with mean direction φ = atan2(-S/2, (Q - P)/4) and
concentration :math:`\kappa = \lVert((Q - P)/4, -S/2)\rVert`, and π has period π: θ = ω/2 + π B with ω ~ vM(φ, κ) and
B ~ Bernoulli(1/2) (the half turn flips the signs of both factors, another point of the orbit
with the same density). κ = 0 (equal variances) gives a uniform angle.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpyro.distributions as dist

from latentzoo.inference.updates import Move, unwrap

__all__ = ["rotation_angle_law", "factor_rotation_move"]

NORMAL = (dist.Normal,)


def rotation_angle_law(rows, variances, k, l):
    """(φ, κ) of the von Mises law of 2θ for the rotation of plane (k, l).

    Args:
        rows: (R, K) the rows that the prior does not leave invariant (A's and β's stacked).
        variances: (R, K) their prior variances (ξ and b).
        k, l: the plane's two factor indices (traced integers are fine).
    """
    a, b = rows[:, k], rows[:, l]
    v, w = variances[:, k], variances[:, l]
    P = jnp.sum(a * a / v + b * b / w)
    Q = jnp.sum(b * b / v + a * a / w)
    S = jnp.sum(a * b * (1.0 / w - 1.0 / v))
    x, y = 0.25 * (Q - P), -0.5 * S
    return jnp.arctan2(y, x), jnp.hypot(x, y)


def _rotate(values, sites, k, l, theta):
    """Rotate the (k, l) entries of every row of each site (..., K) by theta."""
    c, s = jnp.cos(theta), jnp.sin(theta)
    out = {}
    for name in sites:
        x = values[name]
        a, b = x[..., k], x[..., l]
        x = x.at[..., k].set(c * a - s * b)
        out[name] = x.at[..., l].set(s * a + c * b)
    return out


def factor_rotation_move(*, mixture: bool) -> Move:
    """The factor-rotation move: one exact Givens-angle draw per plane (k, l), k < l, in turn
    (K(K-1)/2 draws, each O(N + D + T)); ``mixture`` for the NL variants (μ rotates too).

    On K = 2 the orbit is one circle, and :func:`~latentzoo.inference.checks.check_move_on_orbit`
    (``periodic=True``) compares the move's angle with the exact law there.
    """
    sites = ("z", "A", "beta") + (("mu",) if mixture else ())

    def step(key, values, obs, priors):
        K = values["z"].shape[-1]
        var_a = unwrap(priors["A"]).scale ** 2
        var_b = unwrap(priors["beta"]).scale ** 2
        variances = jnp.concatenate([jnp.broadcast_to(var_a, values["A"].shape),
                                     jnp.broadcast_to(var_b, values["beta"].shape)], 0)
        planes = [(k, l) for k in range(K) for l in range(k + 1, K)]
        if not planes:
            return {s: values[s] for s in sites}
        ks = jnp.array([p[0] for p in planes])
        ls = jnp.array([p[1] for p in planes])

        def one(current, inputs):
            k, l, key = inputs
            k_angle, k_half = jax.random.split(key)
            rows = jnp.concatenate([current["A"], current["beta"]], 0)
            phi, kappa = rotation_angle_law(rows, variances, k, l)
            omega = dist.VonMises(phi, kappa).sample(k_angle)
            theta = 0.5 * omega + jnp.pi * jax.random.bernoulli(k_half)
            return {**current, **_rotate(current, sites, k, l, theta)}, None

        start = {s: values[s] for s in sites}
        out, _ = jax.lax.scan(one, start, (ks, ls, jax.random.split(key, len(planes))))
        return out

    # the orbit of plane (0, 1), for the checks on K = 2: t is the angle
    def orbit(values, t):
        return {**values, **_rotate(values, sites, 0, 1, jnp.reshape(t, ()))}

    def coordinate(reference, values):
        """The angle that takes the reference's first row of z to this one's, in (-pi, pi]."""
        r, v = reference["z"][0, :2], values["z"][0, :2]
        return jnp.arctan2(r[0] * v[1] - r[1] * v[0], r[0] * v[0] + r[1] * v[1])

    requires = {"z": NORMAL, "A": NORMAL, "beta": NORMAL, **({"mu": NORMAL} if mixture else {})}
    return Move("factor rotations (z, A, beta" + (", mu)" if mixture else ")"), sites, requires,
                step, orbit, None, coordinate, tempered=True)  # the likelihood is kept: any temperature
