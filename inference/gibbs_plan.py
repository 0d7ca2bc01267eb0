"""The Gibbs builder's plan: which update samples which site, which sites a generic kernel samples
and why, and the warnings that say so at the user's line.

:func:`make_plan` matches an update table against the model traced on the data. A latent site no
applicable update covers is sampled generically (NUTS, or ``DiscreteGibbs`` for a discrete site),
for one of two reasons that the plan records and the warnings keep apart:

- the table has an update for the site, but the update does not apply to this model (a user
  swapped a prior to another family, say): :class:`ConjugacyFallbackWarning`, naming the update
  and what it needs;
- the table has no update for the site at all, by design (NOCA's table covers ``s`` and ``pi``
  and leaves ``theta``, ``theta0`` to NUTS): :class:`GenericKernelNote`, a
  subclass that says nothing was changed (the CLI does not show it).

Before either, :func:`make_plan` can ask a *deriver* (``derive``; the builder's default is
:func:`latentzoo.inference.conjugacy.derive_site`) for each uncovered site: a site whose full
conditional the deriver finds in closed form from the model's trace gets that derived update
(after the table's updates in the sweep); for the others the plan keeps the deriver's reason,
and ``print(plan)`` shows it beside the generic kernel.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable
from typing import NamedTuple

import jax
from numpyro.handlers import seed, substitute, trace
from numpyro.infer.gibbs import latent_sample_sites, prototype_trace

from latentzoo.models.tables import DATA_TABLE

from .updates import GibbsUpdate, Move, unwrap

__all__ = [
    "read_model",
    "missing_reads",
    "ConjugacyFallbackWarning",
    "GenericKernelNote",
    "GibbsPlan",
    "make_plan",
    "warn_at_caller",
    "Deriver",
]

NO_UPDATE = "no update in the table writes it"

Deriver = Callable[..., tuple]
"""``derive(model, model_args, model_kwargs, site) -> (update, pair)`` for a site with a derived
conjugate conditional, ``(None, reason)`` otherwise (the reason is one clause)."""


class ConjugacyFallbackWarning(UserWarning):
    """Some sites lost their hand-derived update and are sampled by a generic kernel."""


class GenericKernelNote(ConjugacyFallbackWarning):
    """A note, not a problem: the update table has no hand-derived update for these sites by
    design, so they are sampled by NumPyro's generic kernels (nothing was changed)."""


def _package_dir(module) -> str:
    return os.path.dirname(os.path.abspath(module.__file__)) + os.sep


def _internal_dirs() -> tuple[str, ...]:
    import numpyro

    import latentzoo
    import latentzoo.inference
    import latentzoo.models

    dirs = {_package_dir(m) for m in (numpyro, jax, latentzoo)}
    dirs.update(os.path.abspath(p) + os.sep for m in (latentzoo.inference, latentzoo.models)
                for p in m.__path__)
    try:
        import jaxlib

        dirs.add(_package_dir(jaxlib))
    except ImportError:  # pragma: no cover
        pass
    return tuple(sorted(dirs))


def warn_at_caller(message: str, category: type[Warning]) -> None:
    """Warn with the location of the first frame outside latentzoo, NumPyro and JAX: the user's
    line that ran the sampler or the fit, however deep in NumPyro's drivers the warning is made
    (``warnings.warn_explicit``, so the usual filters and once-per-location registry apply)."""
    internal = _internal_dirs()
    frame = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(internal):
        frame = frame.f_back
    if frame is None:  # called from inside the packages alone (e.g. their own scripts)
        warnings.warn(message, category, stacklevel=2)
        return
    g = frame.f_globals
    filename = frame.f_code.co_filename
    warnings.warn_explicit(
        message, category, filename, frame.f_lineno,
        module=g.get("__name__", "<unknown>"), registry=g.setdefault("__warningregistry__", {}),
        # the globals let the warning show the caller's source line through its module's loader;
        # code with no file (``python -c``, an interactive line) has none to show, and its
        # ``__main__`` loader raises ImportError when asked for source
        module_globals=g if os.path.isfile(filename) else None,
    )


class GibbsPlan(NamedTuple):
    """Which update samples which site, decided from the model's trace.

    Attributes:
        updates: the applicable updates (and moves) in sweep order.
        fallback_continuous: latent sites sampled by NUTS.
        fallback_discrete: latent sites sampled by ``DiscreteGibbs``.
        dropped: ``(update name, reason)`` for each update that does not apply.
        observed: names of the observed sample sites (the data).
        fallback_reasons: ``(site, reason)`` for each fallback site: why no update covers it
            (:data:`NO_UPDATE` when the table has none for it by design).
        derived: ``(site, pair)`` for each site whose update was derived from the model's trace
            (the deriver's name of the conjugate pair).
        not_derived: ``(site, reason)``: why the deriver found no conjugate conditional for a
            fallback site (empty when the plan was made without a deriver).

    ``print(plan)`` shows it as a table; :meth:`site_kinds` says, per latent site, how it is
    sampled.
    """

    updates: tuple[GibbsUpdate | Move, ...]
    fallback_continuous: tuple[str, ...]
    fallback_discrete: tuple[str, ...]
    dropped: tuple[tuple[str, str], ...]
    observed: tuple[str, ...]
    fallback_reasons: tuple[tuple[str, str], ...] = ()
    derived: tuple[tuple[str, str], ...] = ()
    not_derived: tuple[tuple[str, str], ...] = ()

    @property
    def fallback(self) -> tuple[str, ...]:
        return self.fallback_continuous + self.fallback_discrete

    @property
    def moves(self) -> tuple[Move, ...]:
        return tuple(u for u in self.updates if isinstance(u, Move))

    @property
    def swapped(self) -> tuple[str, ...]:
        """Fallback sites that have an update in the table which does not apply to this model."""
        return tuple(s for s, why in self.fallback_reasons if why != NO_UPDATE)

    @property
    def by_design(self) -> tuple[str, ...]:
        """Fallback sites the table has no update for."""
        return tuple(s for s, why in self.fallback_reasons if why == NO_UPDATE)

    def kernel_of(self, site: str) -> str:
        return "DiscreteGibbs" if site in self.fallback_discrete else "NUTS"

    def site_kinds(self) -> dict[str, tuple[str, str]]:
        """``{site: (how, detail)}`` for every latent site: ``("hand-written", update name)``,
        ``("derived", pair)``, or ``("NUTS" | "DiscreteGibbs", why no update covers it, with the
        deriver's reason when one was asked)``."""
        derived = dict(self.derived)
        out: dict[str, tuple[str, str]] = {}
        for u in self.updates:
            if isinstance(u, GibbsUpdate):
                for s in u.sites:
                    out[s] = ("derived", derived[s]) if s in derived else ("hand-written", u.name)
        why, detector = dict(self.fallback_reasons), dict(self.not_derived)
        for s in self.fallback:
            text = why.get(s, "")
            if s in detector:
                text = f"{text}; not conjugate: {detector[s]}" if text else f"not conjugate: {detector[s]}"
            out[s] = (self.kernel_of(s), text)
        return out

    def __repr__(self) -> str:
        derived_sites = {s for s, _ in self.derived}
        rows = [("hand-derived (sweep order)", "", "")]
        for u in self.updates:
            if isinstance(u, GibbsUpdate) and set(u.sites) <= derived_sites:
                kind = "derived conditional"  # its name holds the pair
            else:
                kind = "move" if isinstance(u, Move) else "conditional"
            rows.append((f"  {u.name}", ", ".join(u.sites), kind))
        if self.fallback:
            rows.append(("generic kernels", "", ""))
            kinds = self.site_kinds()
            for s in self.fallback:
                rows.append((f"  {self.kernel_of(s)}", s, kinds[s][1]))
        if self.dropped:
            rows.append(("not used", "", ""))
            rows.extend((f"  {name}", "", reason) for name, reason in self.dropped)
        rows.append(("data", ", ".join(self.observed), ""))
        w0 = max(len(r[0]) for r in rows)
        w1 = max(len(r[1]) for r in rows)
        lines = [f"{a.ljust(w0)}  {b.ljust(w1)}  {c}".rstrip() for a, b, c in rows]
        return "GibbsPlan\n" + "\n".join(lines)

    __str__ = __repr__

    def markdown(self, data_sites=()) -> str:
        """The plan as a Markdown table (update, sites, how), for the docs' move lists, which
        ``tests/models/test_plan_docs.py`` keeps equal to this. ``data_sites``: sites that are
        data in a run (observed there, latent in a prior simulation), left out (whether a
        generic kernel or a derived conditional samples them in the simulation)."""
        def cell(text):
            return str(text).replace("|", "\\|")

        rows = ["| update | sites | how |", "|---|---|---|"]
        pairs = dict(self.derived)
        for u in self.updates:
            if isinstance(u, Move):
                how = "move"
            elif all(s in pairs for s in u.sites):
                if set(u.sites) <= set(data_sites):  # a data site drawn from its own law
                    continue
                how = "derived conditional: " + cell(", ".join(pairs[s] for s in u.sites))
            else:
                how = "exact conditional"
            rows.append(f"| {cell(u.name)} | {', '.join(u.sites)} | {how} |")
        why = dict(self.fallback_reasons)
        for s in self.fallback:
            if s not in data_sites:
                rows.append(f"| {self.kernel_of(s)} | {s} | generic kernel: {cell(why.get(s, ''))} |")
        for name, reason in self.dropped:
            rows.append(f"| {cell(name)} | | not used: {cell(reason)} |")
        return "\n".join(rows)


def read_model(model, values, model_args, model_kwargs):
    """Trace ``model`` with ``values`` substituted; return ``(priors, obs, trace)``.

    ``priors`` maps every sample site to its distribution at these values (the hyperparameters a
    conjugate update reads), ``obs`` maps observed sites to their data and holds the model's data
    tables (:func:`latentzoo.models.tables.data_table`: labels, rank pairs), which reach the
    updates this way as arguments of the compiled program rather than as closed-over constants.
    """
    tr = trace(substitute(seed(model, jax.random.PRNGKey(0)), data=values)).get_trace(
        *model_args, **model_kwargs
    )
    priors = {n: s["fn"] for n, s in tr.items() if s["type"] == "sample"}
    obs = {
        n: s["value"]
        for n, s in tr.items()
        if s["type"] == "sample" and s["is_observed"] and n not in values
    }
    obs.update({n: s["value"] for n, s in tr.items() if s["type"] == DATA_TABLE})
    return priors, obs, tr


class _MissingReads(dict):
    """A dict that records the keys looked up with ``[]`` that it does not hold."""

    def __init__(self, *args, missing):
        super().__init__(*args)
        self.missing = missing

    def __getitem__(self, key):
        if key not in self:
            self.missing.add(key)
        return super().__getitem__(key)


def missing_reads(update, model, values, model_args, model_kwargs) -> list[str]:
    """The names ``update`` looks up in the values, data or priors of this model that the model
    does not have (a site a prior swap removed or renamed), found by tracing one draw abstractly
    (``jax.eval_shape``: nothing is computed)."""
    priors, obs, _ = read_model(model, values, model_args, model_kwargs)
    missing: set = set()
    args = (_MissingReads(values, missing=missing), _MissingReads(obs, missing=missing),
            _MissingReads(priors, missing=missing))
    try:
        jax.eval_shape(lambda key: update.sample(key, *args), jax.random.PRNGKey(0))
    except KeyError:
        pass
    return sorted(map(str, missing))


def make_plan(model, updates, model_args, model_kwargs, rng_key=None,
              derive: Deriver | None = None) -> GibbsPlan:
    """Match the update table against the model traced on this data; with ``derive`` (a
    :data:`Deriver`), ask it for each latent site no applicable update covers before leaving
    the site to a generic kernel."""
    rng_key = jax.random.PRNGKey(0) if rng_key is None else rng_key
    tr = prototype_trace(model, rng_key, model_args, model_kwargs)
    latent = latent_sample_sites(tr)
    observed = tuple(
        n for n, s in tr.items() if s["type"] == "sample" and s["is_observed"]
    )
    covered: set[str] = set()
    chosen, dropped = [], []
    lost: dict[str, str] = {}  # site -> why the table's update for it does not apply
    for u in updates:
        absent = [s for s in u.sites if s not in latent]
        if absent:
            dropped.append((u.name, f"sites {absent} are not latent sites of the model"))
            continue
        mismatched = []
        for site, families in u.requires.items():
            if site not in tr or tr[site]["type"] != "sample":
                mismatched.append(f"{site} is not a sample site")
            elif not isinstance(unwrap(tr[site]["fn"]), tuple(families)):
                have = type(unwrap(tr[site]["fn"])).__name__
                want = "/".join(f.__name__ for f in families)
                mismatched.append(f"{site} is {have}, the update needs {want}")
        if mismatched:
            why = "; ".join(mismatched)
            dropped.append((u.name, why))
            if isinstance(u, GibbsUpdate):
                for s in u.sites:
                    lost.setdefault(s, f"update {u.name!r} does not apply: {why}")
            continue
        if isinstance(u, Move):
            chosen.append(u)
            continue
        if covered & set(u.sites):
            dropped.append((u.name, "its sites are already owned by an earlier update"))
            continue
        covered |= set(u.sites)
        chosen.append(u)
    rest = [s for s in latent if s not in covered]
    if rest or dropped:  # the model is not the one the table was written for: check what it reads
        values = {s: tr[s]["value"] for s in latent}
        kept = []
        for u in chosen:
            # a sample site the model has is never "missing": planned without data (a prior
            # predictive), X is a latent site the updates look up among the observed ones
            absent = [n for n in missing_reads(u, model, values, model_args, model_kwargs)
                      if n not in tr]
            if not absent:
                kept.append(u)
                continue
            why = f"it reads {absent}, which the model does not have"
            dropped.append((u.name, why))
            if isinstance(u, GibbsUpdate):
                covered -= set(u.sites)
                for s in u.sites:
                    lost.setdefault(s, f"update {u.name!r} does not apply: {why}")
        chosen = kept
        rest = [s for s in latent if s not in covered]
    derived, not_derived = [], []
    if derive is not None:
        for s in rest:
            update, text = derive(model, model_args, model_kwargs, s)
            if update is None:
                not_derived.append((s, text))
            else:
                chosen.append(update)
                derived.append((s, text))
                covered.add(s)
        rest = [s for s in rest if s not in covered]
    discrete = tuple(s for s in rest if tr[s]["fn"].has_enumerate_support)
    continuous = tuple(s for s in rest if s not in discrete)
    # A move is exact under the model's own density whoever samples its sites (its `requires`
    # say which priors its ratio is valid for), so it also runs beside a NUTS block; it never
    # moves a discrete site, which DiscreteGibbs owns.
    final = []
    for u in chosen:
        if isinstance(u, Move) and set(u.sites) & set(discrete):
            dropped.append((u.name, "some of its sites are discrete and sampled by DiscreteGibbs"))
        else:
            final.append(u)
    reasons = tuple((s, lost.get(s, NO_UPDATE)) for s in (*continuous, *discrete))
    return GibbsPlan(tuple(final), continuous, discrete, tuple(dropped), observed, reasons,
                     tuple(derived), tuple(not_derived))


def fallback_warnings(plan: GibbsPlan) -> list[tuple[str, type[Warning]]]:
    """The messages the kernel gives for a plan's fallback sites (none when there are none)."""
    out = []
    swapped, by_design = plan.swapped, plan.by_design
    if swapped:
        why = dict(plan.fallback_reasons)
        detector = dict(plan.not_derived)
        parts = "; ".join(
            f"{s} ({plan.kernel_of(s)}): {why[s]}"
            + (f" (nor is it conjugate: {detector[s]})" if s in detector else "")
            for s in swapped)
        out.append((
            f"No hand-derived update applies to {parts}. These sites are sampled generically "
            "through numpyro.infer.Gibbs; inference stays correct, only slower.",
            ConjugacyFallbackWarning,
        ))
    if by_design:
        names = ", ".join(f"{s} ({plan.kernel_of(s)})" for s in by_design)
        out.append((
            f"The update table has no hand-derived update for {names}: by design these sites are "
            "sampled by NumPyro's generic kernels through numpyro.infer.Gibbs (nothing was "
            "changed).",
            GenericKernelNote,
        ))
    return out
