"""The two summary statistics every report of Switchyard uses, defined once."""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["coefficient_of_variation", "quantile"]


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0..1) of already sorted values, linear between order
    statistics (``numpy.percentile``'s default); NaN when there are none.

    Example: ``quantile([1, 2, 3, 4], 0.5) == 2.5``.
    """
    if not sorted_values:
        return math.nan
    position = q * (len(sorted_values) - 1)
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    fraction = position - low
    return sorted_values[low] * (1 - fraction) + sorted_values[high] * fraction


def coefficient_of_variation(values: Sequence[float]) -> float:
    """Population standard deviation over mean; 0 for an empty or all-zero series.

    Example: ``coefficient_of_variation([0.2, 0.6]) == 0.5``.
    """
    if not values:
        return 0.0
    mean = math.fsum(values) / len(values)
    if mean <= 1e-12:
        return 0.0
    var = math.fsum((v - mean) ** 2 for v in values) / len(values)
    return math.sqrt(var) / mean
