r"""Max-margin rank-likelihood discriminative factor model (Yuan, Henao, Tsalik, Langley & Carin,
ICML 2015; supplement section 1), four variants: G-L, R-L, G-NL, R-NL.

Latent factors :math:`w_{i,n} = a_i^\top z_n` (features i = 1..D, samples n = 1..N) explain the
features, and a Bayesian SVM on the factor scores :math:`z_n` explains the labels
:math:`y_n \in \{-1, +1\}`:

- **G** (Gaussian): :math:`x_{i,n} \sim \mathcal N(a_i^\top z_n, 1/\tau_i)`.
- **R** (rank): only the order of each feature's values is used. For every ordered pair
  (lo, hi) of samples with :math:`x_{i,lo} < x_{i,hi}` adjacent in feature i's order, the
  max-margin rank factor :math:`\exp\{-2\max(0, \epsilon - (w_{i,hi} - w_{i,lo}))\}` (the
  Polson–Scott hinge). The pairs are :func:`rank_pairs`: ties are grouped, and each pair enters
  once (the supplement's product over n counts every adjacent pair twice, once as n's upper and
  once as its neighbour's lower factor).
- **L** (linear): :math:`z_n \sim \mathcal N(0, I_K)` and one classifier :math:`\beta`: the
  label factor :math:`\exp\{-2\max(0, 1 - y_n \beta^\top z_n)\}`.
- **NL** (nonlinear): a truncated stick-breaking DP mixture with T components:
  :math:`t(n) \sim \mathrm{Mult}(q)`, :math:`q_t = \nu_t\prod_{l<t}(1-\nu_l)`,
  :math:`\nu_t \sim \mathrm{Beta}(1, \alpha)` (:math:`\nu_T = 1`), :math:`\alpha \sim
  \mathrm{Ga}(\alpha_s, \alpha_r)`, :math:`z_n \sim \mathcal N(\mu_{t(n)}, \psi_{t(n)}^{-1} I_K)`,
  :math:`\mu_t \sim \mathcal N(0, I_K)`, :math:`\psi_t \sim \mathrm{Ga}(\psi_s, \psi_r)`, and a
  classifier :math:`\beta^{(t)}` per component.

Loadings and coefficients get the three-parameter-beta normal shrinkage (Armagan, Dunson &
Clyde 2011), Gamma as (shape, rate):
:math:`a_{i,k} \sim \mathcal N(0, \xi_{i,k})`, :math:`\xi_{i,k} \sim \mathrm{Ga}(r_a, \eta_{i,k})`,
:math:`\eta_{i,k} \sim \mathrm{Ga}(s_a, \Phi_k)`, :math:`\Phi_k \sim \mathrm{Ga}(\tfrac12,
\tilde\Phi)`, :math:`\tilde\Phi \sim \mathrm{Ga}(\tfrac12, 1)`; the same for
:math:`\beta^{(t)}_k` with :math:`b`, :math:`e` and one global :math:`\Phi^{(\beta)}`.
:math:`r = s = \tfrac12` is the horseshoe.

**The augmentation is part of the program.** Polson & Scott write each hinge as a scale mixture,
:math:`e^{-2\max(0, c)} = \int_0^\infty (2\pi\lambda)^{-1/2} e^{-(c + \lambda)^2 / (2\lambda)}
d\lambda`, so the model carries one :math:`\lambda` per hinge (sites ``lam_rank``, ``lam_svm``)
and the hinge's margin as an observation: ``rank_margin`` :math:`\sim \mathcal N(w_{hi} - w_{lo}
- \lambda, \lambda)` observed at :math:`\epsilon`, ``svm_margin`` :math:`\sim \mathcal N(y_n
\beta^\top z_n - \lambda, \lambda)` observed at 1. With the paper's flat "prior" on
:math:`\lambda` (``lam_rate = None``) integrating :math:`\lambda` out gives exactly the hinge
factors. That flat prior is improper, so the prior predictive cannot be drawn; with a proper
:math:`\lambda \sim \mathrm{Exp}(\text{lam\_rate})` the whole program is generative (margins
included) and the Geweke and SBC tests run on it. The Gibbs updates are exact for both.
``marginal=True`` writes the hinges as ``numpyro.factor`` terms instead (no :math:`\lambda`):
the form NUTS runs on.

Sizes: ``y`` (N,) labels in {-1, +1}; the R variants take ``pairs`` (:class:`RankPairs`, P
pairs in all), the G variants ``D``. ``data`` is None (draw from the prior predictive) or a
dict of the observed sites (:func:`observed_data` builds it from (X, y)).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.distributions import constraints

from .tables import data_table

__all__ = [
    "VARIANTS",
    "default_priors",
    "RankPairs",
    "rank_pairs",
    "rank_cuts",
    "coarsen_ranks",
    "rank_factor_svm",
    "observed_data",
    "model_kwargs",
    "stick_weights",
    "default_rank_svm_data",
]

VARIANTS = ("G-L", "R-L", "G-NL", "R-NL")


# ------------------------------------------------------------------------------- priors
def default_priors() -> dict:
    """Hyperparameters of every prior in :func:`rank_factor_svm`. Edit here, or pass
    ``priors={...}`` with the entries to change. Gamma(shape, rate) throughout.

    The supplement states none of them except the horseshoe shapes; the rest are ours.
    """
    return {
        "epsilon": 1.0,  # rank margin ε (the scale of w is set by it, as 1 sets the SVM's)
        "r_a": 0.5, "s_a": 0.5,  # TPB shapes of the loadings A (1/2, 1/2: horseshoe)
        "r_beta": 0.5, "s_beta": 0.5,  # TPB shapes of the coefficients beta
        "Phi_shape": 0.5,  # Φ_k^(a) ~ Ga(1/2, Φ̃^(a)); Φ^(β) ~ Ga(1/2, Φ̃^(β))
        "Phi_tilde_shape": 0.5, "Phi_tilde_rate": 1.0,  # Φ̃ ~ Ga(1/2, 1)
        "tau_shape": 1.0, "tau_rate": 0.1,  # G variants: noise precision τ_i
        "psi_shape": 1.0, "psi_rate": 1.0,  # NL: cluster precision ψ_t ~ Ga(ψ_s, ψ_r)
        "alpha_shape": 1.0, "alpha_rate": 1.0,  # NL: DP concentration α ~ Ga(α_s, α_r)
        "mu_scale": 1.0,  # NL: cluster means μ_t ~ N(0, mu_scale² I)
        # Augmentation λ: None is the paper's flat measure (the hinge exactly; not generative);
        # a rate r > 0 makes it Exp(r), a proper generative program for the Geweke/SBC tests.
        "lam_rate": None,
    }


# ---------------------------------------------------------------------------- rank pairs
class RankPairs(NamedTuple):
    """The rank factors' pairs, all features together (P pairs).

    Attributes:
        feature: (P,) int, the feature i of each pair.
        lo, hi: (P,) int, the samples with x[lo, i] < x[hi, i].
        incidence: (N, L) int, for each sample the pairs it belongs to (padded with 0).
        role: (N, L) float, +1 where the sample is the pair's ``hi``, -1 where ``lo``, 0 padding.
    """

    feature: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    incidence: np.ndarray
    role: np.ndarray

    @property
    def num_pairs(self) -> int:
        return int(self.feature.shape[0])


def _feature_pairs(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) pairs of one feature: consecutive groups of tied values, member r of the upper
    group paired with member r mod n_g of the lower one (stable order inside a group)."""
    order = np.argsort(x, kind="stable")
    values, starts, counts = np.unique(x[order], return_index=True, return_counts=True)
    lo, hi = [], []
    for g in range(1, len(values)):
        lower = order[starts[g - 1]: starts[g - 1] + counts[g - 1]]
        upper = order[starts[g]: starts[g] + counts[g]]
        hi.append(upper)
        lo.append(lower[np.arange(len(upper)) % len(lower)])
    if not hi:
        return np.zeros(0, int), np.zeros(0, int)
    return np.concatenate(lo), np.concatenate(hi)


def rank_pairs(X) -> RankPairs:
    """The pairs of :class:`RankPairs` from the data's within-feature order, X (N, D).

    Ties are grouped: tied samples share no factor, and every sample of a value group is paired
    with one sample of the next lower group (member r with member r mod n_lower). So a constant
    feature contributes nothing, a binary feature puts each 1 above one of the 0s, and with no
    ties the pairs are the N - 1 neighbours in the sorted order: P <= D (N - 1), each sample in at
    most two pairs per feature. A monotone increasing transform of any column leaves the pairs
    unchanged (the point of the rank likelihood).
    """
    X = np.asarray(X)
    N, D = X.shape
    feature, lo, hi = [], [], []
    for i in range(D):
        l, h = _feature_pairs(X[:, i])
        feature.append(np.full(len(l), i))
        lo.append(l)
        hi.append(h)
    feature, lo, hi = (np.concatenate(a).astype(np.int32) for a in (feature, lo, hi))
    count = np.bincount(lo, minlength=N) + np.bincount(hi, minlength=N)
    L = max(int(count.max()) if N else 0, 1)
    incidence = np.zeros((N, L), np.int32)
    role = np.zeros((N, L))
    fill = np.zeros(N, int)
    for p in range(len(feature)):
        for n, r in ((hi[p], 1.0), (lo[p], -1.0)):
            incidence[n, fill[n]] = p
            role[n, fill[n]] = r
            fill[n] += 1
    return RankPairs(feature, lo, hi, incidence, role)


def rank_cuts(X, levels: int) -> list[np.ndarray]:
    """Per column of X (N, D), the cut points that split its values into at most ``levels``
    groups of about equal size: order statistics of the column itself (never interpolated), so a
    monotone increasing transform of the column transforms its cuts with it. A column with at
    most ``levels`` distinct values gets no cuts (it is kept as it is)."""
    X = np.asarray(X, float)
    if isinstance(levels, bool) or not isinstance(levels, (int, np.integer)) or levels < 2:
        raise ValueError(f"levels must be an integer of at least 2, got {levels!r}.")
    cuts = []
    for j in range(X.shape[1]):
        values = np.unique(X[:, j])
        if len(values) <= levels:
            cuts.append(values[1:])  # each distinct value its own group
            continue
        ordered = np.sort(X[:, j])  # a group starts at the sample at each multiple of N/levels
        cuts.append(np.unique(ordered[(np.arange(1, levels) * len(ordered)) // levels]))
    return cuts


def coarsen_ranks(X, cuts) -> np.ndarray:
    """X (M, D) replaced by each entry's group index under ``cuts`` (:func:`rank_cuts`): the
    number of a column's cut points at or below the value. New samples go through the training
    cuts, so their ranks are inserted among the training groups."""
    X = np.asarray(X, float)
    return np.stack([np.searchsorted(c, X[:, j], side="right") for j, c in enumerate(cuts)], 1).astype(float)


def stick_weights(nu):
    """Truncated stick-breaking weights q (T,) from nu (T-1,): q_t = nu_t prod_{l<t} (1 - nu_l),
    the last component taking the remainder (nu_T = 1)."""
    nu = jnp.concatenate([nu, jnp.ones(nu.shape[:-1] + (1,))], -1)
    rest = jnp.concatenate([jnp.ones(nu.shape[:-1] + (1,)), jnp.cumprod(1.0 - nu[..., :-1], -1)], -1)
    return nu * rest


def _lam_prior(rate, shape):
    if rate is None:
        return dist.ImproperUniform(constraints.positive, (), ()).expand(shape)
    return dist.Exponential(rate).expand(shape)


def _tpb(prefix: str, names: tuple[str, str], shape, p, global_shape):
    """Three-parameter-beta normal variances (shape) with their hierarchy's sites:
    Phi_tilde_<prefix> (), Phi_<prefix> (global_shape), then names = (rate site, variance site)."""
    Phi_tilde = numpyro.sample(f"Phi_tilde_{prefix}", dist.Gamma(p["Phi_tilde_shape"], p["Phi_tilde_rate"]))
    Phi = numpyro.sample(f"Phi_{prefix}", dist.Gamma(p["Phi_shape"], Phi_tilde).expand(global_shape).to_event(len(global_shape)))
    r, s = p[f"r_{prefix}"], p[f"s_{prefix}"]
    eta = numpyro.sample(names[0], dist.Gamma(s, Phi).expand(shape).to_event(len(shape)))
    return numpyro.sample(names[1], dist.Gamma(r, eta).to_event(len(shape)))


# -------------------------------------------------------------------------------- model
def rank_factor_svm(
    data=None,
    *,
    y,
    K: int,
    variant: str = "R-L",
    pairs: RankPairs | None = None,
    D: int | None = None,
    T: int = 5,
    priors=None,
    marginal: bool = False,
):
    """The discriminative factor model as a NumPyro program (supplement section 1).

    Args:
        data: None, or the observed sites: ``{"X": (N, D)}`` (G variants) or
            ``{"rank_margin": (P,)}`` (R variants), with ``"svm_margin": (N,)``.
            :func:`observed_data` builds it (margins at ε and 1).
        y: labels (N,) in {-1, +1} (a fixed covariate: the hinge is a pseudo-likelihood of y).
        K: number of factors. variant: one of :data:`VARIANTS`.
        pairs: the rank pairs (R variants). D: number of features (G variants; R reads it from
            ``pairs`` unless given). T: truncation of the DP mixture (NL variants; L uses 1).
        priors: entries overriding :func:`default_priors`.
        marginal: True writes the hinges as ``numpyro.factor`` with λ integrated out.

    Sites: ``A`` (D, K) loadings with ``xi_a``, ``eta_a`` (D, K), ``Phi_a`` (K,),
    ``Phi_tilde_a`` (); ``beta`` (T, K) coefficients (T = 1 for L) with ``b_beta``, ``e_beta``
    (T, K), ``Phi_beta`` (), ``Phi_tilde_beta`` (); ``z`` (N, K); NL: ``alpha`` (), ``nu``
    (T-1,), ``mu`` (T, K), ``psi`` (T,), ``t`` (N,); G: ``tau`` (D,), observed ``X``; R:
    ``lam_rank`` (P,), observed ``rank_margin`` (P,); ``lam_svm`` (N,), observed ``svm_margin``
    (N,); deterministic ``u`` (N,) = β_{t(n)}ᵀ z_n, the classifier's score.
    """
    if variant not in VARIANTS:
        raise ValueError(f"Unknown variant {variant!r}; choose one of {', '.join(VARIANTS)}.")
    p = {**default_priors(), **(priors or {})}
    gaussian, mixture = variant.startswith("G"), variant.endswith("NL")
    # the labels and pairs are data tables: the updates read them from the trace, so a fit passes
    # them as arguments of the compiled program (see models/tables.py)
    y = data_table("y", jnp.asarray(y, dtype=jnp.result_type(float)))
    N = y.shape[0]
    if gaussian:
        if D is None:
            if data is None or "X" not in data:
                raise ValueError("The G variants need D (or data with 'X').")
            D = data["X"].shape[1]
    else:
        if pairs is None:
            raise ValueError("The R variants need the rank pairs (see rank_pairs).")
        if D is None:
            if isinstance(pairs.feature, jax.core.Tracer):
                raise ValueError("The R variants need D when their pairs are traced arguments.")
            D = int(np.max(pairs.feature)) + 1
        pairs = data_table("pairs", pairs)
    T = T if mixture else 1
    data = data or {}

    # loadings A (d x K) and coefficients beta (T x K), three-parameter-beta normal shrinkage
    xi_a = _tpb("a", ("eta_a", "xi_a"), (D, K), p, (K,))
    A = numpyro.sample("A", dist.Normal(0.0, jnp.sqrt(xi_a)).to_event(2))
    b_beta = _tpb("beta", ("e_beta", "b_beta"), (T, K), p, ())
    beta = numpyro.sample("beta", dist.Normal(0.0, jnp.sqrt(b_beta)).to_event(2))

    # factor scores z_n: N(0, I) (L) or a truncated DP mixture of isotropic Gaussians (NL)
    if mixture:
        alpha = numpyro.sample("alpha", dist.Gamma(p["alpha_shape"], p["alpha_rate"]))
        nu = numpyro.sample("nu", dist.Beta(1.0, alpha).expand([T - 1]).to_event(1))
        mu = numpyro.sample("mu", dist.Normal(0.0, p["mu_scale"]).expand([T, K]).to_event(2))
        psi = numpyro.sample("psi", dist.Gamma(p["psi_shape"], p["psi_rate"]).expand([T]).to_event(1))
        with numpyro.plate("N", N):
            t = numpyro.sample("t", dist.Categorical(probs=stick_weights(nu)))
        z = numpyro.sample("z", dist.Normal(mu[t], 1.0 / jnp.sqrt(psi[t])[:, None]).to_event(2))
    else:
        t = jnp.zeros(N, jnp.int32)
        z = numpyro.sample("z", dist.Normal(0.0, 1.0).expand([N, K]).to_event(2))
    u = numpyro.deterministic("u", jnp.sum(beta[t] * z, -1))

    # features: Gaussian, or the rank factors of the pairs
    if gaussian:
        tau = numpyro.sample("tau", dist.Gamma(p["tau_shape"], p["tau_rate"]).expand([D]).to_event(1))
        numpyro.sample("X", dist.Normal(z @ A.T, 1.0 / jnp.sqrt(tau)).to_event(2), obs=data.get("X"))
    else:
        diff = jnp.sum(A[pairs.feature] * (z[pairs.hi] - z[pairs.lo]), -1)  # w_hi - w_lo (P,)
        _hinge("rank", diff, data.get("rank_margin"), p, marginal)
    _hinge("svm", y * u, data.get("svm_margin"), p, marginal)


def _hinge(name: str, score, margin, p, marginal: bool):
    """exp{-2 max(0, margin - score)} per entry: augmented (λ site, observed margin) or as a
    factor. The margin defaults to ε for rank pairs and 1 for the SVM."""
    if marginal:
        if margin is None:
            margin = p["epsilon"] if name == "rank" else 1.0
        numpyro.factor(f"{name}_hinge", -2.0 * jnp.sum(jnp.maximum(0.0, margin - score)))
        return
    lam = numpyro.sample(f"lam_{name}", _lam_prior(p["lam_rate"], score.shape).to_event(1))
    numpyro.sample(f"{name}_margin", dist.Normal(score - lam, jnp.sqrt(lam)).to_event(1), obs=margin)


# ------------------------------------------------------------------------------- data
def observed_data(X, y, variant: str, priors=None):
    """``(data, kwargs)`` for :func:`rank_factor_svm` from features X (N, D) and labels y (N,):
    the observed sites at their margins (ε for rank pairs, 1 for the SVM) and the sizes."""
    p = {**default_priors(), **(priors or {})}
    X = np.asarray(X, float)
    y = np.asarray(y, float)
    data = {"svm_margin": jnp.ones(len(y))}
    kwargs = {"y": jnp.asarray(y), "variant": variant}
    if variant.startswith("G"):
        data["X"] = jnp.asarray(X)
        kwargs["D"] = X.shape[1]
    else:
        pairs = rank_pairs(X)
        data["rank_margin"] = jnp.full(pairs.num_pairs, float(p["epsilon"]))
        kwargs["pairs"] = pairs
        kwargs["D"] = X.shape[1]
    return data, kwargs


def model_kwargs(X, y, variant: str, *, K: int, T: int = 5, priors=None):
    """Everything :func:`rank_factor_svm` needs besides ``data``, from (X, y)."""
    _, kw = observed_data(X, y, variant, priors)
    return {**kw, "K": K, "T": T, **({"priors": priors} if priors else {})}


def default_rank_svm_data(seed: int = 0, N: int = 200):
    """Embedded default data: scikit-learn's shipped 8x8 digits, 3 against 5, N rows, pixels
    scaled to [0, 1]; labels -1 (a 3) and +1 (a 5). Returns (X (N, 64), y (N,))."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    keep = np.isin(digits.target, (3, 5))
    X, y = digits.data[keep] / 16.0, np.where(digits.target[keep] == 5, 1.0, -1.0)
    rows = np.random.default_rng(seed).permutation(len(y))[:N]
    return X[rows], y[rows]
