r"""Online (stochastic) variational Bayes for one layer of convolutional FA over mini-batches of
images (the journal version's online VB; Hoffman, Blei, Wang & Paisley 2013, stochastic
variational inference), ``pool=False``.

**Global and local factors.** The atoms q(d_k), their precisions q(beta) and the usages q(pi_k)
are global; each image's maps q(W_n), precisions q(alpha_n), switches q(b_n) and noise precision
q(gamma_n) are local: given the global factors the images are independent.

**One step** on a mini-batch B of the N images (:meth:`OnlineConvFactor.partial_fit`):

1. *local*: for every image of B, ``local_iters`` coordinate-ascent passes (the batch CAVI's
   per-image updates, :func:`~latentzoo.inference.conv_factor.vb_moments.local_maps`, q(alpha),
   q(gamma)) from a fresh start, given the current global factors. During the first
   ``burn_in`` steps the switches are held on (an initialisation of the atoms from the data;
   see :func:`local_fit`). The per-image work is one ``jax.vmap``; the image axis is sharded
   over a 1-D mesh of devices
   (:class:`jax.sharding.NamedSharding`), so each device runs its images and the statistics
   below are summed across devices by XLA.
2. *global*: the intermediate natural parameters are those the batch CAVI update would give if
   the data were B repeated :math:`N/|B|` times (statistics scaled by :math:`N/|B|`), atoms in
   turn as in the batch update (each from the residual with the atoms before it moved: the
   natural gradient of the ELBO in each global block); the natural parameters move by step
   size :math:`\rho_t = (\tau_0 + t)^{-\kappa}` (:func:`step_size`):
   :math:`\lambda \leftarrow (1-\rho_t)\lambda + \rho_t\hat\lambda` for q(pi) (Beta) and q(d_k)
   (per-channel precision matrix and linear term). q(beta) depends on no data and is set to its
   exact optimum given the new q(d) (a coordinate-ascent step on a block without noise).

Memory is that of the global factors and one mini-batch: nothing grows with the number of
images seen. :math:`\kappa \in (0.5, 1]` and :math:`\tau_0 \ge 1` give the Robbins-Monro
conditions; the first step (t = 0) with :math:`\tau_0 = 1` replaces the start completely.
"""

from __future__ import annotations

import sys
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from latentzoo.models.conv_factor import conv_factor, reconstruct
from latentzoo.inference.conjugate import beta_log_moments, gamma_moments
from latentzoo.inference.gaussian import cov_from_tril, gaussian_block
from latentzoo.inference.interrupts import interruptible

from .vb import random_patches, read_cfa_priors, validate_cfa_images
from .vb_moments import AtomMoments, atom_moments, atom_stats, expected_sq_resid, local_maps, toeplitz

__all__ = ["OnlineConvFactor", "GlobalState", "local_fit", "step_size"]


class GlobalState(NamedTuple):
    """The global factors in natural form: q(pi) Beta(``pi_a1``, ``pi_a0``) (K,); q(d_k) per
    channel precision ``d_prec`` (K, C, hw, hw) and linear term ``d_lin`` (K, C, hw), with their
    moments ``d_loc`` (K, C, h, w), ``d_scale_tril``; q(beta) ``beta_a``, ``beta_b``
    (K, C, h, w); ``step`` t."""

    pi_a1: jax.Array
    pi_a0: jax.Array
    d_prec: jax.Array
    d_lin: jax.Array
    d_loc: jax.Array
    d_scale_tril: jax.Array
    beta_a: jax.Array
    beta_b: jax.Array
    step: jax.Array


class _ImagePriors(NamedTuple):
    """Per-image hyperparameters (shared by all images): gamma's c, d; alpha's e, f and W's
    prior mean (K, H', W')."""

    c: jax.Array
    d: jax.Array
    e: jax.Array
    f: jax.Array
    W_loc: jax.Array


def _moments(g: GlobalState) -> AtomMoments:
    Elp, El1 = beta_log_moments(g.pi_a1, g.pi_a0)
    return atom_moments(g.d_loc, cov_from_tril(g.d_scale_tril), Elp - El1)


def local_fit(x, am: AtomMoments, ip: _ImagePriors, iters: int, burn=False):
    """Local coordinate ascent for ONE image x (C, H, W) given the global moments: ``iters``
    passes of (maps and switches, q(alpha), q(gamma)) from the batch fit's start. With ``burn``
    (a traced bool: the burn-in steps) the switches are held on (rho = 1), so every atom gets
    statistics before the switch prior can turn it off; q(alpha) and q(gamma) are updated as
    always (holding <alpha> at 1 for all passes let the 6 x 36 unshrunk coefficients of an 8 x 8
    image take the noise precision down to ~0.4: the maps, then the atoms, shrank to ~0). Returns
    ``(mu, s, rho, E_gamma)``."""
    K, Hp, Wp = ip.e.shape
    P = x.size
    var = jnp.var(x)
    ga = ip.c + 0.5 * P
    init = (jnp.zeros((K, Hp, Wp)), jnp.ones((K, Hp, Wp)), jnp.full((K,), 0.5),
            jnp.ones((K, Hp, Wp)), ga / (0.1 * ga * jnp.where(var > 0, var, 1.0)))

    def one(_, carry):
        mu, s, rho, E_alpha, E_gamma = carry
        mu, s, rho = local_maps(x, mu, s, rho, E_alpha, E_gamma, ip.W_loc, am)
        rho = jnp.where(burn, 1.0, rho)
        E_alpha = (ip.e + 0.5) / (ip.f + 0.5 * ((mu - ip.W_loc) ** 2 + s))
        E_gamma = ga / (ip.d + 0.5 * expected_sq_resid(x, mu, s, rho, am))
        return mu, s, rho, E_alpha, E_gamma

    mu, s, rho, _, E_gamma = jax.lax.fori_loop(0, iters, one, init)
    return mu, s, rho, E_gamma


def step_size(t, tau0: float, kappa: float):
    r"""The step size :math:`\rho_t = (\tau_0 + t)^{-\kappa}` of step t (0-based); in (0, 1] for
    :math:`\tau_0 \ge 1`."""
    return (tau0 + t) ** (-kappa)


def _global_step(g: GlobalState, X, wts, mu, s, rho, E_gamma, pri, scale, tau0, kappa) -> GlobalState:
    """The stochastic natural-gradient step on the globals from one mini-batch X (B, C, H, W)
    with weights ``wts`` (B,) (0 on padding) and its local factors. Atoms in turn, as the batch
    update_d: atom k's intermediate natural parameters are computed from the residual with the
    atoms before it already moved (a block-coordinate natural-gradient step; updating every atom
    from one residual overshoots when several atoms explain the same structure)."""
    K, C, h, w = g.d_loc.shape
    r = step_size(g.step, tau0, kappa)
    E_beta, _ = gamma_moments(g.beta_a, g.beta_b)
    eb = E_beta.reshape(K, C, h * w)
    R = X - reconstruct(rho[:, :, None, None] * mu, g.d_loc)
    stats = jax.vmap(atom_stats)

    def atom(k, carry):
        d_prec, d_lin, d_loc, tril, R = carry
        Z = R + rho[:, k, None, None, None] * reconstruct(mu[:, k][:, None], d_loc[k][None])
        A, lin = stats(Z, mu[:, k], s[:, k], wts * E_gamma * rho[:, k])
        P_hat = toeplitz(scale * A.sum(0), h, w)[None] + eb[k][..., None] * jnp.eye(h * w)
        lin_hat = scale * lin.sum(0).reshape(C, h * w) + eb[k] * pri.d_loc[k].reshape(C, h * w)
        prec_k = (1 - r) * d_prec[k] + r * P_hat
        lin_k = (1 - r) * d_lin[k] + r * lin_hat
        mean, T = gaussian_block(prec_k, lin_k)
        mean = mean.reshape(C, h, w)
        R = Z - rho[:, k, None, None, None] * reconstruct(mu[:, k][:, None], mean[None])
        return (d_prec.at[k].set(prec_k), d_lin.at[k].set(lin_k), d_loc.at[k].set(mean),
                tril.at[k].set(T), R)

    d_prec, d_lin, d_loc, tril, _ = jax.lax.fori_loop(
        0, K, atom, (g.d_prec, g.d_lin, g.d_loc, g.d_scale_tril, R))
    var = jnp.diagonal(cov_from_tril(tril), axis1=-2, axis2=-1).reshape(K, C, h, w)
    rho_sum = wts @ rho
    pi_a1 = (1 - r) * g.pi_a1 + r * (pri.pi_a + scale * rho_sum)
    pi_a0 = (1 - r) * g.pi_a0 + r * (pri.pi_b + scale * (wts.sum() - rho_sum))
    beta_b = pri.h + 0.5 * ((d_loc - pri.d_loc) ** 2 + var)
    return GlobalState(pi_a1, pi_a0, d_prec, d_lin, d_loc, tril, pri.g + 0.5, beta_b,
                       g.step + 1)


class OnlineConvFactor:
    """Streaming VB for one layer of convolutional FA (module docstring).

    Args:
        K: number of dictionary elements (truncation level).
        n_total: N, the number of images the statistics are scaled to (the stream's size, or the
            data set's).
        atom_shape: (h, w).
        priors: dict overriding :func:`~latentzoo.models.conv_factor.default_priors`.
        tau0, kappa: step size (tau0 + t)^-kappa (defaults 2 and 0.7: at the paper's
            alpha ~ Ga(1, 1e-3) they reach the batch fit's error, where tau0 = 1 replaces the
            starting atoms outright at the first step and kappa = 0.55 levels off above it).
        local_iters: coordinate-ascent passes per image and step (and for :meth:`transform`
            unless it is given ``iters``).
        burn_in: the first ``burn_in`` steps hold every switch on in the local step
            (:func:`local_fit`); without it every element is switched off on the starting atoms
            (paper's alpha ~ Ga(1, 1e-3)) and no atom ever gets data.
        seed: picks the starting atoms (patches of the first batch).
        atom_norm: the starting atoms' norm (default ``sqrt(C h w)``, the norm <beta> = 1
            expects; 1 is the batch fit's start). The likelihood
            does not fix the split of scale between atoms and maps; under the paper's
            alpha ~ Ga(1, 1e-3) the ELBO rises slowly with the atoms' scale (batch CAVI's
            largest atom grows from 1 to 7.4 over 150 sweeps), which online VB, with decaying
            steps, climbs far more slowly: the default starts it higher
            (docs/models/conv_factor_vb.md).
        devices: the devices the image axis is sharded over (default: all of ``jax.devices()``).

    Example::

        ocfa = OnlineConvFactor(8, n_total=len(X), atom_shape=(3, 3))
        for batch in np.array_split(X, 20):
            ocfa.partial_fit(batch)
        X_hat = ocfa.reconstruct(X)
    """

    def __init__(self, K: int, *, n_total: int, atom_shape=(3, 3), priors=None, tau0: float = 2.0,
                 kappa: float = 0.7, local_iters: int = 30, seed: int = 0, devices=None,
                 burn_in: int = 6, atom_norm: float | None = None):
        if isinstance(K, bool) or not isinstance(K, (int, np.integer)) or K < 1:
            raise ValueError(f"K must be a positive integer, got {K!r}.")
        if not n_total >= 1:
            raise ValueError(f"n_total must be a positive number of images, got {n_total!r}.")
        if isinstance(burn_in, bool) or not isinstance(burn_in, (int, np.integer)) or burn_in < 0:
            raise ValueError(f"burn_in must be a number of steps >= 0, got {burn_in!r}.")
        if atom_norm is not None and not (np.isfinite(atom_norm) and atom_norm > 0):
            raise ValueError(f"atom_norm must be a positive number, got {atom_norm!r}.")
        if not (0.5 < kappa <= 1.0) or not tau0 >= 1:
            # tau0 < 1 gives rho_0 > 1 (tau0 = 0: infinite), not a convex combination
            raise ValueError(f"the step size needs 0.5 < kappa <= 1 and tau0 >= 1, got kappa={kappa}, tau0={tau0}.")
        self.K, self.n_total, self.atom_shape = int(K), float(n_total), tuple(int(a) for a in atom_shape)
        self.priors, self.tau0, self.kappa = priors, float(tau0), float(kappa)
        self.local_iters, self.seed = int(local_iters), int(seed)
        self.burn_in = int(burn_in)
        self.atom_norm = None if atom_norm is None else float(atom_norm)
        self.mesh = Mesh(np.asarray(devices if devices is not None else jax.devices()), ("images",))
        self._images = NamedSharding(self.mesh, PartitionSpec("images"))
        self._replicated = NamedSharding(self.mesh, PartitionSpec())
        self.state: GlobalState | None = None
        self.image_shape = None
        self.n_seen = 0

    # ----------------------------------------------------------------------- plumbing
    def _check(self, X):
        X = np.asarray(validate_cfa_images(X, K=self.K, atom_shape=self.atom_shape))
        if self.image_shape is not None and X.shape[1:] != self.image_shape:
            raise ValueError(f"images of shape {X.shape[1:]} do not match the stream's {self.image_shape}.")
        return X

    def _shard(self, X):
        """X padded to a multiple of the device count (weight 0 on the padding), sharded."""
        n, ndev = X.shape[0], self.mesh.devices.size
        pad = (-n) % ndev
        Xp = np.concatenate([X, np.zeros((pad,) + X.shape[1:])]) if pad else X
        wts = np.concatenate([np.ones(n), np.zeros(pad)])
        return jax.device_put(Xp, self._images), jax.device_put(wts, self._images)

    def _setup(self, X):
        self.image_shape = X.shape[1:]
        pri = read_cfa_priors(conv_factor, jnp.asarray(X[:1]), K=self.K, atom_shape=self.atom_shape,
                              priors=self.priors)
        self._pri = jax.device_put(pri._replace(c=pri.c[0], d=pri.d[0], e=pri.e[0], f=pri.f[0],
                                                W_loc=pri.W_loc[0]), self._replicated)
        self._ip = _ImagePriors(self._pri.c, self._pri.d, self._pri.e, self._pri.f, self._pri.W_loc)
        K, (C, h, w) = self.K, (X.shape[1], *self.atom_shape)
        norm = np.sqrt(C * h * w) if self.atom_norm is None else self.atom_norm
        m = norm * random_patches(jax.random.PRNGKey(self.seed), jnp.asarray(X), K,
                                            self.atom_shape)
        prec = jnp.broadcast_to(1e4 * jnp.eye(h * w), (K, C, h * w, h * w))
        N = self.n_total
        g = GlobalState(self._pri.pi_a + 0.5 * N, self._pri.pi_b + 0.5 * N, prec,
                        1e4 * m.reshape(K, C, h * w), m,
                        jnp.broadcast_to(1e-2 * jnp.eye(h * w), prec.shape),
                        jnp.broadcast_to(self._pri.g + 0.5, m.shape),
                        jnp.broadcast_to(self._pri.g + 0.5, m.shape), jnp.zeros((), jnp.float64))
        self.state = jax.device_put(g, self._replicated)
        iters, ip = self.local_iters, self._ip
        fit = jax.vmap(local_fit, in_axes=(0, None, None, None, None))
        tau0, kappa, burn_in = self.tau0, self.kappa, self.burn_in

        def step(g, X, wts, scale):
            mu, s, rho, E_gamma = fit(X, _moments(g), ip, iters, g.step < burn_in)
            return _global_step(g, X, wts, mu, s, rho, E_gamma, self._pri, scale, tau0, kappa)

        def locals_(g, X, iters):
            am = _moments(g)
            mu, s, rho, E_gamma = fit(X, am, ip, iters, g.step < burn_in)
            return mu, s, rho, E_gamma, reconstruct(rho[:, :, None, None] * mu, am.m)

        self._step = jax.jit(step, out_shardings=self._replicated)
        self._locals = jax.jit(locals_, static_argnums=2)

    # ------------------------------------------------------------------------- public
    @interruptible
    def partial_fit(self, X) -> "OnlineConvFactor":
        """One stochastic step on a mini-batch of images (B, C, H, W) ((B, H, W): one channel)."""
        X = self._check(X)
        if self.state is None:
            self._setup(X)
        Xs, wts = self._shard(X)
        self.state = self._step(self.state, Xs, wts, jnp.asarray(self.n_total / X.shape[0]))
        self.n_seen += X.shape[0]
        return self

    @interruptible
    def fit(self, X, *, batch_size: int = 10, epochs: int = 1,
            progress: bool = False) -> "OnlineConvFactor":
        """Mini-batches of ``batch_size`` images in a random order, ``epochs`` times over X;
        ``progress``: a bar over the mini-batches (after a line saying XLA is compiling)."""
        from tqdm.auto import tqdm

        X = self._check(X)
        rng = np.random.default_rng(self.seed)
        steps = epochs * -(-len(X) // batch_size)
        if progress:
            print("compiling the online step for these sizes on the first mini-batch; its "
                  "progress bar follows", file=sys.stderr, flush=True)
        with tqdm(total=steps, unit="batch", desc="online cfa", disable=not progress) as bar:
            for _ in range(epochs):
                order = rng.permutation(len(X))
                for lo in range(0, len(X), batch_size):
                    self.partial_fit(X[order[lo:lo + batch_size]])
                    bar.update(1)
        return self

    def _require(self):
        if self.state is None:
            raise ValueError("the model has seen no images yet; call partial_fit first.")

    def _iters(self, iters):
        if iters is None:
            return self.local_iters
        if isinstance(iters, bool) or not isinstance(iters, (int, np.integer)) or iters < 1:
            raise ValueError(f"iters must be a positive integer, got {iters!r}.")
        return int(iters)

    def transform(self, X, *, iters: int | None = None) -> dict:
        """The local factors of images X given the current global ones: ``W_loc``, ``W_scale``
        (B, K, H', W'), ``b_probs`` (B, K), ``E_gamma`` (B,)."""
        self._require()
        X = self._check(X)
        Xs, _ = self._shard(X)
        mu, s, rho, Eg, _ = self._locals(self.state, Xs, self._iters(iters))
        n = X.shape[0]
        return {"W_loc": mu[:n], "W_scale": jnp.sqrt(s[:n]), "b_probs": rho[:n], "E_gamma": Eg[:n]}

    def reconstruct(self, X, *, iters: int | None = None):
        """The expected reconstruction sum_k rho_nk mu_nk * m_k of images X (B, C, H, W)."""
        self._require()
        X = self._check(X)
        Xs, _ = self._shard(X)
        return self._locals(self.state, Xs, self._iters(iters))[-1][: X.shape[0]]

    @property
    def params(self) -> dict:
        """The global factors under the batch guide's param names
        (:func:`~latentzoo.inference.conv_factor.vb.cfa_guide`)."""
        self._require()
        g = self.state
        return {"pi_concentration1": g.pi_a1, "pi_concentration0": g.pi_a0, "d_loc": g.d_loc,
                "d_scale_tril": g.d_scale_tril, "beta_concentration": g.beta_a, "beta_rate": g.beta_b}
