"""The network and its SGD training for ``multiswag_fa.py`` (MultiSWAG with online FA).

Private to that script: the MLP (d_in -> 50 ReLU -> 1) with its parameters flattened into one
vector theta, the jitted and vmapped SGD-with-momentum epoch, the per-run mini-batch indices,
the SWAG paper's learning-rate schedule, and ``train_runs``, which trains R runs at once and
hands theta after every mini-batch step of the SWAG phase to a callback.
"""

from __future__ import annotations

import numpy as np

HIDDEN = 50


class MLP:
    """d_in -> 50 ReLU -> 1, its parameters flattened into one vector theta of length D by
    ``jax.flatten_util.ravel_pytree`` (leaves W1 (d_in, 50), W2 (50, 1), b1 (50,), b2 (1,))."""

    def __init__(self, d_in):
        import jax.numpy as jnp
        from jax.flatten_util import ravel_pytree

        self.d_in = d_in
        template = {"W1": np.zeros((d_in, HIDDEN)), "b1": np.zeros(HIDDEN),
                    "W2": np.zeros((HIDDEN, 1)), "b2": np.zeros(1)}
        flat, self.unravel = ravel_pytree(template)
        self.D = int(flat.size)
        # where each leaf sits in theta, for the NumPy forward pass used in scoring
        positions = self.unravel(jnp.arange(self.D, dtype=float))
        self.index = {k: np.asarray(v).astype(int) for k, v in positions.items()}

    def init(self, rng):
        """He initialisation (NumPy, so no per-shape JAX compilation), as a flat theta."""
        theta = np.zeros(self.D)
        theta[self.index["W1"].ravel()] = rng.standard_normal(self.d_in * HIDDEN) * np.sqrt(2.0 / self.d_in)
        theta[self.index["W2"].ravel()] = rng.standard_normal(HIDDEN) * np.sqrt(1.0 / HIDDEN)
        return theta

    def apply(self, theta, X):
        """f_theta(X) in JAX, theta (D,), X (n, d_in) -> (n,)."""
        import jax

        p = self.unravel(theta)
        h = jax.nn.relu(X @ p["W1"] + p["b1"])
        return (h @ p["W2"] + p["b2"])[:, 0]

    def predict(self, thetas, X):
        """NumPy forward pass for a stack of parameter vectors, (M, D), (n, d_in) -> (M, n)."""
        thetas = np.atleast_2d(thetas)
        W1, b1 = thetas[:, self.index["W1"]], thetas[:, self.index["b1"]]  # (M,d,H), (M,H)
        W2, b2 = thetas[:, self.index["W2"][:, 0]], thetas[:, self.index["b2"][0]]  # (M,H), (M,)
        h = np.maximum(np.einsum("nd,mdh->mnh", X, W1) + b1[:, None, :], 0.0)
        return np.einsum("mnh,mh->mn", h, W2) + b2[:, None]


def build_trainer(apply, momentum):
    """``epoch(theta, vel, wd, lr, idx, X, y)``: one epoch of SGD with momentum and weight decay,
    a ``lax.scan`` over the mini-batches ``idx`` (R, n_batches, batch_size) of row indices,
    jit-compiled and vmapped over the R runs (theta, vel (R, D); wd (R,) per run, traced, so
    the weight-decay selection and the runs share one compilation). Returns the new state
    and theta after every mini-batch step, (R, n_batches, D)."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    def loss(theta, Xb, yb, wd):
        r = apply(theta, Xb) - yb
        return 0.5 * jnp.mean(r * r) + 0.5 * wd * jnp.dot(theta, theta)

    grad = jax.grad(loss)

    def epoch_one(theta, vel, wd, lr, idx, X, y):
        def step(s, ib):
            th, v = s
            v = momentum * v + grad(th, X[ib], y[ib], wd)
            th = th - lr * v
            return (th, v), th

        (theta, vel), iterates = lax.scan(step, (theta, vel), idx)
        return theta, vel, iterates

    return jax.jit(jax.vmap(epoch_one, in_axes=(0, 0, 0, None, 0, None, None)))


def epoch_indices(rngs, n_rows, nb, batch_size):
    """Mini-batch row indices for one epoch of every run, (R, nb, batch_size): a fresh
    permutation per run, its first nb * batch_size rows (``drop_last``, so the shapes are
    static; the left-over rows change from epoch to epoch). If n_rows < nb * batch_size (the
    weight-decay selection trains on fewer rows with the same compiled shapes), permutations
    are concatenated."""
    out = np.empty((len(rngs), nb * batch_size), dtype=np.int32)
    for r, g in enumerate(rngs):
        reps = -(-nb * batch_size // n_rows)
        out[r] = np.concatenate([g.permutation(n_rows) for _ in range(reps)])[: nb * batch_size]
    return out.reshape(len(rngs), nb, batch_size)


def lr_schedule(pre_epochs, lr0, swag_lr):
    """Constant lr0 for the first half of pre-training, then linear decay to the SWAG rate
    (the SWAG paper's schedule)."""
    e = np.arange(pre_epochs)
    half = pre_epochs // 2
    frac = np.clip((e - half + 1) / max(pre_epochs - half, 1), 0.0, 1.0)
    return lr0 + (swag_lr - lr0) * frac


def train_runs(seed, wds, Xs, ys, cfg, compiled, on_epoch, n_rows=None):
    """SGD for len(wds) runs (vmapped; run r has weight decay wds[r] and its own seed):
    pre-training, then ``cfg["swag_epochs"]`` constant-rate epochs; after each SWAG epoch
    ``on_epoch(iterates)`` gets theta after every mini-batch step, shape (R, n_batches, D).
    Only the first ``n_rows`` rows of (Xs, ys) are trained on (default: all); the number of
    mini-batches per epoch is always len(ys) // batch_size. Returns (final theta (R, D), mlp)."""
    import jax.numpy as jnp

    R = len(wds)
    n_rows = len(ys) if n_rows is None else n_rows
    B = cfg["batch_size"]
    nb = len(ys) // B
    if "mlp" not in compiled:  # one network and one compiled epoch for all splits
        compiled["mlp"] = mlp = MLP(Xs.shape[1])
        compiled["epoch"] = build_trainer(mlp.apply, cfg["momentum"])
    mlp, epoch = compiled["mlp"], compiled["epoch"]
    rngs = [np.random.default_rng([seed, r]) for r in range(R)]  # per run: init and shuffling
    theta = jnp.asarray(np.stack([mlp.init(g) for g in rngs]))
    vel = jnp.zeros_like(theta)
    wd = jnp.asarray(wds, dtype=theta.dtype)
    Xj, yj = jnp.asarray(Xs), jnp.asarray(ys)
    pre = cfg["epochs"] - cfg["swag_epochs"]
    for lr in lr_schedule(pre, cfg["lr"], cfg["swag_lr"]):
        theta, vel, _ = epoch(theta, vel, wd, float(lr), epoch_indices(rngs, n_rows, nb, B), Xj, yj)
    for _ in range(cfg["swag_epochs"]):
        theta, vel, its = epoch(theta, vel, wd, cfg["swag_lr"], epoch_indices(rngs, n_rows, nb, B), Xj, yj)
        on_epoch(np.asarray(its))
    return np.asarray(theta), mlp
