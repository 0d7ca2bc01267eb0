"""The two-layer convolutional FA stack (:mod:`latentzoo.inference.conv_factor.stack`).

Deterministic checks of the pooling and of the map back to pixel space at random atoms (no fit):
un-pooling with pooling's positions gives max-pooling's maps; a one-hot layer-2 code maps to its
element in pixel space placed at p times its position, which is layer 1's reconstruction of the
un-pooled layer-2 reconstruction; identity layer-2 atoms carry the pooled maps to layer 1's
reconstruction of its max-pooled maps. Then one short fit on a few 8x8 digits: shapes, usage
and pruning, and that both reconstructions explain most of the images' energy.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from latentzoo.inference.conv_factor import max_pool
from latentzoo.inference.conv_factor.stack import (
    elements_in_pixels,
    fit_layer,
    fit_stack,
    pool_maps,
    to_pixels,
    unpool,
)
from latentzoo.models.conv_factor import as_channels_first, default_cfa_data, reconstruct


@pytest.mark.parametrize("shape,size", [((3, 2, 6, 6), 2), ((2, 3, 7, 5), 3), ((1, 1, 5, 4), 2)])
def test_unpooling_at_the_pooled_positions_gives_max_pooling(shape, size):
    M = jax.random.normal(jax.random.PRNGKey(0), shape)
    pooled, pos = pool_maps(M, size)
    assert pooled.shape == shape[:2] + (-(-shape[2] // size), -(-shape[3] // size))
    back = unpool(pooled, size, shape[-2:], pos)
    expect = max_pool(M.reshape((-1,) + shape[-2:]), size).reshape(shape)
    np.testing.assert_allclose(back, expect, atol=0)
    # the pooled value is the signed coefficient of largest magnitude of its cell
    cell = np.asarray(M[0, 0, :size, :size]).ravel()
    assert float(pooled[0, 0, 0, 0]) == cell[np.argmax(np.abs(cell))]


@pytest.mark.parametrize("size", [1, 2, 3])
def test_a_one_hot_layer_2_code_maps_to_its_element_placed_at_p_times_its_position(size):
    rng = np.random.default_rng(size)
    C, K1, K2, (h1, w1), (h2, w2) = 2, 3, 2, (3, 2), (2, 3)
    d1 = jnp.asarray(rng.normal(size=(K1, C, h1, w1)))
    d2 = jnp.asarray(rng.normal(size=(K2, K1, h2, w2)))
    map1 = (7, 9)  # layer-1 maps; pooled to ceil(./size)
    Mp, Lp = -(-map1[0] // size), -(-map1[1] // size)
    codes_hw = (Mp - h2 + 1, Lp - w2 + 1)
    D = elements_in_pixels(d2, d1, size)
    assert D.shape == (K2, C, size * (h2 - 1) + h1, size * (w2 - 1) + w1)
    H, W = map1[0] + h1 - 1, map1[1] + w1 - 1
    for k, i, j in [(0, 0, 0), (1, codes_hw[0] - 1, codes_hw[1] - 1), (1, 0, codes_hw[1] - 1)]:
        code = jnp.zeros((1, K2) + codes_hw).at[0, k, i, j].set(1.0)
        pix = np.asarray(to_pixels(code, d2, d1, size, map1))[0]
        placed = np.zeros((C, H, W))
        placed[:, size * i: size * i + D.shape[2], size * j: size * j + D.shape[3]] = D[k]
        np.testing.assert_allclose(pix, placed, atol=1e-12)
        # ... which is layer 1's reconstruction of the un-pooled layer-2 reconstruction
        unpooled = unpool(reconstruct(code, d2), size, map1)
        np.testing.assert_allclose(pix, reconstruct(unpooled, d1)[0], atol=1e-12)


def test_identity_layer_2_atoms_carry_the_pooled_maps_to_layer_1s_pooled_reconstruction():
    rng = np.random.default_rng(3)
    N, K1, C, size = 3, 4, 1, 2
    d1 = jnp.asarray(rng.normal(size=(K1, C, 3, 3)))
    maps = jnp.asarray(rng.normal(size=(N, K1, 6, 5)))
    pooled, pos = pool_maps(maps, size)
    eye = jnp.eye(K1)[:, :, None, None]  # layer-2 atom k = unit 1x1 on channel k
    pix = to_pixels(pooled, eye, d1, size, maps.shape[-2:], pos)
    pooled_maps = max_pool(maps.reshape(N * K1, 6, 5), size).reshape(maps.shape)
    np.testing.assert_allclose(pix, reconstruct(pooled_maps, d1), atol=1e-12)


def test_two_layer_stack_on_digits_trains_prunes_and_maps_back():
    # 12 digits, 30 + 10 sweeps per layer: ~20 s, mostly compilation
    X = as_channels_first(default_cfa_data(0, N=12))
    fit = fit_stack(X, K1=8, atom1=(3, 3), K2=6, atom2=(2, 2), pool_size=2, burn_in=30,
                    draws=10, threshold=0.05)
    l1, l2 = fit.layer1, fit.layer2
    K1u, K2u = l1.num_in_use, l2.num_in_use
    assert l1.usage.shape == (8,) and l2.usage.shape == (6,)
    assert K1u == int(np.sum(l1.usage > 0.05)) and 1 <= K1u
    assert l1.d.shape == (K1u, 1, 3, 3) and l1.maps.shape == (12, K1u, 6, 6)
    assert fit.pooled.shape == fit.positions.shape == (12, K1u, 3, 3)
    assert l2.d.shape == (K2u, K1u, 2, 2) and l2.maps.shape == (12, K2u, 2, 2)
    assert fit.elements.shape == (K2u, 1, 5, 5)
    energy = np.sum(X**2, axis=(1, 2, 3))
    r1 = np.sum((X - l1.reconstruction()) ** 2, axis=(1, 2, 3))
    r2 = np.sum((X - fit.reconstruction()) ** 2, axis=(1, 2, 3))
    # layer 1 fits the digits closely; the pooled-then-layer-2 path keeps a coarse image
    # (threshold from the fit: r1/energy is ~0.05, r2/energy ~0.5; a wrong un-pooling or a
    # transposed atom pushes r2 above the energy)
    assert np.mean(r1) < 0.2 * np.mean(energy)
    assert np.mean(r2) < 0.8 * np.mean(energy)


def test_stack_input_errors_are_one_sentence():
    X = as_channels_first(default_cfa_data(0, N=2))
    with pytest.raises(ValueError, match="do not fit in the pooled"):
        fit_stack(X, K1=2, atom1=(3, 3), K2=2, atom2=(4, 4), burn_in=0, draws=1, threshold=-1)
    with pytest.raises(ValueError, match="pool_size"):
        fit_stack(X, K1=2, atom1=(3, 3), K2=2, atom2=(2, 2), pool_size=0)
    with pytest.raises(ValueError, match="do not fit"):
        fit_layer(X, K=2, atom_shape=(9, 9))
