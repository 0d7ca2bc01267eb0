"""Exact tests of the CVQ ``s`` draw, closing gaps mutation testing found in ``cvq/gibbs.py``.

The conditional check compares ``s_conditional`` with the joint density, but ``s_draw`` is what
the sampler runs, and it has two paths: the exact draw from the enumerated table (K <= ENUM_MAX_K)
and a systematic single-site scan (K > ENUM_MAX_K). Survivors were: the path switch flipped
(``K <= ENUM_MAX_K`` -> ``>=`` / ``<``: the scan replaces the exact draw), and, in the scan, the
prior log-odds ``log p - log1p(-p)`` with ``log1p(p)`` and ``- 0.5 tau |w_k|^2`` with ``+``.

Both tests start from a fixed state, draw ``s`` many times (one jitted kernel call vectorised over
keys) and compare frequencies with exact probabilities computed by enumeration from the model's
own densities (``p(s_n | pi) p(x_n | s_n, W, tau)``, the factors of the joint that hold ``s_n``):

- exact path: the law of the row state is the block conditional, whatever the starting state.
  Two sources with the same image (``w_1 = w_0``) explain a row equally well, so the exact law
  splits between ``(1, 0)`` and ``(0, 1)``, while one scan from ``s = 0`` turns the first source on
  and the second off almost always (a difference of ~0.4 in probability);
- scan path (K = ENUM_MAX_K + 1): after one scan the first columns have the law
  ``prod_k p(s_k | s'_{<k}, s0_{>k})`` (each factor a two-state conditional at a known state), and
  every column ``k`` satisfies ``E[s'_k - p(s_k = 1 | s'_{<k}, s0_{>k})] = 0``; both are computed
  exactly from the joint.

Thresholds: 4000 draws give frequency standard errors below 0.008; the tests allow 0.03 (about 4
s.e.), and the mutants miss by 0.1 to 0.5.
"""

import jax
import jax.numpy as jnp
import numpy as np

from latentzoo.inference.cvq import gibbs as cvq_gibbs
from latentzoo.inference.enumerate import all_states
from latentzoo.inference.gibbs import read_model
from latentzoo.models.cvq import cvq

NUM_DRAWS = 4000
TOL = 0.03  # frequency error allowed: ~4 standard errors at 4000 draws (see the module docstring)


def _state(K, N=3, D=4, seed=0):
    """A fixed state with explaining-away between sources 0 and 1 (same image) and unequal pi."""
    rng = np.random.default_rng(seed)
    W = rng.normal(0.0, 1.0, (D, K))
    W[:, 1] = W[:, 0]
    W[:, 2] = rng.normal(0.0, 1.0, D)
    pi = rng.uniform(0.2, 0.8, K)
    pi[1] = pi[0]  # sources 0 and 1 are interchangeable: the exact law is symmetric in them
    X = np.stack([W[:, 0] + 0.1 * rng.normal(size=D), W[:, 0] + W[:, 2], 0.3 * rng.normal(size=D)])[:N]
    values = {"W": jnp.asarray(W), "pi": jnp.asarray(pi), "tau": jnp.asarray(2.5),
              "s": jnp.zeros((N, K), jnp.int32)}
    return values, jnp.asarray(X)


def _row_log_joint(values, X, s):
    """(N,) log p(s_n | pi) + log p(x_n | s_n, W, tau) from the model's sites, at s (N, K)."""
    K = s.shape[1]
    priors, _, _ = read_model(cvq, {**values, "s": s}, (X,), {"K": K})
    return priors["s"].log_prob(s).sum(-1) + priors["X"].log_prob(X).sum(-1)


def _draws(values, X, key):
    """NUM_DRAWS draws of s (NUM_DRAWS, N, K) from one step of s_draw at the fixed state."""
    K = values["W"].shape[1]
    priors, obs, _ = read_model(cvq, values, (X,), {"K": K})
    keys = jax.random.split(key, NUM_DRAWS)
    return jax.lax.map(lambda k: cvq_gibbs.s_draw(k, values, obs, priors)["s"], keys, batch_size=500)


@jax.jit
def _exact_path(values, X, key):
    """Frequencies of the first three columns' states and their exact law (N, 8), from two
    starting states (s = 0 and s = 1)."""
    K = values["W"].shape[1]
    N = X.shape[0]
    states = all_states(K, X.dtype)
    lj = jax.lax.map(lambda st: _row_log_joint(values, X, jnp.broadcast_to(st, (N, K))), states,
                     batch_size=512)  # (S, N)
    table = jax.nn.softmax(lj, axis=0)
    idx = (states[:, :3] @ jnp.array([1.0, 2.0, 4.0])).astype(jnp.int32)
    exact = jax.vmap(lambda t: jnp.zeros(8, X.dtype).at[idx].add(t), in_axes=1)(table)  # (N, 8)

    def freq(s0, k):
        s = _draws({**values, "s": s0}, X, k)
        code = (s[..., :3] @ jnp.array([1, 2, 4])).astype(jnp.int32)  # (M, N)
        return jax.nn.one_hot(code, 8, dtype=X.dtype).mean(0)

    k0, k1 = jax.random.split(key)
    return freq(jnp.zeros((N, K), jnp.int32), k0), freq(jnp.ones((N, K), jnp.int32), k1), exact


def test_s_draw_is_exact_for_K_up_to_ENUM_MAX_K():
    for K in (3, cvq_gibbs.ENUM_MAX_K):  # both sides of the path switch K <= ENUM_MAX_K
        values, X = _state(K)
        from_zero, from_one, exact = _exact_path(values, X, jax.random.PRNGKey(K))
        # the test has power: the exact law of row 0 splits between (1, 0) and (0, 1) (codes 1, 2)
        assert min(float(exact[0, 1]), float(exact[0, 2])) > 0.2, np.asarray(exact[0])
        for freq in (from_zero, from_one):
            err = float(jnp.abs(freq - exact).max())
            assert err < TOL, (K, err, np.round(np.asarray(freq), 3), np.round(np.asarray(exact), 3))


@jax.jit
def _scan_path(values, X, key):
    """One scan (K > ENUM_MAX_K) from s0 = values['s'], M times. Returns the draws (M, N, K);
    for each column k of each draw the exact p(s_k = 1 | s'_{<k}, s0_{>k}) (M, N, K); the
    frequencies of the first three columns' states (N, 8) and their exact law (N, 8), the
    product of the three two-state conditionals. All from the joint density."""
    N, K = values["s"].shape
    s0 = values["s"].astype(X.dtype)
    s = _draws(values, X, key).astype(X.dtype)  # (M, N, K)
    before = jnp.tril(jnp.ones((K, K), X.dtype), -1)  # before[k, j] = 1 if j < k

    def p_col(sd, k):  # (N,) p(s_k = 1 | sd_{<k}, s0_{>k})
        base = before[k] * sd + (1.0 - before[k]) * s0
        on, off = base.at[:, k].set(1.0), base.at[:, k].set(0.0)
        return jax.nn.sigmoid(_row_log_joint(values, X, on) - _row_log_joint(values, X, off))

    p = jax.lax.map(lambda sd: jax.vmap(lambda k: p_col(sd, k), out_axes=1)(jnp.arange(K)), s,
                    batch_size=500)

    prefixes = all_states(3, X.dtype)  # (8, 3), row c is the binary expansion of c

    def law(c):  # (N,) probability that the scan's first three columns come out as c
        sd = s0.at[:, :3].set(jnp.broadcast_to(c, (N, 3)))
        return jnp.prod(jnp.stack([jnp.where(c[k] == 1, p_col(sd, k), 1 - p_col(sd, k))
                                   for k in range(3)]), axis=0)

    exact = jax.vmap(law, out_axes=1)(prefixes)  # (N, 8)
    code = (s[..., :3] @ jnp.array([1.0, 2.0, 4.0])).astype(jnp.int32)
    freq = jax.nn.one_hot(code, 8, dtype=X.dtype).mean(0)
    return s, p, freq, exact


def test_column_scan_for_large_K_draws_each_site_from_its_exact_conditional():
    K = cvq_gibbs.ENUM_MAX_K + 1
    values, X = _state(K, seed=1)
    s0 = jnp.asarray(np.random.default_rng(2).integers(0, 2, (X.shape[0], K)), jnp.int32)
    s, p, freq, exact = _scan_path({**values, "s": s0}, X, jax.random.PRNGKey(7))
    # the first three columns' joint law after one scan, exactly
    err = float(jnp.abs(freq - exact).max())
    assert err < TOL, (err, np.round(np.asarray(freq), 3), np.round(np.asarray(exact), 3))
    # every column: the drawn bit minus its exact conditional probability has mean zero
    z = np.asarray((s - p).mean(0) / (jnp.sqrt((p * (1 - p)).mean(0) / NUM_DRAWS) + 1e-12))
    assert np.abs(z).max() < 4.5, np.round(z, 1)  # 39 sites: Bonferroni at ~3e-4 familywise
