"""The discrete-event simulator: the registered policies over simulated instances."""

from switchyard.native import compiled

from research.llm import simulator as _simulator
from research.llm.config import SimulationConfig, SimulationError
from research.llm.metrics import RunMetrics
from research.llm.simulator import Simulator

NATIVE = compiled(_simulator)
"""Whether the simulator's hot modules run compiled (:mod:`switchyard.native`)."""

__all__ = ["NATIVE", "RunMetrics", "SimulationConfig", "SimulationError", "Simulator"]
