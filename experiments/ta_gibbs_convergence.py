"""How many alternating Gibbs sweeps the tensor analyzer's latent groups need (the supplement:
"about 20").

A TA with known parameters (TA{2,2,2} as in the supplement, and a 6-D TA{6,2,2}) generates N
rows; the parameters stay fixed and only the groups z_1, z_2 are sampled, by the hand-derived
alternating updates, in 4 chains started from over-dispersed draws (3x the prior's scale). For
each burn-in length s the split R-hat is computed on the next ``--window`` sweeps, for 6 chosen
latent factors (rows 0-2, first coordinate of each group) and as the largest over every factor
of every row; once with the alternating updates alone and once with the partially collapsed
move (z_2 by MH with z_1 integrated out, then z_1 exactly) after each sweep. ArviZ trace and rank plots of the 6 factors; PNG of R-hat against s; CSV and JSON.

    python experiments/ta_gibbs_convergence.py [--quick] [--out DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from functools import partial

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import latentzoo  # noqa: E402,F401
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from numpyro.diagnostics import split_gelman_rubin  # noqa: E402

from _binary_common import check_at_least, save_figure, write_csv, write_json  # noqa: E402
from latentzoo import arviz_adapter as azx  # noqa: E402
from latentzoo import arviz_plots  # noqa: E402
from latentzoo.inference.gibbs import SweepState, sweep  # noqa: E402
from latentzoo.inference.ta import collapsed_group_move, group_update  # noqa: E402
from latentzoo.models.tensor_analyzer import random_ta_parameters, sample_ta, tensor_analyzer  # noqa: E402

BURN_INS = (1, 2, 5, 10, 20, 40, 80, 160)


def run_chains(X, params, d, sweeps, chains, seed, collapsed):
    """Latent draws of every chain: {z_j: (chains, sweeps, N, d_j)} with parameters fixed."""
    model = partial(tensor_analyzer, d=d)
    table = [group_update(j) for j in range(len(d))]
    if collapsed:
        table.append(collapsed_group_move(len(d) - 1, 0))
    N = X.shape[0]
    fixed = {k: jnp.asarray(v) for k, v in params.items()}

    def chain(key):
        k0, key = jax.random.split(key)
        starts = jax.random.split(k0, len(d))
        zs = {f"z_{j + 1}": 3.0 * jax.random.normal(starts[j], (N, dj)) for j, dj in enumerate(d)}
        state = SweepState({**fixed, **zs}, key, jnp.zeros(()), jnp.zeros((), bool))

        def body(state, _):
            state = sweep(model, table, state, (X,), {})
            return state, {k: state.z[k] for k in zs}

        return jax.lax.scan(body, state, None, length=sweeps)[1]

    return jax.jit(jax.vmap(chain))(jax.random.split(jax.random.PRNGKey(seed), chains))


def rhat_after(draws, burn_in, window):
    """Split R-hat of draws (chains, sweeps, ...) over sweeps [burn_in, burn_in + window)."""
    part = np.asarray(draws[:, burn_in : burn_in + window])
    return np.asarray(split_gelman_rubin(part))


def experiment(name, D, d, N, noise, args, out, collapsed):
    rng = np.random.default_rng(args.seed)
    params = random_ta_parameters(rng, D, d, noise=noise)
    X, _ = sample_ta(rng, params, N, d)
    X = jnp.asarray(X)
    sweeps = max(BURN_INS) + args.window
    t = time.perf_counter()
    draws = run_chains(X, params, d, sweeps, args.chains, args.seed, collapsed)
    sampler = "alternating + collapsed move" if collapsed else "alternating"
    tag = f"{name}_{'collapsed' if collapsed else 'alternating'}"
    secs = time.perf_counter() - t
    chosen = np.concatenate([np.asarray(draws["z_1"])[:, :, :3, 0], np.asarray(draws["z_2"])[:, :, :3, 0]], -1)
    labels = [f"z_1[{n},0]" for n in range(3)] + [f"z_2[{n},0]" for n in range(3)]
    every = np.concatenate([np.asarray(v).reshape(*v.shape[:2], -1) for v in draws.values()], -1)
    rows = []
    for s in BURN_INS:
        r6 = rhat_after(chosen, s, args.window)
        rall = rhat_after(every, s, args.window)
        rows.append({"data": name, "sampler": sampler, "burn_in_sweeps": s, "max_rhat_6_factors": float(r6.max()),
                     "max_rhat_all_factors": float(rall.max()),
                     "share_all_factors_below_1.01": float(np.mean(rall < 1.01))})
    # the 6 factors after 20 sweeps of burn-in, as ArviZ sees them
    kept = chosen[:, 20 : 20 + args.window]
    idata = azx.from_draws({lab: kept[..., i] for i, lab in enumerate(labels)})
    arviz_plots.plot_trace(idata, os.path.join(out, f"ta_gibbs_trace_{tag}.png"),
                           title=f"{name}, {sampler}: 6 latent factors after 20 sweeps")
    arviz_plots.plot_rank(idata, os.path.join(out, f"ta_gibbs_rank_{tag}.png"))
    return rows, secs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer rows and a shorter window (CI)")
    ap.add_argument("--out", default=None, help="output folder (default experiments/results; "
                    "with --quick runs/ta_gibbs_convergence_quick)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--chains", type=int, default=4, help="chains for R-hat (at least 2)")
    ap.add_argument("--window", type=int, default=None, help="sweeps R-hat is computed over (default 400; quick 100)")
    args = ap.parse_args(argv)
    args.out = args.out or ("runs/ta_gibbs_convergence_quick" if args.quick else "experiments/results")
    args.window = args.window if args.window is not None else (100 if args.quick else 400)
    check_at_least("ta_gibbs_convergence", chains=(args.chains, 2), window=(args.window, 4))
    os.makedirs(args.out, exist_ok=True)
    N = 50 if args.quick else 500
    rows, timing = [], {}
    for name, D, d in (("TA{2,2,2}", 2, (2, 2)), ("TA{6,2,2}", 6, (2, 2))):
        for collapsed in (False, True):
            tag = name.replace("{", "").replace("}", "").replace(",", "-")
            r, secs = experiment(tag, D, d, N, 0.1, args, args.out, collapsed)
            rows += r
            timing[f"{name} {r[0]['sampler']}"] = secs
    print(f"{'data':<10} {'sampler':<29} {'burn-in':>8} {'max R-hat (6)':>14} {'max R-hat (all)':>16} {'share < 1.01':>13}")
    for r in rows:
        print(f"{r['data']:<10} {r['sampler']:<29} {r['burn_in_sweeps']:>8} {r['max_rhat_6_factors']:>14.3f} "
              f"{r['max_rhat_all_factors']:>16.3f} {r['share_all_factors_below_1.01']:>13.3f}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    for name in sorted({(r["data"], r["sampler"]) for r in rows}):
        rr = [r for r in rows if (r["data"], r["sampler"]) == name]
        ax.plot([r["burn_in_sweeps"] for r in rr], [r["max_rhat_all_factors"] for r in rr], "o-",
                label=f"{name[0]}, {name[1]}")
    ax.axhline(1.01, color="0.5", lw=0.8)
    ax.set(xscale="log", yscale="log", xlabel="burn-in sweeps", ylabel="max split R-hat, all factors")
    ax.legend(fontsize=7)
    save_figure(fig, os.path.join(args.out, "ta_gibbs_rhat.png"))
    write_csv(os.path.join(args.out, "ta_gibbs_convergence.csv"), rows)
    result = {"N": N, "chains": args.chains, "window": args.window, "rows": rows, "seconds": timing}
    write_json(args.json or os.path.join(args.out, "ta_gibbs_convergence.json"), result)
    return result


if __name__ == "__main__":
    main()
