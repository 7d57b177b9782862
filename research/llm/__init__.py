"""The discrete-event simulator: the registered policies over simulated instances."""

from research.llm.config import SimulationConfig, SimulationError
from research.llm.metrics import RunMetrics
from research.llm.simulator import Simulator

__all__ = ["RunMetrics", "SimulationConfig", "SimulationError", "Simulator"]
