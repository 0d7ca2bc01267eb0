"""The zoo registry: a model family declares itself here once, and everything else reads it.

A :class:`Family` names its NumPyro model, its data kind (:mod:`latentzoo.data`), its default
data, its inference methods as runners that all return ArviZ ``InferenceData``, the identified
quantities that summaries, convergence checks and plots look at, and its posterior predictive.
The CLI (``latentzoo list|run|diagnose``), the zoo tables in the docs and the conformance tests
read :data:`REGISTRY`; none of them names a family or a site.

Families live one per module under :mod:`latentzoo.families` and call :func:`register` at import;
:func:`families` imports that package, so adding a module there is all it takes. A user (or a
test) may register a family of their own the same way, from anywhere.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

from latentzoo.data import DataKind

__all__ = [
    "RunConfig",
    "Option",
    "FamilyChecks",
    "Method",
    "Family",
    "REGISTRY",
    "register",
    "unregister",
    "families",
    "get_family",
    "METHOD_VOCABULARY",
]

# One vocabulary for every family: the same word means the same kind of inference everywhere.
METHOD_VOCABULARY = {
    "gibbs": "Gibbs sampling with the paper's hand-derived conditionals (MCMC)",
    "nuts": "NumPyro's NUTS on the same model (MCMC baseline)",
    "vb": "mean-field coordinate-ascent VI (point parameters where the paper uses variational EM)",
    "em": "EM with the exact posterior of the latents (closed form, or enumeration for binary)",
    "mcem": "Monte Carlo EM: Gibbs E-step on persistent chains, closed-form M-step (point estimates)",
    "online-em": "streaming EM over chunks (O(DK) memory)",
    "online-sga": "streaming stochastic gradient ascent over chunks (O(DK) memory)",
}


class RunConfig(NamedTuple):
    """Everything a runner may need besides the data; filled by the CLI or a user.

    ``K`` is the latent dimension, ``J`` the number of mixture components (mixture families;
    None: the family's default). ``chains``/``samples``/``warmup`` are for MCMC, ``sweeps``/``restarts`` for point fits
    (None: the method's default), ``chunk_size`` for streaming methods, ``data_path`` for
    runners that read the file themselves (streaming), ``progress`` shows progress bars.
    ``checkpoint_dir``: where :func:`latentzoo.runs.run_mcmc` saves MCMC checkpoints (None: no
    checkpoints), ``resume`` continues from them, ``checkpoint_every`` draws per segment (None:
    about one checkpoint every :data:`latentzoo.checkpoint.CHECKPOINT_SECONDS`).
    ``options``: the values of the family's own :class:`Option` s by name (the CLI fills in
    each option's default when it is not given; read-only).
    ``replicas``: more than 1 runs a Gibbs method as replica exchange over that many tempered
    copies of its table, the hottest at inverse temperature ``min_beta``
    (:class:`~latentzoo.inference.samplers.ReplicaExchange`).
    ``distributed``: run a Gibbs method's chains (one after another) with the rows split over
    every device of every process (:func:`latentzoo.runs.run_mcmc`; the CLI's ``--distributed``);
    only for methods that declare :attr:`Method.distributed`.
    """

    K: int
    J: int | None = None
    seed: int = 0
    chains: int = 4
    samples: int = 1000
    warmup: int = 500
    sweeps: int | None = None
    restarts: int | None = None
    quick: bool = False
    progress: bool = False
    chunk_size: int = 1000
    data_path: str | None = None
    standardize: bool = False
    checkpoint_dir: str | None = None
    resume: bool = False
    checkpoint_every: int | None = None
    options: Mapping[str, Any] = MappingProxyType({})
    replicas: int = 1
    min_beta: float = 0.01
    distributed: bool = False


class Option(NamedTuple):
    """A family-specific setting, offered on the command line as ``--<name>`` (values reach the
    runners in :attr:`RunConfig.options`).

    Attributes:
        name: the flag's name (``--<name>``) and the key in ``RunConfig.options``.
        help: one line for ``latentzoo run --help``.
        choices: the allowed values (after ``type``), or None for any.
        default: the value when the flag is not given.
        type: converts the command-line string (``int``, ``float``, ``str``).
    """

    name: str
    help: str = ""
    choices: tuple | None = None
    default: Any = None
    type: Callable[[str], Any] = str


class Method(NamedTuple):
    """One inference method of a family.

    Attributes:
        name: a word of :data:`METHOD_VOCABULARY`.
        run: ``run(data, config: RunConfig) -> InferenceData``. ``data`` is what the family's
            data kind validated (``None`` for a streaming method, which reads
            ``config.data_path`` or its default stream itself).
        kind: ``"draws"`` (MCMC or approximate-posterior draws: the summary has sd, HDI, ESS and
            R-hat) or ``"point"`` (an EM / variational-EM /
            streaming estimate: the summary shows estimates, the trace plot the objective).
        streaming: True when the runner reads the data itself, chunk by chunk.
        cli: False for methods offered from Python only.
        ignores_priors: sites whose prior the method does not read (a maximum-likelihood point
            fit); an edit of one in the model file is then reported, not silently ignored
            (:func:`latentzoo.priors.ignored_edits`).
        distributed: True for a Gibbs method that runs with :attr:`RunConfig.distributed`: its
            runner samples through :func:`latentzoo.runs.run_mcmc` with a kernel whose per-row
            latents have a leading row axis, and its row-sharded run has been tested
            (``latentzoo run --distributed`` refuses every other method).
    """

    name: str
    run: Callable[..., Any]
    kind: str = "draws"
    streaming: bool = False
    cli: bool = True
    ignores_priors: tuple[str, ...] = ()
    distributed: bool = False


class FamilyChecks(NamedTuple):
    """What the registry-wide conformance tests (``tests/test_conformance.py``) run per family.

    Attributes:
        model_kwargs: small sizes for prior-predictive draws and the short Geweke run, e.g.
            ``dict(N=12, D=4, K=2)``; the model's ``X`` must come out (N, D).
        gibbs_table: ``() -> list of updates`` for the hand-derived Gibbs kernel, or None; a
            table built per design (it reads fixed covariates such as labels) takes the model's
            keyword arguments: ``(model_kwargs) -> list``.
        test_functions: Geweke test functions ``{name: values -> array}`` (identified ones).
        broken_site: a continuous site whose update the tests break (draw scaled by 0.8) to show
            the short Geweke run has the power to fail a wrong kernel.
        vb: ``() -> (driver, X, model_kwargs)`` a :class:`~latentzoo.inference.cavi.CAVI`
            driver and a small data set for the ELBO-monotonicity check, or None.
        random_priors: ``(numpy Generator) -> priors dict`` with non-default hyperparameters
            (non-zero means, unequal scales, shapes far from 1) of every site the table's
            updates read: the deterministic checks run every update under them.
        orbit_model_kwargs: sizes at which every move with an orbit has a one-dimensional orbit
            (e.g. K = 1), for :func:`~latentzoo.inference.checks.check_move_on_orbit`.
        informative_model_kwargs: sizes with many rows per parameter, where the posterior is far
            from the prior (an SBC run there has power against updates that are right only
            when the data say little).
        informative_warmup: sweeps of warm-up for that SBC run (thinning grows with it); raise
            it for a sampler that needs more than 50 sweeps to forget its start there.
        data_sites: the observed sites the Geweke and SBC runs redraw, passed to the model as
            its first argument: ``"X"`` (the array), or a tuple of names (a dict of them, for a
            model with several observed sites, e.g. augmented hinge margins).
        sized_model_kwargs: ``(N, D) -> model_kwargs`` at N rows and D columns (images: N
            images of D x D pixels), so the program-size test can lower a sweep at two sizes and
            show that the compiled program does not grow with the data.
        geweke_seed: the PRNG seed of the registry-wide short Geweke run (and its broken twin).
        edge_model_kwargs: model_kwargs at shapes that put every axis at its edge where the model
            allows it (one row, one column, K = 1, a mixture component with no rows; images:
            several channels, non-square): every update's conditional is checked there too,
            since a count or a broadcast over the wrong axis agrees with the joint at the
            default shapes and not at these.
    """

    model_kwargs: dict
    gibbs_table: Callable | None = None
    test_functions: dict | None = None
    broken_site: str | None = None
    vb: Callable | None = None
    random_priors: Callable | None = None
    orbit_model_kwargs: dict | None = None
    informative_model_kwargs: dict | None = None
    informative_warmup: int = 50
    data_sites: str | tuple[str, ...] = "X"
    sized_model_kwargs: Callable | None = None
    edge_model_kwargs: tuple[dict, ...] = ()
    geweke_seed: int = 11


class Family(NamedTuple):
    """A model family of the zoo.

    Attributes:
        name: CLI name (``latentzoo run <name>``).
        title, paper: for ``latentzoo list`` and the docs' zoo table.
        model: the NumPyro program (``model(X=None, *, K, ..., priors=None)``).
        data_kind: the :class:`~latentzoo.data.DataKind` its data is loaded and validated as.
        default_data: ``default_data(seed) -> data`` (embedded or synthetic; no network).
        methods: the inference methods, first = default.
        identified: posterior sites that are identified (invariant to the model's symmetries):
            what summaries, convergence warnings and diagnose's plots look at (FA: ``cov``,
            never the rotating ``W``).
        trace_sites: sites for trace plots (a few, small).
        posterior_predictive: ``(idata, rng_seed) -> {"X": array (1, S, N, ...)}``, or None.
        default_K: latent dimension when ``--K`` is not given.
        docs: the docs page of the family (relative to ``docs/``).
        checks: what the conformance tests run (:class:`FamilyChecks`), or None.
        test_statistics: the predictive checks' test statistics ``{name: T}``, each a plain
            function ``T(X (..., N, D)) -> array (...)`` or ``(..., m)``; None: the defaults of
            the data kind (:data:`latentzoo.predictive_checks.DEFAULT_STATISTICS`).
        options: the family's own settings (:class:`Option`), e.g. a model variant; the CLI
            offers each as ``--<name>`` and refuses them for other families.
        scale_free: True when the family's runners do not depend on the columns' scale (they
            use ranks, or standardise themselves): the CLI's note on far-from-unit-scale data
            does not apply.
        predict: ``(draws, X_new (M, D) with NaN for missing entries, run) -> dict`` of arrays
            (chains, draws, M, ...) per posterior draw (``draws``: the thinned posterior;
            ``run``: the whole saved run, for what it recorded in ``constant_data``): a density
            model returns ``log_lik`` (chains, draws, M), each new row's log density (of its
            observed entries) under each draw, and ``X_completed`` (chains, draws, M, D) where
            it imputes; a classifier returns ``prob`` (chains, draws, M), p(y = +1 | θ_s, x),
            and may return ``draw_index`` (the draws of each chain it used instead); used by
            :func:`latentzoo.predict.predict`. None: the family cannot score new rows yet.
    """

    name: str
    title: str
    paper: str
    model: Callable
    data_kind: DataKind
    default_data: Callable[[int], Any]
    methods: tuple[Method, ...]
    identified: tuple[str, ...]
    trace_sites: tuple[str, ...] = ()
    posterior_predictive: Callable | None = None
    default_K: int = 3
    docs: str = ""
    checks: FamilyChecks | None = None
    test_statistics: Mapping[str, Callable] | None = None
    options: tuple[Option, ...] = ()
    scale_free: bool = False
    predict: Callable | None = None

    def method(self, name: str | None) -> Method:
        """The method called ``name`` (None: the default); ValueError naming the choices."""
        if name is None:
            return self.methods[0]
        for m in self.methods:
            if m.name == name:
                return m
        raise ValueError(
            f"Unknown method {name!r} for {self.name}; choose one of "
            f"{', '.join(m.name for m in self.methods)}."
        )

    @property
    def cli_methods(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.methods if m.cli)


REGISTRY: dict[str, Family] = {}


def register(family: Family) -> Family:
    """Add ``family`` to the zoo (replacing one of the same name); returns it."""
    for m in family.methods:
        if m.name not in METHOD_VOCABULARY:
            raise ValueError(
                f"Method {m.name!r} of {family.name} is not in the zoo's vocabulary "
                f"({', '.join(METHOD_VOCABULARY)}); add it to METHOD_VOCABULARY with its meaning."
            )
        if m.kind not in ("draws", "point"):
            raise ValueError(f"Method {m.name!r} of {family.name} has unknown kind {m.kind!r}.")
    REGISTRY[family.name] = family
    return family


def unregister(name: str) -> None:
    REGISTRY.pop(name, None)


_loaded = False


def families() -> Mapping[str, Family]:
    """The registry, after importing every module of :mod:`latentzoo.families` once."""
    global _loaded
    if not _loaded:
        import latentzoo.families as pkg

        for info in pkgutil.iter_modules(pkg.__path__):
            if not info.name.startswith("_"):
                importlib.import_module(f"{pkg.__name__}.{info.name}")
        _loaded = True
    return REGISTRY


def get_family(name: str) -> Family:
    """The family called ``name``; ValueError naming the choices."""
    zoo = families()
    if name not in zoo:
        raise ValueError(f"Unknown model {name!r}; choose one of {', '.join(zoo)}.")
    return zoo[name]
