r"""Hand-derived Gibbs updates for tensor analyzers and their mixtures
(:mod:`latentzoo.models.tensor_analyzer`; derivations in full in ``docs/models/tensor_analyzer.md``).

Notation: X (N, D); groups :math:`z_j` (N, d_j); :math:`y_n = [z_{n1}; \dots; z_{nJ}]` (P),
:math:`u_n = z_{n1} \otimes \dots \otimes z_{nJ}` (Q); per component k: W_k (D, P),
T_k (D, d_1, ..., d_J), mu_k (D,), Psi_k (D,) noise variances; labels c (N,), weights pi (C,).
A plain TA is handled as the one-component case (its sites have no component axis; the helpers
add one). Priors are read from the model at the current values: :math:`z_{nj} \sim \mathcal
N(m_z, s_z^2)` elementwise, :math:`W, T, \mu` elementwise Normals, :math:`\Psi_{kd} \sim
\mathrm{InvGamma}(a, b)`, :math:`\pi \sim \mathrm{Dir}(\alpha)`.

- ``z_j | x, z_{-j}, c`` (the supplement's "alternating Gibbs sampling"): given the other groups
  the mean is affine in :math:`z_j`, :math:`e_n = M_{nj} z_{nj} + o_{nj}` with
  :math:`M_{nj} = W_{k,[j]} + T_k \times_{i \ne j} z_{ni}` (D x d_j; the multilinear term is
  linear in :math:`z_j` with no offset) and :math:`o_{nj} = W_{k,[-j]} y_{n,[-j]} + \mu_k`, so
  :math:`z_{nj} \mid \cdot \sim \mathcal N(P^{-1} b, P^{-1})`,
  :math:`P = S^{-1} + M^\top \beta\Psi_k^{-1} M`,
  :math:`b = S^{-1} m_z + M^\top \beta\Psi_k^{-1} (x_n - o_{nj})`, rows independent.
  :math:`\beta` is the likelihood's temperature (1 unless annealed,
  :mod:`latentzoo.inference.tempering`).
- ``(c, z_1) | x, z_{-1}`` (MTA): :math:`z_1` integrates out of the tempered joint in closed
  form, :math:`p(c_n = k \mid \cdot) \propto \pi_k\, \mathcal N(x_n; o_{n1k} + M_{n1k} m_z,\
  M S M^\top + \Psi_k/\beta)\, e^{\Delta_k}` with
  :math:`\Delta_k = (1-\beta)(\tfrac D2 \log 2\pi + \tfrac12 \sum_d \log \Psi_{kd}) - \tfrac D2
  \log\beta` (the part of :math:`p(x \mid \cdot)^\beta` that is not :math:`\mathcal N(x; \cdot,
  \Psi/\beta)`; zero at :math:`\beta = 1`, label-dependent otherwise because each component has
  its own noise). The Gaussian integral is evaluated through the d_1 x d_1 precision:
  :math:`\log Z = -\tfrac12[D\log 2\pi + \log|\Sigma| + \log|S| + \log|P| + r^\top\Sigma^{-1}r
  + m^\top S^{-1} m - b^\top P^{-1} b]`. Then :math:`z_1 \mid c` as above.
- ``c | z`` (stand-in when the block cannot run): :math:`\propto \pi_k \mathcal N(x_n; e_{nk},
  \Psi_k)^\beta`.
- ``(W_k, T_k, mu_k) | z, c, Psi``: row d of :math:`B_k = [W_k, T_{k(1)}, \mu_k]` multiplies the
  features :math:`f_n = [y_n; u_n; 1]`, so :math:`B_{kd} \sim \mathcal N(P^{-1} h, P^{-1})`,
  :math:`P = \Lambda_0 + \Psi_{kd}^{-1} \sum_{n: c_n = k} f_n f_n^\top`,
  :math:`h = \Lambda_0 m_0 + \Psi_{kd}^{-1} \sum_{n: c_n = k} x_{nd} f_n`, independent over
  (k, d): one joint draw instead of the supplement's separate eqs. 6 and 8.
- ``Psi_kd | ·``: :math:`\mathrm{InvGamma}(a + N_k/2,\ b + \tfrac12 \sum_{n: c_n=k}
  (x_{nd} - e_{nd})^2)`.
- ``pi | c``: :math:`\mathrm{Dir}(\alpha + N_{1:C})`.

Every update reads the likelihood's temperature :math:`\beta`, so the whole table also samples
the annealed posterior :math:`p(\theta)\,p(z)\,p(x \mid z, \theta)^\beta`: the noise precision
becomes :math:`\beta\Psi^{-1}` in the Gaussian blocks, and Psi's update becomes
:math:`\mathrm{InvGamma}(a + \beta N_k/2,\ b + \tfrac\beta2 \sum r^2)`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpyro.distributions as dist

from latentzoo.models.tensor_analyzer import contract, kron_rows

from latentzoo.inference import small_linalg
from latentzoo.inference.conjugate import dirichlet_categorical_posterior
from latentzoo.inference.gaussian import (
    LOG_2PI,
    diag_embed,
    gaussian_draw,
    mvn_from_precision,
    shared_gram_draw,
)
from latentzoo.inference.tempering import temperature
from latentzoo.inference.updates import GibbsUpdate, prior_params, unwrap

__all__ = [
    "components",
    "select_rows",
    "group_update",
    "label_group_update",
    "label_update",
    "loadings_update",
    "Psi_update",
    "pi_update",
    "group_natural",
    "collapsed_log_Z",
    "label_group_logits",
    "label_group_log_prob",
    "loadings_natural",
    "rows_share_prior_precision",
    "loadings_log_prob",
]

NORMAL = (dist.Normal,)
INVERSE_GAMMA = (dist.InverseGamma,)
DIRICHLET = (dist.Dirichlet,)
CATEGORICAL = (dist.CategoricalProbs, dist.CategoricalLogits)


# ------------------------------------------------------------------------------ helpers
def _groups(values):
    """The latent groups in order: [z_1, ..., z_J]."""
    J = sum(1 for k in values if k.startswith("z_"))
    return [values[f"z_{j + 1}"] for j in range(J)]


def components(values):
    """(W, T, mu, Psi) with a leading component axis (C = 1 for a plain TA), and labels c (N,)."""
    zs = _groups(values)
    N = zs[0].shape[0]
    if "c" in values:
        return values["W"], values["T"], values["mu"], values["Psi"], values["c"]
    W, T, mu, Psi = (values[k][None] for k in ("W", "T", "mu", "Psi"))
    return W, T, mu, Psi, jnp.zeros(N, dtype=jnp.int32)


def _offsets(sizes, j):
    start = sum(sizes[:j])
    return start, start + sizes[j]


def _group_prior(priors, name, dj):
    m, s = prior_params(priors[name], (dj,), "loc", "scale")
    return m, 1.0 / s**2


def _group_basis(values, j):
    """The effective loading of z_j as a fixed basis times per-row weights:
    M_{nk} = sum_l G_k[:, :, l] w_{nl}, with G_k = [W_{k,[j]} | T_{k(j)}] (C, D, d_j, 1 + e) and
    w_n = [1; kron of the other groups] (N, 1 + e), e = prod_{i != j} d_i.

    Working with (G, w) rather than M itself keeps every array at (C, N, D) or smaller: M has
    d_j times more entries, which made the label block memory-bound on large data.
    """
    W, T, _, _, _ = components(values)
    zs = _groups(values)
    N = zs[0].shape[0]
    lo, hi = _offsets([z.shape[-1] for z in zs], j)
    C, D = T.shape[0], T.shape[1]
    # T_{k(j)}: mode j next to D, the other modes after it in increasing order, flattened
    # row-major, which is the order the running Kronecker product below produces
    others = [i for i in range(len(zs)) if i != j]
    T_j = jnp.transpose(T, (0, 1, 2 + j, *(2 + i for i in others))).reshape(C, D, hi - lo, -1)
    G = jnp.concatenate([W[:, :, lo:hi, None], T_j], axis=-1)
    u = jnp.ones((N, 1), dtype=zs[0].dtype)
    for i in others:
        u = (u[:, :, None] * zs[i][:, None, :]).reshape(N, -1)
    w = jnp.concatenate([jnp.ones((N, 1), dtype=u.dtype), u], axis=-1)
    return G, w


def group_natural(values, obs, priors, j: int):
    """Natural parameters of z_j | x, z_{-j} under every component: P (C, N, d_j, d_j),
    b (C, N, d_j), and the pieces the label block needs: the weighted squared residual of the
    rest, q = (x - o)ᵀ diag(lam) (x - o) (C, N), and the noise precision lam = beta / Psi (C, D).

    With M = G w (:func:`_group_basis`) and the rest of the mean o = A a (A = [W | mu],
    a = [y with z_j zeroed; 1]): P = S⁻¹ + wᵀ K w with the per-component Gram
    K = Gᵀ diag(lam) G; Mᵀ lam (x - o) = wᵀ (Gᵀ lam x - Gᵀ lam A a); and
    q = xᵀ lam x - 2 xᵀ lam A a + aᵀ Aᵀ lam A a. Every large product is an (N, D) x (D, small)
    matrix product: neither the (C, N, D, d_j) loadings nor the (C, N, D) residuals are formed,
    which is what makes the label block fast on 10^4 patches x 20 components (10x against the
    direct form). The expanded q loses about eps * xᵀ lam x to cancellation: 1e-9 nats at
    standardised scales and noise variances down to 1e-6 in float64
    (``tests/inference/test_ta_gibbs.py`` checks it against the direct form).
    """
    X = obs["X"]
    name = f"z_{j + 1}"
    W, _, mu, Psi, _ = components(values)
    beta = temperature(priors["X"])
    m, p0 = _group_prior(priors, name, values[name].shape[-1])
    zs = _groups(values)
    lo, hi = _offsets([z.shape[-1] for z in zs], j)
    y_rest = jnp.concatenate(zs, axis=-1).at[:, lo:hi].set(0.0)
    lam = beta / Psi  # (C, D)
    G, w = _group_basis(values, j)
    C, D, d, k = G.shape
    LG = G * lam[:, :, None, None]
    LG_flat = LG.reshape(C, D, d * k)
    K = jnp.einsum("cdak,cdbl->cabkl", LG, G).reshape(C, d * d, k * k)
    ww = (w[:, :, None] * w[:, None, :]).reshape(-1, k * k)
    P = jnp.matmul(ww, jnp.swapaxes(K, -1, -2)).reshape(C, -1, d, d) + diag_embed(p0)
    # the rest of the mean, o = A a with A = [W | mu] (C, D, P + 1) and a = [y_rest; 1], enters
    # through (N, D) x (D, small) products only: the (C, N, D) residual is never formed
    a = jnp.concatenate([y_rest, jnp.ones((y_rest.shape[0], 1), y_rest.dtype)], axis=-1)
    A = jnp.concatenate([W, mu[:, :, None]], axis=-1)
    LA = A * lam[:, :, None]
    Gr = jnp.matmul(X, LG_flat) - jnp.matmul(a, jnp.einsum("cdp,cdq->cpq", A, LG_flat))
    b = jnp.einsum("cnak,nk->cna", Gr.reshape(C, -1, d, k), w) + m * p0
    # q = xᵀΛx - 2 xᵀΛo + oᵀΛo, exact in float64 at the scales of standardised data
    aa = (a[:, :, None] * a[:, None, :]).reshape(a.shape[0], -1)
    AtLA = jnp.einsum("cdp,cdq->cpq", A, LA).reshape(C, -1)
    q = lam @ (X * X).T - 2.0 * jnp.sum(jnp.matmul(X, LA) * a, -1) + AtLA @ aa.T
    return P, b, q, lam


def select_rows(c, *arrays):
    """Pick each row's component: arrays (C, N, ...) -> (N, ...)."""
    rows = jnp.arange(c.shape[0])
    return tuple(a[c, rows] for a in arrays)


# ---------------------------------------------------------------------------- z_j | rest
def _group_draw(j):
    def draw(key, values, obs, priors):
        P, b, _, _ = group_natural(values, obs, priors, j)
        _, _, _, _, c = components(values)
        return {f"z_{j + 1}": gaussian_draw(key, *select_rows(c, P, b))}

    return draw


def _group_conditional(j):
    def conditional(values, obs, priors):
        P, b, _, _ = group_natural(values, obs, priors, j)
        _, _, _, _, c = components(values)
        return {f"z_{j + 1}": mvn_from_precision(*select_rows(c, P, b))}

    return conditional


# ------------------------------------------------------------------- labels (MTA only)
def collapsed_log_Z(values, obs, priors, j: int = 0):
    """log of the (tempered) likelihood of every row under every component with z_j integrated
    out, log ∫ N(z_j; m, S) p(x_n | z, c_n = k)^beta dz_j, (C, N); and z_j's per-component natural
    parameters P (C, N, d, d), b (C, N, d)."""
    P, b, q, lam = group_natural(values, obs, priors, j)
    name = f"z_{j + 1}"
    m, p0 = _group_prior(priors, name, values[name].shape[-1])
    beta = temperature(priors["X"])
    D = lam.shape[-1]
    L = small_linalg.cholesky(P)  # (C, N, d, d); plain XLA (batched LAPACK can deadlock)
    v = small_linalg.solve_lower(L, b)
    log_det_P = 2.0 * jnp.sum(jnp.log(jnp.diagonal(L, axis1=-2, axis2=-1)), -1)  # (C, N)
    log_det_Sigma = -jnp.sum(jnp.log(lam), -1)[:, None]  # (C, 1)
    quad = q + jnp.sum(m * m * p0) - jnp.sum(v * v, -1)
    log_Z = -0.5 * (D * LOG_2PI + log_det_Sigma - jnp.sum(jnp.log(p0)) + log_det_P + quad)
    _, _, _, Psi, _ = components(values)
    delta = (1.0 - beta) * (0.5 * D * LOG_2PI + 0.5 * jnp.sum(jnp.log(Psi), -1)) - 0.5 * D * jnp.log(beta)
    # at beta = 0 the likelihood is flat (p(x | .)^0 = 1): log Z = 0 exactly, where the formula
    # above would give inf - inf
    return jnp.where(beta > 0, log_Z + delta[:, None], 0.0), P, b


def label_group_logits(values, obs, priors, j: int = 0):
    """log p(c_n = k | x, z_{-j}) up to a per-row constant, (N, C), with z_j integrated out of
    the (tempered) joint; also returns the per-component natural parameters of z_j."""
    log_Z, P, b = collapsed_log_Z(values, obs, priors, j)
    log_pi = jnp.asarray(unwrap(priors["c"]).logits)
    return log_pi[None, :] + log_Z.T, P, b


def _label_group_draw(j):
    def draw(key, values, obs, priors):
        k_c, k_z = jax.random.split(key)
        logits, P, b = label_group_logits(values, obs, priors, j)
        c = jax.random.categorical(k_c, logits, axis=-1).astype(values["c"].dtype)
        return {"c": c, f"z_{j + 1}": gaussian_draw(k_z, *select_rows(c, P, b))}

    return draw


def label_group_log_prob(values, obs, priors, j: int = 0):
    """log q(c, z_j | rest) of the block draw, summed over rows (for tests)."""
    logits, P, b = label_group_logits(values, obs, priors, j)
    c = values["c"]
    log_c = jnp.take_along_axis(jax.nn.log_softmax(logits, -1), c[:, None], -1).sum()
    log_z = mvn_from_precision(*select_rows(c, P, b)).log_prob(values[f"z_{j + 1}"]).sum()
    return log_c + log_z


def _label_conditional(values, obs, priors):
    X = obs["X"]
    W, T, mu, Psi, _ = components(values)
    zs = _groups(values)
    y = jnp.concatenate(zs, axis=-1)
    mean = jnp.einsum("cdp,np->cnd", W, y) + jax.vmap(lambda Tk: contract(Tk, zs))(T) + mu[:, None]
    r = X[None] - mean
    beta = temperature(priors["X"])
    loglik = -0.5 * (jnp.einsum("cnd,cd->nc", r * r, 1.0 / Psi) + jnp.sum(jnp.log(Psi), -1))
    return {"c": dist.Categorical(logits=jnp.asarray(unwrap(priors["c"]).logits) + beta * loglik)}


# ------------------------------------------------------------------ (W, T, mu) | rest
def _features(values):
    zs = _groups(values)
    N = zs[0].shape[0]
    return jnp.concatenate([*zs, kron_rows(zs), jnp.ones((N, 1), zs[0].dtype)], axis=-1)


def _loadings_prior(values, priors):
    """Prior mean and precision of each row [W_kd, T_kd, mu_kd], (C, D, F) each."""
    W, T, mu, _, _ = components(values)
    C, D, P = W.shape
    Q = math.prod(T.shape[2:])
    shapes = {"W": (C, D, P), "T": (C, D, *T.shape[2:]), "mu": (C, D)}
    m_W, s_W = prior_params(priors["W"], shapes["W"] if "c" in values else shapes["W"][1:], "loc", "scale")
    m_T, s_T = prior_params(priors["T"], shapes["T"] if "c" in values else shapes["T"][1:], "loc", "scale")
    m_mu, s_mu = prior_params(priors["mu"], shapes["mu"] if "c" in values else shapes["mu"][1:], "loc", "scale")
    lead = (C, D)
    mean = jnp.concatenate(
        [m_W.reshape(*lead, P), m_T.reshape(*lead, Q), m_mu.reshape(*lead, 1)], -1
    )
    scale = jnp.concatenate(
        [s_W.reshape(*lead, P), s_T.reshape(*lead, Q), s_mu.reshape(*lead, 1)], -1
    )
    return mean, 1.0 / scale**2


def _loadings_terms(values, obs, priors):
    """The pieces of every row's precision and linear term: prior precisions p0 (C, D, F),
    Gram matrices FtF (C, F, F), tempered noise precisions lam (C, D) and h (C, D, F), with
    P_kd = diag(p0_kd) + lam_kd FtF_k."""
    X = obs["X"]
    _, _, _, Psi, c = components(values)
    C = Psi.shape[0]
    f = _features(values)  # (N, F)
    R = jax.nn.one_hot(c, C, dtype=f.dtype)  # (N, C)
    m0, p0 = _loadings_prior(values, priors)
    lam = temperature(priors["X"]) / Psi  # (C, D) noise precision, tempered
    FtF = jnp.einsum("nc,nf,ng->cfg", R, f, f)
    XtF = jnp.einsum("nc,nd,nf->cdf", R, X, f)
    h = XtF * lam[..., None] + m0 * p0
    return p0, FtF, lam, h


def loadings_natural(values, obs, priors):
    """P (C, D, F, F) and h (C, D, F) of each row of B_k = [W_k, T_k(1), mu_k], F = P + Q + 1."""
    p0, FtF, lam, h = _loadings_terms(values, obs, priors)
    return FtF[:, None] * lam[..., None, None] + diag_embed(p0), h


def rows_share_prior_precision(values, priors) -> bool:
    """Whether the prior scales of W, T and mu are the same for every output row d (their
    parameters have no D axis, or one of length 1): decided from shapes, before tracing."""
    J = len(_groups(values))
    for name, trailing in (("W", 1), ("T", J), ("mu", 0)):
        shape = jnp.shape(unwrap(priors[name]).scale)
        if len(shape) > trailing and shape[-trailing - 1] != 1:
            return False
    return True


def _split_loadings(B, values):
    """(C, D, F) rows -> {"W", "T", "mu"} in the sites' shapes."""
    W, T, _, _, _ = components(values)
    C, D, P = W.shape
    Q = math.prod(T.shape[2:])
    out = {"W": B[..., :P], "T": B[..., P : P + Q].reshape(T.shape), "mu": B[..., -1]}
    if "c" not in values:
        out = {k: v[0] for k, v in out.items()}
    return out


def _join_loadings(values):
    W, T, mu, _, _ = components(values)
    return jnp.concatenate([W, T.reshape(*W.shape[:2], -1), mu[..., None]], -1)


def _loadings_draw(key, values, obs, priors):
    """The joint row draw. With the same prior precision on every row (the model's default),
    all D rows of component k share one Gram matrix, and one eigendecomposition per component
    replaces D Cholesky factorisations of F x F (F = P + Q + 1 = 121 at d = (10, 10)):
    :func:`~latentzoo.inference.gaussian.shared_gram_draw`, the same law."""
    if not rows_share_prior_precision(values, priors):
        return _split_loadings(gaussian_draw(key, *loadings_natural(values, obs, priors)), values)
    p0, FtF, lam, h = _loadings_terms(values, obs, priors)
    return _split_loadings(shared_gram_draw(key, p0[:, 0], FtF, lam, h), values)


def loadings_log_prob(values, obs, priors):
    """log q(W, T, mu | rest) of the joint row draw, summed (for tests)."""
    return mvn_from_precision(*loadings_natural(values, obs, priors)).log_prob(_join_loadings(values)).sum()


# ------------------------------------------------------------------------ Psi and pi
def _Psi_conditional(values, obs, priors):
    X = obs["X"]
    W, T, mu, Psi, c = components(values)
    zs = _groups(values)
    y = jnp.concatenate(zs, axis=-1)
    mean = jnp.einsum("ndp,np->nd", W[c], y) + contract(T[c], zs) + mu[c]
    R = jax.nn.one_hot(c, Psi.shape[0], dtype=X.dtype)
    ss = R.T @ ((X - mean) ** 2)  # (C, D)
    counts = R.sum(0)[:, None]
    shape = Psi.shape if "c" in values else Psi.shape[1:]
    a0, b0 = prior_params(priors["Psi"], shape, "concentration", "rate")
    if "c" not in values:
        ss, counts = ss[0], counts[0]
    # p(x | .)^beta = prod Psi^{-beta/2} exp(-beta r^2 / (2 Psi)) up to constants
    beta = temperature(priors["X"])
    return {"Psi": dist.InverseGamma(a0 + 0.5 * beta * counts, b0 + 0.5 * beta * ss)}


def _pi_conditional(values, obs, priors):
    alpha = unwrap(priors["pi"]).concentration
    counts = jax.nn.one_hot(values["c"], values["pi"].shape[0], dtype=values["pi"].dtype).sum(0)
    return {"pi": dirichlet_categorical_posterior(alpha, counts)}


# ------------------------------------------------------------------------------- table
def group_update(j: int) -> GibbsUpdate:
    """z_j | x, z_{-j}, (c): the supplement's alternating Gibbs step for group j (0-based)."""
    name = f"z_{j + 1}"
    return GibbsUpdate(f"{name} | rest", (name,), {name: NORMAL, "X": NORMAL},
                       _group_conditional(j), _group_draw(j), tempered=True)


def label_group_update(j: int = 0) -> GibbsUpdate:
    """(c, z_j) as one exact block: c with z_j integrated out, then z_j | c."""
    name = f"z_{j + 1}"
    requires = {"c": CATEGORICAL, name: NORMAL, "X": NORMAL}
    return GibbsUpdate(f"(c, {name}) | rest (block)", ("c", name), requires, draw=_label_group_draw(j),
                       tempered=True)


def label_update() -> GibbsUpdate:
    return GibbsUpdate("c | z, params", ("c",), {"c": CATEGORICAL, "X": NORMAL}, _label_conditional,
                       tempered=True)


def loadings_update() -> GibbsUpdate:
    """(W, T, mu) jointly, one Gaussian draw per (component, output dimension)."""
    requires = {"W": NORMAL, "T": NORMAL, "mu": NORMAL, "X": NORMAL}
    return GibbsUpdate("(W, T, mu) | z, c, Psi (rows)", ("W", "T", "mu"), requires, draw=_loadings_draw,
                       tempered=True)


def Psi_update() -> GibbsUpdate:
    return GibbsUpdate("Psi | z, c, W, T, mu", ("Psi",), {"Psi": INVERSE_GAMMA, "X": NORMAL}, _Psi_conditional,
                       tempered=True)


def pi_update() -> GibbsUpdate:
    # reads the labels, not the likelihood: the same on the tempered posterior
    return GibbsUpdate("pi | c", ("pi",), {"pi": DIRICHLET, "c": CATEGORICAL}, _pi_conditional,
                       tempered=True)
