"""Cooperative vector quantizer: Gibbs table (with the collapsed source move and the split-merge
move), mean-field variational EM and exact EM."""

from latentzoo.inference.cvq.em import (
    EXACT_EM_BLOCKS,
    cvq_exact_em,
    cvq_exact_loglik,
    cvq_guide,
    cvq_vb_blocks,
    cvq_vem,
    fit_cvq,
)
from latentzoo.inference.cvq.gibbs import cvq_updates, init_from_data
from latentzoo.inference.cvq.split_merge import split_merge_move

__all__ = [
    "cvq_updates", "cvq_vem", "cvq_exact_em", "cvq_vb_blocks", "EXACT_EM_BLOCKS", "cvq_guide",
    "cvq_exact_loglik", "fit_cvq", "split_merge_move", "init_from_data",
]
