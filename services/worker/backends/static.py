"""A backend of static batches over one or more runners that share a model cache.

The torch worker serves two kinds of model behind one :class:`Backend`: the
classification variants (:class:`~services.worker.backends.classifier.ClassifierRunner`)
and the tiny language model (:class:`~services.worker.backends.torch_lm.TinyLmRunner`).
Each step picks the next batch (:func:`~services.worker.batching.pick_batch`: the head of
the queue and the ready requests of its model) and hands it to the runner that owns the
model, which runs it to completion. A running batch cannot be preempted: migrations move
only waiting requests of this backend.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Protocol

from switchyard.contracts.messages import Assignment, ResourceVector

from services.worker.backends.base import (
    BackendLoad,
    ExecutionSink,
    Preemption,
    Result,
    UnsupportedWorkError,
    WorkSpec,
)
from services.worker.batching import pick_batch
from services.worker.model_cache import ModelCache
from services.worker.queue import BatchKey, LocalQueue, WorkItem


class StaticRunner(Protocol):
    """Runs batches of the models it owns."""

    def servable_models(self) -> list[str]: ...

    def owns(self, key: BatchKey) -> bool: ...

    def describe(self, assignment: Assignment) -> WorkSpec:
        """As :meth:`Backend.describe`; raises :class:`UnsupportedWorkError`."""
        ...

    def estimate_batch_s(self, items: Sequence[WorkItem]) -> float:
        """Wall seconds to serve ``items`` (all of one key)."""
        ...

    async def run(self, batch: list[WorkItem], sink: ExecutionSink) -> None:
        """Run ``batch`` (one key) to completion, reporting each item once."""
        ...

    def decode_step_s(self) -> float:
        """Wall seconds of its current decode step; 0.0 when not generating."""
        ...


class _Tracking:
    """Passes reports on, remembering which items were reported finished or failed."""

    def __init__(self, sink: ExecutionSink) -> None:
        self.sink = sink
        self.done: set[int] = set()

    async def started(self, items: Sequence[WorkItem]) -> None:
        await self.sink.started(items)

    async def tokens(self, item: WorkItem, new_tokens: int, text: str) -> None:
        await self.sink.tokens(item, new_tokens, text)

    async def finished(self, item: WorkItem, result: Result) -> None:
        self.done.add(id(item))
        await self.sink.finished(item, result)

    async def failed(self, item: WorkItem, error: str) -> None:
        self.done.add(id(item))
        await self.sink.failed(item, error)

    async def prefill_done(self, item: WorkItem, handoff: Preemption) -> None:
        self.done.add(id(item))
        await self.sink.prefill_done(item, handoff)


class StaticBatchBackend:
    """Static batching over ``runners``; the torch backend of a worker.

    Args:
        runners: who runs which models; the first that owns a request serves it.
        cache: the model cache the runners share (for resident models and memory).
        worker_type: ``cpu`` or ``cuda``.
        max_batch: the most requests in one batch.
    """

    name = "torch"
    emulated = False
    profile: str | None = None

    def __init__(
        self,
        runners: Sequence[StaticRunner],
        cache: ModelCache,
        *,
        worker_type: str,
        max_batch: int,
    ) -> None:
        self.runners = tuple(runners)
        self.cache = cache
        self._worker_type = worker_type
        self.max_batch = max_batch
        self._running: list[WorkItem] = []
        self._busy_since_s: float | None = None

    @property
    def worker_type(self) -> str:
        return self._worker_type

    def servable_models(self) -> list[str]:
        return [model for runner in self.runners for model in runner.servable_models()]

    def resident_models(self) -> list[str]:
        return self.cache.resident()

    def wall_s(self, modelled_s: float) -> float:
        return modelled_s

    def describe(self, assignment: Assignment) -> WorkSpec:
        problems: list[str] = []
        for runner in self.runners:
            try:
                return runner.describe(assignment)
            except UnsupportedWorkError as exc:
                problems.append(str(exc))
        request = assignment.request
        what = getattr(request.payload, "model", None) or request.app
        raise UnsupportedWorkError(
            f"this torch worker cannot serve {request.payload.kind.value} request for "
            f"{what!r}: " + "; ".join(problems)
        )

    def _runner(self, key: BatchKey) -> StaticRunner:
        for runner in self.runners:
            if runner.owns(key):
                return runner
        raise UnsupportedWorkError(f"no runner serves model {key.model!r}")

    def has_running(self) -> bool:
        # A static batch runs inside one step: between steps nothing is in progress.
        return False

    async def step(
        self,
        queue: LocalQueue,
        sink: ExecutionSink,
        *,
        admit: bool,
        wake: asyncio.Event | None = None,
    ) -> bool:
        # A static batch is one model call: there is nothing to end early for ``wake``.
        if not admit:
            return False
        batch = pick_batch(queue.ready(time.time()), self.max_batch)
        if not batch:
            return False
        queue.take(batch)
        tracking = _Tracking(sink)
        self._running = batch
        self._busy_since_s = time.time()
        try:
            await self._runner(batch[0].key).run(batch, tracking)
        except Exception as exc:
            # A bug or a broken model must not take the worker down: fail what is left.
            for item in batch:
                if id(item) not in tracking.done:
                    await sink.failed(item, f"{type(exc).__name__}: {exc}")
        finally:
            self._running = []
            self._busy_since_s = None
        return True

    def preempt(self, request_id: str) -> Preemption | None:
        return None

    def load(self, waiting: Sequence[WorkItem]) -> BackendLoad:
        groups: dict[BatchKey, list[WorkItem]] = defaultdict(list)
        for item in waiting:
            groups[item.key].append(item)
        waiting_s = 0.0
        for key, items in groups.items():
            try:
                waiting_s += self._runner(key).estimate_batch_s(items)
            except UnsupportedWorkError:
                continue
        running = list(self._running)
        running_s = 0.0
        if running:
            try:
                total_s = self._runner(running[0].key).estimate_batch_s(running)
            except UnsupportedWorkError:
                total_s = 0.0
            elapsed_s = time.time() - (self._busy_since_s or time.time())
            running_s = max(0.0, total_s - elapsed_s)
        utilization = 1.0 if waiting else min(1.0, len(running) / self.max_batch)
        cpu = float(os.cpu_count() or 1)
        gpu = 1.0 if self._worker_type == "cuda" else 0.0
        decode_step_s = max((runner.decode_step_s() for runner in self.runners), default=0.0)
        return BackendLoad(
            running=[(item, running_s) for item in running],
            waiting_s=waiting_s,
            utilization=utilization,
            max_slots=self.max_batch,
            decode_step_s=decode_step_s,
            capacity=ResourceVector(cpu=cpu, gpu=gpu, mem_bytes=self.cache.budget_bytes),
            free=ResourceVector(
                cpu=cpu * (1.0 - utilization),
                gpu=gpu * (1.0 - utilization),
                mem_bytes=self.cache.free_bytes,
            ),
        )
