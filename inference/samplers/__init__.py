"""Samplers built on the Gibbs tables: kernels that compose hand-derived updates into something
more than one sweep (replica exchange over tempered copies of a table)."""

from ..gibbs import observed_log_likelihood
from .replica_exchange import (
    ReplicaExchange,
    ReplicaExchangeState,
    adapt_ladder,
    geometric_ladder,
    swap_log_ratio,
    swap_step,
)

__all__ = [
    "ReplicaExchange",
    "ReplicaExchangeState",
    "adapt_ladder",
    "geometric_ladder",
    "observed_log_likelihood",
    "swap_log_ratio",
    "swap_step",
]
