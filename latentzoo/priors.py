"""The priors a run used, as written in the model file, and whether a method reads them.

A user swaps a prior by editing ``default_priors()`` at the top of a model file
(``models/<family>.py``). A run records what it read there, so a result can always be traced to
its priors: :func:`prior_record` gives each site's prior as text (``"Normal(loc=0.0,
scale=1.0)"``) and a SHA-256 of the model file, stored by ``latentzoo run`` in ``posterior.nc``'s
attributes ``latentzoo_priors`` (JSON) and ``latentzoo_model_sha256``.

Maximum-likelihood point fits (CVQ's ``vb`` and ``em``, the tensor analyzers' ``mcem``) do not
read some priors at all (``Method.ignores_priors``). :func:`ignored_edits` compares the model
file's priors with the ones the package ships (:data:`SHIPPED_PRIORS`, kept in step with the
model files by ``tests/models/test_priors_record.py``) and names the edited ones such a method
ignores, which the command line then says in one line instead of running as if nothing changed.
"""

from __future__ import annotations

import hashlib
import inspect
import sys

import numpy as np

__all__ = ["describe", "model_priors", "model_source_sha256", "prior_record", "ignored_edits",
           "SHIPPED_PRIORS"]

# What each model file's default_priors() says as shipped (describe()); a model is named by its
# module. tests/models/test_priors_record.py fails when a model file and this table disagree.
SHIPPED_PRIORS: dict[str, dict[str, str]] = {
    "latentzoo.models.cvq": {
        "pi": "Beta(concentration1=1.0, concentration0=1.0)",
        "W": "Normal(loc=0.0, scale=1.0)",
        "tau": "Gamma(concentration=2.0, rate=0.5)",
    },
    "latentzoo.models.tensor_analyzer": {
        "pi": "1.0",
        "W": "Normal(loc=0.0, scale=1.0)",
        "T": "Normal(loc=0.0, scale=1.0)",
        "mu": "Normal(loc=0.0, scale=10.0)",
        "Psi": "InverseGamma(concentration=2.0, rate=1.0)",
        "z": "Normal(loc=0.0, scale=1.0)",
    },
}


def _value(v) -> str:
    a = np.asarray(v)
    if a.ndim == 0:
        return repr(float(a)) if np.issubdtype(a.dtype, np.number) else repr(a.item())
    if a.size <= 6:
        return "[" + ", ".join(repr(float(x)) for x in a.ravel()) + "]"
    return f"array{tuple(a.shape)} mean {float(a.mean()):.6g}"


def describe(prior) -> str:
    """A prior as text: a NumPyro distribution as ``Name(param=value, ...)`` (its
    ``arg_constraints`` parameters; arrays of more than 6 values by shape and mean), anything
    else (a Dirichlet concentration given as a float) by its value."""
    params = getattr(prior, "arg_constraints", None)
    if params is None:
        return _value(prior) if np.ndim(prior) or isinstance(prior, (int, float)) else repr(prior)
    shown = []
    for name in params:
        value = getattr(prior, name, None)
        if value is not None:
            shown.append(f"{name}={_value(value)}")
    return f"{type(prior).__name__}({', '.join(shown)})"


def _module(model):
    inner = getattr(model, "func", model)  # functools.partial
    return sys.modules[inner.__module__]


def model_priors(model, K: int | None = None) -> dict[str, str]:
    """``default_priors()`` of the model's file, described (:func:`describe`); {} when the model's
    module has none. ``K``: passed where the priors depend on it (convolutional FA's)."""
    read = getattr(_module(model), "default_priors", None)
    if read is None:
        return {}
    takes_k = "K" in inspect.signature(read).parameters
    if takes_k and K is None:
        raise ValueError(f"{_module(model).__name__}.default_priors needs K.")
    priors = read(K=K) if takes_k else read()
    return {site: describe(p) for site, p in priors.items()}


def model_source_sha256(model) -> str:
    """SHA-256 of the model's source file as it is now ("" when it cannot be read)."""
    try:
        return hashlib.sha256(inspect.getsource(_module(model)).encode()).hexdigest()
    except (OSError, TypeError):
        return ""


def prior_record(model, K: int | None = None) -> dict[str, str]:
    """The attributes a run stores: ``latentzoo_priors`` (JSON of :func:`model_priors`) and
    ``latentzoo_model_sha256``."""
    import json

    return {"latentzoo_priors": json.dumps(model_priors(model, K), sort_keys=True),
            "latentzoo_model_sha256": model_source_sha256(model)}


def ignored_edits(model, sites) -> dict[str, str]:
    """The priors among ``sites`` that differ from the shipped ones (:data:`SHIPPED_PRIORS`) in
    the model file as it is now: {site: its prior now}. Empty for a model the table does not
    list."""
    shipped = SHIPPED_PRIORS.get(_module(model).__name__)
    if shipped is None:
        return {}
    now = model_priors(model)
    return {s: now[s] for s in sites if s in now and now[s] != shipped.get(s)}
