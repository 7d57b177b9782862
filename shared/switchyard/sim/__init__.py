"""The discrete-event simulator: the registered policies over simulated instances."""

from switchyard.sim.metrics import RunMetrics
from switchyard.sim.simulator import SimulationConfig, SimulationError, Simulator

__all__ = ["RunMetrics", "SimulationConfig", "SimulationError", "Simulator"]
