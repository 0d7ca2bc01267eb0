"""Sizes of a model's data: from the data when given, else from the ``N``/``D`` arguments
(prior-predictive draws)."""

from __future__ import annotations

__all__ = ["data_sizes"]


def data_sizes(X, N, D, model: str = "the model"):
    """``(N, D)`` from ``X`` (N, D) when it is given, else the given sizes."""
    if X is not None:
        return X.shape[0], X.shape[1]
    if N is None or D is None:
        raise ValueError(f"{model} needs either data X or both sizes N and D.")
    return N, D
