"""The worker's local queue: the requests it holds that have not started yet.

Order is the scheduler's: :attr:`Assignment.order` first (lower runs first), then
``assigned_at_s``, then arrival at this worker, so equal orders stay first-come
first-served. A request whose ``not_before_s`` lies in the future (its KV cache is still
in transfer after a migration) stays in place but is not *ready*: nothing may start it
before then.

**Tenants share the queue fairly.** An LLM request of a named tenant is ordered no
earlier than its tenant's previous request here plus that one's estimated service time
(a virtual clock, as in fair queueing): ``order = max(order, next[tenant])``, then
``next[tenant] = order + estimate_s``. The scheduler's order is arrival time for LLM
requests, so a tenant whose requests come no faster than they are served keeps
first-come first-served, while one that sends a burst has it spread over the time it
takes to serve, and another tenant's request arriving meanwhile waits behind only the
part of the burst that was due before it (rather than all of it). Within a tenant the
order stays first-come first-served. Requests without a tenant (an API without keys)
and classification requests (whose order is the window scheduler's plan) keep the
scheduler's order.

A pure data structure: no clock (callers pass ``now_s``), no I/O.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span
from switchyard.contracts.messages import Assignment, InferenceRequest, LLMPayload


class BatchKey(NamedTuple):
    """What must match for requests to share a batch: the served model and its variant.

    LLM requests use the model name for both (``tiny-lm``/``tiny-lm``); classification
    requests use ``app/variant`` as the model and the variant name as ``variant``.
    """

    model: str
    variant: str


@dataclass(frozen=True, slots=True)
class EmulatedTimes:
    """Modelled instants of an emulated request, on the backend's modelled clock (seconds
    since the backend started). They are a performance model's output, never measured."""

    started_s: float
    first_token_s: float | None = None
    finished_s: float | None = None


_sequence = itertools.count()


@dataclass(eq=False, slots=True, kw_only=True)
class WorkItem:
    """One assigned request on this worker, from intake to completion.

    Attributes:
        assignment: the scheduler's decision this item came from.
        key: the batch it can join.
        received_at_s: wall-clock time this worker took the assignment.
        prompt_tokens: prompt length as the backend counts it (0 for classification).
        output_tokens: total output the request will have (0 for classification).
        generated_tokens: output tokens produced so far, here or before a migration.
        brings_kv: it came with its KV cache (moved while running, or handed on after its
            prefill), so it decodes on without a prefill; cleared when this worker puts it
            back in its queue after taking it out of the batch (its KV cache is gone).
        estimate_s: the backend's estimate of its service time, for ``queued_work_s``.
        started_s, first_token_s: wall-clock instants on this worker.
        emulated: modelled instants, for an emulated backend.
        ran_on: where it ran when that differs by model (``cpu`` for classifiers on a
            CUDA worker); None: the backend's worker type.
        chunk_index, pending_chunk_tokens, pending_chunk_text: streaming state.
        trace_context: the trace context its assignment was handled in (the
            assignment's CONSUMER span), captured at intake: what the worker publishes
            for it later, from the engine, continues the request's trace from there.
        span: its execution span while it runs (a child of ``trace_context``).
        fair_order: its order in this worker's queue once pushed (the scheduler's,
            or its tenant's fair share of it: see the module docstring).
    """

    assignment: Assignment
    key: BatchKey
    received_at_s: float
    prompt_tokens: int = 0
    output_tokens: int = 0
    generated_tokens: int = 0
    brings_kv: bool = False
    estimate_s: float = 0.0
    started_s: float | None = None
    first_token_s: float | None = None
    emulated: EmulatedTimes | None = None
    ran_on: str | None = None
    chunk_index: int = 0
    pending_chunk_tokens: int = 0
    pending_chunk_text: list[str] = field(default_factory=list)
    trace_context: Context | None = None
    span: Span | None = None
    fair_order: float | None = None
    seq: int = field(default_factory=lambda: next(_sequence))

    @property
    def request(self) -> InferenceRequest:
        return self.assignment.request

    @property
    def request_id(self) -> str:
        return self.assignment.request.request_id

    @property
    def epoch(self) -> int:
        return self.assignment.epoch

    @property
    def not_before_s(self) -> float | None:
        return self.assignment.not_before_s

    @property
    def streaming(self) -> bool:
        payload = self.assignment.request.payload
        return isinstance(payload, LLMPayload) and payload.stream

    @property
    def context_tokens(self) -> int:
        """Tokens in this request's context now: prompt plus output generated so far."""
        return self.prompt_tokens + self.generated_tokens

    def ready(self, now_s: float) -> bool:
        """Whether it may start at ``now_s`` (no KV cache still in transfer)."""
        return self.not_before_s is None or self.not_before_s <= now_s

    def sort_key(self) -> tuple[float, float, int]:
        order = self.assignment.order if self.fair_order is None else self.fair_order
        return (order, self.assignment.assigned_at_s, self.seq)

    @contextlib.contextmanager
    def in_trace(self) -> Iterator[None]:
        """Make its execution span (or, before it started, the context its assignment was
        taken in) current: what is published inside continues the request's trace."""
        context = self.trace_context
        if self.span is not None:
            context = trace.set_span_in_context(self.span, context)
        if context is None:
            yield
            return
        token = otel_context.attach(context)
        try:
            yield
        finally:
            otel_context.detach(token)


class LocalQueue:
    """Waiting requests in scheduler order, indexed by request id (one entry per request)."""

    def __init__(self) -> None:
        self._keys: list[tuple[float, float, int]] = []
        self._items: list[WorkItem] = []
        self._by_id: dict[str, WorkItem] = {}
        self._tenant_next: dict[str, float] = {}
        """Per tenant: the earliest order its next LLM request may take."""

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[WorkItem]:
        """In queue order."""
        return iter(list(self._items))

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._by_id

    def get(self, request_id: str) -> WorkItem | None:
        return self._by_id.get(request_id)

    def push(self, item: WorkItem) -> None:
        """Add ``item`` in order.

        Raises:
            ValueError: the queue already holds this request (remove the old copy first).
        """
        if item.request_id in self._by_id:
            raise ValueError(f"request {item.request_id!r} is already queued")
        if item.fair_order is None:  # once: a request put back keeps its place
            item.fair_order = self._fair_order(item)
        key = item.sort_key()
        index = bisect.bisect_right(self._keys, key)
        self._keys.insert(index, key)
        self._items.insert(index, item)
        self._by_id[item.request_id] = item

    def _fair_order(self, item: WorkItem) -> float:
        request = item.request
        order = item.assignment.order
        if request.tenant is None or not isinstance(request.payload, LLMPayload):
            return order
        order = max(order, self._tenant_next.get(request.tenant, -math.inf))
        self._tenant_next[request.tenant] = order + max(0.0, item.estimate_s)
        return order

    def remove(self, request_id: str) -> WorkItem | None:
        """Take a request out (started, migrated or superseded); None when not queued."""
        item = self._by_id.pop(request_id, None)
        if item is None:
            return None
        index = bisect.bisect_left(self._keys, item.sort_key())
        # Keys are unique (seq breaks ties), so the item sits exactly at ``index``.
        del self._keys[index]
        del self._items[index]
        return item

    def take(self, items: Sequence[WorkItem]) -> None:
        """Remove every item of ``items`` (a batch that starts)."""
        for item in items:
            self.remove(item.request_id)

    def ready(self, now_s: float) -> list[WorkItem]:
        """The items that may start at ``now_s``, in queue order."""
        return [item for item in self._items if item.ready(now_s)]

    def has_ready(self, now_s: float) -> bool:
        return any(item.ready(now_s) for item in self._items)

    def next_ready_s(self, now_s: float) -> float | None:
        """The earliest ``not_before_s`` still ahead of ``now_s``; None when no item waits on one."""
        pending = [
            item.not_before_s
            for item in self._items
            if item.not_before_s is not None and item.not_before_s > now_s
        ]
        return min(pending) if pending else None

    def waiting_tokens(self) -> int:
        """Context tokens of every waiting request (prompt plus output generated elsewhere)."""
        return sum(item.context_tokens for item in self._items)
