r"""Hand-derived Gibbs updates for the Bayesian mixture of factor analysers
(:mod:`latentzoo.models.mfa`; derivations in full in ``docs/models/mfa.md``).

Notation: X (N, D); labels c (N,) with one-hot :math:`R_{nj} = [c_n = j]` and counts
:math:`N_j = \sum_n R_{nj}`; z (N, K); W (J, D, K) with rows :math:`w_{jd} \in \mathbb R^K`;
mu (J, D); psi (D,) noise precisions, :math:`\Psi = \mathrm{diag}(\psi)`; pi (J,). Priors (read
from the model at the current values): :math:`w_{jdk} \sim \mathcal N(m_W, s_W^2)`,
:math:`\mu_{jd} \sim \mathcal N(m_\mu, s_\mu^2)`, :math:`\psi_d \sim \mathrm{Gamma}(a, b)`,
:math:`z_{nk} \sim \mathcal N(m_z, s_z^2)` (shared by rows), :math:`\pi \sim \mathrm{Dir}(\alpha)`.
The joint density is

.. math::

    p = p(\pi) \prod_j p(W_j) p(\mu_j)\, p(\psi) \prod_n \pi_{c_n}\, \mathcal N(z_n; m_z, S_z)
        \prod_d \mathcal N(x_{nd};\ w_{c_n d}^\top z_n + \mu_{c_n d},\ 1/\psi_d),

and each conditional is the product of the factors that involve its block, normalised:

- ``(c, z) | W, mu, psi, pi`` -- an exact *block* draw, rows independent. Integrating
  :math:`z_n` out of :math:`\mathcal N(z_n; m_z, S_z)\,\mathcal N(x_n; W_j z_n + \mu_j, \Psi^{-1})`
  gives :math:`p(c_n = j \mid \cdot) \propto \pi_j\, \mathcal N(x_n;\ \mu_j + W_j m_z,\ C_j)`,
  :math:`C_j = W_j S_z W_j^\top + \Psi^{-1}`. With :math:`M_j = S_z^{-1} + W_j^\top \Psi W_j =
  L_j L_j^\top` (K x K) and :math:`r_{nj} = x_n - \mu_j - W_j m_z`, Woodbury and the determinant
  lemma give :math:`r^\top C_j^{-1} r = r^\top \Psi r - \lVert L_j^{-1} W_j^\top \Psi r\rVert^2`
  and :math:`\log|C_j| = 2\sum_k \log L_{j,kk} + \log|S_z| - \sum_d \log\psi_d`: no D x D
  matrix is formed. Then :math:`z_n \mid c_n = j \sim \mathcal N(M_j^{-1} b_{nj}, M_j^{-1})`,
  :math:`b_{nj} = S_z^{-1} m_z + W_j^\top \Psi (x_n - \mu_j)`.
- ``z | c, W, mu, psi`` (the second half alone; a closed-form conditional for checks and for the
  uncollapsed table): :math:`\mathcal N(M_{c_n}^{-1} b_{n c_n}, M_{c_n}^{-1})`, rows independent.
- ``c | z, W, mu, psi, pi``: :math:`p(c_n = j) \propto \pi_j \prod_d \mathcal N(x_{nd};
  w_{jd}^\top z_n + \mu_{jd}, 1/\psi_d)`. Correct but slow to mix on its own (a label cannot
  move while :math:`z_n` is pinned to its current component's coordinates), hence the block.
- ``w_{jd} | c, z, mu, psi``: :math:`\mathcal N(P_{jd}^{-1} h_{jd}, P_{jd}^{-1})`,
  :math:`P_{jd} = s_W^{-2} I + \psi_d \sum_n R_{nj} z_n z_n^\top`,
  :math:`h_{jd} = m_W s_W^{-2} + \psi_d \sum_n R_{nj} (x_{nd} - \mu_{jd}) z_n`; (j, d) independent.
- ``mu_{jd} | c, z, W, psi``: :math:`\mathcal N(h_{jd}/P_{jd}, 1/P_{jd})`,
  :math:`P_{jd} = s_\mu^{-2} + N_j \psi_d`,
  :math:`h_{jd} = m_\mu s_\mu^{-2} + \psi_d \sum_n R_{nj}(x_{nd} - w_{jd}^\top z_n)`.
- ``psi_d | c, z, W, mu``: :math:`\mathrm{Gamma}(a + N/2,\ b + \tfrac12 \sum_n r_{nd}^2)`,
  :math:`r_{nd} = x_{nd} - w_{c_n d}^\top z_n - \mu_{c_n d}` (every row, whatever its component).
- ``pi | c``: :math:`\mathrm{Dirichlet}(\alpha + (N_1, \dots, N_J))`.
- the shift and scale moves (:mod:`latentzoo.inference.mfa.moves`): each component's factors
  trade with its mean (translation group, an exact draw on the orbit) and with its loadings
  (scale group, one MH step on the orbit).

Tempered (replica exchange's hotter copies, :math:`p(X \mid \cdot)^\beta`): every formula above
holds with :math:`\psi` replaced by :math:`\beta\psi` in the likelihood's terms, and the noise
update becomes :math:`\mathrm{Gamma}(a + \beta N/2,\ b + \tfrac\beta2 \sum_n r_{nd}^2)`; the
updates read :math:`\beta` from the model, so the table has a tempered form.

An empty component (:math:`N_j = 0`) gets its prior back from every formula above, so no special
case is needed. Sums over "rows assigned to j" are one-hot-weighted sums over all rows, which
keeps every update a fixed-shape, jit-friendly array expression vectorised over j and d.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpyro.distributions as dist

from latentzoo.models.mfa import component_means

from latentzoo.inference import small_linalg
from latentzoo.inference.conjugate import dirichlet_categorical_posterior, gamma_precision_posterior, normal_mean_posterior
from latentzoo.inference.seeding import kmeans_pp_seeds
from latentzoo.inference.tempering import temperature
from latentzoo.inference.gaussian import diag_embed, gaussian_draw, mvn_from_precision
from latentzoo.inference.mfa.moves import scale_move, shift_move
from latentzoo.inference.updates import GibbsUpdate, Move, prior_params, unwrap

__all__ = [
    "mfa_updates",
    "cz_update",
    "c_given_z_update",
    "z_given_c_update",
    "W_update",
    "mu_update",
    "psi_update",
    "pi_update",
    "c_marginal_logits",
    "cz_log_prob",
    "init_from_data",
]

NORMAL = (dist.Normal,)
GAMMA = (dist.Gamma,)
DIRICHLET = (dist.Dirichlet,)
CATEGORICAL = (dist.CategoricalProbs, dist.CategoricalLogits)


def _lik_precision(values, priors):
    """beta * psi (D,): the noise precisions as the likelihood's temperature beta sees them.
    p(x | .)^beta is N(x; mean, diag(1/(beta psi))) times a factor free of c, z, W and mu, so every
    conditional of those is the untempered one at precision beta * psi (beta = 1 unless the
    model is tempered, as replica exchange's hotter copies are)."""
    return temperature(priors["X"]) * values["psi"]


def _onehot(values):
    """R (N, J): one-hot labels, in the data's float dtype so sums are plain matmuls."""
    return jax.nn.one_hot(values["c"], values["W"].shape[0], dtype=values["W"].dtype)


def _log_weights(priors):
    """log pi (J,) as the model's label prior says (reads the site, not ``values['pi']``, so a
    label prior written differently in the model file is honoured)."""
    return jnp.asarray(unwrap(priors["c"]).logits)


def _z_prior(values, priors):
    """Mean m_z (K,) and precision 1/s_z^2 (K,) of the factor prior (shared by all rows)."""
    K = values["z"].shape[-1]
    m, s = prior_params(priors["z"], (K,), "loc", "scale")
    return m, 1.0 / s**2


def _component_precisions(values, priors):
    """M_j = S_z^{-1} + W_jᵀ Ψ W_j, (J, K, K): the posterior precision of z_n given c_n = j."""
    W, psi = values["W"], _lik_precision(values, priors)
    _, p0 = _z_prior(values, priors)
    WtPsi = jnp.swapaxes(W, -1, -2) * psi  # (J, K, D)
    return WtPsi @ W + diag_embed(p0), WtPsi


# ---------------------------------------------------------------------- labels and factors
def c_marginal_logits(values, obs, priors):
    """log pi_j + log N(x_n; mu_j + W_j m_z, C_j), (N, J), by Woodbury (z integrated out)."""
    X, W, mu, psi = obs["X"], values["W"], values["mu"], _lik_precision(values, priors)
    D = X.shape[-1]
    m, p0 = _z_prior(values, priors)
    M, WtPsi = _component_precisions(values, priors)
    L = small_linalg.cholesky(M)  # (J, K, K); plain XLA (batched LAPACK can deadlock)
    centre = mu + W @ m  # (J, D): the marginal mean of each component
    # r^T Psi r expanded as x^T Psi x - 2 x^T Psi c_j + c_j^T Psi c_j keeps the work at N*J*D
    # without materialising an (N, J, D) residual; float64 makes the cancellation harmless.
    quad = (
        ((X * X) @ psi)[:, None]
        - 2.0 * (X * psi) @ centre.T
        + ((centre * centre) @ psi)[None, :]
    )  # (N, J)
    proj = jnp.einsum("jkd,nd->jkn", WtPsi, X) - (WtPsi @ centre[..., None])  # (J, K, N)
    u = small_linalg.tril_inverse(L) @ proj  # L_j^{-1} W_jᵀ Ψ r_nj
    quad = quad - jnp.sum(u * u, axis=1).T
    logdet = (
        2.0 * jnp.sum(jnp.log(jnp.diagonal(L, axis1=-2, axis2=-1)), -1)
        - jnp.sum(jnp.log(p0))
        - jnp.sum(jnp.log(psi))
    )  # (J,)
    loglik = -0.5 * (D * jnp.log(2.0 * jnp.pi) + logdet[None, :] + quad)
    return _log_weights(priors) + loglik


def _z_natural(values, obs, priors, c):
    """Natural parameters of z | c: precision M_{c_n} (N, K, K) and b_n (N, K)."""
    X, mu = obs["X"], values["mu"]
    m, p0 = _z_prior(values, priors)
    M, WtPsi = _component_precisions(values, priors)
    b = jnp.einsum("nkd,nd->nk", WtPsi[c], X - mu[c]) + m * p0
    return M[c], b


def _cz_draw(key, values, obs, priors):
    k_c, k_z = jax.random.split(key)
    logits = c_marginal_logits(values, obs, priors)
    c = jax.random.categorical(k_c, logits, axis=-1).astype(values["c"].dtype)
    return {"c": c, "z": gaussian_draw(k_z, *_z_natural(values, obs, priors, c))}


def cz_log_prob(values, obs, priors):
    """log p(c, z | W, mu, psi, pi, X) of the block draw, summed over rows (for tests)."""
    c = values["c"]
    logits = jax.nn.log_softmax(c_marginal_logits(values, obs, priors), axis=-1)
    log_c = jnp.take_along_axis(logits, c[:, None], axis=-1).sum()
    log_z = mvn_from_precision(*_z_natural(values, obs, priors, c)).log_prob(values["z"])
    return log_c + log_z.sum()


def _z_conditional(values, obs, priors):
    return {"z": mvn_from_precision(*_z_natural(values, obs, priors, values["c"]))}


def _z_draw(key, values, obs, priors):
    return {"z": gaussian_draw(key, *_z_natural(values, obs, priors, values["c"]))}


def c_conditional(values, obs, priors):
    X, W, mu, z = obs["X"], values["W"], values["mu"], values["z"]
    psi = _lik_precision(values, priors)
    r = X[:, None, :] - jnp.einsum("jdk,nk->njd", W, z) - mu[None]  # (N, J, D)
    # The log psi_d / 2 terms are the same for every j and cancel in the normalisation.
    return {"c": dist.Categorical(logits=_log_weights(priors) - 0.5 * (r * r) @ psi)}


# --------------------------------------------------------------------- component parameters
def _W_natural(values, obs, priors):
    """P (J, D, K, K) and h (J, D, K) of each row w_jd given the rows assigned to j."""
    X, z, mu, psi = obs["X"], values["z"], values["mu"], _lik_precision(values, priors)
    J, D, K = values["W"].shape
    R = _onehot(values)
    loc0, scale0 = prior_params(priors["W"], (J, D, K), "loc", "scale")
    prec0 = 1.0 / scale0**2
    ZtZ = jnp.einsum("nj,nk,nl->jkl", R, z, z)  # Z_jᵀ Z_j over the rows of component j
    P = psi[None, :, None, None] * ZtZ[:, None] + diag_embed(prec0)
    XtZ = jnp.einsum("nj,nd,nk->jdk", R, X, z)
    h = psi[None, :, None] * (XtZ - mu[..., None] * (R.T @ z)[:, None, :]) + loc0 * prec0
    return P, h


def _W_conditional(values, obs, priors):
    return {"W": mvn_from_precision(*_W_natural(values, obs, priors))}


def _W_draw(key, values, obs, priors):
    return {"W": gaussian_draw(key, *_W_natural(values, obs, priors))}


def _mu_conditional(values, obs, priors):
    X, z, W, psi = obs["X"], values["z"], values["W"], _lik_precision(values, priors)
    J, D = values["mu"].shape
    R = _onehot(values)
    loc0, scale0 = prior_params(priors["mu"], (J, D), "loc", "scale")
    resid_sum = R.T @ X - jnp.einsum("jdk,jk->jd", W, R.T @ z)  # sum_{n in j} (x_n - W_j z_n)
    return {"mu": normal_mean_posterior(loc0, scale0**-2, R.sum(0)[:, None] * psi, psi * resid_sum)}


def _psi_conditional(values, obs, priors):
    X = obs["X"]
    N, D = X.shape
    a0, b0 = prior_params(priors["psi"], (D,), "concentration", "rate")
    r = X - component_means(values["W"], values["mu"], values["z"], values["c"])
    beta = temperature(priors["X"])  # p(x | psi)^beta: psi^(beta N/2) exp(-beta psi sum r^2 / 2)
    return {"psi": gamma_precision_posterior(a0, b0, beta * N, beta * (r * r).sum(0))}


def _pi_conditional(values, obs, priors):
    alpha = unwrap(priors["pi"]).concentration
    return {"pi": dirichlet_categorical_posterior(alpha, _onehot(values).sum(0))}


# ------------------------------------------------------------------------------ start
def init_from_data(key, X, *, J: int, K: int):
    """A data-driven starting state (pass as ``init_params``; vmap over keys for several chains).

    Means are k-means++ seeds (:func:`latentzoo.inference.seeding.kmeans_pp_seeds`), labels the
    nearest seed, psi the inverse per-coordinate residual variance, W and z zero. Why: from a
    prior draw a local sampler can lock into a mode that merges two well-separated clusters into
    one long component (a K-factor component can stretch along the line between them) and is
    slow to leave it; seeding one mean per cluster avoids that without fixing the answer.
    Shapes: X (N, D) -> pi (J,), mu (J, D), W (J, D, K), psi (D,), c (N,), z (N, K).
    """
    centres, c = kmeans_pp_seeds(key, X, J)
    N, D = X.shape
    r = X - centres[c]
    # floor at a millionth of the total variance: a seed that sits on every row of its cluster
    # (N small) would otherwise give an infinite precision
    var = jnp.maximum(jnp.mean(r * r, 0), 1e-6 * jnp.var(X, 0) + 1e-12)
    return {
        "pi": jnp.full((J,), 1.0 / J, X.dtype),
        "mu": centres,
        "W": jnp.zeros((J, D, K), X.dtype),
        "psi": 1.0 / var,
        "c": c,
        "z": jnp.zeros((N, K), X.dtype),
    }


# ------------------------------------------------------------------------------- table
def cz_update() -> GibbsUpdate:
    """(c, z) as one exact block: c from its z-marginalised conditional, then z | c."""
    requires = {"c": CATEGORICAL, "z": NORMAL, "X": NORMAL}
    return GibbsUpdate("(c, z) | W, mu, psi, pi (block)", ("c", "z"), requires, draw=_cz_draw,
                       tempered=True)


def c_given_z_update() -> GibbsUpdate:
    requires = {"c": CATEGORICAL, "X": NORMAL}
    return GibbsUpdate("c | z, W, mu, psi, pi", ("c",), requires, c_conditional, tempered=True)


def z_given_c_update() -> GibbsUpdate:
    requires = {"z": NORMAL, "X": NORMAL}
    return GibbsUpdate("z | c, W, mu, psi", ("z",), requires, _z_conditional, _z_draw, tempered=True)


def W_update() -> GibbsUpdate:
    requires = {"W": NORMAL, "X": NORMAL}
    return GibbsUpdate("W | c, z, mu, psi (rows)", ("W",), requires, _W_conditional, _W_draw,
                       tempered=True)


def mu_update() -> GibbsUpdate:
    return GibbsUpdate("mu | c, z, W, psi", ("mu",), {"mu": NORMAL, "X": NORMAL}, _mu_conditional,
                       tempered=True)


def psi_update() -> GibbsUpdate:
    return GibbsUpdate("psi | c, z, W, mu", ("psi",), {"psi": GAMMA, "X": NORMAL}, _psi_conditional,
                       tempered=True)


def pi_update() -> GibbsUpdate:
    # no likelihood term: the same at every temperature
    return GibbsUpdate("pi | c", ("pi",), {"pi": DIRICHLET, "c": CATEGORICAL}, _pi_conditional,
                       tempered=True)


def mfa_updates(*, collapsed: bool = True, interweave: bool = True) -> list[GibbsUpdate | Move]:
    """The MFA update table in sweep order.

    ``collapsed=True`` (default): the (c, z) block, then W, mu, psi, pi. ``c | z`` follows the
    block as a stand-in: it is dropped while the block owns ``c``, and takes over ``c`` if a
    changed factor prior removes the block (z then falls back to NUTS). ``collapsed=False``: the
    plain Gibbs scan c | z, z | c, W, mu, psi, pi (valid, mixes worse; kept for comparison).
    ``interweave=True`` (default) ends the sweep with the shift move of each component's factors
    against its mean and the scale move of its loadings against its factors
    (:mod:`latentzoo.inference.mfa.moves`): without them the mixture mean on the default data had
    bulk ESS 74 in 4 x 4000 sweeps (R-hat 1.06).
    """
    params = [W_update(), mu_update(), psi_update(), pi_update()]
    moves = [shift_move(), scale_move()] if interweave else []
    if collapsed:
        return [cz_update(), c_given_z_update(), *params, *moves]
    return [c_given_z_update(), z_given_c_update(), *params, *moves]
