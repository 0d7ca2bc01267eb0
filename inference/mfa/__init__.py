"""Mixture of factor analyzers (Ghahramani & Hinton 1996): the Gibbs table."""

from latentzoo.inference.mfa.gibbs import init_from_data, mfa_updates

__all__ = ["mfa_updates", "init_from_data"]
