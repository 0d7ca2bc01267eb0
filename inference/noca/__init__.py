"""Noisy-OR component analyzer: variational EM (Jaakkola-Jordan bound), exact EM and MCMC."""

from latentzoo.inference.noca.bound import noca_bound, noca_exact_loglik
from latentzoo.inference.noca.em import (
    fit_noca,
    noca_exact_em,
    noca_exact_em_blocks,
    noca_guide,
    noca_vb_blocks,
    noca_vem,
)
from latentzoo.inference.noca.mcmc import noca_kernel, noca_updates

__all__ = [
    "noca_vem", "noca_exact_em", "noca_vb_blocks", "noca_exact_em_blocks", "noca_guide",
    "noca_bound", "noca_exact_loglik", "fit_noca", "noca_updates", "noca_kernel",
]
