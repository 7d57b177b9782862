"""What the multi-model simulator refuses, each naming the problem."""

from __future__ import annotations

from switchyard.errors import SwitchyardError

__all__ = ["PlanError", "RoutingError", "SimulationInputError"]


class PlanError(SwitchyardError):
    """A placement plan was refused (overflow, duplicate load, unknown names)."""


class RoutingError(SwitchyardError):
    """A router chose a worker that does not hold the model."""


class SimulationInputError(SwitchyardError, ValueError):
    """The workload or workers cannot be simulated (cycle, unknown model, bad config)."""
