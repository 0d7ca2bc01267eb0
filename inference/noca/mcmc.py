r"""MCMC for the Bayesian NOCA through the Gibbs builder's fallback path.

NOCA has one conjugate block, :math:`\pi_i \mid s \sim \mathrm{Beta}(a + \sum_n s_{ni},\ b + N -
\sum_n s_{ni})`. Nothing else is conjugate: the noisy-OR likelihood couples theta, theta0 and s.
The table therefore holds only the pi update, and :class:`~latentzoo.inference.gibbs.ConjugateGibbs`
hands ``s`` to NumPyro's ``DiscreteGibbs`` and ``theta``, ``theta0`` to NUTS (with a
``ConjugacyFallbackWarning`` naming them), composed by ``numpyro.infer.Gibbs``. This is the
builder's fallback path on a real model; it is correct but slow (``DiscreteGibbs`` re-evaluates
the model once per binary site), so it is meant for small problems and for checking.
"""

from __future__ import annotations

from functools import partial

from latentzoo.models.noca import noca

from latentzoo.inference.gibbs import ConjugateGibbs
from latentzoo.inference.conjugate import beta_bernoulli_update
from latentzoo.inference.updates import GibbsUpdate

__all__ = ["noca_updates", "noca_kernel"]

# The Beta-Bernoulli pi | s update is shared with CVQ (latentzoo.inference.conjugate): both models
# draw s_nk ~ Bernoulli(pi_k) with pi_k ~ Beta, so the one derivation serves both.


def noca_updates() -> list[GibbsUpdate]:
    """The NOCA table: only pi | s; s goes to DiscreteGibbs and theta, theta0 to NUTS."""
    return [beta_bernoulli_update("pi", "s")]


def noca_kernel(K: int | None = None, **nuts_kwargs) -> ConjugateGibbs:
    """``ConjugateGibbs(noca, noca_updates())`` with optional NUTS settings. With ``K`` the model
    is bound to that number of sources, so ``MCMC(..., jit_model_args=True)`` (which traces every
    model argument) does not turn the plate size into a traced value; run it without ``K``."""
    model = noca if K is None else partial(noca, K=K)
    return ConjugateGibbs(model, noca_updates(), nuts_kwargs=nuts_kwargs or None)
