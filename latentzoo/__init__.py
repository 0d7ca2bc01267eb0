"""latentzoo: Bayesian latent-factor models from published papers, on NumPyro.

Importing the package switches JAX to 64-bit floats. This is the single place where that
happens: the papers' algebra (Cholesky factors of K x K posterior precisions built from
sums over thousands of rows, Gamma shapes of order N/2, log-likelihoods of order N*D) loses
digits in float32, and the Geweke / SBC tests are sensitive enough to notice. Every
subpackage (``latentzoo.models``, ``latentzoo.inference``) imports this module first.

It also asks XLA's CPU backend for its classic emitters where the installed jaxlib has them
(:mod:`latentzoo.xla_flags`: faster to compile and to run on the zoo's programs;
``LATENTZOO_XLA_CLASSIC_EMITTERS=0`` keeps XLA's default).
"""

import os

from latentzoo.xla_flags import use_classic_cpu_emitters

use_classic_cpu_emitters()  # before JAX creates its CPU client, which reads XLA_FLAGS

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

# ArviZ 1.x's ``az.from_numpyro(mcmc)`` reads ``numpyro.infer.initialization`` as an attribute
# of ``numpyro.infer``, which is not always set (the submodule can be in sys.modules with the
# attribute missing, depending on import order): it raised AttributeError on every latentzoo
# MCMC run. Set it, once, where it is missing.
import numpyro.infer  # noqa: E402
import numpyro.infer.initialization as _initialization  # noqa: E402

if not hasattr(numpyro.infer, "initialization"):
    numpyro.infer.initialization = _initialization

# One namespace over three folders: installed, ``latentzoo.models`` and ``latentzoo.inference``
# live inside this package. Imported from a source checkout (the repository root as the working
# directory puts this folder first on sys.path, ahead of an installed copy), they are the sibling
# folders ``models/`` and ``inference/``: add the root to the package's search path so they resolve.
_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if os.path.isfile(os.path.join(_root, "pyproject.toml")) and all(
    os.path.isfile(os.path.join(_root, sub, "__init__.py")) for sub in ("models", "inference")
) and not os.path.isdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), "models")):
    __path__.append(_root)  # noqa: F821 (a package's own __path__)

__version__ = "0.1.0"

__all__ = ["__version__", "predict"]


def __getattr__(name):
    """``latentzoo.predict`` without importing it first (PEP 562): the module is loaded on first
    use, so ``import latentzoo`` stays light. Called, ``latentzoo.predict(run_dir, X_new)``
    returns the prediction's ArviZ InferenceData (see :mod:`latentzoo.predict`)."""
    if name == "predict":
        import importlib

        return importlib.import_module("latentzoo.predict")
    raise AttributeError(f"module 'latentzoo' has no attribute {name!r}")
