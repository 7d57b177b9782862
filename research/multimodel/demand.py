"""The multi-model simulator's demand estimate per model, and its large-change trigger.

``rps[m]`` is a continuous-time exponentially weighted moving average of stage
invocations of model ``m`` (a stage is *invoked* when it becomes ready): a counter that
decays as ``exp(-dt / tau_s)`` and gains 1 per invocation, divided by ``tau_s``. At a
constant rate of ``r`` invocations per second it reads ``r``.

Large change: when an invocation moves a model's estimate ``r`` away from its value
``r0`` at the last placement update by more than ``large_change * r0`` (a fraction, 0.5 =
50 %) *and* by more than three standard deviations of the estimate's Poisson noise,
``3 * sqrt(max(r0, 1 / tau_s) / tau_s)``, the simulator runs an extra update (no sooner
than ``large_change_min_gap_s`` after the previous one). Example: ``tau = 5 s``, ``r0 =
4/s``: noise sd ``sqrt(4 / 5) = 0.89``, so an extra update needs ``|r - 4| > max(2, 2.68)
= 2.68`` per second.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

__all__ = ["DemandEstimate"]


class DemandEstimate:
    """Invocation rates per model (``rps``, a live table) as of each model's last change."""

    __slots__ = ("_base", "_count", "_large_change", "_tau_s", "_updated_s", "rps")

    def __init__(self, models: Iterable[str], tau_s: float, large_change: float | None) -> None:
        self._tau_s = tau_s
        self._large_change = large_change
        self._count: dict[str, float] = dict.fromkeys(models, 0.0)
        self._updated_s: dict[str, float] = dict.fromkeys(self._count, 0.0)
        self._base: dict[str, float] = dict.fromkeys(self._count, 0.0)
        self.rps: dict[str, float] = dict.fromkeys(self._count, 0.0)

    def invoke(self, model: str, now_s: float) -> bool:
        """Count one invocation of ``model``; whether its estimate moved by a large change
        since the last update (:meth:`mark_update`)."""
        tau = self._tau_s
        count = self._count[model] * math.exp((self._updated_s[model] - now_s) / tau) + 1.0
        self._count[model] = count
        self._updated_s[model] = now_s
        rate = count / tau
        self.rps[model] = rate
        threshold = self._large_change
        if threshold is None:
            return False
        base = self._base[model]
        change = abs(rate - base)
        # Past the relative threshold and past three standard deviations of the
        # estimate's own Poisson noise (sqrt(rate / tau)), so that a rarely used model's
        # jitter does not set off an update on every invocation.
        return change > threshold * base and change > 3.0 * math.sqrt(max(base, 1.0 / tau) / tau)

    def decay_to(self, now_s: float) -> None:
        """Bring every model's estimate to ``now_s`` (before a placement update reads it)."""
        tau = self._tau_s
        for model, count in self._count.items():
            self.rps[model] = count * math.exp((self._updated_s[model] - now_s) / tau) / tau

    def mark_update(self) -> None:
        """The estimates as they are now are what a large change is measured from."""
        self._base.update(self.rps)
