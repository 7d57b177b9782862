"""A request as the simulator reads it from a trace row, and as it tracks it: mutable,
one per row."""

from __future__ import annotations

from typing import Protocol

from switchyard.contracts.messages import WorkloadType
from switchyard.policies.snapshot import RequestView
from switchyard.prediction import ServiceTimeFeatures


class LlmTraceRequest(Protocol):
    """What the simulator reads of a trace row (``loadgen``'s ``TraceRequest`` has it)."""

    @property
    def arrival_s(self) -> float: ...
    @property
    def prompt_tokens(self) -> int: ...
    @property
    def output_tokens(self) -> int: ...
    @property
    def workload(self) -> WorkloadType: ...
    @property
    def prefix_blocks(self) -> tuple[int, ...]: ...


class SimRequest:
    """The simulator's record of one request, from arrival to its last token."""

    __slots__ = (
        "arrival_s",
        "decode_to",
        "end_token",
        "features",
        "finished_s",
        "first_token_s",
        "generated_at_join",
        "index",
        "instance",
        "join_step",
        "join_token",
        "migrations",
        "output_tokens",
        "predicted_s",
        "prefill_s",
        "prefix_blocks",
        "prompt_tokens",
        "queued_at_s",
        "run_base_s",
        "run_per_step_s",
        "served_by",
        "served_on",
        "slo_s",
        "started_s",
        "view",
        "work_s",
        "workload",
    )

    def __init__(
        self,
        *,
        index: int,
        arrival_s: float,
        prompt_tokens: int,
        output_tokens: int,
        workload: WorkloadType,
        view: RequestView,
        slo_s: float,
    ) -> None:
        self.index = index
        self.arrival_s = arrival_s
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.workload = workload
        self.view = view
        self.slo_s = slo_s
        """The latency within which the request meets its SLO."""
        self.prefix_blocks: tuple[int, ...] = ()
        """Its prompt's KV-block ids (:mod:`switchyard.perf.prefix_cache`; empty: none known)."""
        # The instance running it, compared by identity only (so this module needs
        # nothing of the instance's and the two do not import each other).
        self.instance: object | None = None
        self.decode_to: tuple[object, float] | None = None
        """Its decode worker and the work counted there, when chosen at arrival
        (``SimulationConfig.decode_at_arrival``)."""
        self.queued_at_s = arrival_s
        self.served_by = ""
        """The worker type it was last queued on."""
        self.served_on = ""
        """The worker it was last queued on."""
        self.started_s = -1.0
        """When it was first admitted to a batch (negative: not yet)."""
        self.prefill_s = -1.0
        self.first_token_s = -1.0
        self.finished_s = -1.0
        self.generated_at_join = 0
        """Tokens it had generated when it joined its current batch (0: no KV cache yet)."""
        self.join_step = 0
        self.join_token = -1
        self.work_s = 0.0
        """Its predicted work as counted in its current worker's queue."""
        self.predicted_s: dict[str, float] = {}
        """Raw predictions ``s^`` per worker type, kept to score the predictor."""
        self.features: dict[str, ServiceTimeFeatures] | None = None
        """What the predictor was asked per worker type (None: not predicted), kept so
        its update on completion reuses them."""
        self.migrations = 0
        self.run_base_s = 0.0
        self.run_per_step_s = 0.0
        """Its running work left is ``run_base_s - steps_done * run_per_step_s`` in its
        worker's step count (see :class:`SimInstance`)."""
        self.end_token = -1
        """Positive while its work left counts in its worker's queued work."""

    @property
    def has_kv(self) -> bool:
        return self.generated_at_join > 0

    def service_estimate_s(self, worker_type: str) -> float:
        return self.view.calibrated_s.get(worker_type, 0.0)
