"""Errors of the SneakPeek estimator: every one is a ``ValueError`` naming the bad input."""

from __future__ import annotations

from switchyard.errors import SwitchyardError

__all__ = [
    "EmptyTrainingSetError",
    "FeatureDimensionError",
    "LabelError",
    "NeighbourCountError",
    "NonFiniteFeatureError",
    "RecallError",
    "SneakPeekError",
    "UnknownIndexKindError",
]


class SneakPeekError(SwitchyardError, ValueError):
    """Base of every SneakPeek input error; never retriable (the same input fails again)."""


class EmptyTrainingSetError(SneakPeekError):
    """The index was asked to build over zero training rows (or zero feature columns)."""


class FeatureDimensionError(SneakPeekError):
    """Features are not a 2-D array with the index's number of columns."""


class NonFiniteFeatureError(SneakPeekError):
    """A feature row holds NaN or an infinity; the message names the first such row."""


class NeighbourCountError(SneakPeekError):
    """``k`` is outside ``1 <= k <= n_rows`` of the index."""


class LabelError(SneakPeekError):
    """Training labels are not one non-negative integer per row, or exceed the prior's classes."""


class RecallError(SneakPeekError):
    """A variant's per-class recalls are not ``C`` finite numbers in ``[0, 1]``."""


class UnknownIndexKindError(SneakPeekError):
    """The index kind is not one of ``flat``, ``ivf``, ``hnsw``."""
