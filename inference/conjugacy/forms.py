r"""Which children a site has, and whether each depends on it in a conjugate form, decided
numerically from traces of the model at several values of the site (never from its source).

A sample site is a *child* of site :math:`w` when a leaf of its distribution (a parameter, a
mask) changes between traces at two random values of :math:`w`. For each child the table
:data:`RULES` names, per prior family, the child families it pairs with, the parameters that may
depend on :math:`w` and the form that dependence must have:

- ``affine``: :math:`f(\sum_i a_i w_i) = \sum_i a_i f(w_i)` for weights summing to one (a
  location: Normal prior);
- ``linear``: the same for any weights, so :math:`f(0) = 0` as well (a precision, a variance, a
  rate: Gamma or InverseGamma prior; checked at positive combinations, inside the support);
- ``select``: each entry of the parameter *is* an entry of :math:`w` (a probability: Beta
  prior), or each row is a row of :math:`w` (a probability vector: Dirichlet prior); the match
  found at one random :math:`w` must hold at a second one.

Each identity is checked on the elements a child's mask keeps, at random points, to a relative
:data:`RTOL`; an exactly affine map passes with round-off, a smooth non-affine one (``tanh``)
misses by orders of magnitude more.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist

from .tracing import on_index_space, peel

__all__ = [
    "RTOL",
    "Rule",
    "RULES",
    "PRIOR_FAMILIES",
    "ChildForm",
    "rule_for",
    "depends_on_site",
    "check_child",
    "AFFINE_WEIGHTS",
    "LINEAR_WEIGHTS",
]

#: Relative tolerance of the numerical identities (round-off of float64 is ~1e-16 per operation).
RTOL = 1e-8

#: The combinations of the three random points the affine and linear checks evaluate at:
#: each row weighs (w1, w2, w3). Affine rows sum to one; linear rows are positive (a positive
#: combination of positive values stays in the support of a Gamma or InverseGamma prior).
AFFINE_WEIGHTS = np.array([[0.3, 0.7, 0.0], [0.5, 0.7, -0.2]])
LINEAR_WEIGHTS = np.array([[0.6, 1.7, 0.0], [0.4, 0.9, 1.3]])


class Rule(NamedTuple):
    """One conjugate pair: a prior family, a child family and how the child may use the site.

    Attributes:
        prior: the prior family's class.
        child: the child family's class (exact type, after the wrappers).
        fields: the child's data fields that may depend on the site.
        param: ``child -> array``: the parameter whose form is checked.
        trailing: dims of that parameter beyond the child's elements (1 for a probability row).
        form: ``"affine"``, ``"linear"``, ``"select"`` or ``"select_rows"``.
        word: what the parameter is called in a reason (``"mean"``, ``"precision"``, ...).
        label: the pair's name, e.g. ``"Gamma–Normal (precision)"``.
    """

    prior: type
    child: type
    fields: frozenset
    param: Callable
    trailing: int
    form: str
    word: str
    label: str


def _rules() -> tuple[Rule, ...]:
    R = []
    for prior in (dist.Normal, dist.MultivariateNormal):
        R.append(Rule(prior, dist.Normal, frozenset({"loc"}), lambda d: d.loc, 0, "affine", "mean",
                      f"{prior.__name__}–Normal (mean)"))
        R.append(Rule(prior, dist.MultivariateNormal, frozenset({"loc"}), lambda d: d.loc, 1,
                      "affine", "mean", f"{prior.__name__}–MultivariateNormal (mean)"))
    R += [
        Rule(dist.Gamma, dist.Normal, frozenset({"scale"}), lambda d: d.scale ** -2.0, 0, "linear",
             "precision", "Gamma–Normal (precision)"),
        Rule(dist.Gamma, dist.Poisson, frozenset({"rate"}), lambda d: d.rate, 0, "linear", "rate",
             "Gamma–Poisson"),
        Rule(dist.Gamma, dist.Exponential, frozenset({"rate"}), lambda d: d.rate, 0, "linear",
             "rate", "Gamma–Exponential"),
        Rule(dist.Gamma, dist.Gamma, frozenset({"rate"}), lambda d: d.rate, 0, "linear", "rate",
             "Gamma–Gamma (rate)"),
        Rule(dist.InverseGamma, dist.Normal, frozenset({"scale"}), lambda d: d.scale ** 2.0, 0,
             "linear", "variance", "InverseGamma–Normal (variance)"),
    ]
    for child, field in ((dist.BernoulliProbs, "probs"), (dist.BernoulliLogits, "logits")):
        R.append(Rule(dist.Beta, child, frozenset({field}), lambda d: d.probs, 0, "select",
                      "probability", "Beta–Bernoulli"))
    for child, field in ((dist.BinomialProbs, "probs"), (dist.BinomialLogits, "logits")):
        R.append(Rule(dist.Beta, child, frozenset({field}), lambda d: d.probs, 0, "select",
                      "probability", "Beta–Binomial"))
    for child, field in ((dist.CategoricalProbs, "probs"), (dist.CategoricalLogits, "logits")):
        R.append(Rule(dist.Dirichlet, child, frozenset({field}), lambda d: d.probs, 1,
                      "select_rows", "probabilities", "Dirichlet–Categorical"))
    for child, field in ((dist.MultinomialProbs, "probs"), (dist.MultinomialLogits, "logits")):
        R.append(Rule(dist.Dirichlet, child, frozenset({field}), lambda d: d.probs, 1,
                      "select_rows", "probabilities", "Dirichlet–Multinomial"))
    return tuple(R)


#: Every supported (prior family, child family) pair.
RULES: tuple[Rule, ...] = _rules()

#: The prior families the detector knows a conjugate pair for.
PRIOR_FAMILIES: tuple[type, ...] = (dist.Normal, dist.MultivariateNormal, dist.Gamma,
                                    dist.InverseGamma, dist.Beta, dist.Dirichlet)

_FIELD_WORDS = {"loc": "mean", "scale": "scale", "rate": "rate", "concentration": "concentration",
                "probs": "probabilities", "logits": "logits", "total_count": "total count",
                "scale_tril": "covariance", "covariance_matrix": "covariance",
                "precision_matrix": "covariance"}


def rule_for(prior: type, child: type) -> Rule | None:
    for r in RULES:
        if r.prior is prior and r.child is child:
            return r
    return None


def _fields(d) -> tuple[str, ...]:
    return tuple(type(d).gather_pytree_data_fields())


def _same(a, b) -> bool:
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    try:
        same_structure = ta == tb
    except ValueError:  # an array held as metadata (a Multinomial's total_count)
        same_structure = str(ta) == str(tb)
    if not same_structure:
        return False
    for x, y in zip(la, lb):
        x, y = np.asarray(x), np.asarray(y)
        if x.shape != y.shape or not np.array_equal(x, y, equal_nan=np.issubdtype(x.dtype, np.inexact)):
            return False
    return True


def depends_on_site(fns) -> bool:
    """Whether a site's distribution differs between traces (``fns``: its ``fn`` per trace)."""
    return any(not _same(fns[0], f) for f in fns[1:])


class ChildForm(NamedTuple):
    """The verdict on one child: its rule when conjugate, else the reason (one clause)."""

    name: str
    rule: Rule | None
    reason: str | None


def _close(lhs, rhs, terms, scale) -> bool:
    err = jnp.abs(lhs - rhs)
    return bool(jnp.all(err <= RTOL * (terms + jnp.abs(lhs)) + 1e-12 * scale))


def _combination_holds(f, weights) -> bool:
    """f: list of the parameter at w1, w2, w3, then at each weighted combination (masked
    elements, flattened)."""
    base = jnp.stack(f[:3])
    scale = float(jnp.max(jnp.abs(jnp.stack(f)))) if f[0].size else 0.0
    for row, fc in zip(weights, f[3:]):
        w = jnp.asarray(row)[:, None]
        pred = jnp.sum(w * base, axis=0)
        terms = jnp.sum(jnp.abs(w * base), axis=0)
        if not _close(fc, pred, terms, scale):
            return False
    return True


def _selection_holds(p1, p2, w1, w2) -> bool:
    """Each entry of p1 equals an entry of w1, and the entry at the same place in w2 equals p2."""
    if p1.size == 0:
        return True
    w1, w2, p1, p2 = (np.asarray(a, np.float64).ravel() for a in (w1, w2, p1, p2))
    order = np.argsort(w1)
    srt = w1[order]
    pos = np.clip(np.searchsorted(srt, p1), 1, len(srt) - 1) if len(srt) > 1 else np.zeros(len(p1), int)
    lo, hi = order[np.maximum(pos - 1, 0)], order[pos]
    idx = np.where(np.abs(w1[lo] - p1) <= np.abs(w1[hi] - p1), lo, hi)
    ok1 = np.abs(w1[idx] - p1) <= RTOL * np.abs(p1) + 1e-15
    ok2 = np.abs(w2[idx] - p2) <= RTOL * np.abs(p2) + 1e-15
    return bool(np.all(ok1) and np.all(ok2))


def _row_selection_holds(p1, p2, w1, w2) -> bool:
    """Each row of p1 (M, k) is a row of w1 (n, k), and the same row of w2 is p2's row."""
    if p1.shape[0] == 0:
        return True
    p1, p2, w1, w2 = (np.asarray(a, np.float64) for a in (p1, p2, w1, w2))
    k = w1.shape[-1]
    w1, w2 = w1.reshape(-1, k), w2.reshape(-1, k)
    # match on the first coordinate (distinct with probability one at a random point) ...
    order = np.argsort(w1[:, 0])
    srt = w1[order, 0]
    pos = np.clip(np.searchsorted(srt, p1[:, 0]), 1, len(srt) - 1) if len(srt) > 1 else np.zeros(len(p1), int)
    lo, hi = order[np.maximum(pos - 1, 0)], order[pos]
    idx = np.where(np.abs(w1[lo, 0] - p1[:, 0]) <= np.abs(w1[hi, 0] - p1[:, 0]), lo, hi)
    # ... then every coordinate must agree, at both points
    ok1 = np.abs(w1[idx] - p1) <= RTOL * np.abs(p1) + 1e-15
    ok2 = np.abs(w2[idx] - p2) <= RTOL * np.abs(p2) + 1e-15
    return bool(np.all(ok1) and np.all(ok2))


def _masked(param, peeled, trailing):
    x = on_index_space(param, peeled.index_shape, trailing)
    if peeled.mask is None:
        return x.reshape((-1,) + x.shape[x.ndim - trailing:] if trailing else (-1,))
    m = np.asarray(peeled.mask)
    return x[m]


def check_child(name: str, site: str, prior: type, fns, points) -> ChildForm:
    """The verdict on child ``name`` of ``site`` from its distributions ``fns`` at ``points``.

    ``points``: the site's values the traces were made at: three random points, then the
    combinations of :data:`AFFINE_WEIGHTS` (Normal priors) or :data:`LINEAR_WEIGHTS` (Gamma,
    InverseGamma) of them; for Beta and Dirichlet priors the first two are used.
    """
    peeled = [peel(f) for f in fns]
    base = peeled[0].base
    family = type(base).__name__
    if any(type(p.base) is not type(base) for p in peeled):
        return ChildForm(name, None, f"the family of child '{name}' changes with '{site}'")
    if isinstance(base, (dist.MixtureSameFamily, dist.MixtureGeneral)):
        return ChildForm(name, None, f"child '{name}' is a mixture ({family}): its density in "
                                     f"'{site}' is a sum over components, which has no "
                                     "conjugate form")
    rule = rule_for(prior, type(base))
    if rule is None:
        pairs = sorted({r.child.__name__ for r in RULES if r.prior is prior})
        return ChildForm(name, None, f"child '{name}' is {family}, which has no conjugate pair "
                                     f"with a {prior.__name__} prior here (supported children: "
                                     f"{', '.join(pairs)})")
    changed = [f for f in _fields(base)
               if not _same(getattr(peeled[0].base, f), getattr(peeled[1].base, f))
               or not _same(getattr(peeled[0].base, f), getattr(peeled[2].base, f))]
    wrong = [f for f in changed if f not in rule.fields]
    if wrong:
        words = " and the ".join(_FIELD_WORDS.get(f, f) for f in wrong)
        return ChildForm(name, None, f"the {words} of child '{name}' ({family}) depends on "
                                     f"'{site}', which a {prior.__name__} prior is not "
                                     "conjugate to")
    if not changed:
        return ChildForm(name, None, f"the mask or temperature of child '{name}' depends on "
                                     f"'{site}'")
    if any(tuple(p.index_shape) != tuple(peeled[0].index_shape) for p in peeled):
        return ChildForm(name, None, f"the shape of child '{name}' changes with '{site}'")
    masks = [None if p.mask is None else np.asarray(p.mask) for p in peeled]
    if any((m is None) != (masks[0] is None) or (m is not None and not np.array_equal(m, masks[0]))
           for m in masks):
        return ChildForm(name, None, f"the mask of child '{name}' depends on '{site}'")
    values = [_masked(rule.param(p.base), peeled[0], rule.trailing) for p in peeled]
    if rule.form == "affine":
        ok = _combination_holds(values, AFFINE_WEIGHTS)
        why = f"the {rule.word} of child '{name}' is not affine in '{site}'"
    elif rule.form == "linear":
        ok = _combination_holds(values, LINEAR_WEIGHTS)
        why = f"the {rule.word} of child '{name}' is not linear in '{site}'"
    elif rule.form == "select":
        ok = _selection_holds(values[0], values[1], points[0], points[1])
        why = f"the {rule.word} of child '{name}' is not an element of '{site}'"
    else:
        ok = _row_selection_holds(values[0], values[1], points[0], points[1])
        why = f"the {rule.word} of child '{name}' are not a row of '{site}'"
    return ChildForm(name, rule if ok else None, None if ok else why)
