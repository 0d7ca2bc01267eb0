"""Back end of ``latentzoo run cvq|noca``: fit the binary-latent models by variational EM, exact EM
or MCMC. The CLI module parses arguments and calls :func:`fit_binary_model`.
"""

from __future__ import annotations

import numpy as np


__all__ = ["fit_binary_model", "default_data", "MODELS", "METHODS"]

MODELS = ("cvq", "noca")
METHODS = ("vem", "em", "gibbs")
NOCA_MCMC_MAX_SITES = 2000


def default_data(name: str, seed: int = 0) -> np.ndarray:
    """The embedded synthetic data set: CVQ bars (500 x 64, Gaussian noise) or NOCA shapes
    (2000 x 64 binary)."""
    if name == "cvq":
        from latentzoo.models.cvq import default_cvq_data

        return default_cvq_data(seed)[0]
    if name == "noca":
        from latentzoo.models.noca import default_noca_data

        return default_noca_data(seed)[0]
    raise ValueError(f"Unknown binary-latent model {name!r}; use 'cvq' or 'noca'.")


def fit_binary_model(
    name: str,
    X,
    *,
    method: str,
    K: int,
    seed: int = 0,
    quick: bool = False,
    num_samples: int = 500,
    num_warmup: int = 500,
    chains: int = 1,
) -> dict:
    """Fit CVQ or NOCA.

    Returns ``{"kind": "mcmc", "mcmc", "model", "X", "model_kwargs"}`` for ``method="gibbs"`` and
    ``{"kind": "point", "params", "losses", "X"}`` (losses = -objective per sweep) otherwise.
    Raises ``ValueError`` for an unknown model or method and for bad data (NaN/inf, non-binary
    data for NOCA, K >= D).
    """
    import jax
    import jax.numpy as jnp

    if name not in MODELS:
        raise ValueError(f"Unknown binary-latent model {name!r}; use 'cvq' or 'noca'.")
    if method not in METHODS:
        raise ValueError(f"Unknown method {method!r} for {name}; use 'vem', 'em' or 'gibbs'.")
    X = default_data(name, seed) if X is None else X
    if name == "cvq":
        from latentzoo.models.cvq import cvq as model
    else:
        from latentzoo.models.noca import noca as model
    from latentzoo.inference.validation import check_matrix

    X = check_matrix(X, K=K, binary=name == "noca", name=f"{name.upper()} data")
    if method == "em" and K > 16:
        raise ValueError(f"Exact EM enumerates 2^K states and is limited to K <= 16, got K = {K}.")
    if method == "gibbs":
        from numpyro.infer import MCMC

        if name == "cvq":
            from latentzoo.inference.cvq.gibbs import cvq_updates
            from latentzoo.inference.gibbs import ConjugateGibbs

            kernel = ConjugateGibbs(model, cvq_updates())
        else:
            from latentzoo.inference.noca.mcmc import noca_kernel

            if X.shape[0] * K > NOCA_MCMC_MAX_SITES:
                # DiscreteGibbs re-evaluates the whole model once per binary site and sweep
                raise ValueError(
                    f"NOCA MCMC updates each of the N*K = {X.shape[0] * K} binary sources one at a "
                    f"time and is meant for small problems (N*K <= {NOCA_MCMC_MAX_SITES}); use "
                    "--method vem or em, or fewer rows."
                )

            kernel = noca_kernel()
        if quick:
            num_samples, num_warmup = min(num_samples, 50), min(num_warmup, 50)
        mcmc = MCMC(
            kernel,
            num_warmup=num_warmup,
            num_samples=num_samples,
            num_chains=chains,
            chain_method="sequential",
            progress_bar=False,
        )
        mcmc.run(jax.random.PRNGKey(seed), jnp.asarray(X), K=K)
        return {"kind": "mcmc", "mcmc": mcmc, "model": model, "X": X, "model_kwargs": {"K": K}}
    steps = 30 if quick else 300
    if name == "cvq":
        from latentzoo.inference.cvq.em import fit_cvq

        res = fit_cvq(X, K, method=method, num_steps=steps, seed=seed, restarts=1 if quick else 5)
    else:
        from latentzoo.inference.noca.em import fit_noca

        res = fit_noca(X, K, method=method, num_steps=steps, seed=seed, restarts=1 if quick else 3)
    params = {k: np.asarray(v) for k, v in res.params.items()}
    return {"kind": "point", "params": params, "losses": np.asarray(res.losses), "X": X}
