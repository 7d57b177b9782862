"""The two summary statistics every report of Switchyard uses, defined once."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["coefficient_of_variation", "quantile", "quantiles"]


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0..1) of ``values``, linear between order statistics
    (``numpy.quantile``'s default method); NaN when there are none.

    Example: ``quantile([1, 2, 3, 4], 0.5) == 2.5``.
    """
    return quantiles(values, (q,))[0]


def quantiles(values: Sequence[float], qs: Sequence[float]) -> tuple[float, ...]:
    """:func:`quantile` of ``values`` at each of ``qs``, the same figures, with the values
    converted to an array once (the conversion is most of a call on a long list).

    Example: ``quantiles([1, 2, 3, 4], (0.0, 0.5)) == (1.0, 2.5)``.
    """
    if not values:
        return tuple(math.nan for _ in qs)
    return tuple(float(v) for v in np.quantile(np.asarray(values, dtype=float), qs))


def coefficient_of_variation(values: Sequence[float]) -> float:
    """Population standard deviation over mean; 0 for an empty or all-zero series.

    Example: ``coefficient_of_variation([0.2, 0.6])`` is 0.5 (to rounding).
    """
    if not values:
        return 0.0
    mean = math.fsum(values) / len(values)
    if mean <= 1e-12:
        return 0.0
    var = math.fsum((v - mean) ** 2 for v in values) / len(values)
    return math.sqrt(var) / mean
