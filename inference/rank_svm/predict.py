r"""Posterior predictive class probabilities of the rank-likelihood factor SVM for new samples.

Given posterior draws θ (from :func:`~latentzoo.inference.rank_svm.fit_gibbs` or any sampler of
:func:`~latentzoo.models.rank_factor_svm.rank_factor_svm`) and the training features, a new
sample x* (D,) gets factor scores z* (and, for NL, a component t*) from their conditional given
θ and x*, **without** the label factor (its label is what is predicted):

- **G**: :math:`z^* \mid x^*, A, \tau` is Gaussian, precision :math:`s I + A^\top\mathrm{diag}
  (\tau)A` and linear term :math:`s m + A^\top\mathrm{diag}(\tau)x^*` with the prior's
  :math:`(m, s) = (0, 1)` (L) or :math:`(\mu_t, \psi_t)` (NL). For NL, t* is drawn first from
  :math:`p(t\mid x^*) \propto q_t\,\mathcal N(x^*; A\mu_t, AA^\top/\psi_t + \mathrm{diag}(1/\tau))`
  (Woodbury and the determinant lemma: only K x K factorisations). Exact draws.
- **R**: x* enters only through its place in each feature's training order
  (:func:`insert_ranks`): per feature i, a hinge :math:`e^{-2\max(0, \epsilon - (w^*_i -
  w_{i,lo}))}` with its lower neighbour and :math:`e^{-2\max(0, \epsilon - (w_{i,hi} -
  w^*_i))}` with its upper one, :math:`w^*_i = a_i^\top z^*`, :math:`w_{i,m} = a_i^\top z_m`
  with the training z of the same draw. As in the fit, each hinge is a Polson–Scott mixture, so
  a few Gibbs sweeps over :math:`(\lambda^*, t^*, z^*)` draw from the conditional:
  :math:`1/\lambda \sim \mathrm{IG}(1/|c|, 1)` with c = ε − score (drawn by
  :func:`~latentzoo.inference.gig.polson_scott_lambda`, the same IG written so that it stays
  finite at c = 0); :math:`t^* \mid z^* \propto q_t\,\mathcal N(z^*; \mu_t, \psi_t^{-1}I)`
  (NL); :math:`z^* \mid \lambda^*, t^*` Gaussian with precision :math:`sI + \sum_i
  (1/\lambda_{i,lo} + 1/\lambda_{i,hi})a_ia_i^\top` and linear term :math:`sm + \sum_i a_i[(w_{i,lo}
  + \epsilon + \lambda_{i,lo})/\lambda_{i,lo} + (w_{i,hi} - \epsilon - \lambda_{i,hi})/
  \lambda_{i,hi}]` (a missing neighbour drops its terms). The chain starts at the ridge fit of
  z* to the neighbours' midpoints, shrunk towards the neighbours' mean z; the states after
  ``burn_in`` sweeps are kept. The new hinges use the paper's flat λ measure whatever
  ``lam_rate`` the draws were made with.

The class probability of one state is the normalised pseudo-likelihood
:math:`p(y = +1 \mid u) = h(1 - u)/(h(1 - u) + h(1 + u))`, :math:`h(c) = e^{-2\max(0, c)}`,
:math:`u = \beta_{t^*}^\top z^*` (:func:`label_probability`); averaged over the kept states it is
:math:`p(y^* = +1 \mid \theta, x^*)`, and over draws the posterior predictive.

Through NumPyro: :func:`new_sample_labels` is a small program whose ``beta``, ``z_new`` and
``t_new`` are taken from :func:`new_sample_states`, so ``numpyro.infer.Predictive`` returns the
deterministic ``prob`` and the sampled labels ``y`` (:func:`posterior_predictive` does both).
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.distributions import constraints
from numpyro.infer import Predictive

from latentzoo.inference.gig import polson_scott_lambda
from latentzoo.models.rank_factor_svm import VARIANTS, default_priors, stick_weights

__all__ = [
    "small_cholesky",
    "forward_solve",
    "backward_solve",
    "small_gaussian_draw",
    "NewRanks",
    "insert_ranks",
    "label_probability",
    "new_sample_states",
    "predict_proba",
    "new_sample_labels",
    "posterior_predictive",
]


class NewRanks(NamedTuple):
    """Where new samples fall in each feature's training order.

    Attributes:
        lo, hi: (M, D) int, the training sample that is the lower / upper neighbour of new sample
            m in feature i (0 where there is none).
        has_lo, has_hi: (M, D) bool, whether that neighbour exists.
    """

    lo: np.ndarray
    hi: np.ndarray
    has_lo: np.ndarray
    has_hi: np.ndarray


def insert_ranks(X_train, X_new) -> NewRanks:
    """The neighbours of each new sample (rows of X_new (M, D)) among the training samples
    (rows of X_train (N, D)), feature by feature.

    Rule (ties): training values equal to x*_i are neither above nor below it. The lower
    neighbour is the nearest strictly lower training value and the upper neighbour the nearest
    strictly higher one; when several training samples share that value, the one adjacent to x*
    in the stable sorted order (the order :func:`~latentzoo.models.rank_factor_svm.rank_pairs`
    uses) is taken: the last of the lower group and the first of the upper group. Depends only on
    the joint order of training and new values, so a strictly increasing transform applied to
    both leaves it unchanged.
    """
    X_train, X_new = np.asarray(X_train, float), np.asarray(X_new, float)
    N = X_train.shape[0]
    order = np.argsort(X_train, axis=0, kind="stable")  # (N, D)
    lo, hi = np.zeros(X_new.shape, np.int32), np.zeros(X_new.shape, np.int32)
    has_lo, has_hi = np.zeros(X_new.shape, bool), np.zeros(X_new.shape, bool)
    for i in range(X_train.shape[1]):
        sorted_i = X_train[order[:, i], i]
        below = np.searchsorted(sorted_i, X_new[:, i], side="left") - 1  # last value < x*
        above = np.searchsorted(sorted_i, X_new[:, i], side="right")  # first value > x*
        has_lo[:, i], has_hi[:, i] = below >= 0, above < N
        lo[:, i] = order[np.clip(below, 0, N - 1), i]
        hi[:, i] = order[np.clip(above, 0, N - 1), i]
    return NewRanks(lo, hi, has_lo, has_hi)


def label_probability(u):
    """p(y = +1 | u) = h(1 - u) / (h(1 - u) + h(1 + u)), h(c) = exp(-2 max(0, c)): the SVM's
    hinge pseudo-likelihood normalised over the two labels (any shape)."""
    return jax.nn.sigmoid(2.0 * jnp.maximum(0.0, 1.0 + u) - 2.0 * jnp.maximum(0.0, 1.0 - u))


# ------------------------------------------------------------ small Gaussian blocks, plain jnp
# The draws below run inside a loop over sweeps that is vmapped over posterior draws. There,
# LAPACK's batched Cholesky (a custom call) has left XLA's CPU runtime waiting forever on its
# thread pool (jaxlib 0.10, batches of ~3000 10 x 10 matrices, intermittently), so these small
# K x K factorisations are written out in elementwise jnp operations, unrolled over K.
def small_cholesky(P):
    """Lower Cholesky factor of a batch of small SPD matrices (..., K, K)."""
    K = P.shape[-1]
    L = jnp.zeros_like(P)
    for j in range(K):
        d = jnp.sqrt(P[..., j, j] - jnp.sum(L[..., j, :j] ** 2, -1))
        col = (P[..., j + 1:, j] - jnp.sum(L[..., j + 1:, :j] * L[..., j, None, :j], -1)) / d[..., None]
        L = L.at[..., j, j].set(d).at[..., j + 1:, j].set(col)
    return L


def forward_solve(L, b):
    """Solve L x = b (L lower, (..., K, K); b (..., K))."""
    x = jnp.zeros_like(b)
    for j in range(b.shape[-1]):
        x = x.at[..., j].set((b[..., j] - jnp.sum(L[..., j, :j] * x[..., :j], -1)) / L[..., j, j])
    return x


def backward_solve(L, b):
    """Solve Lᵀ x = b (L lower)."""
    K = b.shape[-1]
    x = jnp.zeros_like(b)
    for j in reversed(range(K)):
        x = x.at[..., j].set((b[..., j] - jnp.sum(L[..., j + 1:, j] * x[..., j + 1:], -1)) / L[..., j, j])
    return x


def small_gaussian_draw(key, P, h):
    """One draw of N(P⁻¹h, P⁻¹) per row: x = L⁻ᵀ(L⁻¹h + ε), P = LLᵀ."""
    L = small_cholesky(P)
    return backward_solve(L, forward_solve(L, h) + jax.random.normal(key, h.shape, h.dtype))


# ------------------------------------------------------------------------ one posterior draw
def _prior_of_t(draw, t, K):
    """The z prior's precision s (M,) and mean m (M, K) of component t (M,) (L: N(0, I))."""
    if "mu" not in draw:
        return jnp.ones(t.shape), jnp.zeros(t.shape + (K,))
    return draw["psi"][t], draw["mu"][t]


def _t_logits_given_z(draw, z):
    """(M, T) log q_t + log N(z; μ_t, I/ψ_t): t*'s conditional without the label factor."""
    K = z.shape[-1]
    mu, psi = draw["mu"], draw["psi"]
    sq = jnp.sum((z[:, None, :] - mu[None]) ** 2, -1)
    return jnp.log(stick_weights(draw["nu"]))[None] + 0.5 * K * jnp.log(psi)[None] - 0.5 * psi[None] * sq


def _rank_states(key, draw, ranks, epsilon, num_sweeps, burn_in):
    """(R, M, K) z* and (R, M) t* after ``burn_in`` of ``num_sweeps`` sweeps, R = the rest."""
    A, z_train = draw["A"], draw["z"]
    D, K = A.shape
    M = ranks.lo.shape[0]
    mixture = "mu" in draw
    cols = jnp.arange(D)[None, :]
    w_train = z_train @ A.T  # (N, D)
    w_lo, w_hi = w_train[ranks.lo, cols], w_train[ranks.hi, cols]  # (M, D)
    m_lo, m_hi = ranks.has_lo.astype(A.dtype), ranks.has_hi.astype(A.dtype)
    # start: w* fitted to the middle of its neighbours (one side: ε beyond the one there is),
    # ridge-shrunk towards the neighbours' mean z (the right scale even where A is small)
    target = jnp.where(ranks.has_lo & ranks.has_hi, 0.5 * (w_lo + w_hi),
                       jnp.where(ranks.has_lo, w_lo + epsilon, w_hi - epsilon))
    known = (ranks.has_lo | ranks.has_hi).astype(A.dtype)
    z_sum = jnp.einsum("md,mdk->mk", m_lo, z_train[ranks.lo]) \
        + jnp.einsum("md,mdk->mk", m_hi, z_train[ranks.hi])
    z_bar = z_sum / jnp.maximum(1.0, jnp.sum(m_lo + m_hi, -1))[:, None]
    P0 = jnp.eye(K) + jnp.einsum("md,dk,dj->mkj", known, A, A)
    h0 = z_bar + jnp.einsum("md,dk->mk", known * target, A)
    L0 = small_cholesky(P0)
    z0 = backward_solve(L0, forward_solve(L0, h0))

    def sweep(state, key):
        z, t = state
        k_lo, k_hi, k_t, k_z = jax.random.split(key, 4)
        w = z @ A.T  # (M, D)
        lam_lo = polson_scott_lambda(k_lo, epsilon - (w - w_lo))
        lam_hi = polson_scott_lambda(k_hi, epsilon - (w_hi - w))
        if mixture:
            t = jax.random.categorical(k_t, _t_logits_given_z(draw, z), axis=-1).astype(t.dtype)
        s, m = _prior_of_t(draw, t, K)
        g_lo, g_hi = m_lo / lam_lo, m_hi / lam_hi
        P = s[:, None, None] * jnp.eye(K) + jnp.einsum("md,dk,dj->mkj", g_lo + g_hi, A, A)
        lin = g_lo * (w_lo + epsilon + lam_lo) + g_hi * (w_hi - epsilon - lam_hi)
        h = s[:, None] * m + lin @ A
        z = small_gaussian_draw(k_z, P, h)
        return (z, t), (z, t)

    keys = jax.random.split(key, num_sweeps)
    _, (zs, ts) = jax.lax.scan(sweep, (z0, jnp.zeros(M, jnp.int32)), keys)
    return zs[burn_in:], ts[burn_in:]


def _gaussian_states(key, draw, X_new, num_states):
    """(R, M, K) exact draws of z* | x*, θ and (R, M) t* | x*, θ (R = num_states)."""
    A, tau = draw["A"], draw["tau"]
    K = A.shape[1]
    M = X_new.shape[0]
    AtA = (A.T * tau) @ A  # Aᵀ diag(τ) A (K, K)
    b = (X_new * tau) @ A  # Aᵀ diag(τ) x* (M, K)
    k_t, k_z = jax.random.split(key)
    if "mu" in draw:
        mu, psi = draw["mu"], draw["psi"]
        prec = psi[:, None, None] * jnp.eye(K) + AtA  # (T, K, K)
        L = small_cholesky(prec)
        # log N(x*; Aμ_t, AAᵀ/ψ_t + diag(1/τ)) up to terms free of t, through K x K algebra:
        # r = x* - Aμ_t, rᵀC⁻¹r = rᵀdiag(τ)r - vᵀ prec_t⁻¹ v with v = Aᵀdiag(τ)r
        v = b[:, None, :] - (mu @ AtA)[None]  # (M, T, K)
        xtx = jnp.sum(X_new**2 * tau, -1)[:, None]  # (M, 1)
        rtr = xtx - 2.0 * (b @ mu.T) + jnp.einsum("tk,kj,tj->t", mu, AtA, mu)[None]
        sol = forward_solve(L[None], v)  # (M, T, K)
        quad = rtr - jnp.sum(sol**2, -1)
        logdet = 2.0 * jnp.sum(jnp.log(jnp.diagonal(L, axis1=-2, axis2=-1)), -1) - K * jnp.log(psi)
        logits = jnp.log(stick_weights(draw["nu"]))[None] - 0.5 * (logdet[None] + quad)
        t = jax.random.categorical(k_t, logits, axis=-1, shape=(num_states, M))
        P, h = prec[t], (psi[:, None] * mu)[t] + b[None]
    else:
        t = jnp.zeros((num_states, M), jnp.int32)
        P = jnp.eye(K) + AtA
        h = jnp.broadcast_to(b, (num_states, M, K))
    return small_gaussian_draw(k_z, P, h), t


# ----------------------------------------------------------------------------- the API
_NEEDED = {"G-L": ("A", "beta", "tau"), "R-L": ("A", "beta", "z"),
           "G-NL": ("A", "beta", "tau", "mu", "psi", "nu"),
           "R-NL": ("A", "beta", "z", "mu", "psi", "nu")}


def _draws(samples, variant: str, max_draws: int | None) -> dict:
    if hasattr(samples, "get_samples"):
        samples = samples.get_samples()
    if variant not in VARIANTS:
        raise ValueError(f"Unknown variant {variant!r}; choose one of {', '.join(VARIANTS)}.")
    missing = [s for s in _NEEDED[variant] if s not in samples]
    if missing:
        raise ValueError(f"The posterior draws lack {', '.join(missing)}, which {variant} "
                         "prediction needs.")
    draws = {s: jnp.asarray(samples[s]) for s in _NEEDED[variant]}
    S = draws["A"].shape[0]
    if max_draws is not None and S > max_draws:  # evenly spaced, so the thinning is deterministic
        keep = np.unique(np.linspace(0, S - 1, max_draws).round().astype(int))
        draws = {s: v[keep] for s, v in draws.items()}
    return draws


def _new_features(X_new, D: int) -> np.ndarray:
    X_new = np.asarray(X_new)
    if X_new.dtype == object or not (np.issubdtype(X_new.dtype, np.number) or X_new.dtype == bool):
        raise ValueError(f"The new samples must be numeric, got dtype {X_new.dtype}.")
    X_new = X_new.astype(float)
    if X_new.ndim != 2 or X_new.shape[1] != D:
        raise ValueError(f"The new samples must be a matrix with {D} columns (one row per "
                         f"sample), got shape {X_new.shape}.")
    if not np.all(np.isfinite(X_new)):
        raise ValueError(f"The new samples contain {int(np.sum(~np.isfinite(X_new)))} NaN or "
                         "infinite value(s).")
    return X_new


def new_sample_states(samples, X_train, X_new, *, variant: str, priors=None, seed: int = 0,
                      num_sweeps: int = 30, burn_in: int = 15, max_draws: int | None = None,
                      draw_batch: int = 16) -> dict:
    """Draws of the new samples' latents, R per posterior draw.

    Args:
        samples: posterior draws (a dict with leading axis S, or a finished ``MCMC``), with the
            sites of ``variant`` (A, beta; z for R; tau for G; mu, psi, nu for NL).
        X_train: (N, D) the training features the draws were fitted to (R: their order; G:
            unused, may be None). X_new: (M, D) new samples, on the training data's scale.
        variant: one of ``G-L, R-L, G-NL, R-NL``. priors: read for the rank margin ε.
        seed: the key of all draws. num_sweeps, burn_in: R variants' sweeps per draw, and
            how many are dropped (R = num_sweeps - burn_in kept; G draws R exact states).
        max_draws: use at most this many posterior draws (evenly spaced). draw_batch: draws
            processed together (memory).

    Returns: ``{"beta": (S, T, K), "z_new": (S, R, M, K), "t_new": (S, R, M)}``.
    """
    if not 0 <= burn_in < num_sweeps:
        raise ValueError(f"burn_in must be at least 0 and below num_sweeps ({num_sweeps}), "
                         f"got {burn_in}.")
    draws = _draws(samples, variant, max_draws)
    D = draws["A"].shape[1]
    X_new = _new_features(X_new, D)
    keys = jax.random.split(jax.random.PRNGKey(seed), draws["A"].shape[0])
    gaussian = variant.startswith("G")
    if gaussian:
        new = jnp.asarray(X_new)
    else:
        X_train = np.asarray(X_train, float)
        if X_train.ndim != 2 or X_train.shape[1] != D:
            raise ValueError(f"The training features must be the (N, {D}) matrix the draws were "
                             f"fitted to, got shape {X_train.shape}.")
        new = NewRanks(*(jnp.asarray(a) for a in insert_ranks(X_train, X_new)))
    epsilon = float({**default_priors(), **(priors or {})}["epsilon"])
    z_new, t_new = _states(keys, draws, new, epsilon, gaussian=gaussian, num_sweeps=int(num_sweeps),
                           burn_in=int(burn_in), batch=int(draw_batch))
    return {"beta": draws["beta"], "z_new": z_new, "t_new": t_new}


@partial(jax.jit, static_argnames=("gaussian", "num_sweeps", "burn_in", "batch"))
def _states(keys, draws, new, epsilon, *, gaussian, num_sweeps, burn_in, batch):
    """The states of every draw (compiled once per shape and setting)."""
    if gaussian:
        def one(args):
            return _gaussian_states(args[0], args[1], new, num_sweeps - burn_in)
    else:
        def one(args):
            return _rank_states(args[0], args[1], new, epsilon, num_sweeps, burn_in)
    return _map_in_batches(one, (keys, draws), batch)


def _map_in_batches(f, xs, batch: int):
    """``lax.map(f, xs, batch_size=batch)`` with the draws padded to a multiple of the batch (by
    repeating the last), so that XLA compiles one batched body and no remainder."""
    S = jax.tree_util.tree_leaves(xs)[0].shape[0]
    batch = max(1, min(batch, S))
    pad = -S % batch
    if pad:
        xs = jax.tree_util.tree_map(lambda a: jnp.concatenate([a, jnp.repeat(a[-1:], pad, 0)]), xs)
    out = jax.lax.map(f, xs, batch_size=batch)
    return jax.tree_util.tree_map(lambda a: a[:S], out)


def new_sample_labels(*, M: int, K: int, T: int = 1, R: int = 1):
    """The labels of M new samples as a NumPyro program, for ``numpyro.infer.Predictive`` with
    ``posterior_samples`` from :func:`new_sample_states`: ``beta`` (T, K), ``z_new`` (R, M, K) and
    ``t_new`` (R, M) are placeholders (improper; they are always given). Deterministic
    ``u`` (R, M) = β_{t*}ᵀz* and ``prob`` (M,) = p(y* = +1 | θ, x*) averaged over the R states;
    sampled ``y_is_positive`` (M,) ~ Bernoulli(prob) and deterministic ``y`` (M,) in {-1, +1}."""
    beta = numpyro.sample("beta", dist.ImproperUniform(constraints.real, (), (T, K)))
    z_new = numpyro.sample("z_new", dist.ImproperUniform(constraints.real, (), (R, M, K)))
    t_new = numpyro.sample("t_new", dist.ImproperUniform(constraints.nonnegative_integer, (), (R, M)))
    u = numpyro.deterministic("u", jnp.sum(beta[t_new] * z_new, -1))
    prob = numpyro.deterministic("prob", jnp.mean(label_probability(u), 0))
    positive = numpyro.sample("y_is_positive", dist.Bernoulli(probs=prob))
    numpyro.deterministic("y", 2 * positive - 1)


def posterior_predictive(samples, X_train, X_new, *, variant: str, seed: int = 0, **kw) -> dict:
    """``numpyro.infer.Predictive`` over :func:`new_sample_labels` with the new samples' states:
    ``{"prob": (S, M), "y": (S, M) in {-1, +1}, "u": (S, R, M)}``. ``kw`` go to
    :func:`new_sample_states`."""
    states = new_sample_states(samples, X_train, X_new, variant=variant, seed=seed, **kw)
    S, R, M, K = states["z_new"].shape
    predictive = Predictive(new_sample_labels, posterior_samples=states,
                            return_sites=["prob", "y", "u"])
    out = predictive(jax.random.PRNGKey(seed + 1), M=M, K=K, T=states["beta"].shape[1], R=R)
    return {k: out[k] for k in ("prob", "y", "u")}


def predict_proba(samples, X_train, X_new, *, variant: str, seed: int = 0, **kw) -> np.ndarray:
    """Posterior predictive p(y* = +1 | data, x*) (M,) of each new sample, averaged over draws
    and states (:func:`new_sample_states`; ``kw`` go there)."""
    states = new_sample_states(samples, X_train, X_new, variant=variant, seed=seed, **kw)
    beta = states["beta"][:, None, None]  # (S, 1, 1, T, K)
    b = jnp.take_along_axis(beta, states["t_new"][..., None, None], axis=-2)[..., 0, :]
    u = jnp.sum(b * states["z_new"], -1)  # (S, R, M)
    return np.asarray(jnp.mean(label_probability(u), (0, 1)))
