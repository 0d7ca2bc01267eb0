import functools
import os
import tempfile
import time
import warnings

import pytest

# JAX's persistent compilation cache, for the whole test session. Most of the suite's time is XLA
# compiling the same Gibbs / NUTS / SBC programs and the thousands of single-primitive programs
# eager code compiles, on every run: cold, the suite takes about 27 minutes on 2 cores; with the
# cache a later run (a fresh CI venv too: the folder is the user's, not the venv's) loads them
# instead, and identical programs in different tests hit it within one run. The key is the
# program itself (without source locations), the jaxlib version, the platform and the XLA flags,
# so a changed kernel, a jax upgrade or other flags compile afresh rather than reuse a stale entry.
#   default                        ~/.cache/latentzoo/jax (or $XDG_CACHE_HOME/latentzoo/jax);
#   JAX_COMPILATION_CACHE_DIR=DIR  DIR (experiments/mutation_score.py passes a private copy);
#   LATENTZOO_TEST_JAX_CACHE=0     compile everything afresh (as does JAX_ENABLE_COMPILATION_CACHE=false).
# Workers that crashed inside XLA (while loading an entry, and with the cache off while compiling)
# ran out of memory maps, not into bad entries: see _release_compiled_programs below. Entries are
# written atomically (see _atomic_cache_writes). Set through the environment, before JAX is
# imported, so that the interpreters some tests start (the CLI's console script, the four-device
# run) follow the same setting.
_CACHE_HOME = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
if os.environ.get("LATENTZOO_TEST_JAX_CACHE") != "0":
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(_CACHE_HOME, "latentzoo", "jax"))
_USE_CACHE = bool(os.environ.get("JAX_COMPILATION_CACHE_DIR")) \
    and os.environ.get("LATENTZOO_TEST_JAX_CACHE") != "0" \
    and os.environ.get("JAX_ENABLE_COMPILATION_CACHE", "").lower() not in ("false", "0")
_JAX_CACHE = {
    # Every program, however quick to compile: loading an entry takes ~10 ms where compiling even
    # a one-primitive program takes 20-50 ms, and those are most of the suite's compilations
    # (measured: a warm run of test_gibbs_builder.py takes half as long with 0 as with 0.5 s).
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    # No size floor either (-1 also stops JAX choosing one per file system): entries are a few KB
    # to a few MB, a few thousand files in all.
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1",
}
_usable = False
if _USE_CACHE:
    for _name, _value in _JAX_CACHE.items():
        os.environ.setdefault(_name, _value)
    try:  # a folder that cannot be written would make JAX warn on every compilation: compile instead
        os.makedirs(os.environ["JAX_COMPILATION_CACHE_DIR"], exist_ok=True)
        _usable = os.access(os.environ["JAX_COMPILATION_CACHE_DIR"], os.W_OK | os.X_OK)
    except OSError:
        _usable = False
# XLA's CPU backend without LLVM's optimisation passes, for the test session and the interpreters
# it starts: compiling is most of the suite's time, and the suite's programs run on a few rows,
# where optimised code saves less than its optimisation costs (a cold tests/inference/
# test_cvq_gibbs.py: 120 s with the default level, 77 s without). IEEE semantics are the same at
# every level (XLA's CPU backend does not enable fast-math), so results agree to round-off.
# LATENTZOO_TEST_XLA_OPT=1 keeps XLA's default.
if os.environ.get("LATENTZOO_TEST_XLA_OPT") != "1" \
        and "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()

# `import latentzoo` also asks for XLA's classic CPU emitters where the jaxlib has them
# (latentzoo/xla_flags.py: the suite's programs compile 35-40 % faster, e.g. a cold
# tests/inference/test_ta_gibbs.py on two workers in 87 s against 142);
# LATENTZOO_TEST_XLA_OPT=1 keeps XLA's defaults there too.
if os.environ.get("LATENTZOO_TEST_XLA_OPT") == "1":
    os.environ.setdefault("LATENTZOO_XLA_CLASSIC_EMITTERS", "0")
if not _usable:
    # also keeps the CLI's own cache (in a run's checkpoint folder) off in the console scripts
    # the tests start: every test process compiles, none loads
    os.environ["JAX_ENABLE_COMPILATION_CACHE"] = "false"

import jax  # noqa: E402

import latentzoo  # noqa: E402,F401  (float64 before any test builds arrays)

# In case JAX was imported before this file (by a plugin), apply the same settings explicitly.
if not _usable:
    jax.config.update("jax_enable_compilation_cache", False)
else:
    jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
    jax.config.update(
        "jax_persistent_cache_min_compile_time_secs",
        float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]),
    )
    jax.config.update(
        "jax_persistent_cache_min_entry_size_bytes",
        int(os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"]),
    )


def _atomic_cache_writes():
    """Write each cache entry to a temporary file and rename it into place.

    JAX's file cache (without a size limit, which needs the ``filelock`` package) writes entries
    in place, so the other xdist worker, compiling the same program at the same moment, can read a
    half-written file: JAX then warns and compiles again, and a test that turns every warning into
    an error fails. A rename is atomic, so a reader sees no entry or the whole entry. Left as JAX
    has it when its internals differ from what this expects.
    """
    try:
        from jax._src import lru_cache
    except ImportError:
        return
    cls, suffix = getattr(lru_cache, "LRUCache", None), getattr(lru_cache, "_CACHE_SUFFIX", None)
    if cls is None or not isinstance(suffix, str) or not callable(getattr(cls, "put", None)):
        return
    original = cls.put

    def put(self, key, value):
        folder = getattr(self, "path", None)
        if getattr(self, "eviction_enabled", True) or not key or folder is None \
                or not os.path.isdir(str(folder)):
            return original(self, key, value)
        final = os.path.join(str(folder), f"{key}{suffix}")
        if os.path.exists(final):
            return None
        fd, tmp = tempfile.mkstemp(dir=str(folder), prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(value)
            os.replace(tmp, final)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return None

    cls.put = put


def _prune_cache(folder, max_age_days=30):
    """Drop entries nobody has read or written for a month (old kernels, old jaxlib versions), and
    temporary files a killed run left, so the folder does not grow without bound."""
    now = time.time()
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        try:
            st = entry.stat()
            stale = entry.name.startswith(".tmp-") and now - st.st_mtime > 86400
            stale |= entry.name.endswith("-cache") and now - max(st.st_atime, st.st_mtime) \
                > max_age_days * 86400
            if stale and entry.is_file():
                os.unlink(entry.path)
        except OSError:
            pass


if _usable:
    _atomic_cache_writes()
    if "PYTEST_XDIST_WORKER" not in os.environ:  # once per session, before the workers start
        _prune_cache(os.environ["JAX_COMPILATION_CACHE_DIR"])

# Modules with a module fixture that several tests share (one CLI run, one MCMC run, a fit saved
# under a module's temporary folder). Under xdist's "load" distribution (pyproject's addopts)
# those tests may land on both workers, and each worker would build the fixture (tens of seconds
# each, compilation mostly: the rank SVM's predict tests fitted the same run on both workers, 60 s
# of compiling twice). With this scheduler each such module goes to one worker as a whole; every
# other test is dealt out one at a time, as "load" does. A module is grouped when its source
# defines a module-scoped fixture, or when it is listed here (tests that share programs without
# a fixture). (xdist's own xdist_group marks cannot do this here: under pytest 9 the group never
# reaches the scheduler.) Other --dist modes are left alone.
GROUPED_MODULES = ("tests/cli/test_cli.py", "tests/inference/test_mfa_gibbs.py",
                   "tests/inference/test_rank_svm_vb.py")
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@functools.lru_cache(maxsize=None)
def _grouped(module: str) -> bool:
    """Whether the tests of ``module`` (a path relative to the repository) run on one worker."""
    try:
        with open(os.path.join(_ROOT, module), encoding="utf-8") as fh:
            text = fh.read()
    except OSError:
        text = ""
    return module in GROUPED_MODULES or 'scope="module"' in text


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedFixtureScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            module = nodeid.split("::", 1)[0]
            return module if _grouped(module) else nodeid

    return SharedFixtureScheduling(config, log)


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drop JAX's in-memory caches of traced and compiled programs after each test module.

    A worker process otherwise keeps every executable the suite has compiled loaded to its end,
    each with its own code mappings: a worker had 18,000 memory maps after 22 minutes (and its
    predecessor 6 GB), and XLA crashed inside compilation (a segmentation fault, twice in one CI
    run, after 50 and 70 minutes), consistent with the kernel's limit on maps
    (vm.max_map_count, 65,530 by default) running out. Cleared, the maps of freed executables
    are reused: 150 compilations add ~250
    maps, and 150 more after a clear add none. Programs rarely repeat across modules, so little
    is compiled twice (four inference modules in one process: peak memory 1.8 GB instead of
    3.0 GB, and no slower)."""
    yield
    import gc

    jax.clear_caches()
    gc.collect()


# ArviZ 0.2x announces its 1.x refactor on import; it is not about this project.
warnings.filterwarnings("ignore", category=FutureWarning, module="arviz")
