"""A simulation's settings: the cluster, how requests are predicted and how they are
judged; checked when made, so a bad one fails before any run."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from switchyard.contracts.messages import WorkloadType
from switchyard.prediction import CalibrationConfig
from switchyard.slo import DEFAULT_TOKEN_SLOS, TokenSlo

from research.llm.disaggregation import pool_problem

__all__ = ["SimulationConfig", "SimulationError"]


class SimulationError(ValueError):
    """A simulation that cannot run as configured; the message says why."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SimulationConfig:
    """One simulated cluster and how requests are predicted and judged."""

    workers: int
    profiles: tuple[str, ...] = ("a100-80gb/llama-2-7b",)
    """Performance profiles, assigned to workers in turn (several: a mixed cluster)."""
    slo_scale: float = 5.0
    """A request meets its end-to-end objective when its latency is at most this times
    its service time on an idle worker of the first profile."""
    token_slos: Mapping[WorkloadType, TokenSlo] = field(default_factory=lambda: DEFAULT_TOKEN_SLOS)
    """TTFT and TPOT objectives per workload class (:mod:`switchyard.slo`)."""
    predictor: str = "linear"
    predictor_error: float = 0.0
    """Multiplicative error injected into every prediction (0.4 = 40 %)."""
    calibration: CalibrationConfig = field(default_factory=CalibrationConfig)
    train_requests: int = 2000
    """Requests of the trace (drawn at random) the predictor is trained on offline."""
    online_updates: bool = True
    """Update the predictor and the calibration from every completion."""
    violation_window: int = 100
    """Completions over which the rebalancer's recent SLO-violation rate is measured."""
    seed: int = 0
    max_batch_slots: int | None = None
    """The most requests a worker runs at once, in place of its profile's (1: one at a
    time, the queueing-dominated regime of :mod:`research.llm.regimes`); None: the
    profile's."""
    chunked_prefill_tokens: int | None = None
    """Chunked prefill (Sarathi-Serve; vLLM's ``enable_chunked_prefill``) with this token
    budget per iteration (``max_num_batched_tokens``): running requests decode one token
    each and prompts are prefilled in chunks from what is left
    (:mod:`research.llm.chunked`). None: off, every prompt prefilled whole in an
    iteration of its own (the default). It must cover every profile's batch slots, as
    vLLM requires of ``max_num_batched_tokens`` (the simulator checks)."""
    prefill_workers: int | None = None
    """Prefill/decode disaggregation (DistServe, Splitwise, Dynamo): the first this-many
    workers only prefill, the rest only decode, and any policy places each phase over
    its pool (:mod:`research.llm.disaggregation`). None: off, every worker runs both
    phases (the default; a stage-aware policy such as ``splitwise`` still splits the
    cluster by its own ``prefill_fraction``). Both pools must keep a worker."""
    decode_at_arrival: bool = False
    """With ``prefill_workers``: choose each request's decode worker on arrival, with its
    prefill worker (Splitwise's cluster scheduler, llm-d's P/D profile, and the live
    placer do), instead of when its prefill ends; the chosen worker counts it as
    waiting, with its predicted work, until it arrives there."""
    heartbeat_s: float | None = None
    """Policies decide on each worker as its last heartbeat showed it, every this-many
    seconds, plus the requests sent to it since (counted as waiting), as the live
    placer does (:mod:`research.llm.heard`). None: on every worker's state at that
    instant (the default)."""

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise SimulationError(f"workers must be at least 1, got {self.workers}")
        if not self.profiles:
            raise SimulationError("at least one performance profile is needed")
        if self.slo_scale <= 0:
            raise SimulationError(f"slo-scale must be > 0, got {self.slo_scale}")
        if not 0.0 <= self.predictor_error <= 1.0:
            raise SimulationError(
                f"predictor-error must be within [0, 1], got {self.predictor_error}"
            )
        slots = self.max_batch_slots
        if slots is not None and (isinstance(slots, bool) or slots < 1):
            raise SimulationError(f"max-batch-slots must be at least 1, got {slots!r}")
        chunked = self.chunked_prefill_tokens
        if chunked is not None and (isinstance(chunked, bool) or chunked < 1):
            raise SimulationError(
                f"chunked-prefill must be a positive number of tokens, got {chunked!r}"
            )
        beat = self.heartbeat_s
        if beat is not None and (
            isinstance(beat, bool) or not (isinstance(beat, float | int) and 0 < beat < math.inf)
        ):
            raise SimulationError(f"heartbeat must be a positive number of seconds, got {beat!r}")
        if self.prefill_workers is not None:
            problem = pool_problem(self.workers, self.prefill_workers)
            if problem is not None:
                raise SimulationError(problem)
        elif self.decode_at_arrival:
            raise SimulationError("decode-at-arrival needs prefill-workers (the pools)")
