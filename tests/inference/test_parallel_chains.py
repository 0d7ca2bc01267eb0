"""Four chains in parallel across four (simulated) CPU devices with chain_method="parallel".

XLA_FLAGS must be set before JAX starts, so the run happens in a fresh interpreter.
"""

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import jax, numpy as np
    from numpyro.infer import MCMC, Predictive
    from latentzoo.models.factor_analysis import factor_analysis
    from latentzoo.inference.gibbs import ConjugateGibbs
    from latentzoo.inference.fa.gibbs import fa_updates
    assert jax.local_device_count() == 4, jax.devices()
    X = Predictive(factor_analysis, num_samples=1)(jax.random.PRNGKey(0), N=50, D=5, K=2)["X"][0]
    mcmc = MCMC(ConjugateGibbs(factor_analysis, fa_updates()), num_warmup=50, num_samples=50,
                num_chains=4, chain_method="parallel", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(1), X, K=2)
    cov = np.asarray(mcmc.get_samples(group_by_chain=True)["cov"])
    assert cov.shape == (4, 50, 5, 5), cov.shape
    assert len({float(c[-1, 0, 0]) for c in cov}) == 4  # four distinct chains
    print("ok")
    """
)


def test_four_chains_on_four_cpu_devices():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")
