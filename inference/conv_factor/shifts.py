r"""Drawing activation maps: the exact colour-class sampler, the paper's parallel all-shifts
update, and max-pooling.

Notation (:mod:`latentzoo.models.conv_factor`): images R, X (N, C, H, W); maps W (N, K, H', W')
with H' = H - h + 1; atoms d (K, C, h, w); the residual :math:`R_n = X_n - \sum_k b_{nk} W_{nk}
* d_k`. The coefficient :math:`w_{nki}` at position i = (i_1, i_2) adds
:math:`b_{nk} w_{nki}` times the atom with its top-left corner at i, so, with everything else
fixed, its full conditional is (derived from the joint in ``docs/models/conv_factor.md``)

.. math::

    w_{nki} \mid - \sim \mathcal N\Big(\frac{\gamma_n b_{nk}\,(\langle R_n, S_i d_k\rangle +
    \lVert d_k\rVert^2 w_{nki}) + \alpha_{nki} m_{nki}}{\Lambda},\ \Lambda^{-1}\Big),\qquad
    \Lambda = \gamma_n b_{nk} \lVert d_k\rVert^2 + \alpha_{nki}

(supplement eqs. 3-4 per shift; :math:`S_i d_k` is the atom placed at i; the bracket is the
residual with w_{nki}'s own contribution added back, correlated with the atom; m is the prior
mean, 0 in the paper). Two coefficients of one map interact only when their atoms overlap, i.e.
when they are less than h rows *and* less than w columns apart.

**Colouring (exact).** Position i gets colour (i_1 mod h, i_2 mod w): two distinct positions of
one colour are a multiple of h rows or of w columns apart, so their atoms never overlap and
their coefficients are conditionally independent given everything else. One colour class of one
element is drawn jointly (all images at once: images are independent given the atoms), the
residual is updated, and the h·w classes and the K elements follow in turn: a systematic scan
of exact conditional draws, which leaves the joint conditional of W invariant. The class
correlations are a strided correlation (``lax.conv`` with window strides (h, w)); the residual
update tiles disjoint copies of the atom (a reshape, no convolution).

**Parallel (the paper's eqs. 6-7, not exact).** Every shift of one element drawn at once from
the per-shift conditionals above, all read from the same residual. Overlapping shifts are
correlated, so this is a Jacobi-style step, not a draw from the joint conditional; it is kept
(``w_update="parallel"``) so that its cost in correctness can be measured (the Geweke test
fails it).

**Max-pooling (outside the model).** The paper's heuristic: after each element's draw, keep in
each pooling region only the largest-magnitude coefficient and set the rest to zero. It is not
a draw from any conditional of the model; :func:`max_pool` implements it for ``pool=True``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from latentzoo.models.conv_factor import reconstruct

__all__ = ["colour_grid", "draw_maps_coloured", "draw_maps_parallel", "max_pool",
           "class_conditional", "scan_from_zero"]

_DIMS = ("NCHW", "OIHW", "NCHW")


def colour_grid(map_hw, atom_hw):
    """(M, L, Hpad, Wpad): a colour class has at most M x L positions (M = ceil(H'/h)); arrays are
    padded to (Hpad, Wpad) = (M h + h - 1, L w + w - 1) so that every class's block of
    (M h, L w) starting at its offset (i_1, i_2) < (h, w) fits."""
    (Hp, Wp), (h, w) = map_hw, atom_hw
    M, L = -(-Hp // h), -(-Wp // w)
    return M, L, M * h + h - 1, L * w + w - 1


def _pad(x, Hpad, Wpad, value=0.0):
    cfg = [(0, 0)] * (x.ndim - 2) + [(0, Hpad - x.shape[-2]), (0, Wpad - x.shape[-1])]
    return jnp.pad(x, cfg, constant_values=value)


def _block(x, ci, cj, M, L, h, w):
    """x[..., ci : ci + M h, cj : cj + L w] (dynamic offsets, static size)."""
    start = (0,) * (x.ndim - 2) + (ci, cj)
    return jax.lax.dynamic_slice(x, start, x.shape[:-2] + (M * h, L * w))


def _put_block(x, block, ci, cj):
    return jax.lax.dynamic_update_slice(x, block, (0,) * (x.ndim - 2) + (ci, cj))


def _lattice(block, M, L, h, w):
    """The class's positions of a block: (..., M h, L w) -> (..., M, L)."""
    return block.reshape(block.shape[:-2] + (M, h, L, w))[..., :, 0, :, 0]


def _set_lattice(block, values, M, L, h, w):
    b = block.reshape(block.shape[:-2] + (M, h, L, w))
    return b.at[..., :, 0, :, 0].set(values).reshape(block.shape)


def _class_terms(R_pad, W_pad_k, loc_k, prec_k, dk, bk, gamma, ci, cj, grid, map_hw):
    """Natural parameters of one colour class of element k: (mean, precision, valid, w_old,
    residual block); arrays of shape (N, M, L)."""
    M, L, _, _ = grid
    C, h, w = dk.shape
    Rb = _block(R_pad, ci, cj, M, L, h, w)  # (N, C, M h, L w)
    corr = jax.lax.conv_general_dilated(Rb, dk[None], (h, w), "VALID", dimension_numbers=_DIMS)[:, 0]
    w_old = _lattice(_block(W_pad_k, ci, cj, M, L, h, w), M, L, h, w)
    loc = _lattice(_block(loc_k, ci, cj, M, L, h, w), M, L, h, w)
    prec0 = _lattice(_block(prec_k, ci, cj, M, L, h, w), M, L, h, w)
    rows = ci + h * jnp.arange(M)
    cols = cj + w * jnp.arange(L)
    valid = (rows[:, None] < map_hw[0]) & (cols[None, :] < map_hw[1])
    gb = (gamma * bk)[:, None, None]
    dd = jnp.sum(dk * dk)
    P = gb * dd + prec0
    mean = (gb * (corr + dd * w_old) + prec0 * loc) / P
    return mean, P, valid, w_old, Rb


def _set_class(Wk, R_pad, Rb, new, w_old, bk, dk, ci, cj, grid):
    """Write one colour class's new values into the (padded) maps Wk (N, Hpad, Wpad) and move the
    residual: (Wk, R_pad)."""
    M, L, _, _ = grid
    h, w = dk.shape[1:]
    delta = bk[:, None, None] * (new - w_old)
    # disjoint copies of the atom: delta[n, m, l] d[c, u, v] at (ci + h m + u, cj + w l + v)
    tiles = jnp.einsum("nml,cuv->ncmulv", delta, dk).reshape(Rb.shape)
    R_pad = _put_block(R_pad, Rb - tiles, ci, cj)
    block = _set_lattice(_block(Wk, ci, cj, M, L, h, w), new, M, L, h, w)
    return _put_block(Wk, block, ci, cj), R_pad


def _padded(W, R, loc, prec, grid):
    _, _, Hpad, Wpad = grid
    return (_pad(W, Hpad, Wpad), _pad(R, Hpad, Wpad), _pad(loc, Hpad, Wpad),
            _pad(prec, Hpad, Wpad, 1.0))


def class_conditional(W, R, b, d, gamma, loc, prec, k: int, colour: int):
    """The exact joint conditional of one colour class of element k (for the checks): ``(mean,
    sd, valid)`` (N, M, L) with ``R`` the current residual. Positions outside the map have
    ``valid`` False."""
    N, K, Hp, Wp = W.shape
    C, h, w = d.shape[1:]
    grid = colour_grid((Hp, Wp), (h, w))
    Wp_, Rp, locp, precp = _padded(W, R, loc, prec, grid)
    mean, P, valid, _, _ = _class_terms(Rp, Wp_[:, k], locp[:, k], precp[:, k], d[k], b[:, k],
                                        gamma, colour // w, colour % w, grid, (Hp, Wp))
    return mean, 1.0 / jnp.sqrt(P), valid


def draw_maps_coloured(key, W, R, b, d, gamma, loc, prec, *, pool_size=None):
    """The exact systematic scan over elements k and colour classes (module docstring).

    Args: W (N, K, H', W') current maps; R (N, C, H, W) current residual; b (N, K); d (K, C, h,
    w); gamma (N,); loc, prec (N, K, H', W') the coefficients' prior means and precisions.
    ``pool_size``: max-pool each element's map after its draw (outside the model), or None.
    Returns (W, R) with R the residual of the new maps.
    """
    N, K, Hp, Wp = W.shape
    C, h, w = d.shape[1:]
    grid = colour_grid((Hp, Wp), (h, w))
    W_pad, R_pad, loc_pad, prec_pad = _padded(W, R, loc, prec, grid)

    def element(k, carry):
        W_pad, R_pad, key = carry
        key, k_el = jax.random.split(key)
        dk, bk = d[k], b[:, k]
        Wk, lk, pk = W_pad[:, k], loc_pad[:, k], prec_pad[:, k]

        def colour(c, inner):
            Wk, R_pad = inner
            ci, cj = c // w, c % w
            mean, P, valid, w_old, Rb = _class_terms(R_pad, Wk, lk, pk, dk, bk, gamma, ci, cj,
                                                     grid, (Hp, Wp))
            eps = jax.random.normal(jax.random.fold_in(k_el, c), mean.shape, mean.dtype)
            new = jnp.where(valid, mean + eps / jnp.sqrt(P), 0.0)
            return _set_class(Wk, R_pad, Rb, new, w_old, bk, dk, ci, cj, grid)

        Wk, R_pad = jax.lax.fori_loop(0, h * w, colour, (Wk, R_pad))
        if pool_size is not None:
            Wk, R_pad = _pool_element(Wk, R_pad, dk, bk, (Hp, Wp), pool_size)
        return W_pad.at[:, k].set(Wk), R_pad, key

    W_pad, R_pad, _ = jax.lax.fori_loop(0, K, element, (W_pad, R_pad, key))
    H, Wd = R.shape[-2:]
    return W_pad[..., :Hp, :Wp], R_pad[..., :H, :Wd]


def scan_from_zero(key, Wk, R_k, force, dk, gamma, loc_k, prec_k):
    """The joint (b, W) move's proposal q (:mod:`.joint_b`): the exact colour-class scan of one
    element's maps with b = 1, started from maps at 0 and the residual without the element.

    Each class is drawn from its Normal conditional given the classes before it (the later ones
    still 0), so q is the product of those densities, a proper density on the map that does not
    depend on the current map or switch. Images with ``force`` draw nothing: each class is set
    to ``Wk``'s values instead, and log q is that map's density under the same scan.

    Args: Wk (N, H', W') current maps of the element; R_k (N, C, H, W) the residual without it;
    force (N,) bool; dk (C, h, w); gamma (N,); loc_k, prec_k (N, H', W') the prior's means and
    precisions. Returns (maps (N, H', W'), log q (N,), residual R_k - maps * d_k (N, C, H, W)).
    """
    N, Hp, Wp = Wk.shape
    C, h, w = dk.shape
    grid = colour_grid((Hp, Wp), (h, w))
    M, L, _, _ = grid
    cur, R_pad, lk, pk = _padded(Wk, R_k, loc_k, prec_k, grid)
    ones = jnp.ones((N,), Wk.dtype)

    def colour(c, carry):
        Wn, R_pad, logq = carry
        ci, cj = c // w, c % w
        mean, P, valid, w_old, Rb = _class_terms(R_pad, Wn, lk, pk, dk, ones, gamma, ci, cj,
                                                 grid, (Hp, Wp))
        eps = jax.random.normal(jax.random.fold_in(key, c), mean.shape, mean.dtype)
        forced = _lattice(_block(cur, ci, cj, M, L, h, w), M, L, h, w)
        new = jnp.where(valid, jnp.where(force[:, None, None], forced, mean + eps / jnp.sqrt(P)),
                        0.0)
        z2 = P * (new - mean) ** 2
        lq = jnp.where(valid, 0.5 * (jnp.log(P) - jnp.log(2 * jnp.pi) - z2), 0.0)
        Wn, R_pad = _set_class(Wn, R_pad, Rb, new, w_old, ones, dk, ci, cj, grid)
        return Wn, R_pad, logq + jnp.sum(lq, (1, 2))

    start = (jnp.zeros_like(cur), R_pad, jnp.zeros((N,), Wk.dtype))
    Wn, R_pad, logq = jax.lax.fori_loop(0, h * w, colour, start)
    H, Wd = R_k.shape[-2:]
    return Wn[:, :Hp, :Wp], logq, R_pad[..., :H, :Wd]


def draw_maps_parallel(key, W, R, b, d, gamma, loc, prec, *, pool_size=None):
    """The supplement's eqs. 6-7: each element's shifts all at once from one residual (elements
    in turn). NOT a draw from the joint conditional of the shifts (module docstring); same
    arguments and return as :func:`draw_maps_coloured`."""
    N, K, Hp, Wp = W.shape
    H, Wd = R.shape[-2:]

    def element(k, carry):
        W, R = carry
        dk, bk, Wk = d[k], b[:, k], W[:, k]
        gb = (gamma * bk)[:, None, None]
        dd = jnp.sum(dk * dk)
        corr = jax.lax.conv_general_dilated(R, dk[None], (1, 1), "VALID", dimension_numbers=_DIMS)[:, 0]
        P = gb * dd + prec[:, k]
        mean = (gb * (corr + dd * Wk) + prec[:, k] * loc[:, k]) / P
        eps = jax.random.normal(jax.random.fold_in(key, k), mean.shape, mean.dtype)
        new = mean + eps / jnp.sqrt(P)
        R = R - reconstruct((bk[:, None, None] * (new - Wk))[:, None], dk[None])
        if pool_size is not None:
            new, R = _pool_element(new, R, dk, bk, (Hp, Wp), pool_size)
        return W.at[:, k].set(new), R

    W, R = jax.lax.fori_loop(0, K, element, (W, R))
    return W, R


def max_pool(Wk, size: int):
    """Keep the largest-magnitude coefficient of each ``size`` x ``size`` region of every map, zero
    the rest (ties: the first). Wk (N, H', W'), any H', W' (edge regions are smaller)."""
    N, Hp, Wp = Wk.shape
    Mp, Lp = -(-Hp // size), -(-Wp // size)
    x = _pad(Wk, Mp * size, Lp * size)
    x = x.reshape(N, Mp, size, Lp, size).transpose(0, 1, 3, 2, 4).reshape(N, Mp, Lp, size * size)
    keep = jax.nn.one_hot(jnp.argmax(jnp.abs(x), axis=-1), size * size, dtype=x.dtype)
    x = (x * keep).reshape(N, Mp, Lp, size, size).transpose(0, 1, 3, 2, 4)
    return x.reshape(N, Mp * size, Lp * size)[:, :Hp, :Wp]


def _pool_element(Wk, R, dk, bk, map_hw, size):
    """Max-pool one element's (possibly padded) maps and move the residual accordingly."""
    Hp, Wp = map_hw
    core = Wk[:, :Hp, :Wp]
    pooled = max_pool(core, size)
    change = (bk[:, None, None] * (pooled - core))[:, None]
    H, Wd = Hp + dk.shape[1] - 1, Wp + dk.shape[2] - 1
    R = R.at[..., :H, :Wd].add(-reconstruct(change, dk[None]))
    return Wk.at[:, :Hp, :Wp].set(pooled), R
