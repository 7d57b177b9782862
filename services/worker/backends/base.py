"""The one interface every execution backend of a worker implements.

A worker's engine (:class:`services.worker.service.WorkerService`) owns the queue and the
bus; a backend owns execution. The engine calls :meth:`Backend.step` in a loop, and the
backend takes what it starts from the queue and reports through an :class:`ExecutionSink`:
``started`` when requests start, ``tokens`` as output is generated (for streaming),
``finished`` or ``failed`` at the end. One step is whatever unit of work the backend
runs at a time, which lets both shapes of batching fit:

- continuous batching (the emulated LLM): one step is one engine iteration, a prefill of
  newly admitted requests or one decode step of the running batch; requests join and
  leave the batch between steps, and a running request can be preempted (migrated);
- static batches (the torch classifier and tiny language model): one step picks a
  batch of one model and runs it to completion.

The engine never looks inside a model, and a backend never touches the bus.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from switchyard.contracts.messages import (
    Assignment,
    ClassificationResult,
    LLMResult,
    PlacedModel,
    ResourceVector,
    StageResult,
)
from switchyard.errors import SwitchyardError

from services.worker.queue import BatchKey, LocalQueue, WorkItem

Result = LLMResult | ClassificationResult | StageResult


class UnsupportedWorkError(SwitchyardError):
    """An assignment this backend cannot serve (unknown model or application, wrong kind,
    a request that can never fit); the message says why, for the FAILED completion."""


@dataclass(frozen=True, slots=True)
class WorkSpec:
    """How a backend sizes an assignment at intake.

    Attributes:
        key: the batch it can join.
        prompt_tokens: its prompt length as this backend counts it (0: classification).
        output_tokens: the output it will have in all (0: classification).
        estimate_s: the service time it needs alone, in wall seconds.
    """

    key: BatchKey
    prompt_tokens: int = 0
    output_tokens: int = 0
    estimate_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Preemption:
    """A running request taken out of the batch for migration, or after its prefill for
    its decode worker."""

    item: WorkItem
    kv_tokens: int
    """Tokens of KV cache to move: its prompt plus the output generated so far."""
    transfer_s: float
    """Wall seconds the transfer takes (modelled, and scaled like the emulation's time)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendLoad:
    """What a heartbeat reports about execution, at one instant.

    ``running`` pairs each running item with the wall seconds it still needs;
    ``waiting_s`` is the estimate of the waiting items given to :meth:`Backend.load`.
    ``placed``, ``speed`` and ``gpu_type`` are a multi-model worker's (``emulated-models``):
    the models placed on it, its service-time divisor and its GPU type; other backends
    leave the defaults (nothing placed).
    """

    running: Sequence[tuple[WorkItem, float]]
    waiting_s: float
    utilization: float
    max_slots: int
    kv_used_tokens: int = 0
    kv_capacity_tokens: int = 0
    running_kv_tokens: int = 0
    decode_step_s: float = 0.0
    prefill_share: float = 0.0
    """An LLM backend's recent share of its busy time spent prefilling (0..1; 0: unknown)."""
    chunked_prefill_tokens: int | None = None
    """The chunked-prefill budget of an LLM backend that prefills in chunks."""
    prefilling_tokens: int = 0
    """Prompt tokens of the whole-prompt prefill iteration in progress (0: none)."""
    capacity: ResourceVector = field(default_factory=ResourceVector)
    free: ResourceVector = field(default_factory=ResourceVector)
    kv_cache_free_bytes: int | None = None
    placed: Sequence[PlacedModel] = ()
    speed: float = 1.0
    gpu_type: str | None = None

    @property
    def queued_work_s(self) -> float:
        """Work held in wall seconds: the waiting requests in full, running what is left."""
        return self.waiting_s + sum(left_s for _, left_s in self.running)


class ExecutionSink(Protocol):
    """Where a backend reports progress; the worker service implements it."""

    async def started(self, items: Sequence[WorkItem]) -> None:
        """``items`` left the queue and started (their swap-in, prefill or batch began)."""
        ...

    async def tokens(self, item: WorkItem, new_tokens: int, text: str) -> None:
        """``item`` generated ``new_tokens`` more output tokens, decoding to ``text``."""
        ...

    async def finished(self, item: WorkItem, result: Result) -> None:
        """``item`` is done; ``result`` is its answer."""
        ...

    async def prefill_done(self, item: WorkItem, handoff: Preemption) -> None:
        """``item``'s prefill gave its first token and, its assignment naming a decode
        worker, it left the batch with its KV cache (``handoff``): hand it on."""
        ...

    async def failed(self, item: WorkItem, error: str) -> None:
        """``item`` could not be served; ``error`` says why (in the FAILED completion)."""
        ...


class Backend(Protocol):
    """An execution backend: the models a worker serves and how it runs them.

    Attributes:
        name: the backend's name in heartbeats (``emulated-llm``, ``torch``).
        emulated: True when it spends modelled time instead of running a model; every
            completion, chunk and heartbeat of the worker then says ``emulated``.
        worker_type: the GPU name (emulated) or the torch device (``cpu``, ``cuda``).
        profile: the performance profile (``GPU/model``) of an emulated LLM, else None.
    """

    @property
    def name(self) -> str: ...

    @property
    def emulated(self) -> bool: ...

    @property
    def worker_type(self) -> str: ...

    @property
    def profile(self) -> str | None: ...

    def servable_models(self) -> list[str]:
        """Every model this backend can serve (loading it first when not resident)."""
        ...

    def resident_models(self) -> list[str]:
        """The models in memory now."""
        ...

    def describe(self, assignment: Assignment) -> WorkSpec:
        """Size an assignment at intake.

        Raises:
            UnsupportedWorkError: this backend cannot serve it; the message says why.
        """
        ...

    def has_running(self) -> bool:
        """Whether requests are in progress between steps (continuous batching)."""
        ...

    async def step(
        self,
        queue: LocalQueue,
        sink: ExecutionSink,
        *,
        admit: bool,
        wake: asyncio.Event | None = None,
    ) -> bool:
        """Run one unit of work; False when there was nothing it could do.

        Takes the requests it starts out of ``queue`` (only ready ones, and none when
        ``admit`` is False: the worker is draining and only finishes what runs).
        Reports every request it took through ``sink``, each exactly once as finished
        or failed, unless it was preempted. Never raises for a request's own fault.
        ``wake`` is set when new work arrives meanwhile: a backend whose unit of work
        is long and divisible may end it early so the work is admitted sooner.
        """
        ...

    def preempt(self, request_id: str) -> Preemption | None:
        """Take a running request out for migration; None when it is not running here or
        this backend cannot move running work (a static batch runs to its end)."""
        ...

    def load(self, waiting: Sequence[WorkItem]) -> BackendLoad:
        """Load, queue and resource figures for a heartbeat, given the waiting items."""
        ...

    def wall_s(self, modelled_s: float) -> float:
        """Wall seconds that ``modelled_s`` seconds of this backend's time take
        (the emulation's time scale; identity for real backends)."""
        ...
