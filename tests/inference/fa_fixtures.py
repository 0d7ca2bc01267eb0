"""Shared pieces of the FA inference tests: small problem sizes, test functions, broken controls."""

import jax.numpy as jnp
import numpyro.distributions as dist

from latentzoo.inference.fa import gibbs as fa_gibbs
from latentzoo.inference.updates import GibbsUpdate, Move

# A small problem keeps hundreds of simulations cheap. mu's prior is tightened from the model's
# N(0, 10^2): under a diffuse prior the Geweke chain moves mu by ~1/sqrt(N) per step across a
# range of 10, its autocorrelation time dwarfs any affordable run and the z-scores stop being
# standard normal. Editing the hyperparameter keeps every conjugate update (that is tested too).
SMALL = dict(N=12, D=4, K=2, priors={"mu": dist.Normal(0.0, 1.0)})

# Identifiable functions of the parameters (W alone is identified only up to rotation, and a
# correct but slowly rotating sampler would fail SBC on W's entries).
TEST_FUNCTIONS = {
    "psi": lambda v: v["psi"],
    "mu": lambda v: v["mu"],
    "cov_diag": lambda v: jnp.sum(v["W"] ** 2, -1) + 1.0 / v["psi"],
    "cov01": lambda v: v["W"][0] @ v["W"][1],
}


def broken_psi_update(knob=1.0) -> GibbsUpdate:
    """psi | rest with the Gamma shape off by knob x N/2: the deliberately wrong control (knob 1).
    Knob 0 is the right update exactly; a traced knob lets the right table and the control
    share one compiled check (``sbc_runs``)."""
    right = fa_gibbs.psi_update()

    def conditional(values, obs, priors):
        d = right.conditional(values, obs, priors)["psi"]
        N = obs["X"].shape[0]
        return {"psi": dist.Gamma(d.concentration + knob * 0.5 * N, d.rate)}

    return GibbsUpdate("psi (broken: shape + N/2)", ("psi",), right.requires, conditional)


def broken_scale_move() -> Move:
    """The scale move with the Jacobian's sign flipped (c^(N-D) instead of c^(D-N))."""

    def step(key, values, obs, priors):
        N = values["z"].shape[0]
        D = values["W"].shape[0]
        # Pretend the sizes are swapped: the MH ratio then uses the wrong Jacobian.
        out = fa_gibbs.scale_step(key, values, obs, priors, jacobian_power=N - D)
        return out

    return Move("scale move (broken Jacobian)", ("W", "z"), {"X": (dist.Normal,)}, step)


def table_with(replacements):
    """The FA table with some updates replaced by name prefix (e.g. {"psi": broken})."""
    out = []
    for u in fa_gibbs.fa_updates():
        key = u.name.split()[0]
        out.append(replacements.get(key, u))
    return out
