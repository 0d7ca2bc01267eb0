"""Noisy-OR component analyzer: variational and exact MAP-EM (Jaakkola-Jordan bound /
enumeration), held-out likelihood, and MCMC."""

from latentzoo.inference.noca.blocks import (
    noca_data_init,
    noca_exact_em,
    noca_exact_em_blocks,
    noca_guide,
    noca_vb_blocks,
    noca_vem,
    read_noca_priors,
)
from latentzoo.inference.noca.bound import noca_bound, noca_exact_loglik, noca_exact_rows, noca_importance_loglik
from latentzoo.inference.noca.fit import (
    fit_noca, live_sources, noca_heldout_loglik, noca_mean_field, noca_mean_field_rows,
)
from latentzoo.inference.noca.mcmc import noca_kernel, noca_updates

__all__ = [
    "noca_vem", "noca_exact_em", "noca_vb_blocks", "noca_exact_em_blocks", "noca_guide",
    "noca_data_init", "read_noca_priors", "noca_bound", "noca_exact_loglik", "noca_exact_rows",
    "noca_importance_loglik", "fit_noca", "live_sources", "noca_heldout_loglik", "noca_mean_field", "noca_mean_field_rows",
    "noca_updates", "noca_kernel",
]
