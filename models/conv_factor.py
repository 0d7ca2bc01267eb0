r"""Convolutional factor analysis, one layer (Chen, Polatkan, Sapiro, Blei, Dunson & Carin,
"Deep learning with hierarchical convolutional factor analysis"; the supplement's model).

.. math::

    X_n = \sum_{k=1}^K b_{nk}\,(W_{nk} * d_k) + \epsilon_n, \qquad
    \epsilon_n \sim \mathcal N(0, \gamma_n^{-1} I_P),

    b_{nk} \sim \mathrm{Bernoulli}(\pi_k),\quad \pi_k \sim \mathrm{Beta}(1/K, b),\quad
    w_{nki} \sim \mathcal N(0, \alpha_{nki}^{-1}),\quad \alpha_{nki} \sim \mathrm{Ga}(e, f),

    d_{kj} \sim \mathcal N(0, \beta_{kj}^{-1}),\quad \beta_{kj} \sim \mathrm{Ga}(g, h),\quad
    \gamma_n \sim \mathrm{Ga}(c, d)

(Gamma distributions with shape and *rate*). The beta-Bernoulli prior prunes dictionary
elements, so ``K`` is a truncation level.

**Convolution convention.** Images are ``(C, H, W)``; atoms ``d_k`` are ``(C, h, w)`` and span
every input channel; activation maps ``W_nk`` are ``(H-h+1, W-w+1)`` ("valid" size). ``W_nk *
d_k`` is the *full* 2-D convolution of the map with each channel of the atom, giving an
``(C, H, W)`` image:

.. math:: (W_{nk} * d_k)[c, y, x] = \sum_{i,j} W_{nk}[i, j]\; d_k[c,\, y - i,\, x - j],

i.e. a coefficient at position ``(i, j)`` places a copy of the atom with its top-left corner at
``(i, j)``. Its adjoint (what every conditional needs) is the valid *correlation*
``(R \star d_k)[i, j] = \sum_{c,u,v} R[c, i+u, j+v]\, d_k[c, u, v]``. Both are
:func:`jax.lax.conv_general_dilated` calls batched over images (:func:`reconstruct`,
:func:`correlate`).

Sites (paper's symbols): ``pi`` (K,), ``b`` (N, K), ``alpha`` and ``W`` (N, K, H-h+1, W-w+1),
``beta`` and ``d`` (K, C, h, w), ``gamma`` (N,), observed ``X`` (N, C, H, W). Every per-image site
sits in the plate ``N`` (dim -1) with the rest of its shape as the event, so the pointwise
log-likelihood is one value per image. Deterministic summaries invariant to relabelling the
elements: ``num_active`` (elements used by at least one image), ``recon_norm`` and
``resid_norm`` (N,) (the norms of :math:`\hat X_n = \sum_k b_{nk} W_{nk} * d_k` and of
:math:`X_n - \hat X_n`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

__all__ = [
    "default_priors",
    "conv_factor",
    "reconstruct",
    "correlate",
    "map_shape",
    "as_channels_first",
    "default_cfa_data",
]

_DIMS = ("NCHW", "OIHW", "NCHW")


# ------------------------------------------------------------------------------- priors
def default_priors(K: int) -> dict[str, dist.Distribution]:
    """The model's priors. Edit here (or pass ``priors={...}`` to :func:`conv_factor`).

    The hierarchical levels (``W | alpha``, ``d | beta``) are fixed by the model; the top levels
    are the paper's (the public single-layer implementation's values: c = d = 1e-6, e = g = 1,
    f = h = 1e-3), with pi ~ Beta(1/K, b), b = 1.
    """
    return {
        "pi": dist.Beta(1.0 / K, 1.0),  # pi_k ~ Beta(1/K, b): usage of element k
        "gamma": dist.Gamma(1e-6, 1e-6),  # gamma_n ~ Ga(c, d): noise precision of image n
        "alpha": dist.Gamma(1.0, 1e-3),  # alpha_nki ~ Ga(e, f): precision of coefficient w_nki
        "beta": dist.Gamma(1.0, 1e-3),  # beta_kj ~ Ga(g, h): precision of atom entry d_kj
    }


# ------------------------------------------------------------------------- convolutions
def map_shape(image_hw, atom_hw) -> tuple[int, int]:
    """Shape (H-h+1, W-w+1) of a "valid" activation map."""
    (H, Wd), (h, w) = image_hw, atom_hw
    return H - h + 1, Wd - w + 1


def reconstruct(W, d):
    """``sum_k W[:, k] * d_k`` (full convolution): W (N, K, H', W'), d (K, C, h, w) ->
    (N, C, H'+h-1, W'+w-1). Multiply W by b first to get the model's mean."""
    h, w = d.shape[-2:]
    kernel = jnp.swapaxes(d[..., ::-1, ::-1], 0, 1)  # (C, K, h, w): correlation with the flip
    return jax.lax.conv_general_dilated(
        W, kernel, (1, 1), ((h - 1, h - 1), (w - 1, w - 1)), dimension_numbers=_DIMS
    )


def correlate(R, d):
    """The adjoint of :func:`reconstruct`: ``(R ⋆ d_k)[n, k, i, j] = sum_{c,u,v} R[n, c, i+u,
    j+v] d[k, c, u, v]``; R (N, C, H, W), d (K, C, h, w) -> (N, K, H-h+1, W-w+1)."""
    return jax.lax.conv_general_dilated(R, d, (1, 1), "VALID", dimension_numbers=_DIMS)


# -------------------------------------------------------------------------------- model
def _sizes(X, N, image_shape):
    if X is not None:
        if X.ndim != 4:
            raise ValueError(f"conv_factor needs images shaped (N, C, H, W), got shape {X.shape}.")
        return X.shape[0], tuple(X.shape[1:])
    if N is None or image_shape is None:
        raise ValueError("conv_factor needs either images X or both N and image_shape=(C, H, W).")
    return N, tuple(image_shape)


def conv_factor(X=None, *, K: int, atom_shape=(3, 3), N: int | None = None, image_shape=None,
                priors=None):
    """One layer of convolutional factor analysis as a NumPyro program (supplement, model of
    eqs. 1-14).

    Args:
        X: images (N, C, H, W), or None to draw from the prior predictive.
        K: number of dictionary elements (truncation level).
        atom_shape: (h, w) of each atom; it spans all C channels.
        N, image_shape: number of images and (C, H, W), needed only when ``X`` is None.
        priors: optional dict overriding entries of :func:`default_priors`.
    """
    N, (C, H, Wd) = _sizes(X, N, image_shape)
    h, w = atom_shape
    Hp, Wp = map_shape((H, Wd), (h, w))
    if Hp < 1 or Wp < 1:
        raise ValueError(f"atoms {h}x{w} do not fit in {H}x{Wd} images.")
    p = {**default_priors(K), **(priors or {})}
    pi = numpyro.sample("pi", p["pi"].expand([K]).to_event(1))
    beta = numpyro.sample("beta", p["beta"].expand([K, C, h, w]).to_event(4))
    d = numpyro.sample("d", dist.Normal(0.0, 1.0 / jnp.sqrt(beta)).to_event(4))
    with numpyro.plate("N", N, dim=-1):
        gamma = numpyro.sample("gamma", p["gamma"])
        b = numpyro.sample("b", dist.Bernoulli(probs=pi).to_event(1))
        alpha = numpyro.sample("alpha", p["alpha"].expand([N, K, Hp, Wp]).to_event(3))
        W = numpyro.sample("W", dist.Normal(0.0, 1.0 / jnp.sqrt(alpha)).to_event(3))
        mean = reconstruct(b[:, :, None, None] * W, d)
        scale = (1.0 / jnp.sqrt(gamma))[:, None, None, None]
        X = numpyro.sample("X", dist.Normal(mean, scale).to_event(3), obs=X)
    numpyro.deterministic("num_active", jnp.sum(jnp.any(b > 0, axis=0)))
    numpyro.deterministic("recon_norm", jnp.sqrt(jnp.sum(mean**2, axis=(1, 2, 3))))
    numpyro.deterministic("resid_norm", jnp.sqrt(jnp.sum((X - mean) ** 2, axis=(1, 2, 3))))


# ------------------------------------------------------------------------------- data
def as_channels_first(X) -> np.ndarray:
    """An image stack as the model takes it: (N, H, W) -> (N, 1, H, W); (N, H, W, C) (the image
    data kind's channels-last layout) -> (N, C, H, W)."""
    X = np.asarray(X, dtype=np.float64)
    if X.ndim == 3:
        return X[:, None]
    if X.ndim == 4:
        return np.moveaxis(X, -1, 1)
    raise ValueError(f"an image stack must be (N, H, W) or (N, H, W, C), got shape {X.shape}.")


def default_cfa_data(seed: int = 0, N: int = 40) -> np.ndarray:
    """The default stack: the first ``N`` of scikit-learn's shipped 8x8 digits (no network),
    pixel values scaled to [0, 1], as (N, 8, 8) (the image data kind's layout). ``seed`` picks
    which images (a random subset for seed > 0)."""
    from sklearn.datasets import load_digits

    images = load_digits().images / 16.0
    idx = np.arange(N) if seed == 0 else np.random.default_rng(seed).choice(len(images), N, replace=False)
    return images[idx].astype(np.float64)
