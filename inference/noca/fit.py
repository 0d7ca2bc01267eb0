r"""Fitting NOCA: restarts, re-seeding of switched-off sources, progress, held-out likelihood.

:func:`fit_noca` runs the MAP-EM tables of :mod:`latentzoo.inference.noca.blocks` with the CAVI
driver, from the data-driven start, in *rounds*: after a run converges, every source that is
switched off (fewer than ``min_rows`` expected rows, or no gate above ``min_p``) is re-seeded at
the rows the fit explains worst relative to independent items, and the fit goes on from there.
A round is kept only if it ends at a higher objective than the previous one (otherwise the fit
stops at the previous round), so the result is the best of what was tried; the sweeps of all
rounds of one start share the budget ``num_steps``. Within a round the driver's objective never
decreases; across a re-seeding it may drop and recover (``losses`` concatenates the kept rounds).
With ``restarts = R`` the whole procedure runs from R starts (keys split from ``seed``) and the
start with the best final objective is returned.
"""

from __future__ import annotations

import sys
import time
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.infer.svi import SVIRunResult

from latentzoo.models.noca import noca

from latentzoo.inference.binary_draw import ENUM_MAX_K
from latentzoo.inference.cavi import CAVI, VariationalFit, new_rows
from latentzoo.inference.enumerate import MAX_EXACT_K
from latentzoo.inference.noca.blocks import (
    noca_data_init,
    noca_exact_em,
    noca_guide,
    noca_vem,
)
from latentzoo.inference.noca.bound import (
    noca_bound_rows,
    noca_exact_loglik,
    noca_exact_rows,
    noca_importance_loglik,
    positive_index,
)
from latentzoo.inference.noca.em import lam_update, q_update
from latentzoo.inference.validation import check_matrix

__all__ = ["fit_noca", "live_sources", "noca_heldout_loglik", "noca_mean_field", "noca_mean_field_rows"]


def live_sources(params, N: int, *, min_rows: float = 1.0, min_p: float = 0.05) -> np.ndarray:
    """(K,) bool: source i is live when it is on in at least ``min_rows`` rows in expectation
    (N pi_i) and some gate p_ij = 1 - exp(-theta_ij) reaches ``min_p``."""
    pi = np.asarray(params["pi_loc"])
    p_max = -np.expm1(-np.asarray(params["theta_loc"]).max(1))
    return (N * pi >= min_rows) & (p_max >= min_p)


@partial(jax.jit, static_argnums=(2, 3))
def _row_scores(params, X, method, num_pos):
    """Per-row objective (exact log p(x_n), or the bound's row terms) minus the row's
    log-likelihood under independent items: low = co-occurrences the sources do not explain."""
    if method == "em":
        ll = noca_exact_loglik(X, params["theta_loc"], params["theta0_loc"], params["pi_loc"], per_row=True)
    else:
        ll = noca_bound_rows(params, X, num_pos=num_pos)
    N = X.shape[0]
    freq = (X.sum(0) + 0.5) / (N + 1.0)
    indep = X @ jnp.log(freq) + (1.0 - X) @ jnp.log1p(-freq)
    return ll - indep


def _reseed(params, X, dead, rng, method, num_pos):
    """New start: the dead sources' gates and pi from templates seeded at badly explained rows
    (drawn from the worst 5 % of the rows with two or more findings), the rest unchanged."""
    Xn = np.asarray(X)
    score = np.asarray(_row_scores(params, X, method, num_pos))
    cand = np.flatnonzero(Xn.sum(1) >= 2)
    if cand.size < dead.sum():
        return None
    worst = cand[np.argsort(score[cand])[: max(int(dead.sum()), int(0.05 * cand.size))]]
    seeds = rng.choice(worst, int(dead.sum()), replace=False)
    key = jax.random.PRNGKey(int(rng.integers(2**31)))
    fresh = noca_data_init(key, Xn, int(dead.sum()), seed_rows=seeds)
    theta = np.asarray(params["theta_loc"]).copy()
    pi = np.asarray(params["pi_loc"]).copy()
    theta[dead] = np.asarray(fresh["theta_loc"])
    pi[dead] = np.asarray(fresh["pi_loc"])
    lam = np.asarray(params["lam"]).copy()
    lam[:, dead] = pi[dead][None, :]
    out = {**params, "theta_loc": jnp.asarray(theta), "pi_loc": jnp.asarray(pi), "lam": jnp.asarray(lam)}
    if method == "vb":  # give the new sources a share of every positive finding's Jensen weights
        q = np.asarray(params["q"]).copy()
        q[:, dead] = 1.0 / theta.shape[0]
        out["q"] = jnp.asarray(q / q.sum(1, keepdims=True))
    return out


def fit_noca(
    X,
    K: int,
    *,
    method: str = "vb",
    num_steps: int = 300,
    seed: int = 0,
    restarts: int = 1,
    rounds: int = 3,
    progress_bar: bool = False,
    rtol: float = 1e-7,
    init_params=None,
    priors=None,
    **algo_kwargs,
) -> VariationalFit:
    """Fit NOCA by variational MAP-EM on the Jaakkola-Jordan bound (``method="vb"``) or exact
    MAP-EM by enumerating the 2^K source states (``"em"``, K <= 16); the model's priors (or
    ``priors``, a dict as for :func:`~latentzoo.models.noca.noca`) enter as pseudo-counts.

    Args:
        X: binary data (N, D).
        K: number of sources.
        num_steps: sweep budget of one start (shared by its re-seeding rounds).
        seed, restarts: R starts with keys split from ``seed``; the best final objective is kept.
        rounds: at most this many re-seedings of switched-off sources per start (0: none).
        progress_bar: a bar per run and one line per start on stderr.
        rtol: stop a run when the objective changes by less than ``rtol`` times the objective's absolute value.
        init_params: entries that override the data-driven start (first start only).
        algo_kwargs: go to :func:`~latentzoo.inference.noca.blocks.noca_vem` or
            :func:`~latentzoo.inference.noca.blocks.noca_exact_em`.

    Returns :class:`~latentzoo.inference.cavi.VariationalFit` (``.params``, ``.losses`` =
    -objective after each sweep of the kept rounds, ``.guide`` = :func:`noca_guide`, ``.model``).
    """
    if method not in ("vb", "em"):
        raise ValueError(f"Unknown NOCA fitting method {method!r}; the valid names are 'vb' and 'em'.")
    if isinstance(restarts, bool) or not isinstance(restarts, (int, np.integer)) or restarts < 1:
        raise ValueError(f"restarts must be a positive integer, got {restarts!r}.")
    X = jnp.asarray(check_matrix(X, K=K, binary=True, name="NOCA data"))
    if method == "em" and K > MAX_EXACT_K:
        raise ValueError(f"Exact EM enumerates 2^K states and is limited to K <= {MAX_EXACT_K}, got K = {K}.")
    algo = noca_vem(**algo_kwargs) if method == "vb" else noca_exact_em(**algo_kwargs)
    cavi = CAVI(noca, noca_guide, algo)
    kwargs = dict(K=K, num_pos=int(X.sum()), priors=priors)
    if progress_bar:
        what = f"{2**K} source states per row" if method == "em" else f"{kwargs['num_pos']} positive findings"
        print(f"NOCA {method}: {X.shape[0]} rows x {X.shape[1]} items, K = {K} ({what}); up to "
              f"{num_steps} sweeps x {restarts} start(s), stopping at relative change {rtol:g}",
              file=sys.stderr, flush=True)
    best = None
    for r, key in enumerate(jax.random.split(jax.random.PRNGKey(seed), restarts)):
        t0 = time.perf_counter()
        label = f" restart {r + 1}/{restarts}" if restarts > 1 else ""
        res = _fit_one(cavi, key, X, kwargs, method, num_steps, rounds, rtol,
                       init_params if r == 0 else None, progress_bar, label)
        if progress_bar:
            live = int(live_sources(res.params, X.shape[0]).sum())
            print(f"NOCA {method}{label or ''}: objective {-float(res.losses[-1]):.6g} after "
                  f"{len(res.losses)} sweeps, {live} of {K} sources live, "
                  f"{time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        if best is None or float(res.state.elbo) > float(best.state.elbo):
            best = res
    return VariationalFit(best, noca_guide, noca, row_log_likelihood=_noca_rows,
                          score_kind="exact" if K <= ENUM_MAX_K else "lower bound")


def _noca_rows(params, X):
    """Each new row's log p(x_n | theta, theta0, pi): exact by enumeration up to ENUM_MAX_K
    sources, the Jaakkola-Jordan mean-field lower bound above."""
    theta, theta0, pi = params["theta_loc"], params["theta0_loc"], params["pi_loc"]
    X = new_rows(X, theta.shape[1], binary=True)
    if theta.shape[0] <= ENUM_MAX_K:
        return noca_exact_rows(X, theta, theta0, pi)[0]
    return noca_mean_field_rows(X, theta, theta0, pi, num_pos=int(X.sum()))[0]


def _fit_one(cavi, key, X, kwargs, method, num_steps, rounds, rtol, init_params, progress_bar, label):
    """One start: a run, then up to ``rounds`` re-seedings (switched-off sources, else the least
    used source not yet tried), each kept only if it ends at a higher objective."""
    key, k_init = jax.random.split(key)
    state = cavi.init(k_init, X, init_params=init_params, **kwargs)
    res = cavi.run(key, num_steps, X, init_state=state, progress_bar=progress_bar, rtol=rtol, **kwargs)
    losses = list(np.asarray(res.losses))
    used = len(losses)
    rng = np.random.default_rng(np.asarray(jax.random.key_data(key)).ravel().tolist())
    N = X.shape[0]
    tried: set[int] = set()
    for _ in range(rounds):
        if num_steps - used <= 0:
            break
        dead = ~live_sources(res.params, N)
        if not dead.any():  # none switched off: re-seed the least used source not tried yet
            order = [int(i) for i in np.argsort(np.asarray(res.params["pi_loc"])) if int(i) not in tried]
            if not order:
                break
            tried.add(order[0])
            dead = np.arange(dead.size) == order[0]
        start = _reseed(res.params, X, dead, rng, method, kwargs["num_pos"])
        if start is None:
            break
        key, k_run = jax.random.split(key)
        state = cavi.init(k_run, X, init_params=start, **kwargs)
        nxt = cavi.run(k_run, num_steps - used, X, init_state=state, progress_bar=progress_bar, rtol=rtol, **kwargs)
        used += len(nxt.losses)
        if float(nxt.state.elbo) > float(res.state.elbo):
            res, tried = nxt, set()
            losses += list(np.asarray(nxt.losses))
    return SVIRunResult(res.params, res.state, jnp.asarray(losses))


def noca_mean_field(X, theta, theta0, pi, *, iters: int = 60):
    """(lam (N, K), q (P, K)) of the variational E-step at fixed parameters: ``iters`` rounds of
    (q steps, lam) from lam = 1/2, q uniform (rows are independent, so this serves held-out rows)."""
    return _mean_field(X, theta, theta0, pi, num_pos=int(np.asarray(X).sum()), iters=iters)


@partial(jax.jit, static_argnames=("num_pos", "iters"))
def _mean_field(X, theta, theta0, pi, *, num_pos: int, iters: int):
    """The E-step loop of :func:`noca_mean_field` in one program (a ``fori_loop``), the data an
    argument: -> (lam (N, K), q (P, K))."""
    N, K = X.shape[0], theta.shape[0]
    rows, cols = positive_index(X, num_pos)

    def body(_, carry):
        lam, q = carry
        q = q_update(q, lam, theta, theta0, rows, cols, 2)
        return lam_update(q, X, theta, theta0, pi, rows, cols), q

    start = (jnp.full((N, K), 0.5, X.dtype), jnp.full((num_pos, K), 1.0 / K, X.dtype))
    return jax.lax.fori_loop(0, iters, body, start)


def noca_mean_field_rows(X, theta, theta0, pi, *, num_pos: int, iters: int = 60):
    """``(bound (N,), lam (N, K))`` for K too large to enumerate: the variational E-step at fixed
    parameters (:func:`noca_mean_field`'s loop: ``iters`` rounds of q steps then the exact lam
    maximiser, from lam = 1/2 and q uniform; neither step lowers the bound) and the
    Jaakkola-Jordan lower bound on each row's log p(x_n) it reaches
    (:func:`~latentzoo.inference.noca.bound.noca_bound_rows`). ``num_pos`` is the number of ones
    in X (a shape, so static under jit). vmap-able over posterior draws."""
    lam, q = _mean_field(X, theta, theta0, pi, num_pos=num_pos, iters=iters)
    params = {"pi_loc": pi, "theta_loc": theta, "theta0_loc": theta0, "lam": lam, "q": q}
    return noca_bound_rows(params, X, num_pos=num_pos), lam


def noca_heldout_loglik(X, params, *, rng_key=None, num_samples: int = 2000, exact_max_K: int = MAX_EXACT_K):
    """log p(x_n | fitted params) per row, (N,), of rows not used in the fit: exact by enumerating
    the 2^K states when K <= ``exact_max_K``, else importance sampling
    (:func:`~latentzoo.inference.noca.bound.noca_importance_loglik`, proposal half the held-out
    rows' mean-field posterior, half the prior). Returns ``(loglik (N,), how)`` with how
    "exact" or "importance sampling"."""
    X = jnp.asarray(check_matrix(X, binary=True, name="held-out NOCA data"))
    theta, theta0, pi = params["theta_loc"], params["theta0_loc"], params["pi_loc"]
    if theta.shape[0] <= exact_max_K:
        return noca_exact_loglik(X, theta, theta0, pi, per_row=True), "exact"
    lam, _ = noca_mean_field(X, theta, theta0, pi)
    key = jax.random.PRNGKey(0) if rng_key is None else rng_key
    return noca_importance_loglik(X, theta, theta0, pi, key, lam=lam, num_samples=num_samples), "importance sampling"
