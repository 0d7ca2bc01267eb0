r"""Noisy-OR component analyzer (NOCA): binary sources that switch binary findings on
(lecture "Noisy-OR Component Analyzer"; Singliar & Hauskrecht, JMLR 2006).

.. math::

    s_{ni} \sim \mathrm{Bernoulli}(\pi_i), \qquad
    P(x_{nj} = 0 \mid s_n) = (1 - p_{0j}) \prod_{i=1}^K (1 - p_{ij})^{s_{ni}}
                           = \exp\big(-\theta_{0j} - \textstyle\sum_i \theta_{ij} s_{ni}\big),

with the lecture's parameterisation :math:`\theta_{ij} = -\log(1 - p_{ij}) \ge 0` and a leak
:math:`\theta_{0j} > 0` (the leak keeps :math:`P(x_{nj}=1\mid s)` positive, so a finding that is on
with no active source has finite log-probability; every bound below needs it).

Priors (:func:`default_priors`): :math:`\pi_i \sim \mathrm{Beta}(a_\pi, b_\pi)` and, for every
noisy-OR strength, a Beta prior on the probability itself, :math:`p_{ij} \sim \mathrm{Beta}(a, b)`
and :math:`p_{0j} \sim \mathrm{Beta}(a_0, b_0)`, written on the model's sites
:math:`\theta = -\log(1 - p)` as :class:`NoisyOrBeta`. Its log density,
:math:`(a-1)\log(1-e^{-\theta}) - b\theta - \log B(a, b)`, has the form of the log-likelihood of
:math:`a-1` findings that are on and :math:`b` that are off, so the point fits (MAP-EM,
:mod:`latentzoo.inference.noca.em`) add these as pseudo-counts; the MCMC samples the same model.

Shapes: ``pi`` (K,), ``theta`` (K, D) (row i = source i, as :math:`\theta_{ij}`), ``theta0`` (D,),
``s`` (N, K) in nested plates ``N`` (dim -2) x ``K`` (dim -1) (``DiscreteGibbs`` cannot sample
``to_event`` Bernoulli sites), ``X`` (N, D) in plates ``N`` (dim -2) x ``D`` (dim -1).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from jax.scipy.special import betaln, digamma, polygamma
from numpyro.distributions import constraints
from numpyro.distributions.util import promote_shapes

from latentzoo.models.shapes import data_sizes

__all__ = [
    "NoisyOrBeta",
    "default_priors",
    "noca",
    "noisy_or_logits",
    "shape_sources",
    "simulate_noca",
    "default_noca_data",
    "basket_parameters",
    "attribute_parameters",
]


# ------------------------------------------------------------------------------- priors
class NoisyOrBeta(dist.Distribution):
    r"""The noisy-OR strength :math:`\theta = -\log(1 - p)` of a probability
    :math:`p \sim \mathrm{Beta}(a, b)` (``concentration1`` = a, ``concentration0`` = b).

    Density on :math:`\theta > 0` (the Beta density times :math:`dp/d\theta = e^{-\theta}`):

    .. math:: \log p(\theta) = (a - 1)\log(1 - e^{-\theta}) - b\,\theta - \log B(a, b),

    i.e. the log-likelihood of :math:`a - 1` findings that are on and :math:`b` that are off under
    a gate of strength :math:`\theta` alone. ``a = 1`` is the exponential distribution of rate b
    (:math:`p = 1` is never favoured); the MAP updates need ``a >= 1`` (log-concave density).
    """

    arg_constraints = {"concentration1": constraints.positive, "concentration0": constraints.positive}
    support = constraints.positive
    pytree_data_fields = ("concentration1", "concentration0")

    def __init__(self, concentration1, concentration0, *, validate_args=None):
        self.concentration1, self.concentration0 = promote_shapes(concentration1, concentration0)
        batch_shape = jax.lax.broadcast_shapes(jnp.shape(concentration1), jnp.shape(concentration0))
        self.concentration1 = jnp.broadcast_to(self.concentration1, batch_shape)
        self.concentration0 = jnp.broadcast_to(self.concentration0, batch_shape)
        super().__init__(batch_shape=batch_shape, validate_args=validate_args)

    def sample(self, key, sample_shape=()):
        # 1 - p ~ Beta(b, a); theta = -log(1 - p), kept finite where 1 - p underflows
        u = dist.Beta(self.concentration0, self.concentration1).sample(key, sample_shape)
        return -jnp.log(jnp.clip(u, jnp.finfo(jnp.result_type(float)).tiny, 1.0))

    def log_prob(self, value):
        a, b = self.concentration1, self.concentration0
        # (a - 1) * log(1 - e^-theta), written as 0 for a = 1 so theta -> 0 stays finite
        on = jnp.where(a == 1.0, 0.0, (a - 1.0) * jnp.log(-jnp.expm1(-value)))
        return on - b * value - betaln(a, b)

    @property
    def mean(self):
        # E[-log U] for U = 1 - p ~ Beta(b, a)
        return digamma(self.concentration0 + self.concentration1) - digamma(self.concentration0)

    @property
    def variance(self):
        return polygamma(1, self.concentration0) - polygamma(1, self.concentration0 + self.concentration1)


def default_priors() -> dict[str, dist.Distribution]:
    """The model's priors, elementwise. Edit here (or pass ``priors={...}`` to :func:`noca`).

    The point fits read these hyperparameters as pseudo-counts (docs/models/noca.md, "MAP-EM")."""
    return {
        "pi": dist.Beta(1.0, 1.0),  # source probabilities pi_i
        # p_ij ~ Beta(1, 2): every gate counts 2 findings that stayed off (shrinks p towards 0,
        # so a source seen in a few rows cannot set its p to 1)
        "theta": NoisyOrBeta(1.0, 2.0),
        # leak p_0j ~ Beta(2, 2): one finding on and two off per item, the add-one smoothing of
        # an independent Bernoulli (an item never on in training keeps a leak of ~1/N)
        "theta0": NoisyOrBeta(2.0, 2.0),
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


def basket_parameters(seed: int = 0, D: int = 169, K: int = 8):
    """A grocery-basket-like NOCA: (theta (K, D), theta0 (D,), pi (K,)).

    Item popularity is skewed (leak p_0j log-normal around 0.8 %, clipped to [0.05 %, 20 %]);
    each of K rare sources (pi_i ~ U(0.04, 0.15)) turns on 3-6 items with p_ij ~ U(0.3, 0.8).
    At D = 169 about 2.6 % of the entries are ones (about 4.4 items per row)."""
    rng = np.random.default_rng(seed)
    p0 = np.clip(np.exp(rng.normal(np.log(0.008), 1.1, D)), 5e-4, 0.2)
    theta = np.zeros((K, D))
    for i in range(K):
        items = rng.choice(D, rng.integers(3, 7), replace=False)
        theta[i, items] = -np.log1p(-rng.uniform(0.3, 0.8, items.size))
    return theta, -np.log1p(-p0), rng.uniform(0.04, 0.15, K)


def attribute_parameters(seed: int = 0, D: int = 85, K: int = 6):
    """An attribute-matrix-like NOCA (animals x attributes): (theta (K, D), theta0 (D,), pi (K,)).

    K sources (pi_i ~ U(0.2, 0.5)) each turn on 10-20 attributes with p_ij ~ U(0.6, 0.95); leaks
    p_0j ~ U(0.03, 0.15). About 30 % of the entries are ones."""
    rng = np.random.default_rng(seed)
    p0 = rng.uniform(0.03, 0.15, D)
    theta = np.zeros((K, D))
    for i in range(K):
        items = rng.choice(D, rng.integers(10, 21), replace=False)
        theta[i, items] = -np.log1p(-rng.uniform(0.6, 0.95, items.size))
    return theta, -np.log1p(-p0), rng.uniform(0.2, 0.5, K)
