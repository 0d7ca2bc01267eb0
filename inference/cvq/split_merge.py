r"""A split-merge move for pairs of CVQ sources: two columns of indicators redrawn together by
Metropolis-Hastings with both sources' loadings integrated out, then the loadings given them.

Why: on the default bars some chains reach a state where one source holds two bars (it is on in
every row that has either, its image a blend of both) and another source is off. The collapsed
source move (:mod:`latentzoo.inference.cvq.moves`) can turn the free source on only row by row,
and each single row is still explained by the merged source, so no chain leaves that state
(R-hat 1.53 on ``sigma``, docs/convergence.md). This move proposes the whole split at once: the
merged source's rows shared out between it and the free source, and the reverse merge (the
feature split-merge of Meeds, Ghahramani, Neal & Roweis 2007, with the sequential-allocation
proposal of Dahl 2005 / restricted-Gibbs allocation of Jain & Neal 2004, for K fixed sources
whose rows overlap), then re-allocates the pair's rows between the two sources.

**Target.** Pick an ordered pair of sources :math:`(k, j)`, :math:`k \ne j`. Write
:math:`a = s_{\cdot k}`, :math:`b = s_{\cdot j}` (binary N-vectors), :math:`R = X - \sum_{l
\notin\{k,j\}} s_{\cdot l} w_l^\top` and :math:`\lambda = \beta\tau` (the likelihood's
temperature times the noise precision). With :math:`w_k, w_j` integrated out the joint density
of the two columns given everything else is, for each feature d with
:math:`u_d = (W_{dk}, W_{dj}) \sim \mathcal N(m_d, V_d)`, :math:`V_d = \mathrm{diag}(v_{dk},
v_{dj})` (the model's elementwise Normal prior),

.. math::

    \pi(a, b) \propto \prod_n \mathrm{Bern}(a_n; \pi_{nk})\,\mathrm{Bern}(b_n; \pi_{nj})
        \prod_d \int \mathcal N(u_d; m_d, V_d) \prod_n \mathcal N(R_{nd};\ a_n u_{d1} + b_n
        u_{d2},\ \lambda^{-1})\, du_d .

Each integral is a 2-dimensional Gaussian one. With :math:`z_n = (a_n, b_n)`, the Gram matrix
:math:`G = \sum_n z_n z_n^\top = \begin{pmatrix} n_a & n_{ab} \\ n_{ab} & n_b\end{pmatrix}`
(rows on in k, in j, in both) and :math:`h_d = \sum_n z_n R_{nd} = (a^\top R_{\cdot d},
b^\top R_{\cdot d})`, the exponent is :math:`-\tfrac12 u^\top P_d u + u^\top c_d` plus terms
free of (a, b), where :math:`P_d = V_d^{-1} + \lambda G` and :math:`c_d = V_d^{-1} m_d +
\lambda h_d`; completing the square,

.. math::

    \log \pi(a, b) = \sum_n \bigl(a_n \operatorname{logit}\pi_{nk} + b_n \operatorname{logit}
        \pi_{nj}\bigr) + \sum_d \Bigl[-\tfrac12 \log\det(I + \lambda V_d G)
        + \tfrac12 c_d^\top P_d^{-1} c_d\Bigr] + \text{const}

(:math:`\pi(a, b)` the target, :math:`\pi_{nk}` the model's source probabilities;
:func:`pair_log_likelihood`; with :math:`b = 0` it is the one-source
:func:`~latentzoo.inference.cvq.moves.collapsed_column_log_likelihood` plus a constant). It
depends on the columns only through :math:`(n_a, n_b, n_{ab}, h)`, which are running sums over
rows, O(D) each.

**Split and merge.** The union :math:`c = a \lor b` is what both keep. Call a state with
:math:`b = 0` *merged* and one with :math:`b \ne 0` *split*; a split state with union c gives
each row of c one of the patterns 10, 01, 11; :math:`|c|`, :math:`|a|`, :math:`|b|` count rows.

- *Split* (from a merged state :math:`x = (c, 0)` with :math:`|c| \ge 2`): draw two anchors, an
  ordered pair :math:`(i, l)` of distinct rows of c, uniformly: probability
  :math:`\alpha_x = 1/(|c|(|c|-1))`. Allocate the rows of c sequentially: i first (pattern 10
  or 11), then l (01 or 11), then the others in a uniform random order :math:`\sigma` (drawn
  independently of the state; 10, 01 or 11), each with probability proportional to
  :math:`\mathrm{Bern}(z_{n1}; \pi_{nk})\mathrm{Bern}(z_{n2}; \pi_{nj})
  \exp \ell(T_{<n} + z_n \otimes R_n)` among its allowed patterns, with :math:`\ell` the
  collapsed log likelihood above and :math:`T_{<n}` the statistics of the rows allocated so
  far (rows not yet visited count as off in both, the same for every choice): restricted Gibbs
  on a growing set of rows, seeded by the anchors (Jain & Neal 2004, Dahl 2005). Rows off in c
  stay 00. :math:`q_\sigma(y \mid x, i, l)` is the product of the chosen probabilities. The
  split reaches every y with union c that has :math:`a_i = 1` and :math:`b_l = 1`.
- *Merge* (from a split state :math:`y = (a, b)`): draw i uniformly among the rows on in k and
  l uniformly among the rows on in j other than i: probability :math:`\alpha_y = 1/(|a|(|b| -
  b_i))`. Propose :math:`x = (a \lor b, 0)` (deterministic) and compute
  :math:`q_\sigma(y \mid x, i, l)` by running the same scan with the choices forced to y's
  patterns.
- Otherwise (:math:`|c| < 2`, :math:`a = 0`, or b only on at i) the step leaves the state.

Each split path (x, i, l, y) has exactly one reverse path, the merge from y that draws the same
anchors (the merge map ignores them; the split from x with anchors (i, l) reaches y exactly
when the merge from y can draw them). Metropolis-Hastings on the paths,

.. math::

    \alpha(x \to y) = \min\Bigl(1, \frac{\pi(y)\, \alpha_y}
        {\pi(x)\, \alpha_x\, q_\sigma(y \mid x, i, l)}\Bigr), \qquad
    \alpha(y \to x) = \min\Bigl(1, \frac{\pi(x)\, \alpha_x\, q_\sigma(y \mid x, i, l)}
        {\pi(y)\, \alpha_y}\Bigr)

(:func:`split_log_ratio`), gives per path :math:`\pi(x)\alpha_x q_\sigma\, \alpha(x \to y) =
\min(\pi(x)\alpha_x q_\sigma,\ \pi(y)\alpha_y) = \pi(y)\alpha_y\, \alpha(y \to x)`, and summed over
the paths that join x and y, detailed balance for :math:`\pi`. The pair (k, j) and the order
:math:`\sigma` are drawn independently of the state, so the mixture over them keeps
:math:`\pi` too. That the merge map is many-to-one is what the split's proposal accounts for:
it covers the fibre :math:`\{y : a \lor b = c\}` (all of it that the anchors allow), and the
reverse of a merge is the exact probability of the path that leads to y. Without the anchors a
split is hopeless: a free source's :math:`\pi_j` is near 0 and a first row on in it alone pays
the prior and the cost of a new image (:math:`\tfrac D2 \log(1 + v\lambda)`, about 50 nats on
64 pixels), so the allocation would put every row back into source k.

**Re-allocation.** A merge from a split state that is a local mode is rejected even when
another split of the same union is far better (from the merged bars, chains with split and
merge alone reached a source on in the rows of two bars with a second source correcting it on
part of them, and stayed). So after the split or merge the same pair is re-allocated: draw
anchors (i, l), a uniform ordered pair of distinct rows of c (their law depends only on c,
which the step keeps); if the current y has :math:`a_i = 1` and :math:`b_l = 1`, propose
:math:`y'` by the sequential allocation above (a new order :math:`\sigma`) and accept with

.. math::

    \min\Bigl(1, \frac{\pi(y')\, q_\sigma(y \mid i, l)}{\pi(y)\, q_\sigma(y' \mid i, l)}\Bigr)

(:func:`reallocation_log_ratio`; :math:`q_\sigma(y \mid i, l)` by the forced scan, the anchor
probabilities cancel), else leave y. This is Metropolis-Hastings with an independence proposal
on the set of y with :math:`a_i = b_l = 1`, which both y and y' are in. Merged states are never
in it.

**Loadings.** After the two accept steps, :math:`u_d \mid a, b \sim \mathcal N(P_d^{-1} c_d,
P_d^{-1})` for every d, the exact conditional of what the target integrated out. The MH steps
keep :math:`p(s_{\cdot k}, s_{\cdot j} \mid X, s_{\cdot,-kj}, W_{\cdot,-kj}, \tau, \pi)` and
the draw completes it to the joint of :math:`(s_{\cdot k}, s_{\cdot j}, w_k, w_j)`: a
partially collapsed Gibbs step in the order that keeps it valid (van Dyk & Park 2008), as in
the source move. The likelihood is tempered through :math:`\lambda = \beta\tau` only (the
Bernoulli prior is not), so the move samples the tempered posterior too.

One call makes ``num_proposals`` attempts (default K), each on a uniformly drawn ordered pair:
split or merge, re-allocation, loadings; two loops over the rows of the union (the
re-allocation scores the current state alongside its proposal), three O(D) candidates a row.

Tested exactly in ``tests/inference/test_cvq_split_merge.py`` (one call from exact draws of
the joint on an enumerable problem keeps it; with a proposal term dropped it does not), which
also shows the move leaving the merged state that the table without it keeps.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpyro.distributions as dist

from latentzoo.inference.gaussian import gaussian_draw
from latentzoo.inference.updates import Move

from .moves import source_move_inputs

__all__ = ["split_merge_move", "pair_log_likelihood", "split_log_ratio", "reallocation_log_ratio"]


def pair_log_likelihood(n_a, n_b, n_ab, h_a, h_b, prior_loc, prior_var, lam):
    r""":math:`\log p(R \mid s_{\cdot k}, s_{\cdot j})` up to terms free of the columns, with
    :math:`w_k, w_j` integrated out (module docstring).

    ``n_a, n_b, n_ab``: scalars, the rows on in k, in j, in both; ``h_a, h_b`` (D,):
    :math:`s_{\cdot k}^\top R`, :math:`s_{\cdot j}^\top R`; ``prior_loc``, ``prior_var``: pairs
    ``(m_k, m_j)``, ``(v_k, v_j)`` of (D,) arrays; ``lam`` the (tempered) noise precision."""
    (m1, m2), (v1, v2) = prior_loc, prior_var
    P11, P22, P12 = 1.0 / v1 + lam * n_a, 1.0 / v2 + lam * n_b, lam * n_ab
    c1, c2 = m1 / v1 + lam * h_a, m2 / v2 + lam * h_b
    det = P11 * P22 - P12 * P12
    # det(I + lam V G) = v1 v2 det(P), written so that it is >= 1 without cancellation in the
    # common case n_ab = 0
    log_det = jnp.log((1.0 + v1 * lam * n_a) * (1.0 + v2 * lam * n_b) - v1 * v2 * P12 * P12)
    quad = (P22 * c1 * c1 - 2.0 * P12 * c1 * c2 + P11 * c2 * c2) / det
    return jnp.sum(-0.5 * log_det + 0.5 * quad)


def split_log_ratio(log_pi_split, log_pi_merged, log_q_split, log_q_merge):
    r""":math:`\log \frac{\pi(y)\, q(x \mid y)}{\pi(x)\, q(y \mid x)}`, the log acceptance
    ratio of the split x -> y (the merge y -> x accepts with minus it): ``log_q_split`` the
    log probability that the split from x picks its anchors and proposes y, ``log_q_merge``
    that the merge from y picks the same anchors (module docstring)."""
    return log_pi_split - log_pi_merged - log_q_split + log_q_merge


def reallocation_log_ratio(log_pi_new, log_pi_old, log_q_new, log_q_old):
    r""":math:`\log \frac{\pi(y')\, q(y)}{\pi(y)\, q(y')}`, the log acceptance ratio of the
    re-allocation y -> y' (module docstring)."""
    return log_pi_new - log_pi_old - log_q_new + log_q_old


# the three patterns a row on in the union can take, (in k, in j): 10, 01, 11
_PATTERNS_A = (1.0, 0.0, 1.0)
_PATTERNS_B = (0.0, 1.0, 1.0)
_FIRST_ANCHOR = (True, False, True)  # i is on in k: 10 or 11
_SECOND_ANCHOR = (False, True, True)  # l is on in j: 01 or 11


def _uniform_index(key, mask):
    """A uniformly random index among the True entries of ``mask`` (Gumbel-max)."""
    return jnp.argmax(jnp.where(mask, jax.random.gumbel(key, mask.shape), -jnp.inf))


def _uniform_pair(key, mask):
    """A uniformly random ordered pair of distinct True entries of ``mask`` (Gumbel top-2)."""
    g = jnp.where(mask, jax.random.gumbel(key, mask.shape), -jnp.inf)
    i = jnp.argmax(g)
    return i, jnp.argmax(g.at[i].set(-jnp.inf))


class _Pair(NamedTuple):
    """What an attempt on the pair (k, j) reads: the residual without the pair, the priors."""

    R: jax.Array  # (N, D)
    m: tuple  # (m_k, m_j), (D,) each
    v: tuple  # (v_k, v_j)
    lg_k: jax.Array  # (N,) logit pi_nk
    lg_j: jax.Array
    lam: jax.Array


def _pattern(a, b):
    """Each row's pattern code: 10 -> 0, 01 -> 1, 11 -> 2 (00 -> -1)."""
    return (a > 0).astype(jnp.int32) + 2 * (b > 0).astype(jnp.int32) - 1


def _log_pi(pair, a, b):
    """log pi(a, b) up to a constant: the Bernoulli prior terms and the collapsed likelihood."""
    return (pair_log_likelihood(a.sum(), b.sum(), a @ b, a @ pair.R, b @ pair.R, pair.m, pair.v, pair.lam)
            + a @ pair.lg_k + b @ pair.lg_j)


def _allocate(key, pair, on, i, l_, sample, forced):
    """The sequential allocation of the rows of the union ``on``: anchor i first (10 or 11),
    then anchor l (01 or 11), then the others in a uniform random order (10, 01 or 11), each
    from its restricted-Gibbs probabilities given the rows before it.

    ``sample`` (P,) bool, one entry per path run side by side over the same order: True draws
    the patterns, False takes ``forced`` (pattern codes) and only scores them. Returns a, b
    (P, N) and log q (P,). The loop runs over the |c| rows of the union only."""
    R, dtype = pair.R, pair.R.dtype
    N, D = R.shape
    P = sample.shape[0]
    k_perm, k_u = jax.random.split(key)
    rank = jnp.argsort(jax.random.permutation(k_perm, N)).astype(dtype)
    rank = jnp.where(on, rank, N + rank).at[i].set(-2.0).at[l_].set(-1.0)
    order = jnp.argsort(rank)  # the anchors, the union's other rows in random order, the rest
    allowed = jnp.ones((N, 3), bool).at[i].set(jnp.array(_FIRST_ANCHOR)).at[l_].set(jnp.array(_SECOND_ANCHOR))
    pa, pb = jnp.asarray(_PATTERNS_A, dtype), jnp.asarray(_PATTERNS_B, dtype)
    u = jax.random.uniform(k_u, (N,), dtype)

    def path(stats, smp, r, ok, force, u, la, lb):
        n_a, n_b, n_ab, h_a, h_b, log_q = stats
        # the candidates' log weights: prior terms plus the collapsed likelihood of the rows
        # allocated so far with this row added
        lw = jax.vmap(lambda ea, eb: pair_log_likelihood(
            n_a + ea, n_b + eb, n_ab + ea * eb, h_a + ea * r, h_b + eb * r, pair.m, pair.v, pair.lam)
            + ea * la + eb * lb)(pa, pb)
        lw = jnp.where(ok, lw, -jnp.inf)
        logp = lw - jax.scipy.special.logsumexp(lw)
        drawn = jnp.sum(u > jnp.cumsum(jnp.exp(logp))[:2]).astype(jnp.int32)
        choice = jnp.where(smp, drawn, jnp.clip(force, 0, 2))
        ea, eb = pa[choice], pb[choice]
        return (n_a + ea, n_b + eb, n_ab + ea * eb, h_a + ea * r, h_b + eb * r, log_q + logp[choice]), ea, eb

    def row(t, carry):
        stats, a_out, b_out = carry
        n = order[t]
        stats, ea, eb = jax.vmap(path, in_axes=(0, 0) + (None,) * 6)(
            stats, sample, R[n], allowed[n], forced[n], u[n], pair.lg_k[n], pair.lg_j[n])
        return stats, a_out.at[:, n].set(ea), b_out.at[:, n].set(eb)

    zero, zD, zN = jnp.zeros((P,), dtype), jnp.zeros((P, D), dtype), jnp.zeros((P, N), dtype)
    (_, _, _, _, _, log_q), a, b = jax.lax.fori_loop(
        0, on.sum(), row, ((zero, zero, zero, zD, zD, zero), zN, zN))
    return a, b, log_q


def _split_or_merge(key, pair, a, b, log_ratio):
    """The split (b = 0) or merge (b != 0) step on the pair's columns; returns the new (a, b)."""
    k_anchor, k_anchor2, k_alloc, k_acc = jax.random.split(key, 4)
    union = jnp.maximum(a, b)
    on = union > 0
    n_c = on.sum()
    is_split = jnp.all(b == 0)
    # anchors: the split draws an ordered pair of distinct rows of the union; the merge draws i
    # among y's rows on in k and l among its rows on in j other than i
    i_s, l_s = _uniform_pair(k_anchor, on)
    i_m = _uniform_index(k_anchor, a > 0)
    l_m = _uniform_index(k_anchor2, (b > 0) & (jnp.arange(a.shape[0]) != i_m))
    i, l_ = jnp.where(is_split, i_s, i_m), jnp.where(is_split, l_s, l_m)
    possible = jnp.where(is_split, n_c >= 2, (a.sum() >= 1) & (b.sum() - b[i_m] >= 1))
    log_pi_merged = _log_pi(pair, union, jnp.zeros_like(b))
    log_alpha_x = -jnp.log(n_c * (n_c - 1.0))
    log_u = jnp.log(jax.random.uniform(k_acc, (), a.dtype, minval=1e-300))
    # A merge is rejected whatever q_sigma(y | x) is when u is above its ratio at q = 1 (log q
    # <= 0, and the ratio grows with q): skip the allocation loop then (the decision is the one
    # the loop would give). Between two sources that explain different rows that is most merges.
    merge_bound = -log_ratio(_log_pi(pair, a, b), log_pi_merged, log_alpha_x,
                             -jnp.log(a.sum() * (b.sum() - b[i_m])))
    run = possible & (is_split | (log_u < merge_bound))

    def allocate(_):  # the split state: the proposal (split) or the current state (merge: scored)
        return tuple(x[0] for x in _allocate(k_alloc, pair, on, i, l_, is_split[None], _pattern(a, b)))

    a_y, b_y, log_q = jax.lax.cond(run, allocate, lambda _: (a, b, jnp.zeros((), a.dtype)), None)
    log_q_split = log_q + log_alpha_x
    log_q_merge = -jnp.log(a_y.sum() * (b_y.sum() - b_y[i]))
    log_r = log_ratio(_log_pi(pair, a_y, b_y), log_pi_merged, log_q_split, log_q_merge)
    accept = run & jnp.where(is_split, log_u < log_r, log_u < -log_r)
    a_new = jnp.where(accept, jnp.where(is_split, a_y, union), a)
    b_new = jnp.where(accept, jnp.where(is_split, b_y, 0.0), b)
    return a_new, b_new


def _reallocate(key, pair, a, b, log_ratio):
    """The re-allocation step: y = (a, b) with anchors i in a, l in b -> a fresh allocation y' of
    the same union with the same anchors; returns the new (a, b)."""
    k_anchor, k_alloc, k_acc = jax.random.split(key, 3)
    union = jnp.maximum(a, b)
    on = union > 0
    i, l_ = _uniform_pair(k_anchor, on)
    possible = (on.sum() >= 2) & (a[i] > 0) & (b[l_] > 0)

    def allocate(_):  # the proposal and the current state's score, side by side in one loop
        (a_new, _), (b_new, _), (log_q_new, log_q_old) = _allocate(
            k_alloc, pair, on, i, l_, jnp.array([True, False]), _pattern(a, b))
        return a_new, b_new, log_q_new, log_q_old

    zero = jnp.zeros((), a.dtype)
    a_new, b_new, log_q_new, log_q_old = jax.lax.cond(possible, allocate, lambda _: (a, b, zero, zero), None)
    log_r = log_ratio(_log_pi(pair, a_new, b_new), _log_pi(pair, a, b), log_q_new, log_q_old)
    log_u = jnp.log(jax.random.uniform(k_acc, (), a.dtype, minval=1e-300))
    accept = possible & (log_u < log_r)
    return jnp.where(accept, a_new, a), jnp.where(accept, b_new, b)


def _draw_loadings(key, pair, a, b):
    """(w_k, w_j) | columns, per feature: N(P_d^{-1} c_d, P_d^{-1}) with the 2x2 precision
    P_d = V_d^{-1} + lam G of :func:`pair_log_likelihood` (:func:`gaussian_draw`, D blocks)."""
    (m1, m2), (v1, v2), lam = pair.m, pair.v, pair.lam
    P12 = lam * (a @ b)
    P = jnp.stack([jnp.stack([1.0 / v1 + lam * a.sum(), jnp.broadcast_to(P12, v1.shape)], -1),
                   jnp.stack([jnp.broadcast_to(P12, v1.shape), 1.0 / v2 + lam * b.sum()], -1)], -2)
    c = jnp.stack([m1 / v1 + lam * (a @ pair.R), m2 / v2 + lam * (b @ pair.R)], -1)  # (D, 2)
    w = gaussian_draw(key, P, c)
    return w[:, 0], w[:, 1]


def _attempt(key, E, s, W, loc, var, logit, lam, log_ratio, realloc_log_ratio):
    """One attempt on a uniformly drawn ordered pair (k, j): split or merge, re-allocate, then
    the pair's loadings. ``E = X - s Wᵀ`` is kept current."""
    K = s.shape[1]
    k_pair1, k_pair2, k_sm, k_re, k_w = jax.random.split(key, 5)
    k = jax.random.randint(k_pair1, (), 0, K)
    j = (k + jax.random.randint(k_pair2, (), 1, K)) % K  # uniform over the K - 1 others
    a, b = s[:, k], s[:, j]
    R = E + a[:, None] * W[:, k][None, :] + b[:, None] * W[:, j][None, :]  # without the pair
    pair = _Pair(R, (loc[:, k], loc[:, j]), (var[:, k], var[:, j]), logit[:, k], logit[:, j], lam)
    a, b = _split_or_merge(k_sm, pair, a, b, log_ratio)
    a, b = _reallocate(k_re, pair, a, b, realloc_log_ratio)
    wk, wj = _draw_loadings(k_w, pair, a, b)
    E = R - a[:, None] * wk[None, :] - b[:, None] * wj[None, :]
    return E, s.at[:, k].set(a).at[:, j].set(b), W.at[:, k].set(wk).at[:, j].set(wj)


def _split_merge_step(key, values, obs, priors, num_proposals=None, log_ratio=split_log_ratio,
                      realloc_log_ratio=reallocation_log_ratio):
    W, s0 = values["W"], values["s"]
    N, K = s0.shape
    if K < 2:
        return {"s": s0, "W": W}
    lam, loc, var, logit, s, E = source_move_inputs(values, obs, priors)  # E kept current

    def body(_, carry):
        E, s, W, key = carry
        key, sub = jax.random.split(key)
        E, s, W = _attempt(sub, E, s, W, loc, var, logit, lam, log_ratio, realloc_log_ratio)
        return E, s, W, key

    n = K if num_proposals is None else num_proposals
    _, s, W, _ = jax.lax.fori_loop(0, n, body, (E, s, W, key))
    return {"s": s.astype(s0.dtype), "W": W}


def split_merge_move(num_proposals: int | None = None, log_ratio=split_log_ratio,
                     realloc_log_ratio=reallocation_log_ratio) -> Move:
    """The split-merge move on ordered pairs of sources (module docstring): ``num_proposals``
    attempts a call (default K), each on a uniformly drawn ordered pair; exact for the model's
    Normal prior on W, Bernoulli sources and Gaussian noise, on the tempered posterior too.
    ``log_ratio`` and ``realloc_log_ratio`` are :func:`split_log_ratio` and
    :func:`reallocation_log_ratio` (others make a wrong move, for the tests' controls)."""
    bernoulli = (dist.BernoulliProbs, dist.BernoulliLogits)
    return Move("(s_k, s_j, w_k, w_j) split-merge, w integrated out", ("s", "W"),
                {"s": bernoulli, "W": (dist.Normal,), "X": (dist.Normal,)},
                partial(_split_merge_step, num_proposals=num_proposals, log_ratio=log_ratio,
                        realloc_log_ratio=realloc_log_ratio),
                tempered=True, preserves_likelihood=False)
