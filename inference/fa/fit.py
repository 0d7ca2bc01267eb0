"""Front door of the FA closed-form methods: mean-field CAVI (``"vb"``) and MAP-EM (``"em"``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpyro

from latentzoo.inference.cavi import CAVI
from latentzoo.inference.fa.em import fa_em
from latentzoo.inference.fa.vb import fa_cavi, validate_fa_data
from latentzoo.models.factor_analysis import factor_analysis

__all__ = ["FAFit", "fit_fa_variational"]


class FAFit(NamedTuple):
    """What :func:`fit_fa_variational` returns: the run and the guide its params belong to."""

    result: numpyro.infer.svi.SVIRunResult
    guide: Callable


def fit_fa_variational(
    X,
    K: int,
    method: str = "vb",
    num_steps: int = 1000,
    seed: int = 0,
    progress_bar: bool = False,
    init_params=None,
    *,
    model=factor_analysis,
    priors=None,
    rtol: float = 1e-9,
) -> FAFit:
    """Fit FA by mean-field CAVI (``method="vb"``) or MAP-EM with point W, mu, psi (``"em"``).

    Runs up to ``num_steps`` sweeps (stopping when the relative objective change < ``rtol``) under
    the driver's ELBO-decrease check. Returns ``FAFit(result, guide)``: ``result`` is the
    ``SVIRunResult`` (losses = -objective); ``Predictive(model, guide=guide, params=result.params)``
    gives the posterior predictive.
    """
    X = jnp.asarray(validate_fa_data(X, K))
    if method == "vb":
        fa = fa_cavi(model)
    elif method == "em":
        fa = fa_em(model)
    else:
        raise ValueError(f"Unknown FA variational method {method!r}; use 'vb' or 'em'.")
    runner = CAVI(model, fa.guide, fa.algorithm, on_decrease="raise")
    result = runner.run(
        jax.random.PRNGKey(seed), num_steps, X, K=K, priors=priors,
        progress_bar=progress_bar, init_params=init_params, rtol=rtol,
    )
    return FAFit(result, fa.guide)
