"""CVQ split-merge move: chains started where one source holds two bars and another is off.

The state the stuck chain of the default run holds (docs/convergence.md; chain 1 of
``latentzoo run cvq --method gibbs`` after its 500 warm-up sweeps, sigma 0.55): two sources each
on in every row that has either of two bars (a horizontal and a vertical one), two sources off,
the other four on where their bars are; the images at their posterior mean given these
indicators (a merged source's a blend of its two bars), tau and pi at the truth. From there the
full Gibbs table runs with and without the split-merge move
(:mod:`latentzoo.inference.cvq.split_merge`), same keys. A bar counts as
recovered when some source's image has correlation > 0.9 with it; printed per chain: the first
sweep with every bar recovered (or "never"), and sigma and the number of recovered bars at the
end.

    python experiments/cvq_split_merge_demo.py                       # default bars, 8x8, N = 500, K = 8
    python experiments/cvq_split_merge_demo.py --side 6 --bars 4 --N 100 --K 4 --pairs 0-2
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from latentzoo.inference.cvq import cvq_updates
from latentzoo.inference.gibbs import sweep_values
from latentzoo.inference.updates import Move
from latentzoo.models.cvq import bar_sources, cvq, simulate_cvq


def switchable(move: Move) -> Move:
    """``move`` whose result is kept only where ``values["_on"]`` is true: one compiled program
    runs the table with and without it (and the other updates draw with the same keys)."""

    def step(key, values, obs, priors):
        new = move.sample(key, values, obs, priors)
        return {k: jnp.where(values["_on"], new[k], values[k]) for k in new}

    return move._replace(step=step)


def merged_start(X, s_true, sigma, K, pairs):
    """Each pair (p, q) of true sources merged into source p (on where either is), source q and
    the sources past the truth's off, the others true; W at its posterior mean given these s
    (W ~ N(0, 1): a merged source holds the blend of two images that fits its rows best, as the
    stuck chain's does), tau and pi at the truth."""
    N, K_true = s_true.shape
    s = np.zeros((N, K))
    s[:, :K_true] = s_true
    for p, q in pairs:
        s[:, p] = np.maximum(s_true[:, p], s_true[:, q])
        s[:, q] = 0.0
    W = np.linalg.solve(s.T @ s + sigma**2 * np.eye(K), s.T @ X).T
    pi = np.clip(s.mean(0), 0.002, 0.99)
    return {"s": jnp.asarray(s), "W": jnp.asarray(W), "pi": jnp.asarray(pi),
            "tau": jnp.asarray(1.0 / sigma**2)}


def make_runner(K, sweeps):
    """jitted (values0, X, key, on) -> (sweeps,) arrays of the bar correlations and sigma."""
    table = [switchable(u) if u.name.startswith("(s_k, s_j") else u for u in cvq_updates()]
    kw = {"K": K}

    @jax.jit
    def run(values0, X, W_true, key, on):
        def body(values, k):
            keys = jax.random.split(k, len(table))
            values = sweep_values(cvq, table, {**values, "_on": on}, keys, (X,), kw)
            values.pop("_on")
            W = values["W"]
            Wc = W - W.mean(0)
            Tc = W_true - W_true.mean(0)
            corr = (Tc.T @ Wc) / (jnp.linalg.norm(Tc, axis=0)[:, None] * jnp.linalg.norm(Wc, axis=0)[None] + 1e-12)
            return values, (jnp.max(corr, axis=1), 1.0 / jnp.sqrt(values["tau"]))

        return jax.lax.scan(body, values0, jax.random.split(key, sweeps))[1]

    return run


def demo(side=8, bars=8, N=500, K=8, sigma=0.5, pi=0.3, sweeps=300, chains=4, seed=0, threshold=0.9,
         pairs=((1, 4), (2, 5))):
    """{"with": [...], "without": [...]}: per chain (first sweep with every bar recovered or
    None, bars recovered at the end, sigma at the end)."""
    W_true = bar_sources(side, bars)
    X, s_true = simulate_cvq(W_true, pi, sigma, N, np.random.default_rng(seed))
    values0 = merged_start(X, s_true, sigma, K, pairs)
    run = make_runner(K, sweeps)
    out = {}
    for label, on in (("with", True), ("without", False)):
        rows = []
        for c in range(chains):
            corr, sig = (np.asarray(a) for a in run(values0, jnp.asarray(X), jnp.asarray(W_true),
                                                     jax.random.PRNGKey(100 * seed + c), jnp.asarray(on)))
            ok = np.all(corr > threshold, axis=1)
            first = int(np.argmax(ok)) + 1 if ok.any() else None
            rows.append((first, int(np.sum(corr[-1] > threshold)), float(sig[-1])))
        out[label] = rows
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--side", type=int, default=8)
    ap.add_argument("--bars", type=int, default=8)
    ap.add_argument("--N", type=int, default=500)
    ap.add_argument("--K", type=int, default=8)
    ap.add_argument("--sweeps", type=int, default=300)
    ap.add_argument("--chains", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pairs", default="1-4,2-5",
                    help="true sources merged at the start, p-q: q into p (default: two horizontal "
                         "bars each merged with a vertical one, as the stuck chain had them)")
    a = ap.parse_args(argv)
    pairs = tuple(tuple(int(x) for x in pq.split("-")) for pq in a.pairs.split(","))
    t = time.time()
    out = demo(a.side, a.bars, a.N, a.K, sweeps=a.sweeps, chains=a.chains, seed=a.seed, pairs=pairs)
    print(f"{a.bars} bars on {a.side}x{a.side}, N = {a.N}, K = {a.K}, {a.sweeps} sweeps from bars {a.pairs} merged "
          f"(seed {a.seed}, {time.time() - t:.0f} s)")
    print("table                 chain  first sweep with all bars  bars at the end  sigma at the end")
    for label, rows in out.items():
        for c, (first, n_bars, sig) in enumerate(rows):
            print(f"{label + ' split-merge':22s}{c:5d}  {str(first) if first else 'never':>25s}  "
                  f"{n_bars:>8d} of {a.bars}  {sig:16.3f}")


if __name__ == "__main__":
    main()
