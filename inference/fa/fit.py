"""Front door of the FA closed-form methods: mean-field CAVI (``"vb"``) and MAP-EM (``"em"``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from latentzoo.inference.cavi import CAVI, VariationalFit
from latentzoo.inference.fa.em import fa_em
from latentzoo.inference.fa.vb import fa_cavi, validate_fa_data
from latentzoo.models.factor_analysis import factor_analysis

__all__ = ["fit_fa_variational"]

_METHODS = {"vb": fa_cavi, "em": fa_em}


def fit_fa_variational(
    X,
    K: int,
    method: str = "vb",
    num_steps: int = 1000,
    seed: int = 0,
    progress_bar: bool = False,
    init_params=None,
    *,
    restarts: int = 1,
    model=factor_analysis,
    priors=None,
    rtol: float = 1e-9,
) -> VariationalFit:
    """Fit FA by mean-field CAVI (``method="vb"``) or MAP-EM with point W, mu, psi (``"em"``).

    Runs up to ``num_steps`` sweeps (stopping when the relative objective change < ``rtol``) under
    the driver's ELBO-decrease check; with ``restarts=R`` keeps the best of R starts (keys split
    from ``seed``). ``priors`` overrides the model's priors: a new hyperparameter keeps the
    closed-form updates; a new family hands that site's block to SVI steps, with a warning.

    Returns :class:`~latentzoo.inference.cavi.VariationalFit`: ``.params``, ``.losses``
    (-objective after each sweep), ``.result`` (the ``SVIRunResult``), ``.guide`` and ``.model``;
    ``Predictive(fit.model, guide=fit.guide, params=fit.params)`` gives the posterior predictive.
    """
    if method not in _METHODS:
        raise ValueError(f"Unknown FA variational method {method!r}; the valid names are 'vb' and 'em'.")
    X = jnp.asarray(validate_fa_data(X, K))
    fa = _METHODS[method](model)
    runner = CAVI(model, fa.guide, fa.algorithm, on_decrease="raise")
    result = runner.run(
        jax.random.PRNGKey(seed), num_steps, X, K=K, priors=priors,
        progress_bar=progress_bar, init_params=init_params, rtol=rtol, restarts=restarts,
    )
    return VariationalFit(result, fa.guide, model, row_log_likelihood=_fa_rows)


def _fa_rows(params, X):
    """Each new row's log p(x_{n,O}) at the fit (W, mu at their means; psi at its mean or
    point estimate), z ~ N(0, I) integrated out; NaN entries left out
    (:func:`~latentzoo.inference.fa.predict.masked_log_predictive`)."""
    from latentzoo.inference.cavi import new_rows
    from latentzoo.inference.fa.predict import masked_log_predictive

    W, mu = params["W_loc"], params["mu_loc"]
    psi = params["psi_loc"] if "psi_loc" in params else params["psi_concentration"] / params["psi_rate"]
    return masked_log_predictive(new_rows(X, W.shape[0]), W, mu, psi)[0]
