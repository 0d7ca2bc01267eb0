r"""The two-layer convolutional factor analysis stack (the paper's layer-wise training) and the
map of layer-2 elements back to pixel space.

Layer 1 is one layer of :mod:`latentzoo.models.conv_factor` fitted to the images ``X`` (N, C, H,
W) by the exact block Gibbs sampler (:func:`latentzoo.inference.conv_factor.cfa_updates`;
``pool=True`` adds the paper's max-pooling heuristic after each map's draw, outside the model).
After burn-in the sampler's draws give, per element k,

- its **usage**: the posterior frequency of :math:`b_{nk} = 1` over images and draws. Elements
  whose usage is at most ``threshold`` are pruned (the beta-Bernoulli prior switched them off);
  only the K_1' elements **in use** are kept and counted;
- its posterior-mean atom :math:`\bar d_k` and posterior-mean activation maps
  :math:`\bar M_{nk} = \mathbb E[b_{nk} W_{nk}]` (N, H', W').

**Pooling.** Each map of an element in use is max-pooled over ``pool_size`` x ``pool_size``
cells (the last cell of a row/column may be smaller): the cell's largest-magnitude coefficient,
with its sign, and its position in the cell (:func:`pool_maps`). The pooled maps, (N, K_1',
ceil(H'/p), ceil(W'/p)), are layer 2's input: an image stack with K_1' channels. Layer 2 is
fitted the same way, so its atoms span the K_1' channels.

**Back to pixel space.** A layer-2 code (maps :math:`V_{nk}` of element k, in layer 2's map
coordinates) is mapped to pixels linearly, by undoing the two layers in turn:

.. math::

    \hat Z_n = \sum_k V_{nk} * d^{(2)}_k \quad (K_1' \text{ pooled channels}),\qquad
    \hat M_n = U_p(\hat Z_n),\qquad
    \hat X_n = \sum_{j=1}^{K_1'} \hat M_{nj} * \bar d^{(1)}_j

(:func:`to_pixels`), where the un-pooling :math:`U_p` (:func:`unpool`) puts each pooled
coefficient of cell (a, b) back at one position of that cell, zero elsewhere: at the position
pooling took it from when those positions are given (an image's own code), else at the cell's
top-left corner (p a, p b). A layer-2 *element* in pixel space (:func:`elements_in_pixels`) is
the image of a single unit coefficient at the origin with the top-left rule,

.. math::

    D_k = \sum_{j=1}^{K_1'} \big(\uparrow_p d^{(2)}_k[j]\big) * \bar d^{(1)}_j ,

:math:`\uparrow_p` the p-fold upsampling that puts entry (a, b) at (p a, p b): a (C, p(h_2 - 1)
+ h_1, p(w_2 - 1) + w_1) image. By linearity and shift-equivariance a unit coefficient at layer-2
position (i, j) maps to :math:`D_k` placed at (p i, p j) (the tests check this, and that
un-pooling with the pooled positions reproduces max-pooling's maps).
"""

from __future__ import annotations

import time
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from latentzoo.inference.gibbs import SweepState, sweep
from latentzoo.models.conv_factor import conv_factor, reconstruct

from .gibbs import cfa_updates

__all__ = ["LayerFit", "StackFit", "fit_layer", "fit_stack", "pool_maps", "unpool",
           "to_pixels", "elements_in_pixels", "initial_values"]


class LayerFit(NamedTuple):
    """One fitted layer. ``usage`` (K,) and ``in_use`` (K,) cover all K elements; ``d`` (K', C,
    h, w) and ``maps`` (N, K', H', W') only the K' elements in use (posterior means); ``gamma``
    (N,) the posterior-mean noise precisions; ``sweep_seconds`` the wall time of the sampling
    (compilation excluded)."""

    d: np.ndarray
    maps: np.ndarray
    usage: np.ndarray
    in_use: np.ndarray
    gamma: np.ndarray
    sweep_seconds: float

    @property
    def num_in_use(self) -> int:
        return int(self.in_use.sum())

    def reconstruction(self) -> np.ndarray:
        """The posterior-mean reconstruction sum_k M_nk * d_k, (N, C, H, W)."""
        return np.asarray(reconstruct(jnp.asarray(self.maps), jnp.asarray(self.d)))


class StackFit(NamedTuple):
    """Two layers: ``pooled`` (N, K_1', H2, W2) is layer 2's input, ``positions`` (same shape,
    int) where pooling took each coefficient from in its cell; ``elements`` (K_2', C, ., .) the
    layer-2 elements in use in pixel space."""

    layer1: LayerFit
    layer2: LayerFit
    pooled: np.ndarray
    positions: np.ndarray
    pool_size: int
    elements: np.ndarray

    def reconstruction(self) -> np.ndarray:
        """Layer 2's posterior-mean codes carried to pixel space through each image's own
        pooling positions, (N, C, H, W)."""
        map_hw = self.layer1.maps.shape[-2:]
        return np.asarray(to_pixels(self.layer2.maps, self.layer2.d, self.layer1.d,
                                    self.pool_size, map_hw, self.positions))


# ----------------------------------------------------------------------------- pooling
def pool_maps(maps, size: int):
    """Largest-magnitude pooling of maps (..., H', W') over ``size`` x ``size`` cells (edge cells
    are smaller). Returns (pooled, positions), both (..., ceil(H'/size), ceil(W'/size)): the signed
    coefficient of largest magnitude in each cell and its index ``r * size + c`` in the cell
    (ties: the first, which always lies inside the map)."""
    maps = jnp.asarray(maps)
    Hp, Wp = maps.shape[-2:]
    Mp, Lp = -(-Hp // size), -(-Wp // size)
    lead = maps.shape[:-2]
    x = jnp.pad(maps, [(0, 0)] * len(lead) + [(0, Mp * size - Hp), (0, Lp * size - Wp)])
    x = x.reshape(lead + (Mp, size, Lp, size))
    x = jnp.moveaxis(x, -3, -2).reshape(lead + (Mp, Lp, size * size))
    pos = jnp.argmax(jnp.abs(x), axis=-1)
    return jnp.take_along_axis(x, pos[..., None], axis=-1)[..., 0], pos


def unpool(pooled, size: int, map_hw, positions=None):
    """The un-pooling U_p: each pooled coefficient (..., Mp, Lp) back at one position of its
    cell in a (..., H', W') map, zero elsewhere; ``positions`` as :func:`pool_maps` returns them,
    or None for every cell's top-left corner."""
    pooled = jnp.asarray(pooled)
    lead, (Mp, Lp) = pooled.shape[:-2], pooled.shape[-2:]
    pos = jnp.zeros(pooled.shape, jnp.int32) if positions is None else jnp.asarray(positions)
    cells = jax.nn.one_hot(pos, size * size, dtype=pooled.dtype) * pooled[..., None]
    cells = cells.reshape(lead + (Mp, Lp, size, size))
    full = jnp.moveaxis(cells, -3, -2).reshape(lead + (Mp * size, Lp * size))
    return full[..., : map_hw[0], : map_hw[1]]


def to_pixels(codes2, d2, d1, size: int, map_hw, positions=None):
    """Layer-2 codes (N, K_2', ., .) to pixels (N, C, H, W) through layer-2 atoms d2 (K_2', K_1',
    h2, w2), un-pooling and layer-1 atoms d1 (K_1', C, h1, w1) (module docstring)."""
    Z = reconstruct(jnp.asarray(codes2), jnp.asarray(d2))
    return reconstruct(unpool(Z, size, map_hw, positions), jnp.asarray(d1))


def elements_in_pixels(d2, d1, size: int):
    """Layer-2 elements D_k in pixel space, (K_2', C, size (h2-1) + h1, size (w2-1) + w1)."""
    d2 = jnp.asarray(d2)
    K2, K1, h2, w2 = d2.shape
    up = jnp.zeros((K2, K1, size * (h2 - 1) + 1, size * (w2 - 1) + 1), d2.dtype)
    up = up.at[..., ::size, ::size].set(d2)
    return np.asarray(reconstruct(up, jnp.asarray(d1)))


# --------------------------------------------------------------------------- one layer
def initial_values(X, K: int, atom_shape, key):
    """A start: every element on with zero maps (the first W draw then fits the data), random
    unit-norm atoms, gamma_n = 1 / var(X_n) (the noise holds all the signal)."""
    N, C, H, Wd = X.shape
    h, w = atom_shape
    d = jax.random.normal(key, (K, C, h, w), X.dtype)
    d = d / jnp.sqrt(jnp.sum(d**2, (1, 2, 3), keepdims=True))
    shape = (N, K, H - h + 1, Wd - w + 1)
    return {"pi": jnp.full((K,), 0.5, X.dtype), "b": jnp.ones((N, K), X.dtype),
            "W": jnp.zeros(shape, X.dtype), "alpha": jnp.ones(shape, X.dtype), "d": d,
            "beta": jnp.ones_like(d),
            "gamma": 1.0 / jnp.maximum(jnp.var(X, axis=(1, 2, 3)), 1e-8)}


def _chain(state, X, *, model, table, burn_in, draws):
    """``burn_in + draws`` sweeps in one scan (one copy of the sweep to compile); the last
    ``draws`` add E[bW], E[b], E[d], E[gamma] into the carry (nothing per draw is stored)."""

    def one(carry, i):
        s, acc = carry
        s = sweep(model, table, s, (X,), {})
        z = s.z
        keep = (i >= burn_in).astype(X.dtype)
        new = (z["b"][:, :, None, None] * z["W"], z["b"], z["d"], z["gamma"])
        return (s, tuple(a + keep * v for a, v in zip(acc, new))), None

    z = state.z
    acc0 = tuple(jnp.zeros_like(v, dtype=X.dtype) for v in (z["W"], z["b"], z["d"], z["gamma"]))
    (state, acc), _ = jax.lax.scan(one, (state, acc0), jnp.arange(burn_in + draws))
    return state, tuple(a / draws for a in acc)


def fit_layer(X, *, K: int, atom_shape, burn_in: int = 100, draws: int = 50, pool: bool = False,
              pool_size: int = 2, threshold: float = 0.05, seed: int = 0, priors=None,
              joint_b: bool = True) -> LayerFit:
    """One layer by the exact block Gibbs sampler: ``burn_in`` sweeps, then ``draws`` sweeps
    averaged. X (N, C, H, W). ``pool``: the paper's max-pooling after each map's draw (outside
    the model); ``joint_b``: the joint (b, W) move (:func:`.cfa_updates`). Elements with usage
    (posterior frequency of b = 1) <= ``threshold`` are dropped."""
    X = jnp.asarray(X)
    if X.ndim != 4:
        raise ValueError(f"fit_layer needs images shaped (N, C, H, W), got shape {X.shape}.")
    h, w = atom_shape
    if not (1 <= h <= X.shape[2] and 1 <= w <= X.shape[3]):
        raise ValueError(f"atoms {h}x{w} do not fit in {X.shape[2]}x{X.shape[3]} inputs.")
    if burn_in < 0 or draws < 1:
        raise ValueError(f"need burn_in >= 0 and draws >= 1, got {burn_in} and {draws}.")
    model = partial(conv_factor, K=K, atom_shape=(h, w), priors=priors)
    table = tuple(cfa_updates(pool=pool, pool_size=pool_size, joint_b=joint_b))
    key, k0 = jax.random.split(jax.random.PRNGKey(seed))
    state = SweepState(initial_values(X, K, (h, w), k0), key, jnp.zeros((), X.dtype),
                       jnp.zeros((), bool))
    run = jax.jit(partial(_chain, model=model, table=table, burn_in=burn_in, draws=draws))
    run = run.lower(state, X).compile()  # compile first so that the timing is the sampling's
    t = time.perf_counter()
    _, (mW, mb, md, mg) = jax.block_until_ready(run(state, X))
    seconds = time.perf_counter() - t
    usage = np.asarray(mb.mean(0))
    keep = usage > threshold
    return LayerFit(d=np.asarray(md)[keep], maps=np.asarray(mW)[:, keep], usage=usage,
                    in_use=keep, gamma=np.asarray(mg), sweep_seconds=seconds)


# ------------------------------------------------------------------------------ stack
def fit_stack(X, *, K1: int, atom1, K2: int, atom2, pool_size: int = 2, pool: bool = False,
              burn_in: int = 100, draws: int = 50, threshold: float = 0.05, seed: int = 0,
              priors1=None, priors2=None) -> StackFit:
    """Layer 1 on X (N, C, H, W), max-pooling of its posterior-mean maps (elements in use only)
    over ``pool_size`` cells, layer 2 on the pooled maps, layer-2 elements in pixel space.
    ``pool`` also switches on the paper's pooling heuristic inside both samplers (same size)."""
    if isinstance(pool_size, bool) or int(pool_size) < 1:
        raise ValueError(f"pool_size must be a positive integer, got {pool_size!r}.")
    size = int(pool_size)
    H2, W2 = (-(-(n - a + 1) // size) for n, a in zip(np.shape(X)[-2:], atom1))
    if atom2[0] > H2 or atom2[1] > W2:  # checked before any fit
        raise ValueError(f"layer-2 atoms {atom2[0]}x{atom2[1]} do not fit in the pooled "
                         f"{H2}x{W2} maps.")
    kw = dict(burn_in=burn_in, draws=draws, pool=pool, pool_size=size, threshold=threshold)
    l1 = fit_layer(X, K=K1, atom_shape=atom1, seed=seed, priors=priors1, **kw)
    if l1.num_in_use == 0:
        raise ValueError(f"layer 1 kept no element above the usage threshold {threshold}.")
    pooled, positions = pool_maps(l1.maps, size)
    l2 = fit_layer(pooled, K=K2, atom_shape=atom2, seed=seed + 1, priors=priors2, **kw)
    elements = (elements_in_pixels(l2.d, l1.d, size) if l2.num_in_use
                else np.zeros((0, X.shape[1], 1, 1)))
    return StackFit(l1, l2, np.asarray(pooled), np.asarray(positions), size, elements)
