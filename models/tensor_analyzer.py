r"""Tensor analyzers (TA) and their mixtures (MTA): factor analysis with multiplicative groups of
factors (Tang, Salakhutdinov & Hinton, ICML 2013; supplement eqs. 1-3 and 16).

Only the supplement is available. The model below is the reading consistent with every one of
its equations (``docs/models/tensor_analyzer.md`` says where it fills gaps): J latent groups
:math:`z_j \in \mathbb R^{d_j}`, :math:`y = [z_1; \dots; z_J]` (length :math:`P = \sum_j d_j`)
and the multilinear term :math:`T \times_2 z_1 \cdots \times_{J+1} z_J` of a tensor
:math:`T \in \mathbb R^{D \times d_1 \times \dots \times d_J}`,

.. math::

    z_{nj} \sim \mathcal N(0, I_{d_j}), \qquad
    x_n \mid z_n \sim \mathcal N\bigl(W y_n + T_{(1)} u_n + \mu,\ \mathrm{diag}(\Psi)\bigr),

with :math:`u_n = z_{n1} \otimes \dots \otimes z_{nJ}` (length :math:`Q = \prod_j d_j`, first group
slowest, so that ``T.reshape(D, Q) @ u`` is the contraction: the supplement's
:math:`z_J \otimes \dots \otimes z_1` with its column-major unfolding :math:`T_{(1)}` is the same
sum). The supplement has no mean; :math:`\mu` is added here. :math:`\Psi` holds the noise
*variances* (the paper's symbol). ``TA{D, d_1, d_2}`` names the sizes.

The mixture (MTA) has C components, each with its own :math:`W, T, \mu, \Psi`, weights
:math:`\pi` and labels :math:`c_n`; the latent groups are shared in form (the same
:math:`d_j`), drawn anew per row.

Priors live in :func:`default_priors` right below: edit them there, or pass ``priors={...}`` for
one call. ``W``, ``T``, ``mu``, ``z`` take elementwise Normals, ``Psi`` an elementwise InverseGamma
(the conjugate prior of a variance), ``pi`` the Dirichlet concentration. The same program serves
the Bayesian posterior (everything sampled, :func:`latentzoo.inference.ta.ta_updates`) and
maximum-likelihood fitting by Monte Carlo EM (the parameters as point values, only the latents
sampled). Identifiability: ``W``, ``T`` and the ``z_j`` are identified only up to the groups'
rotations and scalings (and sign flips); the marginal law of x and ``Psi`` are identified.
"""

from __future__ import annotations

import math
from string import ascii_lowercase

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

from latentzoo.models.shapes import data_sizes

__all__ = [
    "default_priors",
    "tensor_analyzer",
    "mixture_of_tensor_analyzers",
    "group_names",
    "kron_rows",
    "contract",
    "ta_mean",
    "sample_ta",
    "default_ta_data",
    "random_ta_parameters",
]


# ------------------------------------------------------------------------------- priors
def default_priors() -> dict:
    """The model's priors, elementwise (``pi``: the Dirichlet concentration). Edit here."""
    return {
        "pi": 1.0,  # Dirichlet concentration (float: symmetric; or a (C,) array); MTA only
        "W": dist.Normal(0.0, 1.0),  # additive loadings W_dp, iid
        "T": dist.Normal(0.0, 1.0),  # multiplicative loadings T_d,a,b, iid
        "mu": dist.Normal(0.0, 10.0),  # means mu_d
        "Psi": dist.InverseGamma(2.0, 1.0),  # noise variances Psi_d (shape, scale)
        "z": dist.Normal(0.0, 1.0),  # every group's factors (the model fixes N(0, I))
    }


# ---------------------------------------------------------------------------- structure
def group_names(d) -> tuple[str, ...]:
    """Site names of the latent groups: ("z_1", ..., "z_J") for group sizes ``d``."""
    return tuple(f"z_{j + 1}" for j in range(len(d)))


def kron_rows(zs):
    """Row-wise Kronecker product u_n = z_n1 ⊗ ... ⊗ z_nJ (first group slowest).
    zs: sequence of (..., d_j) -> (..., prod d_j)."""
    u = zs[0]
    for z in zs[1:]:
        u = (u[..., :, None] * z[..., None, :]).reshape(*z.shape[:-1], -1)
    return u


def contract(T, zs, skip: int | None = None):
    """T ×_2 z_1 ... ×_{J+1} z_J per row, leaving mode ``skip`` (if given) open.

    T: (D, d_1, ..., d_J) shared by the rows, or (N, D, d_1, ..., d_J) one per row (a mixture's
    ``T[c]``); zs: J arrays (N, d_j). Returns (N, D) when ``skip`` is None, else
    (N, D, d_skip): the matrix that multiplies z_skip in the mean (the group's effective loading
    given the other groups).
    """
    J = len(zs)
    letters = ascii_lowercase[:J]
    t_sub = ("N" if T.ndim == J + 2 else "") + "D" + letters
    ins, ops = [t_sub], [T]
    for j, z in enumerate(zs):
        if j == skip:
            continue
        ins.append("N" + letters[j])
        ops.append(z)
    out = "ND" + ("" if skip is None else letters[skip])
    return jnp.einsum(",".join(ins) + "->" + out, *ops)


def ta_mean(W, T, mu, zs):
    """E[x_n | z_n] = W y_n + T_(1) u_n + mu. Shapes: W (D, P), T (D, d_1..d_J), mu (D,),
    zs J arrays (N, d_j) -> (N, D)."""
    y = jnp.concatenate(zs, axis=-1)
    return y @ W.T + contract(T, zs) + mu


def _sizes(d):
    d = tuple(int(v) for v in d)
    if len(d) < 1 or min(d) < 1:
        raise ValueError(f"Group sizes d must be one or more positive integers, got {d}.")
    return d, sum(d), math.prod(d)


def _priors(priors):
    return {**default_priors(), **(priors or {})}


# -------------------------------------------------------------------------------- models
def _prior_means(p, d):
    """The groups' prior means as one-row arrays [(1, d_j)]: E[x] = W E[y] + T_(1) E[u] + mu,
    with E[u] = E[z_1] ⊗ ... ⊗ E[z_J] because the groups are independent a priori."""
    return [jnp.broadcast_to(p["z"].mean, (1, dj)) for dj in d]


def _latent_groups(p, d):
    return [numpyro.sample(name, p["z"].expand([dj]).to_event(1)) for name, dj in zip(group_names(d), d)]


def tensor_analyzer(X=None, *, d=(2, 2), N: int | None = None, D: int | None = None, priors=None):
    """A tensor analyzer as a NumPyro program.

    Args:
        X: data (N, D), or None to draw from the prior predictive.
        d: group sizes (d_1, ..., d_J).
        N, D: sizes, needed only when ``X`` is None.
        priors: optional dict overriding entries of :func:`default_priors`.

    Sites: ``W`` (D, P), ``T`` (D, d_1, ..., d_J), ``mu`` (D,), ``Psi`` (D,) noise variances,
    ``z_j`` (N, d_j) in plate ``N``, observed ``X`` (N, D) with one log-likelihood term per row;
    deterministic ``mean_x`` (D,) = E[x | parameters] (invariant to the groups' rotations).
    """
    N, D = data_sizes(X, N, D, "tensor_analyzer")
    d, P, _ = _sizes(d)
    p = _priors(priors)
    with numpyro.plate("D", D, dim=-1):
        mu = numpyro.sample("mu", p["mu"])
        Psi = numpyro.sample("Psi", p["Psi"])
        W = numpyro.sample("W", p["W"].expand([P]).to_event(1))
        T = numpyro.sample("T", p["T"].expand(list(d)).to_event(len(d)))
    numpyro.deterministic("mean_x", ta_mean(W, T, mu, _prior_means(p, d))[0])
    with numpyro.plate("N", N, dim=-1):
        zs = _latent_groups(p, d)
        numpyro.sample("X", dist.Normal(ta_mean(W, T, mu, zs), jnp.sqrt(Psi)).to_event(1), obs=X)


def mixture_of_tensor_analyzers(
    X=None, *, d=(2, 2), C: int = 2, N: int | None = None, D: int | None = None, priors=None
):
    """A mixture of C tensor analyzers as a NumPyro program.

    Sites: ``pi`` (C,), per component ``W`` (C, D, P), ``T`` (C, D, d_1, ..., d_J), ``mu``
    (C, D), ``Psi`` (C, D); per row the label ``c`` (N,) and the groups ``z_j`` (N, d_j);
    observed ``X`` (N, D); deterministic ``mean_x`` (D,) = E[x | parameters] and ``Psi_mean``
    (D,) = sum_k pi_k Psi_k, both invariant to relabelling the components.
    """
    N, D = data_sizes(X, N, D, "mixture_of_tensor_analyzers")
    d, P, _ = _sizes(d)
    p = _priors(priors)
    alpha = jnp.broadcast_to(jnp.asarray(p["pi"], dtype=jnp.result_type(float)), (C,))
    pi = numpyro.sample("pi", dist.Dirichlet(alpha))
    with numpyro.plate("D", D, dim=-1), numpyro.plate("C", C, dim=-2):
        mu = numpyro.sample("mu", p["mu"])
        Psi = numpyro.sample("Psi", p["Psi"])
        W = numpyro.sample("W", p["W"].expand([P]).to_event(1))
        T = numpyro.sample("T", p["T"].expand(list(d)).to_event(len(d)))
    # Summaries invariant to relabelling the components (and to the groups' rotations): what a
    # convergence verdict can look at, since W, T, mu and Psi switch labels between chains.
    numpyro.deterministic("mean_x", pi @ jax.vmap(lambda *a: ta_mean(*a, _prior_means(p, d))[0])(W, T, mu))
    numpyro.deterministic("Psi_mean", pi @ Psi)
    with numpyro.plate("N", N, dim=-1):
        c = numpyro.sample("c", dist.Categorical(pi))
        zs = _latent_groups(p, d)
        y = jnp.concatenate(zs, axis=-1)
        mean = jnp.einsum("ndp,np->nd", W[c], y) + contract(T[c], zs) + mu[c]
        numpyro.sample("X", dist.Normal(mean, jnp.sqrt(Psi[c])).to_event(1), obs=X)


# --------------------------------------------------------------------------- default data
def random_ta_parameters(rng, D: int, d=(2, 2), *, C: int | None = None, noise: float = 0.1,
                         additive: float = 1.0, multiplicative: float = 1.0):
    """Random TA (C None) or MTA parameters, numpy: W ~ N(0, additive^2), T ~ N(0,
    multiplicative^2), mu ~ N(0, 1) (MTA: component means 3 apart on average), Psi = noise^2."""
    d, P, _ = _sizes(d)
    lead = () if C is None else (C,)
    params = {
        "W": additive * rng.normal(size=(*lead, D, P)),
        "T": multiplicative * rng.normal(size=(*lead, D, *d)),
        "mu": (1.0 if C is None else 3.0) * rng.normal(size=(*lead, D)),
        "Psi": np.full((*lead, D), noise**2),
    }
    if C is not None:
        params["pi"] = np.full(C, 1.0 / C)
    return params


def sample_ta(rng, params, N: int, d=(2, 2)):
    """N rows from a TA (or MTA, when ``params`` has ``pi``) with numpy: X (N, D), labels (N,)."""
    d, _, _ = _sizes(d)
    zs = [rng.normal(size=(N, dj)) for dj in d]
    if "pi" in params:
        c = rng.choice(len(params["pi"]), size=N, p=params["pi"])
    else:
        c = np.zeros(N, dtype=int)
        params = {k: v[None] for k, v in params.items()}
    y = np.concatenate(zs, -1)
    u = np.asarray(kron_rows([jnp.asarray(z) for z in zs]))
    Tm = params["T"].reshape(*params["T"].shape[:2], -1)
    mean = np.einsum("ndp,np->nd", params["W"][c], y) + np.einsum("ndq,nq->nd", Tm[c], u)
    mean += params["mu"][c]
    return mean + np.sqrt(params["Psi"][c]) * rng.normal(size=mean.shape), c


def default_ta_data(seed: int = 0, N: int = 400, D: int = 6, d=(2, 2)):
    """The embedded default: N rows from a random TA{D, d_1, d_2} with unit additive loadings,
    multiplicative loadings of scale 0.5 and noise s.d. 0.3. Returns X (N, D). (With a
    multiplicative term as strong as the additive one and little noise, Gibbs chains started
    from the data stop in different local modes: see docs/models/tensor_analyzer.md.)"""
    rng = np.random.default_rng(seed)
    params = random_ta_parameters(rng, D, d, noise=0.3, multiplicative=0.5)
    return sample_ta(rng, params, N, d)[0]
