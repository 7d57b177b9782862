"""The discrete-event simulator: the registered policies over simulated instances."""

from research.native import activate

NATIVE = activate(__path__)
"""Whether the simulator's hot modules run compiled (:mod:`research.native`)."""

from research.llm.config import SimulationConfig, SimulationError  # noqa: E402
from research.llm.metrics import RunMetrics  # noqa: E402
from research.llm.simulator import Simulator  # noqa: E402

__all__ = ["NATIVE", "RunMetrics", "SimulationConfig", "SimulationError", "Simulator"]
