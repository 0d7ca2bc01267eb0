"""The detector: :func:`detect` decides whether one site of a model has a conjugate full
conditional, and :class:`Derived` turns the answer into a
:class:`~latentzoo.inference.updates.GibbsUpdate`.

Steps of :func:`detect` (all numerical, on traces of the model; the model's source is never read):

1. trace the model at the given (or drawn) latent values and read the site's prior family
   (wrappers stripped); an unsupported or truncated family ends here;
2. trace it again at three random values of the site (drawn through the bijection to the
   prior's support) and at weighted combinations of them; every sample site whose distribution
   changes is a child;
3. check each child against :data:`~latentzoo.inference.conjugacy.forms.RULES`: its family pairs
   with the prior, only the allowed parameter depends on the site, and with the required form
   (affine, linear, equal to an element), on the elements its mask keeps;
4. read the conditional's natural parameters off the log density of the prior and children
   (:mod:`~latentzoo.inference.conjugacy.posteriors`), choosing for a Gaussian the smallest block
   structure that reproduces the Hessian, and check the fitted form at a random point;
5. evaluate the conditional at the base values: a non-finite parameter raises ValueError.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from numpyro.distributions.transforms import biject_to

from latentzoo.inference.updates import GibbsUpdate

from . import posteriors as post
from .forms import AFFINE_WEIGHTS, LINEAR_WEIGHTS, PRIOR_FAMILIES, check_child, depends_on_site
from .tracing import base_trace, concrete_arguments, peel, sites_log_density, trace_at

__all__ = [
    "MAX_BLOCK",
    "Derived",
    "NotConjugate",
    "NonFiniteConditional",
    "detect",
    "as_update",
    "derive_site",
]

#: Largest number of elements of a site the Gaussian conditional couples in one block (a dense
#: precision matrix of MAX_BLOCK^2 entries, read by MAX_BLOCK Hessian-vector products).
MAX_BLOCK = 512

_TRUNCATED = (dist.LeftTruncatedDistribution, dist.RightTruncatedDistribution,
              dist.TwoSidedTruncatedDistribution)  # dist.TruncatedDistribution is a factory


class NotConjugate(NamedTuple):
    """The detector's answer when ``site`` has no conjugate conditional: ``reason`` is one
    clause naming the child and what failed, e.g. "the mean of child 'X' is not affine in 'w'"."""

    site: str
    reason: str


class NonFiniteConditional(ValueError):
    """A derived conditional has a non-finite (or non-positive where it must be positive)
    parameter at the values it was derived at."""


class Derived(NamedTuple):
    """A conjugate full conditional found by :func:`detect`.

    Attributes:
        site: the site.
        prior: the prior family's class (``dist.Gamma``, ...).
        children: names of the child sites whose densities enter the conditional, in trace
            order. :meth:`without` leaves one out: that is how the tests build a wrong
            conditional that a Geweke or SBC test must reject.
        child_families: the child families' classes, aligned with ``children``.
        labels: the pair's name for each child, aligned with ``children``.
        block: for a Gaussian, how many trailing axes of the site one block couples (0: every
            element independent; the site's rank: one dense block); 0 for the other families.
        event_ndim: the site's event rank (the conditional has the site's batch/event split).
        model, model_args, model_kwargs: the model and the arguments the conditional re-traces
            it with (the observed values are taken from ``obs`` at each call).

    ``derived.conditional(values, obs, priors)`` is ``{site: Distribution}`` at the current
    values, pure jnp (jit, vmap, scan); ``derived.update()`` is the :class:`GibbsUpdate`.
    """

    site: str
    prior: type
    children: tuple[str, ...]
    child_families: tuple[type, ...]
    labels: tuple[str, ...]
    block: int
    event_ndim: int
    model: Any
    model_args: tuple
    model_kwargs: dict

    @property
    def pair(self) -> str:
        """The conjugate pair(s), e.g. ``"Gamma–Normal (precision)"``."""
        labels = list(dict.fromkeys(self.labels))
        if not labels:
            return f"{self.prior.__name__} prior alone (no children)"
        return " + ".join(labels)

    @property
    def structure(self) -> str:
        """How the conditional couples the site's elements, in words."""
        if self.prior in post.ELEMENTWISE:
            return "independent elements"
        if self.prior is dist.Dirichlet:
            return "one Dirichlet per row"
        if self.block == 0:
            return "independent elements"
        return f"blocks over the last {self.block} axes"

    def log_density(self, values, obs, priors=None):
        """``theta -> log p(site = theta | rest) + const``: the prior's and the children's log
        densities at ``theta`` with the other sites at ``values`` and the data at ``obs``."""
        data = {**values, **(obs or {})}
        names = (self.site, *self.children)

        def logp(theta):
            tr = trace_at(self.model, self.model_args, self.model_kwargs, {**data, self.site: theta})
            return sites_log_density(tr, names, priors)

        return logp

    def _natural(self, values, obs, priors):
        logp = self.log_density(values, obs, priors)
        if self.prior in post.ELEMENTWISE:
            return logp, post.elementwise_natural(self.prior, logp, jnp.shape(values[self.site]))
        if self.prior is dist.Dirichlet:
            return logp, post.dirichlet_natural(logp, jnp.shape(values[self.site]))
        theta0 = jnp.asarray(values[self.site], jnp.float64)
        return logp, post.gaussian_natural(logp, theta0, self.block)

    def _build(self, natural, shape):
        if self.prior in post.ELEMENTWISE:
            return post.elementwise_conditional(self.prior, *natural, self.event_ndim)
        if self.prior is dist.Dirichlet:
            return post.dirichlet_conditional(natural, self.event_ndim)
        return post.gaussian_conditional(*natural, shape, self.block, self.event_ndim)

    def conditional(self, values, obs=None, priors=None) -> dict:
        """``{site: the full conditional}`` at ``values`` (every latent site), ``obs`` (the
        observed sites' values) and ``priors`` (the caller's traced distributions: only the
        children's temperatures are read from them)."""
        _, natural = self._natural(values, obs, priors)
        return {self.site: self._build(natural, jnp.shape(values[self.site]))}

    def draw(self, key, values, obs=None, priors=None) -> dict:
        """One draw of the site from its conditional (Gaussian blocks by a Cholesky solve)."""
        if self.prior in (dist.Normal, dist.MultivariateNormal):
            _, (P, b) = self._natural(values, obs, priors)
            return {self.site: post.gaussian_sample(key, P, b, jnp.shape(values[self.site]), self.block)}
        return {self.site: self.conditional(values, obs, priors)[self.site].sample(key)}

    def without(self, child: str) -> Derived:
        """This conditional with ``child``'s density left out (the prior alone when it is the
        only child): a wrong conditional, the control a Geweke or SBC test must reject."""
        keep = [i for i, c in enumerate(self.children) if c != child]
        return self._replace(children=tuple(self.children[i] for i in keep),
                             child_families=tuple(self.child_families[i] for i in keep),
                             labels=tuple(self.labels[i] for i in keep))

    def bind(self, model, model_args, model_kwargs) -> Derived:
        """The same conditional re-tracing ``model`` with these arguments."""
        return self._replace(model=model, model_args=tuple(model_args),
                             model_kwargs=dict(model_kwargs or {}))

    def update(self) -> GibbsUpdate:
        """The :class:`GibbsUpdate` of the site. Its ``conditional`` carries
        ``bind_model(model, model_args, model_kwargs)``, which the Gibbs builder calls at every
        sweep so that the conditional re-traces the sweep's model with the sweep's arguments
        (hyperparameters passed as arguments, a tempered model). ``tempered`` is True: each
        child's density is weighed by the temperature the caller's ``priors`` give it."""
        requires = {self.site: (self.prior,)}
        requires.update({c: (f,) for c, f in zip(self.children, self.child_families)})
        return GibbsUpdate(f"{self.site} | derived: {self.pair}", (self.site,), requires,
                           _Conditional(self), _Draw(self), tempered=True)


class _Conditional:
    """``(values, obs, priors) -> {site: Distribution}`` with ``bind_model``."""

    def __init__(self, derived: Derived):
        self.derived = derived

    def __call__(self, values, obs, priors):
        return self.derived.conditional(values, obs, priors)

    def bind_model(self, model, model_args, model_kwargs) -> GibbsUpdate:
        return self.derived.bind(model, model_args, model_kwargs).update()


class _Draw:
    def __init__(self, derived: Derived):
        self.derived = derived

    def __call__(self, key, values, obs, priors):
        return self.derived.draw(key, values, obs, priors)


# ------------------------------------------------------------------------------ detect
def _random_points(prior_fn, shape, rng, n):
    transform = biject_to(prior_fn.support)
    ushape = transform.inverse_shape(tuple(shape))
    return [jnp.asarray(transform(jnp.asarray(rng.standard_normal(ushape)))) for _ in range(n)]


def _combinations(points, weights):
    return [sum(float(w) * p for w, p in zip(row, points)) for row in weights]


def detect(model, model_args, model_kwargs, site: str, values=None):
    """Decide whether ``site`` of ``model`` has a conjugate full conditional.

    Args:
        model: a NumPyro program, called as ``model(*model_args, **model_kwargs)``.
        model_args, model_kwargs: its arguments (the data; ``model_kwargs`` may be None);
            tracers are replaced by stand-ins (the decision depends on the form of the model,
            not on the data's values).
        site: the latent sample site.
        values: latent values to trace at; the latent sites not given are set to random values
            in their supports (from a fixed seed, so the answer is reproducible).

    Returns:
        :class:`Derived` or :class:`NotConjugate`.

    Raises:
        ValueError: ``site`` is not a latent sample site; or (:class:`NonFiniteConditional`)
        the derived conditional has a non-finite parameter at these values.
    """
    model_kwargs = dict(model_kwargs or {})
    with jax.ensure_compile_time_eval():
        return _detect(model, tuple(model_args), model_kwargs, site, values)


def _detect(model, model_args, model_kwargs, site, values):
    args, kwargs, stand_ins = concrete_arguments(model_args, model_kwargs)
    if values is not None and any(isinstance(v, jax.core.Tracer) for v in jax.tree_util.tree_leaves(values)):
        values, stand_ins = None, True
    tr, latent, observed = base_trace(model, args, kwargs, values)
    if site not in latent:
        raise ValueError(f"'{site}' is not a latent sample site of the model.")
    prior_fn = tr[site]["fn"]
    peeled = peel(prior_fn)
    family = type(peeled.base)
    if isinstance(peeled.base, _TRUNCATED) or "Truncated" in family.__name__:
        return NotConjugate(site, f"the prior of '{site}' is truncated ({family.__name__}), and "
                                  "a truncated prior has no conjugate pair")
    if family not in PRIOR_FAMILIES:
        names = ", ".join(f.__name__ for f in PRIOR_FAMILIES)
        return NotConjugate(site, f"the prior of '{site}' is {family.__name__}; conjugate pairs "
                                  f"are known for {names} priors")
    if peeled.mask is not None:
        return NotConjugate(site, f"the prior of '{site}' is masked, so some elements have no "
                                  "prior density")

    shape = tuple(jnp.shape(latent[site]))
    rng = np.random.default_rng(20240601)
    points = _random_points(prior_fn, shape, rng, 3)
    if family in (dist.Normal, dist.MultivariateNormal):
        points += _combinations(points, AFFINE_WEIGHTS)
    elif family in (dist.Gamma, dist.InverseGamma):
        points += _combinations(points, LINEAR_WEIGHTS)
    others = {**latent, **observed}
    traces = [trace_at(model, args, kwargs, {**others, site: p}) for p in points]

    children, families, labels = [], [], []
    for name, s in tr.items():
        if s["type"] != "sample" or name == site:
            continue
        fns = [t[name]["fn"] for t in traces]
        if not depends_on_site(fns):
            continue
        verdict = check_child(name, site, family, fns, points)
        if verdict.rule is None:
            return NotConjugate(site, verdict.reason)
        children.append(name)
        families.append(verdict.rule.child)
        labels.append(verdict.rule.label)

    event_ndim = len(prior_fn.event_shape)
    derived = Derived(site, family, tuple(children), tuple(families), tuple(labels), 0,
                      event_ndim, model, args, kwargs)
    base_values = dict(latent)
    if family in post.ELEMENTWISE:
        e1, e2, g = _compiled(derived, base_values, observed,
                              lambda lp, pt: post.elementwise_probe(family, lp, shape, pt), points[0])
        _check_finite(site, stand_ins, e1, e2)
        if not post.verify_elementwise(family, e1, e2, points[0], g):
            return NotConjugate(site, f"the conditional of '{site}' is not a product of "
                                      f"{family.__name__} densities, one per element (a child "
                                      f"mixes several elements of '{site}')")
        natural = (e1, e2)
    elif family is dist.Dirichlet:
        u = jnp.asarray(rng.standard_normal(shape))
        eta, g = _compiled(derived, base_values, observed,
                           lambda lp, uu: post.dirichlet_probe(lp, shape, uu), u)
        _check_finite(site, stand_ins, eta)
        if not post.verify_dirichlet(eta, u, g):
            return NotConjugate(site, f"the conditional of '{site}' is not a Dirichlet per row "
                                      f"(a child mixes several rows of '{site}')")
        natural = eta
    else:
        found = _gaussian_blocks(derived, base_values, observed, rng, stand_ins)
        if isinstance(found, NotConjugate):
            return found
        derived, natural = found
    if not stand_ins and not post.parameters_valid(family, natural):
        raise _non_finite(site)
    return derived.bind(model, model_args, model_kwargs)


def _non_finite(site):
    return NonFiniteConditional(
        f"The derived conditional of '{site}' has a non-finite or invalid parameter at these "
        "values; check its prior's hyperparameters and its children's data.")


def _check_finite(site, stand_ins, *arrays):
    """Raise before the form is verified: a non-finite natural parameter (data with an inf)
    would otherwise fail the verification and read as 'not conjugate'."""
    if not stand_ins and not all(bool(np.all(np.isfinite(np.asarray(a)))) for a in arrays):
        raise _non_finite(site)


def _compiled(derived: Derived, values, observed, body, *extra):
    """``body(log_density, *extra)`` in one compiled program, the array leaves of the model's
    arguments, ``values`` and ``observed`` passed as its arguments (not baked in as constants);
    run eagerly if the model cannot be traced with them abstract."""
    leaves, treedef = jax.tree_util.tree_flatten((derived.model_args, derived.model_kwargs))
    dyn = [i for i, x in enumerate(leaves) if isinstance(x, (jax.Array, np.ndarray))]

    def run(dyn_leaves, vals, obs, *ex):
        full = list(leaves)
        for i, x in zip(dyn, dyn_leaves):
            full[i] = x
        args, kwargs = jax.tree_util.tree_unflatten(treedef, full)
        d = derived._replace(model_args=args, model_kwargs=kwargs)
        return body(d.log_density(vals, obs), *ex)

    arrays = [leaves[i] for i in dyn]
    try:
        return jax.jit(run)(arrays, values, observed, *extra)
    except jax.errors.JAXTypeError:
        return run(arrays, values, observed, *extra)


def _gaussian_blocks(derived: Derived, values, observed, rng, stand_ins=False):
    """``(derived, (P, b))`` with the fewest coupled trailing axes whose blocks reproduce the
    Hessian, or NotConjugate (past :data:`MAX_BLOCK`, or not quadratic)."""
    site = derived.site
    theta0 = jnp.asarray(values[site], jnp.float64)
    values = {**values, site: theta0}
    shape = theta0.shape
    first = 0 if derived.prior is dist.Normal else derived.event_ndim
    v = jnp.asarray(rng.standard_normal(shape))
    theta_c = theta0 + jnp.asarray(rng.standard_normal(shape))
    for t in range(first, len(shape) + 1):
        if math.prod(shape[len(shape) - t:]) > MAX_BLOCK:
            break
        P, b, hv, gc = _compiled(derived, values, observed,
                                 lambda lp, th, vv, tc, t=t: post.gaussian_probe(lp, th, t, vv, tc),
                                 theta0, v, theta_c)
        _check_finite(derived.site, stand_ins, P, b)
        if post.verify_gaussian(P, b, v, hv, theta_c, gc):
            return derived._replace(block=t), (P, b)
    n = math.prod(shape)
    if n <= MAX_BLOCK:
        return NotConjugate(site, f"the conditional log density of '{site}' is not quadratic "
                                  f"in '{site}' (checked at random points)")
    return NotConjugate(site, f"the conditional of '{site}' couples more than {MAX_BLOCK} of its "
                              f"{n} elements in one block (the dense cap MAX_BLOCK = {MAX_BLOCK})")


def as_update(model, site: str, model_args=(), model_kwargs=None, values=None) -> GibbsUpdate:
    """The derived :class:`GibbsUpdate` of ``site``; ValueError with the detector's reason when
    the site has no conjugate conditional."""
    result = detect(model, model_args, model_kwargs, site, values)
    if isinstance(result, NotConjugate):
        raise ValueError(f"No conjugate conditional for '{site}': {result.reason}.")
    return result.update()


def derive_site(model, model_args, model_kwargs, site: str):
    """The Gibbs builder's hook (:func:`latentzoo.inference.gibbs_plan.make_plan`):
    ``(update, pair)`` when ``site`` is conjugate, ``(None, reason)`` when it is not. An error
    while tracing the model at other values of the site becomes the reason (the site then goes
    to NUTS as before); a non-finite derived conditional raises."""
    try:
        result = detect(model, model_args, model_kwargs, site)
    except NonFiniteConditional:
        raise
    except Exception as err:  # noqa: BLE001 - the builder must keep its generic fallback
        return None, f"the detector could not evaluate the model ({type(err).__name__}: {err})"
    if isinstance(result, NotConjugate):
        return None, result.reason
    return result.update(), result.pair
