"""A fake stage worker for the ingress's pipeline tests: it stands in for the scheduler
and an ``emulated-models`` worker. It takes each stage request off
``switchyard.stage-requests``, decides and starts it in the request ledger, and answers
with a Completion carrying a StageResult to the asking replica's partition (the answer
recorded first, as a worker does). A stage's output names its model and its inputs, so a
test sees what was passed along.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from switchyard.bus import Bus
from switchyard.contracts.messages import (
    Assignment,
    Completion,
    CompletionStatus,
    InferenceRequest,
    RequestTimeline,
    StagePayload,
    StageResult,
)
from switchyard.contracts.topics import ANSWERS, STAGE_REQUESTS
from switchyard.lifecycle import Assign, Fence, RequestLedger
from switchyard.state.base import StateStore

from tests.service.ingress_support import Stack

WORKER_ID = "models-1"


def output_of(payload: StagePayload) -> str:
    """What the fake worker answers a stage with: its model over its inputs."""
    inputs = ";".join(f"{name}={text}" for name, text in sorted(payload.inputs.items()))
    return f"{payload.model}<{inputs}>"


@dataclass
class StageWorker:
    """Answers stage requests (module docstring). ``fail``: stages (by name) it fails;
    ``expire``: stages it answers expired; ``delay_s``: seconds a stage runs; ``hold``:
    stages it leaves queued, undecided, until :meth:`release`.

    Attributes:
        seen: every stage request it received, copies included, with when.
        ran: the stage requests it ran, each once however often published.
        finished: when each stage request id's answer was sent.
    """

    bus: Bus
    state: StateStore
    fail: set[str] = field(default_factory=set)
    expire: set[str] = field(default_factory=set)
    hold: set[str] = field(default_factory=set)
    delay_s: dict[str, float] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    """The label a stage (by name) answers, as a classifier would."""
    seen: list[tuple[float, InferenceRequest]] = field(default_factory=list)
    ran: list[InferenceRequest] = field(default_factory=list)
    finished: dict[str, float] = field(default_factory=dict)
    holding: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once a stage is held."""
    _held: list[InferenceRequest] = field(default_factory=list)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def ledger(self) -> RequestLedger:
        return RequestLedger(self.state)

    async def run(self, stopping: asyncio.Event) -> None:
        async with self.bus.subscribe(
            STAGE_REQUESTS, group="fake-stage-worker", stopping=stopping
        ) as sub:
            async for delivery in sub:
                self.seen.append((time.monotonic(), delivery.message))
                self._spawn(delivery.message)

    def _spawn(self, request: InferenceRequest) -> None:
        task = asyncio.create_task(self.serve(request))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def release(self) -> None:
        """Serve the stages held so far, and hold no more."""
        self.hold.clear()
        for request in self._held:
            self._spawn(request)
        self._held.clear()

    def stages_seen(self, call_id: str) -> list[str]:
        return [stage_of(r) for _, r in self.seen if r.request_id.startswith(f"{call_id}.")]

    def stages_ran(self, call_id: str) -> list[str]:
        return [stage_of(r) for r in self.ran if r.request_id.startswith(f"{call_id}.")]

    async def serve(self, request: InferenceRequest) -> None:
        payload = request.payload
        assert isinstance(payload, StagePayload)
        if payload.stage in self.hold:
            self._held.append(request)
            self.holding.set()
            return
        now = time.time()
        assignment = Assignment(
            request=request,
            worker_id=WORKER_ID,
            variant=payload.model,
            order=request.arrival_s,
            policy="fake",
            deadline_s=request.deadline_s,
            assigned_at_s=now,
        )
        if (await self.ledger.assign(Assign(assignment))).result != "assigned":
            return  # decided before (a copy published again): it runs once
        await self.ledger.start_many([Fence(request.request_id, 0, WORKER_ID)], now)
        self.ran.append(request)
        await asyncio.sleep(self.delay_s.get(payload.stage, 0.0))
        status = CompletionStatus.OK
        if payload.stage in self.fail:
            status = CompletionStatus.FAILED
        elif payload.stage in self.expire:
            status = CompletionStatus.EXPIRED
        completion = Completion(
            request_id=request.request_id,
            app=request.app,
            worker_id=WORKER_ID,
            worker_type="emulated-models",
            variant=payload.model,
            status=status,
            result=StageResult(
                model=payload.model,
                output=output_of(payload),
                label=self.labels.get(payload.stage),
            )
            if status is CompletionStatus.OK
            else None,
            error="model weights corrupt" if status is CompletionStatus.FAILED else None,
            timeline=RequestTimeline(
                arrival_s=request.arrival_s, assigned_s=now, started_s=now, finished_s=time.time()
            ),
            deadline_s=request.deadline_s,
            emulated=True,
            reply_to=request.reply_to,
        )
        await self.ledger.finish_many([completion])
        self.finished[request.request_id] = time.monotonic()
        assert request.reply_partition is not None
        await self.bus.publish(ANSWERS, completion, partition=request.reply_partition)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def stage_of(request: InferenceRequest) -> str:
    assert isinstance(request.payload, StagePayload)
    return request.payload.stage


@pytest.fixture(name="worker")
async def worker_fixture(stack: Stack) -> AsyncIterator[StageWorker]:
    worker = StageWorker(stack.bus, stack.state)
    task = asyncio.create_task(worker.run(stack.stopping))
    try:
        yield worker
    finally:
        await worker.close()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
