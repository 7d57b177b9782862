"""The discrete-event simulator: the registered policies over simulated instances."""

from research.llm.metrics import RunMetrics
from research.llm.simulator import SimulationConfig, SimulationError, Simulator

__all__ = ["RunMetrics", "SimulationConfig", "SimulationError", "Simulator"]
