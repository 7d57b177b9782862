"""The adaptive placement policy's cost model: its settings, and the delay of one model
on its replicas (:mod:`switchyard.multimodel.adaptive` explains each term)."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "DEFAULT_ALPHA",
    "DEFAULT_BETA",
    "DEFAULT_GAMMA",
    "AdaptiveConfig",
    "availability",
    "model_delay",
]

DEFAULT_ALPHA = 1.0
"""Weight of the delay term (per stage-second per second)."""
DEFAULT_BETA = 2.0
"""Weight of the resource term (stages per worker's worth of resources held)."""
DEFAULT_GAMMA = 20.0
"""Weight of the load-balance term (stages per unit of summed squared busy share)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AdaptiveConfig:
    """Tunables of the adaptive policy; the module docstring explains each."""

    alpha: float = DEFAULT_ALPHA
    beta: float = DEFAULT_BETA
    gamma: float = DEFAULT_GAMMA
    horizon_s: float = 60.0
    unplaced_penalty_s: float = 300.0
    rho_cap: float = 0.95
    hysteresis: float = 0.5
    min_residency_s: float = 120.0
    max_actions: int = 16

    def __post_init__(self) -> None:
        for name in (
            "alpha",
            "beta",
            "gamma",
            "unplaced_penalty_s",
            "hysteresis",
            "min_residency_s",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0.0):
                raise ValueError(f"{name}: must be a finite number >= 0, got {value!r}")
        if not (math.isfinite(self.horizon_s) and self.horizon_s > 0):
            raise ValueError(f"horizon_s: must be > 0, got {self.horizon_s!r}")
        if not 0.0 < self.rho_cap < 1.0:
            raise ValueError(f"rho_cap: must be within (0, 1), got {self.rho_cap!r}")
        if self.max_actions < 0:
            raise ValueError(f"max_actions: must be >= 0, got {self.max_actions!r}")


def model_delay(
    rate: float, exec_s: float, speed_sum: float, servers: float, config: AdaptiveConfig
) -> float:
    """``D_m`` of one model: stage-seconds per second at effective demand ``rate`` on
    replicas whose availability-weighted speeds sum to ``speed_sum`` over ``servers``
    availability-weighted servers. Example: ``model_delay(0.6, 1.0, 1.0, 1.0, cfg)`` is
    ``0.6 + 0.6**2 / 0.4 = 1.5``."""
    if rate <= 0.0:
        return 0.0
    if speed_sum <= 0.0 or servers <= 0.0:
        return rate * (exec_s + config.unplaced_penalty_s)
    if exec_s <= 0.0:
        return 0.0
    mu = speed_sum / exec_s
    rho = rate / mu
    exponent = math.sqrt(2.0 * (servers + 1.0))
    if rho < config.rho_cap:
        queue = math.pow(rho, exponent) / (1.0 - rho)
    else:
        cap = config.rho_cap
        queue = math.pow(cap, exponent) / (1.0 - cap) + (rate - cap * mu) * config.horizon_s / 2.0
    return rate * servers / mu + queue


def availability(wait_s: float, horizon_s: float) -> float:
    return horizon_s / (horizon_s + max(0.0, wait_s))
