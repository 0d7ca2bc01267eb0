"""Tensor analyzers and their mixtures: the Gibbs table (alternating group draws, the exact
label block), Monte Carlo EM's M-step and the log-likelihood oracle for small latent sizes."""

from .gibbs import (  # noqa: F401
    group_update,
    label_group_update,
    label_update,
    loadings_update,
    pi_update,
    Psi_update,
)
from .table import mta_updates, ta_updates  # noqa: F401
from .moves import collapsed_group_move  # noqa: F401
from .shift import shift_move  # noqa: F401
from .start import init_from_data  # noqa: F401
from .mcem import (  # noqa: F401
    PSI_FLOOR,
    TAFit,
    expected_complete_loglik,
    fit_ta_mcem,
    log_likelihood_estimate,
    mta_m_step,
    ta_features,
    ta_m_step,
)
from .oracle import ta_oracle_log_marginal  # noqa: F401
