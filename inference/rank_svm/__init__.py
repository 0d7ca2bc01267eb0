"""Max-margin rank-likelihood discriminative factor model (Yuan, Henao et al. 2015): Gibbs tables
for the four variants (:mod:`.gibbs`, :mod:`.shrinkage`, :mod:`.dp`, :mod:`.moves`, and the opt-in
:mod:`.classifier_scale`, :mod:`.rotation` and :mod:`.relabel` moves), the Gibbs
fit (:mod:`.fit`) and mean-field variational Bayes (:mod:`.vb`)."""

from latentzoo.inference.rank_svm.dp import dp_updates, t_lam_update
from latentzoo.inference.rank_svm.fit import bind_static, fit_gibbs, initial_values, rank_svm_updates
from latentzoo.inference.rank_svm.gibbs import (
    A_update,
    beta_update,
    lam_update,
    tau_update,
    z_update,
)
from latentzoo.inference.rank_svm.shrinkage import tpb_updates
from latentzoo.inference.rank_svm.vb import (
    RankSVMVariational,
    fit_vb,
    rank_svm_elbo,
    rank_svm_guide,
    rank_svm_sweep,
    rank_svm_vb,
)

__all__ = [
    "rank_svm_updates",
    "fit_gibbs",
    "initial_values",
    "bind_static",
    "lam_update",
    "z_update",
    "A_update",
    "beta_update",
    "tau_update",
    "tpb_updates",
    "t_lam_update",
    "dp_updates",
    "fit_vb",
    "rank_svm_vb",
    "rank_svm_guide",
    "rank_svm_sweep",
    "rank_svm_elbo",
    "RankSVMVariational",
]
