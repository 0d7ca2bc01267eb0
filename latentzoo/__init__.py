"""latentzoo: Bayesian latent-factor models from published papers, on NumPyro.

Importing the package switches JAX to 64-bit floats. This is the single place where that
happens: the papers' algebra (Cholesky factors of K x K posterior precisions built from
sums over thousands of rows, Gamma shapes of order N/2, log-likelihoods of order N*D) loses
digits in float32, and the Geweke / SBC tests are sensitive enough to notice. Every
subpackage (``latentzoo.models``, ``latentzoo.inference``) imports this module first.
"""

import jax

jax.config.update("jax_enable_x64", True)

__version__ = "0.1.0"

__all__ = ["__version__"]
