"""The emulated multi-model backend: pipeline stages on placed models, in modelled time.

It runs no model. It serves :class:`~switchyard.contracts.messages.StagePayload` requests
for the catalogue's multi-model ``models`` (``ServingCatalogue.models``) as the
multi-model simulator does, in real time:

- the models placed here (:class:`~services.worker.placement.ModelPlacement`, driven by
  the placement service's orders) each hold their resource vector, loading for
  ``load_s / time_scale`` wall seconds first;
- each placed model is one replica serving one stage at a time, in queue order;
  different models run side by side. A stage takes ``exec_s * exec_scale / speed /
  time_scale`` wall seconds (the worker's ``speed`` is its service-time divisor);
- a stage for a model not placed here (routed just as it was unloaded, or before any
  placement) loads it on demand when it fits beside what is placed, else waits in the
  queue until room frees; one whose model can never fit here (or that the catalogue
  does not know) is refused at intake, naming the model and the worker's vector;
- its answer is a :class:`~switchyard.contracts.messages.StageResult` whose output is a
  placeholder naming the model, the stage and the request, with the length of its inputs,
  and for a classifier (a model with labels) a label drawn from its shares by the
  request id (:mod:`switchyard.multimodel.branching`).

Everything it reports is modelled, not measured: the worker labels every completion and
heartbeat of this backend ``emulated``. A running stage cannot be preempted (like a torch
batch): migrations move only waiting stages.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence

from switchyard.contracts.messages import (
    Assignment,
    StagePayload,
    StageResult,
)
from switchyard.contracts.messages import (
    ResourceVector as WireVector,
)
from switchyard.multimodel.branching import label_at, unit_of
from switchyard.multimodel.model import ModelSpec, ResourceVector

from services.worker.backends.base import (
    BackendLoad,
    ExecutionSink,
    Preemption,
    UnsupportedWorkError,
    WorkSpec,
)
from services.worker.placement import ModelPlacement, Replica, queued_by_model
from services.worker.queue import BatchKey, LocalQueue, WorkItem

GIB = 1024**3

MAX_LAG_S = 0.05
"""A stage queued behind another starts when that one ended, unless the engine looked
this much later (it was busy elsewhere): then it starts now, as pacing restarts."""


def stage_output(payload: StagePayload, request_id: str) -> str:
    """The placeholder output of an emulated stage: the model, stage and request, and
    how much input it had (what a real model would have read)."""
    inputs = ", ".join(f"{name} {len(text)} chars" for name, text in sorted(payload.inputs.items()))
    return (
        f"[emulated {payload.model}: stage {payload.stage} of {payload.pipeline} request "
        f"{request_id}; inputs: {inputs or 'none'}]"
    )


def wire_vector(vector: ResourceVector) -> WireVector:
    """A catalogue resource vector (GiB) as a heartbeat carries it (bytes)."""
    return WireVector(cpu=vector.cpu, gpu=vector.gpu, mem_bytes=int(vector.mem_gib * GIB))


class EmulatedModelsBackend:
    """Stages of the catalogue's ``models`` on the models placed here, in modelled time.

    Args:
        worker_id: the worker's id (in log lines and errors).
        models: the catalogue's multi-model models by name.
        capacity: the worker's resource vector (cores, GPUs, GiB of memory).
        speed: service-time divisor relative to the reference GPU.
        gpu_type: the GPU type reported (also the worker type).
        time_scale: the emulation runs this many times faster than the model's seconds.
        clock: wall seconds.

    Attributes:
        placement: the models placed here (placement orders act on it).
    """

    name = "emulated-models"
    emulated = True
    profile: str | None = None

    def __init__(
        self,
        worker_id: str,
        models: Mapping[str, ModelSpec],
        capacity: ResourceVector,
        *,
        speed: float = 1.0,
        gpu_type: str,
        time_scale: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not speed > 0:
            raise ValueError(f"speed must be positive, got {speed}")
        self.placement = ModelPlacement(
            worker_id, models, capacity, time_scale=time_scale, clock=clock
        )
        self.speed = speed
        self.gpu_type = gpu_type
        self.time_scale = time_scale
        self.clock = clock
        self._share_s = 0.0  # integral of the busy share, for the utilization
        self._share_last_s = clock()
        self._reported_share_s = 0.0
        self._reported_at_s = self._share_last_s

    # -- identity -----------------------------------------------------------------------------

    @property
    def worker_type(self) -> str:
        return self.gpu_type

    def servable_models(self) -> list[str]:
        placement = self.placement
        return [m for m in sorted(placement.models) if placement.never_fits(m) is None]

    def resident_models(self) -> list[str]:
        now_s = self.clock()
        return [r.model for r in self.placement.replicas.values() if r.loaded(now_s)]

    def wall_s(self, modelled_s: float) -> float:
        return modelled_s / self.time_scale

    def stage_wall_s(self, spec: ModelSpec, exec_scale: float) -> float:
        """Wall seconds one stage of ``spec`` takes here."""
        return self.wall_s(spec.exec_s * exec_scale / self.speed)

    # -- intake -------------------------------------------------------------------------------

    def describe(self, assignment: Assignment) -> WorkSpec:
        request = assignment.request
        payload = request.payload
        if not isinstance(payload, StagePayload):
            raise UnsupportedWorkError(
                f"worker {self.placement.worker_id} serves pipeline stages of the catalogue's "
                f"models only; got a {payload.kind.value} request for {request.app!r}"
            )
        reason = self.placement.never_fits(payload.model)
        if reason is not None:
            raise UnsupportedWorkError(
                f"stage {payload.stage!r} of {payload.pipeline!r} cannot run on worker "
                f"{self.placement.worker_id}: {reason}"
            )
        spec = self.placement.models[payload.model]
        return WorkSpec(
            key=BatchKey(payload.model, assignment.variant),
            estimate_s=self.stage_wall_s(spec, payload.exec_scale),
        )

    # -- execution ----------------------------------------------------------------------------

    def has_running(self) -> bool:
        return any(r.running is not None for r in self.placement.replicas.values())

    async def step(
        self,
        queue: LocalQueue,
        sink: ExecutionSink,
        *,
        admit: bool,
        wake: asyncio.Event | None = None,
    ) -> bool:
        """Finish the stages whose time is up, free drained models and start the loads
        waiting for room, then (when ``admit``) start a stage on every idle loaded model
        that has one waiting, loading models on demand. When none of that happened, sleep
        up to the next finish or load (or until ``wake``); False when nothing is in
        progress.

        The look for stages to start and the look for the next event share one reading
        of the clock: a load that ended between two readings would be in neither, and
        the engine would wait for new work with a stage ready to run."""
        acted = await self._finish_due(sink, self.clock())
        acted = self.placement.settle(queued_by_model(queue)) or acted
        now_s = self.clock()  # after the finishes' awaits: stages may have come meanwhile
        if admit:
            acted = await self._start_ready(queue, sink, now_s) or acted
        if acted:
            return True
        next_s = self._next_event_s(queue, now_s, admit=admit)
        if next_s is None:
            return False
        await _sleep_until(next_s, self.clock, wake)
        return True

    async def _finish_due(self, sink: ExecutionSink, now_s: float) -> bool:
        due = sorted(
            (
                r
                for r in self.placement.replicas.values()
                if r.running is not None and r.finish_at_s <= now_s
            ),
            key=lambda r: r.finish_at_s,
        )
        for replica in due:
            item = replica.running
            assert item is not None
            self._advance_share(now_s)
            replica.running = None
            replica.idle_since_s = replica.finish_at_s
            replica.served_total += 1
            payload = item.request.payload
            assert isinstance(payload, StagePayload)  # describe took only stages
            output = stage_output(payload, item.request_id)
            # A classifier's answer, from its label shares by the request id: a stage run
            # again (a retry, a re-assignment) answers as it did.
            label = label_at(self.placement.models[replica.model].labels, unit_of(item.request_id))
            result = StageResult(model=replica.model, output=output, label=label)
            await sink.finished(item, result)
        return bool(due)

    async def _start_ready(self, queue: LocalQueue, sink: ExecutionSink, now_s: float) -> bool:
        """One stage for each idle loaded model with one ready in the queue (the first in
        queue order); loads on demand for stages whose model is not placed."""
        placement = self.placement
        started: list[WorkItem] = []
        busy: set[str] = set()
        loaded_on_demand = False
        for item in queue.ready(now_s):
            model = item.key.model
            if model in busy:
                continue
            replica = placement.replicas.get(model)
            if replica is None:
                busy.add(model)  # one try a step; it waits in the queue meanwhile
                loaded_on_demand = placement.load_on_demand(model) or loaded_on_demand
                continue
            busy.add(model)
            if replica.running is not None or not replica.loaded(now_s):
                continue
            self._start(replica, item, now_s)
            started.append(item)
        if started:
            queue.take(started)
            await sink.started(started)
        return bool(started) or loaded_on_demand

    def _start(self, replica: Replica, item: WorkItem, now_s: float) -> None:
        payload = item.request.payload
        assert isinstance(payload, StagePayload)
        # Paced: a stage that waited behind another starts when that one ended, so the
        # engine's wake-up latency does not add up over a queue of short stages.
        start_s = max(replica.idle_since_s, item.received_at_s, now_s - MAX_LAG_S)
        start_s = min(start_s, now_s)
        self._advance_share(now_s)
        replica.running = item
        replica.finish_at_s = start_s + self.stage_wall_s(replica.spec, payload.exec_scale)

    def _next_event_s(self, queue: LocalQueue, now_s: float, *, admit: bool) -> float | None:
        """When something may change next: a running stage's end or, when admitting, a
        load that ends while stages wait for it."""
        replicas = self.placement.replicas.values()
        events = [r.finish_at_s for r in replicas if r.running is not None]
        if admit:
            waiting = queued_by_model(queue)
            events += [
                r.ready_at_s for r in replicas if not r.loaded(now_s) and waiting.get(r.model)
            ]
            upcoming = queue.next_ready_s(now_s)
            if upcoming is not None and events:
                events.append(upcoming)
        return min(events) if events else None

    def preempt(self, request_id: str) -> Preemption | None:
        # A stage runs to its end, like a static batch: only waiting stages can move.
        return None

    # -- reporting ------------------------------------------------------------------------------

    def _busy_share(self) -> float:
        """The dominant share of the capacity held by the models serving a stage now."""
        replicas = self.placement.replicas.values()
        busy = [r.spec.resources for r in replicas if r.running is not None]
        total = ResourceVector(
            sum(v.cpu for v in busy), sum(v.gpu for v in busy), sum(v.mem_gib for v in busy)
        )
        return min(1.0, total.share_of(self.placement.capacity)) if busy else 0.0

    def _advance_share(self, now_s: float) -> None:
        elapsed_s = now_s - self._share_last_s
        if elapsed_s > 0:
            self._share_s += self._busy_share() * elapsed_s
            self._share_last_s = now_s

    def load(self, waiting: Sequence[WorkItem]) -> BackendLoad:
        """Load figures for a heartbeat. ``utilization`` is the time-average busy share
        (the dominant resource share of the models serving a stage, as the simulator
        counts it) since the previous call: one call per heartbeat."""
        now_s = self.clock()
        placement = self.placement
        self._advance_share(now_s)
        interval_s = now_s - self._reported_at_s
        if interval_s > 0:
            utilization = (self._share_s - self._reported_share_s) / interval_s
        else:
            utilization = self._busy_share()
        self._reported_share_s, self._reported_at_s = self._share_s, now_s
        replicas = list(placement.replicas.values())
        running = [
            (r.running, max(0.0, r.finish_at_s - now_s)) for r in replicas if r.running is not None
        ]
        return BackendLoad(
            running=running,
            waiting_s=sum(item.estimate_s for item in waiting),
            utilization=min(1.0, max(0.0, utilization)),
            max_slots=len(replicas),
            capacity=wire_vector(placement.capacity),
            free=wire_vector(placement.free()),
            placed=placement.placed(queued_by_model(waiting)),
            speed=self.speed,
            gpu_type=self.gpu_type,
        )


async def _sleep_until(
    deadline_s: float, clock: Callable[[], float], wake: asyncio.Event | None
) -> None:
    """Sleep until ``deadline_s`` on ``clock``, or until ``wake`` is set."""
    delay_s = max(0.0, deadline_s - clock())
    if wake is None:
        await asyncio.sleep(delay_s)
        return
    try:
        async with asyncio.timeout(delay_s):
            await wake.wait()
    except TimeoutError:
        pass
