"""A multi-model simulation run's configuration and what it returns."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from research.multimodel.errors import SimulationInputError

__all__ = ["MultiModelResult", "MultiModelSimConfig", "UpdateRecord"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MultiModelSimConfig:
    """How a multi-model run is carried out (all times in virtual seconds)."""

    update_hz: float = 1.0
    """Periodic placement updates per second."""
    decision_base_s: float = 0.05
    """Routing pause charged for every update."""
    decision_per_change_s: float = 0.01
    """Extra routing pause per load or eviction of the update's plan."""
    load_blocks_worker: bool = False
    """A load blocks its worker from starting stages until it is done."""
    large_change: float | None = 0.5
    """Relative demand change that triggers an extra update; ``None`` turns it off."""
    large_change_min_gap_s: float = 1.0
    """No extra update sooner than this after the previous update."""
    demand_tau_s: float = 5.0
    """Time constant of the demand EWMA."""
    window_s: float = 5.0
    """Width of the latency windows of the metrics (stability, responsiveness)."""
    max_drain_s: float = 600.0
    """The run stops this long after the last arrival even if requests are unfinished."""
    seed: int = 0
    labels_from_ids: bool = False
    """Draw a stage's label (a classifier's answer, an LLM judge's verdict) from a hash of
    ``"{request_id}.{stage}"``, as the emulated workers do, instead of the seeded
    generator: a workload replayed with the live calls' ids then takes their branches."""
    llm_policy: str = "jsq"
    """The registered LLM policy that places LLM stages among their application's workers
    (:mod:`research.multimodel.llm_stages`)."""

    def __post_init__(self) -> None:
        positive = {
            "update_hz": self.update_hz,
            "demand_tau_s": self.demand_tau_s,
            "window_s": self.window_s,
        }
        for name, value in positive.items():
            if not (math.isfinite(value) and value > 0):
                raise SimulationInputError(f"{name} must be a finite number > 0, got {value!r}")
        non_negative = {
            "decision_base_s": self.decision_base_s,
            "decision_per_change_s": self.decision_per_change_s,
            "large_change_min_gap_s": self.large_change_min_gap_s,
            "max_drain_s": self.max_drain_s,
        }
        for name, value in non_negative.items():
            if not (math.isfinite(value) and value >= 0):
                raise SimulationInputError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.large_change is not None and not (
            math.isfinite(self.large_change) and self.large_change > 0
        ):
            raise SimulationInputError(
                f"large_change must be > 0 or None, got {self.large_change!r}"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class UpdateRecord:
    """One placement update."""

    at_s: float
    extra: bool
    """Triggered by a large demand change rather than the period."""
    loads: int
    evictions: int
    decision_wall_s: float
    """Wall-clock seconds the policy's ``place`` took (measured, not simulated)."""
    pause_s: float
    """Routing pause charged in virtual time."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MultiModelResult:
    """What a run produced; :mod:`research.multimodel.metrics` turns it into figures.

    Per-request tuples follow the workload's request order. An unfinished request (the run
    stopped ``max_drain_s`` after the last arrival) has ``finished`` False and a censored
    latency: end of run minus arrival.
    """

    workload: str
    policy: str
    config: MultiModelSimConfig
    arrivals_s: tuple[float, ...]
    latencies_s: tuple[float, ...]
    slo_s: tuple[float, ...]
    finished: tuple[bool, ...]
    end_s: float
    """Virtual time the run ended (the last completion, or the drain cutoff)."""
    worker_ids: tuple[str, ...]
    worker_busy_s: tuple[float, ...]
    """Per worker: seconds with at least one stage in service."""
    worker_share_s: tuple[float, ...]
    """Per worker: integral over time of the dominant share of the resources of the
    replicas serving a stage (capped at 1), in share-seconds."""
    updates: tuple[UpdateRecord, ...]
    stages_run: int
    """Stages answered, model and LLM stages alike."""
    step_at_s: float | None
    llm_worker_busy_s: Mapping[str, float] = field(default_factory=dict)
    """Per LLM worker of LLM stages: seconds with a prefill or a decode step running."""

    @property
    def placement_changes(self) -> int:
        """Loads plus evictions carried out over the run."""
        return sum(u.loads + u.evictions for u in self.updates)
