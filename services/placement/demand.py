"""Stage demand per model, from the scheduler's running counts (pure).

The scheduler counts every stage it routes in ``placement:demand`` (model -> stages so
far, only ever incremented). Each placement round reads those counts;
:class:`DemandRates` turns the increase since the previous read into a rate per wall
second and smooths it with an exponentially weighted moving average over irregular
intervals, as the simulator smooths its own (``research/multimodel/simulator.py``):

    rate <- rate + (1 - exp(-dt / tau_s)) * (increase / dt - rate)

At a constant rate ``r`` it reads ``r``; a model that gets no stages decays towards 0
with time constant ``tau_s``.

Counts are taken as they come: the first read only sets the baseline (what was counted
before this replica started says nothing about the rate now) and the second's rate is
taken as it is (there is nothing to smooth it with yet); a model that appears later
counts all its stages as new, smoothed from 0; a count that went down (the store lost its data and the
scheduler counts again from 0) counts what it holds now as the increase.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

__all__ = ["DemandRates"]


class DemandRates:
    """Smoothed stages per wall second per model, fed the running counts each round."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._rates: dict[str, float] = {}
        self._last_s: float | None = None
        self._warm = False

    @property
    def rates(self) -> Mapping[str, float]:
        """The current smoothed rates (stages per wall second), by model."""
        return self._rates

    def update(self, counts: Mapping[str, int], now_s: float, tau_s: float) -> dict[str, float]:
        """Fold in the counts read at ``now_s`` (wall seconds); returns the rates.

        Args:
            counts: model -> stages counted so far.
            now_s: when they were read.
            tau_s: the smoothing time constant, wall seconds (> 0).

        Raises:
            ValueError: ``tau_s`` not a positive finite number.
        """
        if not (math.isfinite(tau_s) and tau_s > 0):
            raise ValueError(f"tau_s must be a positive number of seconds, got {tau_s!r}")
        last_s = self._last_s
        if last_s is not None and now_s <= last_s:
            return dict(self._rates)  # no interval to divide by: the next read counts it
        previous = self._counts
        self._counts = {model: max(0, count) for model, count in counts.items()}
        self._last_s = now_s
        if last_s is None:
            return dict(self._rates)  # the baseline
        dt_s = now_s - last_s
        # The first interval has no estimate to smooth: it is the estimate.
        weight = 1.0 - math.exp(-dt_s / tau_s) if self._warm else 1.0
        self._warm = True
        for model in sorted(self._counts.keys() | self._rates.keys()):
            count = self._counts.get(model)
            before = previous.get(model)
            if count is None:
                increase = 0
            elif before is None or count < before:
                increase = count
            else:
                increase = count - before
            rate = self._rates.get(model, 0.0)
            self._rates[model] = rate + weight * (increase / dt_s - rate)
        return dict(self._rates)
