"""Summary statistics: several quantiles of one series at once are the figures one at a
time would give, to the last bit (the simulator's summary takes 108 of them a run)."""

from __future__ import annotations

import math
import random

import pytest
from switchyard.stats import coefficient_of_variation, quantile, quantiles


def test_quantiles_at_once_are_each_quantile_exactly() -> None:
    rng = random.Random(7)
    values = [rng.lognormvariate(0.0, 1.5) for _ in range(1_001)]
    qs = (0.5, 0.9, 0.99, *(i / 100 for i in range(101)))
    assert quantiles(values, qs) == tuple(quantile(values, q) for q in qs)
    assert quantiles([1.0, 2.0, 3.0, 4.0], (0.0, 0.5, 1.0)) == (1.0, 2.5, 4.0)


def test_quantiles_of_nothing_are_nan() -> None:
    assert all(math.isnan(v) for v in quantiles([], (0.5, 0.99)))
    assert math.isnan(quantile([], 0.5))


def test_coefficient_of_variation() -> None:
    assert coefficient_of_variation([0.2, 0.6]) == pytest.approx(0.5)
    assert coefficient_of_variation([]) == 0.0
    assert coefficient_of_variation([0.0, 0.0]) == 0.0
