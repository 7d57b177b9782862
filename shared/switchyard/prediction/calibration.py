"""Bias-aware calibration of predicted service times and the adaptive deadline.

A predictor is wrong in both directions, and a scheduler that trusts it blindly
overloads workers whenever it underestimates. Calibration keeps two exponential moving
averages of its recent error, per worker type (one :class:`CalibrationState` each):

    MAE  <- (1 - alpha)*MAE  + alpha*|s - s^|        (seconds)
    MAPE <- (1 - alpha)*MAPE + alpha*|s - s^| / s    (a fraction)

where ``s^`` is the prediction and ``s`` the service time observed on completion. The
first observation seeds each average directly, so a fresh state does not start biased
toward zero. A prediction is then padded by what the errors say it may miss:

    s~ = s^ + beta*MAE + gamma*s^*MAPE       (calibrated service time)
    d  = (1 + eps)*s~                        (adaptive deadline, from the start)

Worked example: ``s^ = 2.0 s``, ``MAE = 0.3 s``, ``MAPE = 0.1`` and
``beta = gamma = 1`` give ``s~ = 2.0 + 0.3 + 2.0*0.1 = 2.5 s``; with ``eps = 0.2`` the
deadline is ``d = 1.2*2.5 = 3.0 s`` after the request starts.

Everything here is pure and immutable: :meth:`CalibrationState.observe` returns a new
state, so the simulator and the live predictor service share the code and a snapshot
never changes under a policy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["CalibrationConfig", "CalibrationState", "adaptive_deadline_s", "calibrated_s"]


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrationConfig:
    """Weights of the calibration; a :class:`ValueError` names any invalid field."""

    beta: float = 1.0
    """Weight of the MAE: seconds added to every prediction per second of MAE."""
    gamma: float = 1.0
    """Weight of the MAPE: the relative margin added, as a multiple of the MAPE."""
    eps: float = 0.2
    """Deadline slack: the deadline is ``(1 + eps)`` times the calibrated time."""
    ema_alpha: float = 0.05
    """Smoothing of the error averages, in (0, 1]: the weight of the newest error."""

    def __post_init__(self) -> None:
        for name in ("beta", "gamma", "eps"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {value}")
        if not (0 < self.ema_alpha <= 1):
            raise ValueError(f"ema_alpha must be within (0, 1], got {self.ema_alpha}")


@dataclass(frozen=True, slots=True)
class CalibrationState:
    """Running error averages of a predictor on one worker type."""

    mae_s: float = 0.0
    """EMA of ``|actual - predicted|``, seconds."""
    mape: float = 0.0
    """EMA of ``|actual - predicted| / actual``, a fraction (0.1 = 10 %)."""
    observations: int = 0
    """Completions that fed ``mae_s``."""
    mape_observations: int = 0
    """Completions that fed ``mape`` (those with a positive actual time)."""

    def observe(
        self, predicted_s: float, actual_s: float, config: CalibrationConfig
    ) -> CalibrationState:
        """The state after one completion; this state is left unchanged.

        A completion whose times are not finite is ignored (the same state comes back);
        one with ``actual_s <= 0`` updates the MAE only, since its relative error is
        undefined.
        """
        if not (math.isfinite(predicted_s) and math.isfinite(actual_s)):
            return self
        alpha = config.ema_alpha
        error_s = abs(actual_s - predicted_s)
        mae_s = error_s if self.observations == 0 else self.mae_s + alpha * (error_s - self.mae_s)
        mape = self.mape
        mape_observations = self.mape_observations
        if actual_s > 0:
            relative = error_s / actual_s
            mape = relative if mape_observations == 0 else mape + alpha * (relative - mape)
            mape_observations += 1
        return CalibrationState(mae_s, mape, self.observations + 1, mape_observations)


def calibrated_s(predicted_s: float, state: CalibrationState, config: CalibrationConfig) -> float:
    """The calibrated service time ``s~ = s^ + beta*MAE + gamma*s^*MAPE``, seconds."""
    return predicted_s + config.beta * state.mae_s + config.gamma * predicted_s * state.mape


def adaptive_deadline_s(
    predicted_s: float, state: CalibrationState, config: CalibrationConfig
) -> float:
    """The adaptive deadline ``d = (1 + eps)*s~``: a duration in seconds from the start."""
    return (1.0 + config.eps) * calibrated_s(predicted_s, state, config)
