"""The scheduler service over the in-memory bus: placements, the request ledger, duplicates,
predictions from the predictor's published model, failures and re-assignments.

Requests are accepted in the ledger and published as the ingress does; every assignment
is read where workers read it: on the partition of ``switchyard.worker-inbox`` its
worker names in its heartbeats.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any, Literal

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from switchyard.bus import Bus, MemoryBroker, MemoryTransport, Subscription
from switchyard.contracts.messages import (
    Assignment,
    Heartbeat,
    InferenceRequest,
    LLMPayload,
    Migration,
    PredictorModel,
    ServiceObservation,
    WorkerDown,
    WorkloadType,
)
from switchyard.contracts.topics import WORKER_EVENTS, WORKER_INBOX, requests_topic
from switchyard.lifecycle import Fence, RequestLedger, RequestRecord, scripts
from switchyard.policies.registry import make_llm_policy
from switchyard.prediction.snapshot import FittedPredictor
from switchyard.selection.registry import make_window_scheduler
from switchyard.serving.catalogue import DEFAULT_LLM_APPLICATIONS, ServingCatalogue
from switchyard.state import keys
from switchyard.state.base import Script
from switchyard.state.memory import MemoryStateStore

from services.predictor.model import LivePredictor
from services.scheduler import SchedulerService
from tests.support.services import (
    eventually,
    heartbeat,
    memory_context,
    service_settings,
    store_worker,
)

DownReason = Literal["heartbeat-timeout", "draining", "drained", "failed"]

CATALOGUE = ServingCatalogue(
    llm={app.name: app for app in DEFAULT_LLM_APPLICATIONS}, classification={}
)
A100_7B = "a100-80gb/llama-2-7b"
INBOX_READ = range(16)
"""The inbox partitions the tests read (every worker here names one of them)."""


def llm_request(request_id: str, prompt_tokens: int = 100) -> InferenceRequest:
    return InferenceRequest(
        request_id=request_id,
        app="llama-2-7b",
        payload=LLMPayload(model="llama-2-7b", prompt_tokens=prompt_tokens, max_output_tokens=50),
        arrival_s=time.time(),
        reply_to="ingress-0",
        reply_partition=0,
    )


def calibrated_model() -> str:
    """The predictor's published model (``PredictorModel`` JSON): pre-trained, and
    calibrated on the a100 by one request that took three times its raw prediction, so
    its calibrated predictions there exceed the raw ones."""
    live = LivePredictor.pretrained(1.0)
    live.observe(
        ServiceObservation(
            worker_type=A100_7B,
            model="llama-2-7b",
            prompt_tokens=100,
            workload=WorkloadType.OTHER,
            raw_predicted_s=1.0,
            execution_s=3.0,
        )
    )
    return live.snapshot(1, time.time()).model_dump_json()


def metric(text: str, name: str, **labels: str) -> float:
    """The value of the Prometheus sample ``name`` carrying ``labels`` (0 when none)."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        sample, _, value = line.rpartition(" ")
        if all(f'{key}="{want}"' in sample for key, want in labels.items()):
            total += float(value)
    return total


class Stack:
    """Scheduler replicas on one in-memory broker and state store, a client publishing
    requests as the ingress does, and a reader of the workers' inbox partitions."""

    def __init__(self, policy: str, spans: InMemorySpanExporter | None = None, **settings: object):
        self.broker = MemoryBroker()
        self.state = MemoryStateStore()
        self.policy = policy
        self.spans = spans
        self.settings = settings
        self.partitions: dict[str, int] = {}
        self.services: list[SchedulerService] = []
        self._client: Bus | None = None
        self._inbox: Subscription[Assignment | Migration] | None = None

    # -- workers, as the monitor records them -------------------------------------------

    def beat(self, worker_id: str, **fields: Any) -> Heartbeat:
        """``worker_id``'s heartbeat, naming the inbox partition it reads."""
        partition = self.partitions.setdefault(worker_id, len(self.partitions))
        assert partition in INBOX_READ
        made = heartbeat(worker_id, **fields)
        return made.model_copy(update={"inbox_partition": partition})

    async def worker(self, worker_id: str, *, status: str = "alive", **fields: Any) -> None:
        await store_worker(self.state, self.beat(worker_id, **fields), status=status)

    # -- the scheduler ---------------------------------------------------------------------

    @property
    def service(self) -> SchedulerService:
        return self.services[0]

    @property
    def client(self) -> Bus:
        assert self._client is not None, "start the stack first"
        return self._client

    @property
    def ledger(self) -> RequestLedger:
        return RequestLedger(self.state)

    async def start(self) -> SchedulerService:
        """Start a scheduler replica (the first also opens the client and the reader)."""
        settings = service_settings(
            llm_policy=self.policy,
            instance_id=f"scheduler-{len(self.services)}",
            **self.settings,
        )
        if self._client is None:
            client = await memory_context(
                "client", settings, self.broker, self.state, spans=self.spans
            )
            self._client = client.bus
            # Opened before anything is published: a reader starts at the partitions' end.
            self._inbox = self._client.subscribe(
                WORKER_INBOX, group="test-workers", partitions=list(INBOX_READ)
            )
            await self._inbox.open()
        ctx = await memory_context("scheduler", settings, self.broker, self.state, spans=self.spans)
        service = SchedulerService(
            ctx, CATALOGUE, make_llm_policy(self.policy), make_window_scheduler("lo-edf")
        )
        await service.start()
        self.services.append(service)
        return service

    async def stop(self) -> None:
        for service in self.services:
            if not service.ctx.stopping.is_set():
                service.ctx.stopping.set()
                await asyncio.wait_for(service.drain(), 10)
        if self._inbox is not None:
            await self._inbox.close()

    def metrics(self, service: SchedulerService | None = None) -> str:
        prometheus = (service or self.service).ctx.telemetry.prometheus
        assert prometheus is not None
        return prometheus.render()

    # -- requests and what the workers get -------------------------------------------------

    async def submit(self, request: InferenceRequest) -> None:
        """What the ingress does: record the request as queued, then publish it."""
        assert (await self.ledger.accept(request)).accepted
        await self.publish(request)

    async def publish(self, request: InferenceRequest) -> None:
        await self.client.publish(requests_topic(request), request)

    async def worker_down(
        self,
        worker_id: str,
        orphans: list[str],
        *,
        reason: DownReason = "heartbeat-timeout",
        held: list[str] | None = None,
    ) -> None:
        """Publish the monitor's verdict that ``worker_id`` is gone (or going), listing
        ``orphans`` and, for a drain, what it ``held`` waiting."""
        await self.client.publish(WORKER_EVENTS, worker_down(worker_id, orphans, reason, held))

    async def assignments(self, count: int) -> list[Assignment]:
        """The next ``count`` assignments sent to the workers, each checked to have gone
        to the partition its worker names."""
        assert self._inbox is not None
        got: list[Assignment] = []
        while len(got) < count:
            delivery = await self._inbox.next_within(10.0)
            assert delivery is not None, f"only {len(got)} of {count} assignments came"
            message = delivery.message
            assert isinstance(message, Assignment), message
            assert delivery.envelope.partition == self.partitions[message.worker_id], message
            got.append(message)
        return got

    async def assignments_until(self, message_id: str) -> list[Assignment]:
        """The assignments sent to the workers up to the one with ``message_id``."""
        got: list[Assignment] = []
        while not got or got[-1].message_id != message_id:
            got += await self.assignments(1)
        return got

    async def sent_meanwhile(self) -> list[Assignment | Migration]:
        """What was sent to the workers and not read yet (everything awaited so far has
        reached the broker)."""
        assert self._inbox is not None
        return [d.message for d in await self._inbox.next_batch(100, timeout_s=0.2)]

    async def record(self, request_id: str) -> RequestRecord:
        found = await self.ledger.read(request_id)
        assert found is not None, f"no record of {request_id}"
        return found

    async def assigned_to(self, worker_id: str, request_id: str) -> bool:
        """Whether ``worker_id``'s assigned set names the request."""
        return await self.state.zscore(keys.assigned(worker_id), request_id) is not None


def worker_down(
    worker_id: str, orphans: list[str], reason: DownReason, held: list[str] | None
) -> WorkerDown:
    return WorkerDown(
        worker_id=worker_id,
        reason=reason,
        detected_at_s=time.time(),
        orphaned_request_ids=orphans,
        held_request_ids=held,
    )


@pytest.fixture
async def jsq() -> AsyncIterator[Stack]:
    stack = Stack("jsq")
    yield stack
    await stack.stop()


# -- first decisions -------------------------------------------------------------------------


async def test_requests_go_to_the_least_loaded_worker_that_serves_their_model(jsq: Stack) -> None:
    await jsq.worker("busy", waiting=5, running=8)
    await jsq.worker("idle")
    await jsq.worker("other-model", models=("llama-2-13b",))
    await jsq.start()
    await jsq.submit(llm_request("r1"))
    (assignment,) = await jsq.assignments(1)  # on idle's inbox partition
    assert assignment.worker_id == "idle"
    assert assignment.variant == "llama-2-7b"
    assert assignment.policy == "jsq"
    assert assignment.epoch == 0
    # The decision is recorded in the ledger before it is sent.
    record = await jsq.record("r1")
    assert (record.status, record.worker_id, record.epoch) == ("assigned", "idle", 0)
    assert record.assignment == assignment
    assert await jsq.assigned_to("idle", "r1")

    # Counted once its send is confirmed, which may be just after the worker has it.
    async def counted() -> bool:
        decisions = metric(jsq.metrics(), "switchyard_scheduler_decisions_total", kind="llm")
        return decisions == 1

    await eventually(counted)
    assert metric(jsq.metrics(), "switchyard_scheduler_decisions_total", policy="jsq") == 1


async def test_a_worker_naming_no_inbox_partition_is_sent_nothing(jsq: Stack) -> None:
    # Idle, but it names no partition: nothing could reach it.
    await store_worker(jsq.state, heartbeat("mute"))
    await jsq.worker("loaded", waiting=5, running=8)
    await jsq.start()
    await jsq.submit(llm_request("r1"))
    (assignment,) = await jsq.assignments(1)
    assert assignment.worker_id == "loaded"
    assert not await jsq.assigned_to("mute", "r1")


async def test_a_burst_between_heartbeats_is_spread_by_local_accounting(jsq: Stack) -> None:
    await jsq.worker("a")
    await jsq.worker("b")
    await jsq.start()
    for i in range(6):
        await jsq.submit(llm_request(f"r{i}"))
    got = await jsq.assignments(6)
    by_worker = {w: sum(1 for a in got if a.worker_id == w) for w in ("a", "b")}
    assert by_worker == {"a": 3, "b": 3}


async def test_a_request_delivered_twice_gets_its_recorded_assignment_again(jsq: Stack) -> None:
    await jsq.worker("a")
    await jsq.worker("b")
    await jsq.start()
    request = llm_request("dup")
    await jsq.submit(request)
    (first,) = await jsq.assignments(1)
    # Delivered again (a redelivery after a crash): the recorded decision is re-sent,
    # not decided anew.
    await jsq.publish(request)
    await jsq.submit(llm_request("after"))
    again, after = await jsq.assignments(2)
    assert again.message_id == first.message_id
    assert again == first
    assert after.request.request_id == "after"
    record = await jsq.record("dup")
    assert (record.worker_id, record.epoch) == (first.worker_id, 0)

    async def counted() -> bool:
        metrics = jsq.metrics()
        return (
            metric(metrics, "switchyard_scheduler_decisions_total", kind="llm") == 2
            and metric(metrics, "switchyard_scheduler_decisions_total", kind="resend") == 1
        )

    await eventually(counted)


# -- predictions -----------------------------------------------------------------------------


async def test_gaps_places_with_the_predictors_published_model() -> None:
    model = calibrated_model()
    stack = Stack("gaps")
    try:
        await stack.worker("a")
        await stack.state.set(keys.PREDICTOR_MODEL, model)
        await stack.start()
        request = llm_request("p1")
        await stack.submit(request)
        (assignment,) = await stack.assignments(1)
    finally:
        await stack.stop()
    # Predicted in-process with the published model: its calibrated prediction places
    # the request, its raw one goes to the worker (reported back for calibration).
    payload = request.payload
    assert isinstance(payload, LLMPayload)
    expected = FittedPredictor.from_model(PredictorModel.model_validate_json(model)).predict(
        prompt_tokens=payload.prompt_tokens,
        workload=payload.workload,
        model=payload.model,
        output_tokens_hint=payload.output_tokens_hint,
        arrival_s=request.arrival_s,
    )
    assert assignment.worker_id == "a"
    assert assignment.predicted_s == pytest.approx(expected.calibrated_by_worker_type_s[A100_7B])
    assert assignment.predicted_raw_s == pytest.approx(expected.raw_by_worker_type_s[A100_7B])
    assert assignment.predicted_s is not None
    assert assignment.predicted_raw_s is not None
    assert assignment.predicted_s > assignment.predicted_raw_s


async def test_without_a_published_model_gaps_decides_at_once_then_takes_the_model() -> None:
    # Waiting for predictions is gone: with no model yet, requests are decided without
    # one (a long prediction wait, which only classification estimates use, changes
    # nothing); a model published later is read within the publish interval.
    stack = Stack("gaps", prediction_wait_s=10.0, predictor_publish_interval_s=0.1)
    try:
        await stack.worker("a")
        service = await stack.start()
        await stack.submit(llm_request("blind"))
        (blind,) = await stack.assignments(1)
        assert blind.predicted_s is None
        assert blind.predicted_raw_s is None

        await stack.state.set(keys.PREDICTOR_MODEL, calibrated_model())

        async def model_read() -> bool:
            return service.placer.predictor is not None

        await eventually(model_read)
        await stack.submit(llm_request("seen"))
        (seen,) = await stack.assignments(1)
    finally:
        await stack.stop()
    assert seen.predicted_s is not None
    assert seen.predicted_raw_s is not None


# -- re-assignments --------------------------------------------------------------------------


async def test_a_dead_workers_unfinished_requests_are_reassigned_with_a_new_epoch(
    jsq: Stack,
) -> None:
    await jsq.worker("doomed")
    await jsq.start()
    await jsq.submit(llm_request("orphan"))
    (first,) = await jsq.assignments(1)
    assert first.worker_id == "doomed"
    await jsq.worker("doomed", sequence=2, status="down")
    await jsq.worker("survivor")
    await asyncio.sleep(0.3)  # a cluster refresh sees the new worker
    await jsq.worker_down("doomed", ["orphan", "unknown-request"], reason="heartbeat-timeout")
    (again,) = await jsq.assignments(1)  # on the survivor's partition
    assert again.request.request_id == "orphan"
    assert again.worker_id == "survivor"
    assert again.epoch == 1
    record = await jsq.record("orphan")
    assert (record.status, record.worker_id, record.epoch) == ("assigned", "survivor", 1)
    assert await jsq.assigned_to("survivor", "orphan")
    assert not await jsq.assigned_to("doomed", "orphan")
    # A listed id without a record is left alone: nothing is made up for it.
    assert await jsq.ledger.read("unknown-request") is None
    await _reassigned(jsq.service, 1)


async def test_a_request_sent_to_a_worker_after_the_monitor_listed_its_orphans_moves_too(
    jsq: Stack,
) -> None:
    await jsq.worker("doomed")
    await jsq.start()
    await jsq.submit(llm_request("late"))
    (first,) = await jsq.assignments(1)
    assert first.worker_id == "doomed"
    await jsq.worker("doomed", sequence=2, status="down")
    await jsq.worker("survivor")
    await asyncio.sleep(0.3)
    # The monitor's list missed it: it was assigned after the monitor looked (the
    # ledger's assigned set of the worker still names it).
    await jsq.worker_down("doomed", [], reason="heartbeat-timeout")
    (again,) = await jsq.assignments(1)
    assert again.request.request_id == "late"
    assert again.worker_id == "survivor"
    assert again.epoch == 1


async def test_of_several_scheduler_replicas_one_moves_each_request(
    jsq: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    await jsq.worker("doomed")
    first_replica = await jsq.start()
    second_replica = await jsq.start()
    await jsq.submit(llm_request("contested"))
    (first,) = await jsq.assignments(1)
    assert first.worker_id == "doomed"
    await jsq.worker("doomed", sequence=2, status="down")
    await jsq.worker("survivor")
    await asyncio.sleep(0.3)  # both replicas' cluster refreshes see the survivor

    # Both replicas handle the same WorkerDown at once (a redelivery after a rebalance),
    # and both read the record before either records its re-assignment: the ledger's
    # compare-and-set on the epoch and worker they replace lets one through.
    monitor = Bus(MemoryTransport())
    await monitor.start()
    try:
        async with monitor.subscribe(WORKER_EVENTS, group="replicas") as sub:
            await monitor.publish(
                WORKER_EVENTS, worker_down("doomed", ["contested"], "heartbeat-timeout", None)
            )
            delivery = await sub.next_within(10.0)
    finally:
        await monitor.stop()
    assert delivery is not None

    both_deciding = asyncio.Barrier(2)
    run_script_many = MemoryStateStore.run_script_many

    async def assign_together(
        self: MemoryStateStore,
        script: Script,
        calls: Sequence[tuple[Sequence[str], Sequence[str]]],
    ) -> list[list[str]]:
        # A re-assignment names the epoch it replaces (argument 5 of the script).
        if script is scripts.ASSIGN and any(args[4] for _, args in calls):
            await both_deciding.wait()
        return await run_script_many(self, script, calls)

    monkeypatch.setattr(MemoryStateStore, "run_script_many", assign_together)
    await asyncio.wait_for(
        asyncio.gather(
            first_replica.reassigner.on_worker_down(delivery),
            second_replica.reassigner.on_worker_down(delivery),
        ),
        10,
    )
    monkeypatch.undo()

    assert sorted([first_replica.reassigned, second_replica.reassigned]) == [0, 1]
    record = await jsq.record("contested")
    assert (record.worker_id, record.epoch) == ("survivor", 1)
    moved = record.assignment
    assert moved is not None
    # One re-assignment was sent. (The replicas' group rebalanced when the second
    # joined, so one may have read the request again and re-sent its recorded decision:
    # the same message, never a second decision.)
    decisions = {first.message_id, moved.message_id}
    (sent,) = [a for a in await jsq.assignments_until(moved.message_id) if a.epoch == 1]
    assert sent == moved
    assert sent.worker_id == "survivor"
    assert {a.message_id for a in await jsq.sent_meanwhile()} <= decisions


async def _leaving_takes(
    jsq: Stack, request_ids: tuple[str, str], *, status: str
) -> SchedulerService:
    """Both requests are assigned to worker ``leaving``, which takes both in (starts them
    in the ledger), then drains (recorded ``status``) while worker ``staying`` joins."""
    await jsq.worker("leaving")
    service = await jsq.start()
    for request_id in request_ids:
        await jsq.submit(llm_request(request_id))
    got = await jsq.assignments(2)
    assert {a.worker_id for a in got} == {"leaving"}
    started = await jsq.ledger.start_many(
        [Fence(request_id, 0, "leaving") for request_id in request_ids], time.time()
    )
    assert started == ["started", "started"]
    draining = jsq.beat("leaving", sequence=2).model_copy(update={"draining": True})
    await store_worker(jsq.state, draining, status=status)
    await jsq.worker("staying")
    await asyncio.sleep(0.3)
    return service


async def _reassigned(service: SchedulerService, count: int) -> None:
    """Wait until ``service`` has counted ``count`` re-assignments (it counts them once
    their sends are confirmed, which may be just after the worker has them)."""

    async def counted() -> bool:
        return service.reassigned == count

    await eventually(counted)


async def test_a_drained_worker_s_finished_request_is_not_run_again(jsq: Stack) -> None:
    # It ran the first to the end while draining; its last, draining heartbeat lists
    # only the second; the first's answer is still on its way.
    service = await _leaving_takes(jsq, ("finished-there", "still-waiting"), status="drained")
    await jsq.worker_down(
        "leaving", ["finished-there", "still-waiting"], reason="drained", held=["still-waiting"]
    )
    (moved,) = await jsq.assignments(1)
    assert moved.request.request_id == "still-waiting"
    assert moved.worker_id == "staying"
    assert moved.epoch == 1
    await _reassigned(service, 1)
    record = await jsq.record("finished-there")
    assert (record.status, record.worker_id, record.epoch) == ("running", "leaving", 0)


async def test_a_draining_worker_hands_over_what_waits_and_keeps_what_runs(jsq: Stack) -> None:
    # Told to stop: it heartbeats "draining" (still alive) and finishes what runs; the
    # monitor names what only waits there.
    service = await _leaving_takes(jsq, ("runs-there", "waits-there"), status="alive")
    await jsq.worker_down("leaving", ["waits-there"], reason="draining", held=["waits-there"])
    (moved,) = await jsq.assignments(1)
    assert (moved.request.request_id, moved.worker_id, moved.epoch) == ("waits-there", "staying", 1)
    # Its last heartbeat still lists the moved request (it never learns of the move) and
    # its assigned set still names the one that ran there: neither is decided again.
    await jsq.worker_down(
        "leaving", ["runs-there", "waits-there"], reason="drained", held=["waits-there"]
    )
    await jsq.submit(llm_request("after"))
    (after,) = await jsq.assignments(1)
    assert after.request.request_id == "after"
    await asyncio.sleep(0.2)
    assert service.reassigned == 1
    assert await jsq.sent_meanwhile() == []
    assert (await jsq.record("runs-there")).worker_id == "leaving"
    assert (await jsq.record("waits-there")).epoch == 1


async def test_a_re_assignment_continues_the_request_s_trace() -> None:
    spans = InMemorySpanExporter()
    stack = Stack("jsq", spans=spans)
    try:
        await stack.worker("doomed")
        await stack.start()
        await stack.submit(llm_request("traced"))  # a trace of its own
        await stack.assignments(1)
        await stack.worker("doomed", sequence=2, status="down")
        await stack.worker("survivor")
        await asyncio.sleep(0.3)
        await stack.worker_down("doomed", ["traced"])  # another trace
        (again,) = await stack.assignments(1)
    finally:
        await stack.stop()
    assert (again.worker_id, again.epoch) == ("survivor", 1)

    finished = spans.get_finished_spans()

    def produced(topic: str) -> list[ReadableSpan]:
        return [
            s
            for s in finished
            if s.kind is SpanKind.PRODUCER
            and str((s.attributes or {}).get("messaging.destination.name", "")).endswith(topic)
        ]

    (request_sent,) = produced("requests")
    (down_sent,) = produced("worker-events")
    (reassign,) = [s for s in finished if s.name == "scheduler reassign"]
    # In the request's trace, not the WorkerDown's; linked to the WorkerDown's.
    assert reassign.context.trace_id == request_sent.context.trace_id
    assert [link.context.trace_id for link in reassign.links] == [down_sent.context.trace_id]
    assert (reassign.attributes or {}).get("switchyard.epoch") == 1
    # The new assignment is published inside it, so the worker's spans follow on; both
    # decisions are in the request's trace.
    assignments = produced("worker-inbox")
    assert len(assignments) == 2
    parents = [s.parent.span_id for s in assignments if s.parent is not None]
    assert parents.count(reassign.context.span_id) == 1
    assert {s.context.trace_id for s in assignments} == {request_sent.context.trace_id}


# -- no worker yet ---------------------------------------------------------------------------


async def test_a_request_for_a_model_nobody_serves_waits_for_a_worker(jsq: Stack) -> None:
    await jsq.start()
    await jsq.submit(llm_request("early"))

    async def parked() -> bool:
        return metric(jsq.metrics(), "switchyard_scheduler_unplaced") == 1

    await eventually(parked)
    assert (await jsq.record("early")).status == "queued"
    await jsq.worker("late")
    (assignment,) = await jsq.assignments(1)
    assert assignment.worker_id == "late"
    assert metric(jsq.metrics(), "switchyard_scheduler_unplaced") == 0


async def test_a_request_waits_until_its_worker_names_an_inbox_partition(jsq: Stack) -> None:
    # A worker whose heartbeats name no partition yet (it has not leased one) serves the
    # model but cannot be sent anything: the request waits for it.
    await store_worker(jsq.state, heartbeat("starting"))
    await jsq.start()
    await jsq.submit(llm_request("early"))

    async def parked() -> bool:
        return metric(jsq.metrics(), "switchyard_scheduler_unplaced") == 1

    await eventually(parked)
    await jsq.worker("starting", sequence=2)  # now it names its partition
    (assignment,) = await jsq.assignments(1)
    assert assignment.worker_id == "starting"
