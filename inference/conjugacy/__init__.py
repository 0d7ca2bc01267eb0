"""Conjugacy detection: Gibbs conditionals derived from a NumPyro model's trace.

:func:`detect` takes a model, its arguments and one latent site, and decides numerically (from
traces of the model at several values of the site, never from its source) whether the site's
full conditional is in closed form: a supported prior family whose children use the site in the
conjugate way (an affine mean, a linear precision, variance or rate, a probability equal to an
element of the site). It returns a :class:`Derived` conditional, convertible to a
:class:`~latentzoo.inference.updates.GibbsUpdate` with :meth:`Derived.update`, or
:class:`NotConjugate` with the reason. The Gibbs builder
(:class:`~latentzoo.inference.gibbs.ConjugateGibbs`, ``derive=True`` by default) asks it for
every latent site that no hand-written update covers, before falling back to NUTS, and its plan
says which sites were derived and why the others were not.

Supported pairs (prior -> child): Normal / MultivariateNormal -> Normal or MultivariateNormal
mean; Gamma -> Normal precision, Poisson rate, Exponential rate, Gamma rate; InverseGamma ->
Normal variance; Beta -> Bernoulli, Binomial; Dirichlet -> Categorical, Multinomial. See
``docs/conjugacy.md`` for the derivations and the limits.

Example::

    from latentzoo.inference.conjugacy import detect
    result = detect(model, (X,), {"N": 10}, "sigma2")
    print(result.pair)               # InverseGamma–Normal (variance)
    update = result.update()         # a GibbsUpdate for ConjugateGibbs, check_conditional, ...
"""

from .detect import (
    MAX_BLOCK,
    Derived,
    NonFiniteConditional,
    NotConjugate,
    as_update,
    derive_site,
    detect,
)
from .forms import PRIOR_FAMILIES, RULES, Rule

__all__ = [
    "detect",
    "as_update",
    "derive_site",
    "Derived",
    "NotConjugate",
    "NonFiniteConditional",
    "MAX_BLOCK",
    "RULES",
    "Rule",
    "PRIOR_FAMILIES",
]
