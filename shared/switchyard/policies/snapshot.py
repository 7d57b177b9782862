"""Frozen views of the cluster that LLM scheduling policies decide over.

A policy never sees a live object: the shell (the simulator, or the scheduler service)
builds these views from whatever it holds (simulated instances, Redis state fed by
heartbeats) and hands them over. Everything a policy may use is here, with units in
the names; nothing here can be mutated, so a policy cannot change the world it reads.

Work is measured in *seconds of predicted service*: the calibrated prediction ``s~`` of
a waiting request counts in full, a running request counts for what its prediction says
is left. It is a load figure, not a waiting time: a worker that batches 30 requests
drains 30 of those seconds at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from switchyard.contracts.messages import WorkloadType


class WorkerRole(StrEnum):
    """What a worker runs: both phases, or one of them (stage-aware pools)."""

    MIXED = "mixed"
    PREFILL = "prefill"
    DECODE = "decode"


class RequestPhase(StrEnum):
    WAITING = "waiting"
    RUNNING = "running"


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestView:
    """One LLM request to place.

    ``predicted_s`` and ``calibrated_s`` map a worker type (GPU profile) to the raw
    prediction ``s^`` and the calibrated ``s~`` of the request's service time there;
    both are empty when the policy runs without prediction. ``true_service_s`` is only
    filled for a clairvoyant reference policy.
    """

    request_id: str
    arrival_s: float
    prompt_tokens: int
    workload: WorkloadType
    model: str
    output_tokens_hint: int | None = None
    predicted_s: Mapping[str, float] = field(default_factory=dict)
    calibrated_s: Mapping[str, float] = field(default_factory=dict)
    deadline_s: float | None = None
    """Adaptive deadline, absolute: arrival plus ``(1 + eps) * s~``."""
    true_service_s: Mapping[str, float] | None = None
    cached_tokens: Mapping[str, int] = field(default_factory=dict)
    """Worker id -> prompt tokens of this request that worker's prefix cache holds
    (absent: none, or not known)."""
    ttft_slo_s: float | None = None
    """Its time-to-first-token objective, seconds from arrival (None: none set)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerView:
    """One worker (one model instance on one or more GPUs), as last reported."""

    worker_id: str
    worker_type: str
    """Its performance profile, e.g. ``a100-80gb/llama-2-7b``; keys ``RequestView.predicted_s``."""
    role: WorkerRole = WorkerRole.MIXED
    alive: bool = True
    waiting: int
    """Requests queued, not yet admitted to the running batch."""
    running: int
    """Requests in the running batch (prefilling or decoding)."""
    max_slots: int
    kv_used_tokens: int
    """KV-cache tokens held or reserved by the running batch."""
    kv_capacity_tokens: int
    queued_work_s: float
    """Predicted seconds of work outstanding (waiting in full, running what is left)."""
    queued_tokens: int
    """Prompt tokens waiting plus KV tokens of the running batch: work without prediction."""
    utilization: float
    """Fraction of the worker's binding resource in use (slots or KV cache), 1.0 when requests wait."""
    decode_step_s: float
    """Duration of one decode step of the current batch (0.0 when idle)."""
    decode_step_per_seq_s: float
    """What one more sequence adds to a decode step (profile constant)."""
    decode_step_per_kv_token_s: float
    """What one more KV token adds to a decode step (profile constant)."""
    kv_bytes_per_token: int
    interconnect_bytes_per_s: float
    prefill_per_token_s: float = 0.0
    """What one more prompt token adds to a prefill (profile constant; 0: not known)."""
    prefill_per_token_sq_s: float = 0.0
    """What the square of a prompt's length adds to its prefill (attention; profile
    constant): a prompt of ``p`` tokens whose first ``c`` are cached is spared
    ``per_token * c + per_token_sq * (p**2 - (p - c)**2)``."""
    prefill_base_s: float = 0.0
    """The fixed time of a prefill iteration (profile constant; 0: not known)."""
    chunk_budget_tokens: int | None = None
    """Tokens one iteration processes when the worker prefills in chunks (chunked
    prefill's budget, vLLM's ``max_num_batched_tokens``); None: whole prompts."""
    prefilling_tokens: int = 0
    """Prompt tokens of the whole-prompt prefill iteration in progress, counted in
    ``running`` and ``kv_used_tokens`` (0: none, or not reported): a request queued
    behind it starts when it ends."""

    def prefill_compute_s(self, prompt_tokens: int, cached_tokens: int) -> float:
        """Seconds of prefill compute the prompt needs on this worker past a cached prefix
        of ``cached_tokens``, whole or in chunks alike (the per-iteration base left out)."""
        rest = prompt_tokens - cached_tokens
        return self.prefill_per_token_s * rest + self.prefill_per_token_sq_s * rest * rest

    def uncached_prefill_s(self, prompt_tokens: int, cached_tokens: int) -> float:
        """Seconds this worker's prefill of the prompt takes past a cached prefix of
        ``cached_tokens``, with its running batch as reported.

        Whole prompts: its compute alone, the profile's per-iteration base left out
        (milliseconds). In chunks: each chunk is what the budget leaves after a token
        for every running request, and each chunk's iteration also pays the larger of
        that base and the running batch's decode step (the decodes ride along), which
        for a long prompt on a small budget is tenths of a second.
        """
        compute_s = self.prefill_compute_s(prompt_tokens, cached_tokens)
        rest = prompt_tokens - cached_tokens
        budget = self.chunk_budget_tokens
        if budget is None or rest <= 0:
            return compute_s
        iterations = -(-rest // max(1, budget - self.running))
        step_s = self.decode_step_s
        if self.prefill_base_s > step_s:
            step_s = self.prefill_base_s
        return compute_s + iterations * step_s

    def prefill_saved_s(self, prompt_tokens: int, cached_tokens: int) -> float:
        """Prefill seconds a cached prefix of ``cached_tokens`` spares this worker."""
        rest = prompt_tokens - cached_tokens
        return self.prefill_per_token_s * cached_tokens + self.prefill_per_token_sq_s * (
            prompt_tokens * prompt_tokens - rest * rest
        )

    @property
    def waiting_prompt_tokens(self) -> int:
        """Prompt tokens of the waiting requests: ``queued_tokens`` less the running
        batch's KV (as workers report both; never below 0)."""
        waiting = self.queued_tokens - self.kv_used_tokens
        return waiting if waiting > 0 else 0

    @property
    def outstanding(self) -> int:
        return self.waiting + self.running

    @property
    def free_slots(self) -> int:
        return max(0, self.max_slots - self.running)

    @property
    def kv_free_tokens(self) -> int:
        return max(0, self.kv_capacity_tokens - self.kv_used_tokens)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSnapshot:
    """Every worker at one instant. ``now_s`` is the only clock a policy may read."""

    now_s: float
    workers: tuple[WorkerView, ...]

    @property
    def utilization(self) -> float:
        """Mean utilisation over live workers (0.0 for an empty cluster)."""
        alive = [w.utilization for w in self.workers if w.alive]
        return sum(alive) / len(alive) if alive else 0.0

    def with_role(self, role: WorkerRole) -> tuple[WorkerView, ...]:
        return tuple(w for w in self.workers if w.alive and w.role is role)

    def eligible(self) -> tuple[WorkerView, ...]:
        """Live workers that take new requests (mixed, or the prefill pool)."""
        workers = self.workers
        decode = WorkerRole.DECODE
        for w in workers:
            if not w.alive or w.role is decode:
                return tuple([w for w in workers if w.alive and w.role is not decode])
        return workers  # every one is eligible (the usual case): no copy needed


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueScope:
    """Which queued requests a rebalancer wants in its snapshot.

    Listing every waiting request of an overloaded cluster on every round would cost
    the shell more than the decision is worth (and a live rebalancer reading Redis
    could not afford it either), so a rebalancer asks for what it can use.
    """

    waiting_tail: int | None = None
    """The last this-many waiting requests of each worker, in queue order (the ones
    facing the longest completion); ``None`` for all, ``0`` for none."""
    running: bool = True
    """Whether the running requests are listed too."""

    def __post_init__(self) -> None:
        if self.waiting_tail is not None and self.waiting_tail < 0:
            raise ValueError(f"waiting_tail must be >= 0 or None, got {self.waiting_tail}")


@dataclass(frozen=True, slots=True, kw_only=True)
class QueuedRequestView:
    """A request already on a worker, as the rebalancer sees it."""

    request: RequestView
    worker_id: str
    phase: RequestPhase
    queued_at_s: float
    work_ahead_s: float
    """Predicted work queued ahead of it on its worker (running requests count in full)."""
    remaining_s: float
    """Its own predicted remaining service time on its current worker."""
    kv_tokens: int
    """KV-cache tokens it holds (0 while waiting): what a migration must move."""
    generated_tokens: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class RebalanceSnapshot:
    """The cluster plus the requests a rebalancer may move, as its :class:`QueueScope` asked."""

    cluster: ClusterSnapshot
    queued: tuple[QueuedRequestView, ...]
    recent_slo_violation_rate: float
    """Share of the recent completions that missed their SLO (0..1)."""
