r"""Denoising and inpainting with one convolutional FA layer: the posterior mean of the clean
image under the exact block Gibbs sampler, with missing pixels imputed by data augmentation.

**Denoising.** The noisy image is the data X; the model's clean image is
:math:`\hat X_n = \sum_k b_{nk} W_{nk} * d_k` and its noise precision :math:`\gamma_n` is
inferred (no noise level is given to the method). The estimate is the posterior mean of
:math:`\hat X_n`, averaged over the draws after burn-in (not the product of posterior-mean maps
and atoms, which is a different quantity).

**Inpainting (missing pixels).** With a mask of observed pixels, the missing ones are latent
variables of the same model. Their full conditional given everything else is the likelihood
itself, :math:`x_{nj} \mid - \sim \mathcal N(\hat X_{nj}, \gamma_n^{-1})`, independent across
pixels; adding that draw to every sweep (Gibbs data augmentation) gives a chain on the parameters
and the missing pixels whose parameter marginal is the posterior given the observed pixels only.
The rest of the sweep is the unchanged table of :func:`.gibbs.cfa_updates`. The paper fits masked
images with an observation mask in the likelihood; augmentation is the same posterior with no
change to the kernels (a deviation in method, not in model).
"""

from __future__ import annotations

import functools
import time
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from latentzoo.inference.gibbs import SweepState, sweep
from latentzoo.models.conv_factor import conv_factor, reconstruct

from .gibbs import cfa_updates
from .stack import initial_values

__all__ = ["impute_missing", "restore", "restore_with_atoms", "Restored", "psnr", "HELD_SITES"]

HELD_SITES = ("d", "pi", "beta")  # what restore_with_atoms holds at a fitted run's values


class Restored(NamedTuple):
    """``image`` (N, C, H, W): posterior mean of the clean image; ``usage`` (K,) posterior
    frequency of b_nk = 1 averaged over images; ``noise_sd`` (N,) posterior mean of
    1/sqrt(gamma_n); ``seconds`` the sampling's wall time (compilation excluded)."""

    image: np.ndarray
    usage: np.ndarray
    noise_sd: np.ndarray
    seconds: float


def impute_missing(key, values, X, observed):
    """One draw of the missing pixels from their full conditional N(X̂, 1/gamma_n); observed
    pixels are kept. X, observed (N, C, H, W) (observed boolean)."""
    mean = reconstruct(values["b"][:, :, None, None] * values["W"], values["d"])
    gamma = jnp.broadcast_to(values["gamma"], X.shape[:1])[:, None, None, None]
    noise = jax.random.normal(key, X.shape, X.dtype) / jnp.sqrt(gamma)
    return jnp.where(observed, X, mean + noise)


def _chain(state, X, observed, *, model, table, burn_in, draws):
    def one(carry, i):
        s, Xf, acc = carry
        s = sweep(model, table, s, (Xf,), {})
        key, k_imp = jax.random.split(s.rng_key)
        s = s._replace(rng_key=key)
        Xf = impute_missing(k_imp, s.z, X, observed)
        z = s.z
        keep = (i >= burn_in).astype(X.dtype)
        new = (reconstruct(z["b"][:, :, None, None] * z["W"], z["d"]), z["b"],
               1.0 / jnp.sqrt(jnp.broadcast_to(z["gamma"], X.shape[:1])))
        return (s, Xf, tuple(a + keep * v for a, v in zip(acc, new))), None

    acc0 = (jnp.zeros_like(X), jnp.zeros_like(state.z["b"], dtype=X.dtype),
            jnp.zeros(X.shape[:1], X.dtype))
    (_, _, acc), _ = jax.lax.scan(one, (state, X, acc0), jnp.arange(burn_in + draws))
    return tuple(a / draws for a in acc)


def _compile(K, atom_shape, burn_in, draws, options, shape, dtype, priors=None, held=()):
    """The chain for these sizes, lowered and compiled ahead of the timed run; the updates of
    the sites in ``held`` are left out of the sweep (those sites keep their starting values)."""
    model = partial(conv_factor, K=K, atom_shape=atom_shape, priors=priors)
    table = tuple(u for u in cfa_updates(**dict(options))
                  if not set(getattr(u, "sites", ())) & set(held))
    fn = jax.jit(partial(_chain, model=model, table=table, burn_in=burn_in, draws=draws))
    X = jax.ShapeDtypeStruct(shape, jnp.dtype(dtype))
    init = jax.eval_shape(lambda x, k: SweepState(initial_values(x, K, atom_shape, k), k,
                                                   jnp.zeros((), x.dtype), jnp.zeros((), bool)),
                          X, jax.random.PRNGKey(0))
    return fn.lower(init, X, jax.ShapeDtypeStruct(shape, jnp.bool_)).compile()


_compiled = functools.lru_cache(maxsize=8)(_compile)


def restore(X, observed=None, *, K: int, atom_shape=(8, 8), burn_in: int = 100, draws: int = 50,
            seed: int = 0, priors=None, **table_options) -> Restored:
    """Posterior-mean clean images of X (N, C, H, W) under one layer fitted to X itself.

    ``observed``: boolean mask like X (False = missing; None = every pixel observed). Missing
    pixels start at their image's mean over observed pixels and are imputed every sweep (module
    docstring). ``table_options`` go to :func:`.gibbs.cfa_updates` (the exact sampler by
    default).
    """
    X, observed, X0 = _checked_images(X, observed, atom_shape, burn_in, draws)
    h, w = atom_shape
    key, k0 = jax.random.split(jax.random.PRNGKey(seed))
    state = SweepState(initial_values(X0, K, (h, w), k0), key, jnp.zeros((), X.dtype),
                       jnp.zeros((), bool))
    options = tuple(sorted(table_options.items()))
    if priors is None:  # same sizes and options: reuse the compiled chain (denoise, then inpaint)
        run = _compiled(int(K), (int(h), int(w)), int(burn_in), int(draws), options,
                        X.shape, X.dtype.name)
    else:
        run = _compile(int(K), (h, w), burn_in, draws, options, X.shape, X.dtype.name, priors)
    t = time.perf_counter()
    image, b, sd = jax.block_until_ready(run(state, X0, observed))
    return Restored(np.asarray(image), np.asarray(b).mean(0), np.asarray(sd),
                    time.perf_counter() - t)


def restore_with_atoms(X, observed=None, *, d, pi, burn_in: int = 100, draws: int = 50,
                       seed: int = 0, priors=None, **table_options) -> Restored:
    """Posterior-mean clean images of new images X (N, C, H, W) under a fitted dictionary: the
    atoms ``d`` (K, C, h, w) and element probabilities ``pi`` (K,) of one posterior draw of a
    run (what ``latentzoo predict`` uses) are held fixed (:data:`HELD_SITES`), and the new
    images' maps W, switches b, map precisions alpha and noise precisions gamma are drawn
    from their full conditionals by the same exact updates as the fit (the table of
    :func:`.gibbs.cfa_updates` without the atoms', pi's and beta's updates), missing pixels
    imputed every sweep as in :func:`restore`. Images of any height and width at least the
    atoms' fit; C must be the atoms' channels."""
    d = jnp.asarray(d, jnp.float64)
    if d.ndim != 4:
        raise ValueError(f"the atoms must be shaped (K, C, h, w), got shape {d.shape}.")
    K, C, h, w = d.shape
    if np.ndim(X) == 4 and np.shape(X)[1] != C:
        raise ValueError(f"the images have {np.shape(X)[1]} channels; the atoms were fitted "
                         f"on {C}.")
    X, observed, X0 = _checked_images(X, observed, (h, w), burn_in, draws)
    key, k0 = jax.random.split(jax.random.PRNGKey(seed))
    start = {**initial_values(X0, K, (h, w), k0), "d": d,
             "pi": jnp.broadcast_to(jnp.asarray(pi, jnp.float64), (K,))}
    state = SweepState(start, key, jnp.zeros((), X.dtype), jnp.zeros((), bool))
    options = tuple(sorted(table_options.items()))
    if priors is None:  # one compiled chain for every draw of the same sizes
        run = _compiled(int(K), (int(h), int(w)), int(burn_in), int(draws), options,
                        X.shape, X.dtype.name, None, HELD_SITES)
    else:
        run = _compile(int(K), (h, w), burn_in, draws, options, X.shape, X.dtype.name, priors,
                       HELD_SITES)
    t = time.perf_counter()
    image, b, sd = jax.block_until_ready(run(state, X0, observed))
    return Restored(np.asarray(image), np.asarray(b).mean(0), np.asarray(sd),
                    time.perf_counter() - t)


def _checked_images(X, observed, atom_shape, burn_in, draws):
    """(X, observed, X0): the images as float64 (N, C, H, W), the mask of observed pixels, and
    the images with each missing pixel at its image's mean over observed ones. One ValueError
    sentence for anything a chain cannot start from."""
    X = jnp.asarray(X, jnp.float64)
    if X.ndim != 4:
        raise ValueError(f"restore needs images shaped (N, C, H, W), got shape {X.shape}.")
    observed = jnp.ones(X.shape, bool) if observed is None else jnp.asarray(observed, bool)
    if observed.shape != X.shape:
        raise ValueError(f"the mask has shape {observed.shape}, the images {X.shape}.")
    if not bool(jnp.all(jnp.where(observed, jnp.isfinite(X), True))):
        raise ValueError("observed pixels must be finite (mark missing ones False in the mask).")
    counts = observed.sum((1, 2, 3))
    if bool(jnp.any(counts == 0)):
        raise ValueError("every image needs at least one observed pixel.")
    if burn_in < 0 or draws < 1:
        raise ValueError(f"need burn_in >= 0 and draws >= 1, got {burn_in} and {draws}.")
    h, w = atom_shape
    if not (1 <= h <= X.shape[2] and 1 <= w <= X.shape[3]):
        raise ValueError(f"atoms {h}x{w} do not fit in {X.shape[2]}x{X.shape[3]} images.")
    fill = (jnp.where(observed, X, 0.0).sum((1, 2, 3)) / counts)[:, None, None, None]
    return X, observed, jnp.where(observed, X, fill)


def psnr(clean, estimate, peak: float = 255.0) -> float:
    """Peak signal-to-noise ratio in dB, 10 log10(peak^2 / MSE)."""
    mse = float(np.mean((np.asarray(clean, float) - np.asarray(estimate, float)) ** 2))
    return float(10.0 * np.log10(peak**2 / max(mse, 1e-300)))
