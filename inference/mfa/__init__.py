"""Mixture of factor analyzers (Ghahramani & Hinton 1996): the Gibbs table and exact EM."""

from latentzoo.inference.mfa.em import MFAFit, fit_mfa_em, mfa_log_likelihood
from latentzoo.inference.mfa.gibbs import init_from_data, mfa_updates

__all__ = ["mfa_updates", "init_from_data", "MFAFit", "fit_mfa_em", "mfa_log_likelihood"]
