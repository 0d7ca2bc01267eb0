"""Bayesian factor analysis (thesis ch. 2-4): the Gibbs table, mean-field CAVI, MAP-EM and the
streaming (online EM / SGA) estimator."""

from latentzoo.inference.fa.em import EM_BLOCKS, fa_em
from latentzoo.inference.fa.fit import fit_fa_variational
from latentzoo.inference.fa.gibbs import (
    W_update,
    fa_updates,
    mu_update,
    psi_update,
    scale_move,
    shear_move,
    shift_move,
    z_update,
)
from latentzoo.inference.fa.online import OnlineFactorAnalysis
from latentzoo.inference.fa.vb import CAVI_BLOCKS, FAPriors, FAVariational, fa_cavi, read_fa_priors

__all__ = [
    "fa_updates", "z_update", "W_update", "mu_update", "psi_update",
    "scale_move", "shift_move", "shear_move",
    "fa_cavi", "fa_em", "CAVI_BLOCKS", "EM_BLOCKS", "FAVariational", "FAPriors", "read_fa_priors",
    "fit_fa_variational", "OnlineFactorAnalysis",
]
