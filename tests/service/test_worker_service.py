"""The worker service over the in-memory bus and state store: what other services see.

Work reaches a worker on its own partition of ``switchyard.worker-inbox`` (named in its
heartbeats), fenced through the request ledger: each test records a request and its
assignment the way the scheduler does before sending it. Answers, and a streamed
request's chunks before them, come back on the ``reply_partition`` of
``switchyard.answers`` the request names.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, Sum
from opentelemetry.sdk.trace import TracerProvider
from switchyard.bus import Bus, Envelope, MemoryTransport, Subscription
from switchyard.config import load_settings
from switchyard.contracts.messages import (
    Assignment,
    ClassificationPayload,
    Completion,
    CompletionStatus,
    Heartbeat,
    InferenceRequest,
    LLMPayload,
    LLMResult,
    Migration,
    OutputChunk,
    RequestTimeline,
)
from switchyard.contracts.topics import ANSWERS, HEARTBEATS, WORKER_INBOX
from switchyard.lifecycle import Assign, Fence, RequestLedger, RequestRecord, scripts
from switchyard.perf import performance_model
from switchyard.runtime.service import ServiceContext
from switchyard.serving import TINY_LM_MODEL, ServingCatalogue
from switchyard.state import MemoryStateStore, keys
from switchyard.state.base import Script
from switchyard.telemetry import Telemetry

from services.worker import create
from services.worker.backends.emulated_llm import EmulatedLlmBackend
from services.worker.reporting import CHUNK_TOKENS
from services.worker.service import WorkerService
from tests.support.bus import drain_for

PROFILE = "a100-80gb/llama-2-7b"
MODEL = "llama-2-7b"
REPLY_PARTITION = 0
"""The partition of ``switchyard.answers`` every request here names for its answer."""
WAIT_S = 20.0  # generous: these waits end on an event, the timeout only bounds a failure

Answers = Subscription[Completion | OutputChunk]
Inboxes = Subscription[Assignment | Migration]


@dataclass
class Stack:
    ctx: ServiceContext
    worker: WorkerService
    state: MemoryStateStore
    metrics: InMemoryMetricReader

    @property
    def bus(self) -> Bus:
        return self.ctx.bus

    def answers(self, group: str) -> Answers:
        return _answers(self.bus, group)

    async def send(self, assignment: Assignment, *, record: bool = True) -> None:
        """Record ``assignment`` (unless ``record`` is False) and send it to the worker."""
        if record:
            await _record(self.state, assignment)
        await _send(self.worker, assignment)


def _context(
    bus: Bus,
    state: MemoryStateStore,
    *,
    metrics: InMemoryMetricReader | None = None,
    **settings: object,
) -> ServiceContext:
    values: dict[str, object] = {
        "worker_id": "w1",
        "heartbeat_interval_s": 0.05,
        "worker_profile": PROFILE,
        "worker_time_scale": 1000.0,
    }
    values.update(settings)
    meters = MeterProvider(metric_readers=[metrics]) if metrics is not None else MeterProvider()
    return ServiceContext(
        name="worker",
        settings=load_settings({}, **values),
        bus=bus,
        state=state,
        telemetry=Telemetry(TracerProvider(), meters),
        logger=logging.getLogger("tests.worker"),
        stopping=asyncio.Event(),
    )


async def _start(worker: WorkerService) -> None:
    """Start ``worker`` and wait for a heartbeat naming its inbox partition: the scheduler
    sends a worker work only once one did (it reads its inbox from then on)."""
    bus = worker.ctx.bus
    async with bus.subscribe(HEARTBEATS, group=f"t-ready-{worker.worker_id}") as beats:
        await worker.start()
        partition = worker.inbox.partition
        await _heartbeat_where(
            beats,
            lambda h: h.worker_id == worker.worker_id and h.inbox_partition == partition,
        )


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    bus = Bus(MemoryTransport())
    await bus.start()
    state = MemoryStateStore("test:")
    metrics = InMemoryMetricReader()
    ctx = _context(bus, state, metrics=metrics)
    worker = await create(ctx)
    assert isinstance(worker, WorkerService)
    await _start(worker)
    yield Stack(ctx, worker, state, metrics)
    ctx.stopping.set()
    await worker.drain()
    await worker.cancel_routines()
    await bus.stop()
    ctx.telemetry.shutdown()


def _llm(
    request_id: str,
    *,
    output: int = 8,
    prompt: int = 100,
    stream: bool = False,
    worker_id: str = "w1",
    epoch: int = 0,
    order: float = 0.0,
    not_before_s: float | None = None,
    model: str = MODEL,
) -> Assignment:
    now = time.time()
    request = InferenceRequest(
        request_id=request_id,
        app=model,
        payload=LLMPayload(
            model=model, prompt_tokens=prompt, max_output_tokens=output, stream=stream
        ),
        arrival_s=now - 0.01,
        reply_to="ingress-1",
        reply_partition=REPLY_PARTITION,
    )
    return Assignment(
        request=request,
        worker_id=worker_id,
        variant=model,
        order=order,
        policy="test",
        epoch=epoch,
        assigned_at_s=now,
        not_before_s=not_before_s,
    )


async def _record(state: MemoryStateStore, assignment: Assignment) -> None:
    """Record the request and its first assignment as the scheduler does."""
    ledger = RequestLedger(state)
    await ledger.accept(assignment.request)
    outcome = await ledger.assign(Assign(assignment))
    assert outcome.result == "assigned", outcome


async def _send(worker: WorkerService, message: Assignment | Migration) -> None:
    """Send ``message`` to ``worker``'s inbox partition (as the scheduler and the
    rebalancer do)."""
    await worker.ctx.bus.publish(WORKER_INBOX, message, partition=worker.inbox.partition)


def _answers(bus: Bus, group: str) -> Answers:
    """A reader of the answers partition the requests here name (open it before the
    worker can answer: it starts at the partition's end)."""
    return bus.subscribe(ANSWERS, group=group, partitions=[REPLY_PARTITION])


async def _elsewhere(worker: WorkerService) -> int:
    """A partition of the worker inbox topic other than ``worker``'s: a target's."""
    partitions = await worker.ctx.bus.partitions_of(WORKER_INBOX)
    return (worker.inbox.partition + 1) % partitions


def _inbox_of(bus: Bus, worker_id: str, partition: int, group: str) -> Inboxes:
    """What ``worker_id`` would read on ``partition`` (its key only, as its inbox does)."""
    key = worker_id.encode()

    def addressed(envelope: Envelope) -> bool:
        return envelope.key == key

    return bus.subscribe(WORKER_INBOX, group=group, partitions=[partition], record_filter=addressed)


async def _next(subscription: Subscription[Completion | OutputChunk]) -> Completion | OutputChunk:
    delivery = await subscription.next_within(WAIT_S)
    assert delivery is not None, f"nothing on {subscription.topic.name} within {WAIT_S} s"
    return delivery.message


async def _next_in_inbox(subscription: Inboxes) -> Assignment | Migration:
    delivery = await subscription.next_within(WAIT_S)
    assert delivery is not None, f"nothing on {subscription.topic.name} within {WAIT_S} s"
    return delivery.message


async def _chunk(subscription: Answers) -> OutputChunk:
    message = await _next(subscription)
    assert isinstance(message, OutputChunk), f"an answer before any chunk: {message}"
    return message


async def _completion(subscription: Answers) -> Completion:
    """The next answer, passing over output chunks."""
    while True:
        message = await _next(subscription)
        if isinstance(message, Completion):
            return message


async def _read(state: MemoryStateStore, request_id: str) -> RequestRecord:
    record = await RequestLedger(state).read(request_id)
    assert record is not None, f"no record of {request_id}"
    return record


def _counted(reader: InMemoryMetricReader, name: str, worker_id: str) -> int:
    """The value of counter ``name`` for ``worker_id`` (0 when it never counted)."""
    data = reader.get_metrics_data()
    total = 0
    for resource in data.resource_metrics if data is not None else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name != name or not isinstance(metric.data, Sum):
                    continue
                for point in metric.data.data_points:
                    if (point.attributes or {}).get("worker_id") == worker_id:
                        total += int(point.value)
    return total


async def test_completions_carry_an_ordered_emulated_timeline(stack: Stack) -> None:
    async with stack.answers("t-completions") as answers:
        await stack.send(_llm("r1", output=6))
        done = await _completion(answers)
    assert done.request_id == "r1"
    assert done.status is CompletionStatus.OK
    assert done.result == LLMResult(output_tokens=6, text="")
    assert done.emulated is True
    assert done.worker_id == "w1"
    assert done.worker_type == "a100-80gb"
    assert done.variant == MODEL
    assert done.reply_to == "ingress-1"
    t = done.timeline
    assert t.assigned_s is not None
    assert t.started_s is not None
    assert t.first_token_s is not None
    assert t.finished_s is not None
    assert t.arrival_s <= t.assigned_s <= t.started_s <= t.first_token_s <= t.finished_s
    # The worker recorded the answer before sending it: the record has it already, and
    # the request left the worker's books.
    record = await _read(stack.state, "r1")
    assert record.status == "ok"
    assert record.completion == done
    assert await stack.state.zcard(keys.assigned("w1")) == 0
    assert await stack.state.hget(keys.worker("w1"), "completed") == "1"


async def test_streamed_chunks_arrive_in_order_and_add_up(stack: Stack) -> None:
    async with stack.answers("t-stream") as answers:
        await stack.send(_llm("s1", output=10, stream=True))
        got: list[OutputChunk] = []
        while not isinstance(message := await _next(answers), Completion):
            got.append(message)
        done = message
    # Every chunk came before the answer, on the same partition.
    assert done.status is CompletionStatus.OK
    assert [c.index for c in got] == list(range(len(got)))
    # At this time scale the emulation decodes several steps per wake-up, so a chunk
    # holds at least CHUNK_TOKENS tokens (the last one the rest).
    assert sum(c.tokens for c in got) == 10
    assert all(c.tokens >= CHUNK_TOKENS for c in got[:-1])
    assert all(c.emulated and c.reply_to == "ingress-1" and c.request_id == "s1" for c in got)


async def test_a_duplicate_or_stale_assignment_runs_once(stack: Stack) -> None:
    first = _llm("dup", output=3, epoch=1, order=1)
    stale = _llm("dup", output=3, epoch=0, order=1)
    # Recorded as the scheduler would: decided (epoch 0), then re-assigned (epoch 1).
    await _record(stack.state, stale)
    outcome = await RequestLedger(stack.state).assign(Assign(first, replaces_epoch=0))
    assert outcome.result == "assigned"
    async with stack.answers("t-dup") as answers:
        await stack.send(first, record=False)
        await stack.send(first, record=False)  # redelivered
        await stack.send(stale, record=False)  # stale
        # The same partition, so the worker reads it after the three above.
        await stack.send(_llm("marker", output=3, order=2))
        seen: list[tuple[str, int]] = []
        while {"dup", "marker"} - {request_id for request_id, _ in seen}:
            done = await _completion(answers)
            seen.append((done.request_id, done.epoch))
        # Every assignment was read before the marker's: a second copy of "dup" would be
        # waiting, running or already answered by now.
        assert len(stack.worker.queue) == 0
        assert not stack.worker.backend.has_running()
        assert await answers.next_within(0.05) is None
    assert sorted(seen) == [("dup", 1), ("marker", 0)]
    # After a restart the in-memory memory is gone, but the record in the ledger (answered
    # under epoch 1) stops the redelivered assignment.
    recorded = await _read(stack.state, "dup")
    assert (recorded.status, recorded.epoch, recorded.worker_id) == ("ok", 1, "w1")
    restarted = WorkerService(stack.ctx, stack.worker.backend)
    assert await restarted.intake.take([(first, None)]) == 0
    assert "dup" not in restarted.queue


async def test_only_our_assignments_are_taken(stack: Stack) -> None:
    other = _llm("other", worker_id="w2")
    await _record(stack.state, other)
    assert await stack.worker.intake.take([(other, None)]) == 0
    assert "other" not in stack.worker.queue
    # Nor does it touch the record: it stays w2's to start.
    record = await _read(stack.state, "other")
    assert (record.status, record.worker_id) == ("assigned", "w2")


async def test_a_bad_assignment_fails_and_the_worker_goes_on(stack: Stack) -> None:
    request = InferenceRequest(
        request_id="cls",
        app="digits",
        payload=ClassificationPayload(features=[1.0, 2.0]),
        arrival_s=time.time(),
        reply_partition=REPLY_PARTITION,
    )
    bad = Assignment(
        request=request,
        worker_id="w1",
        variant="mlp-small",
        order=0,
        policy="test",
        assigned_at_s=time.time(),
    )
    async with stack.answers("t-bad") as answers:
        await stack.send(bad)
        await stack.send(_llm("wrong-model", model="llama-2-13b"))
        await stack.send(_llm("good", output=2))
        results = {c.request_id: c for c in [await _completion(answers) for _ in range(3)]}
    assert results["cls"].status is CompletionStatus.FAILED
    assert results["cls"].error is not None
    assert "classification request" in results["cls"].error
    assert results["cls"].emulated
    assert results["wrong-model"].status is CompletionStatus.FAILED
    assert "not 'llama-2-13b'" in (results["wrong-model"].error or "")
    assert results["good"].status is CompletionStatus.OK
    assert stack.worker.alive
    # The failures are answers like any other: recorded, so a retry or a poll sees them.
    assert (await _read(stack.state, "cls")).status == "failed"
    assert (await _read(stack.state, "wrong-model")).status == "failed"


def _migration(
    request_id: str,
    *,
    from_worker_id: str,
    epoch: int,
    cost_s: float,
    to_inbox_partition: int | None,
    to_worker_id: str = "w2",
    decided_at_s: float | None = None,
) -> Migration:
    return Migration(
        request_id=request_id,
        from_worker_id=from_worker_id,
        to_worker_id=to_worker_id,
        to_inbox_partition=to_inbox_partition,
        epoch=epoch,
        reason="test",
        expected_gain_s=1.0,
        cost_s=cost_s,
        decided_at_s=time.time() if decided_at_s is None else decided_at_s,
    )


async def _until_queued(worker: WorkerService, request_id: str) -> None:
    """Wait until ``worker`` has taken ``request_id`` in and it waits in its queue."""
    deadline = time.monotonic() + WAIT_S
    while request_id not in worker.queue:
        assert time.monotonic() < deadline, f"{request_id} was not taken in"
        await asyncio.sleep(0.01)


async def _heartbeat_where(
    subscription: Subscription[Heartbeat], test: Callable[[Heartbeat], bool]
) -> Heartbeat:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        delivery = await subscription.next_within(WAIT_S)
        assert delivery is not None
        if test(delivery.message):
            return delivery.message
    raise AssertionError("no matching heartbeat")


async def test_heartbeats_report_queue_load_and_resources(stack: Stack) -> None:
    perf = performance_model(PROFILE)
    held = _llm("held", prompt=300, output=20, not_before_s=time.time() + 3600)
    async with stack.bus.subscribe(HEARTBEATS, group="t-hb") as heartbeats:
        await stack.send(held)
        beat = await _heartbeat_where(heartbeats, lambda h: h.queue_length == 1)
    assert beat.worker_id == "w1"
    assert beat.worker_type == "a100-80gb"
    assert beat.backend == "emulated-llm"
    assert beat.emulated
    assert beat.profile == PROFILE
    assert beat.interval_s == 0.05
    assert beat.inbox_partition == stack.worker.inbox.partition  # where to send it work
    assert beat.running == 0
    assert beat.utilization == 1.0  # a request waits
    assert beat.servable_models == [MODEL] == beat.resident_models
    assert beat.max_slots == perf.max_batch_slots
    assert beat.kv_capacity_tokens == perf.kv_capacity_tokens
    assert beat.kv_used_tokens == 0
    assert beat.queued_tokens == 300
    assert beat.queued_work_s == pytest.approx(perf.idle_service_s(300, 20) / 1000.0)
    assert beat.outstanding_total == 1
    assert [e.request_id for e in beat.outstanding] == ["held"]
    assert not beat.outstanding[0].running
    assert beat.capacity.gpu == perf.tensor_parallel
    assert beat.kv_cache_free_bytes == perf.kv_bytes(perf.kv_capacity_tokens)
    assert not beat.draining
    assert beat.predicted_work_s is None  # the assignment carried no prediction


async def test_heartbeats_report_held_work_as_the_scheduler_predicted_it(stack: Stack) -> None:
    """Policies compare queued work with their own predictions (as in the simulator): the
    heartbeat's ``predicted_work_s`` and listed ``remaining_s`` are the assignments'
    ``predicted_s``, while ``queued_work_s`` stays the backend's own estimate."""
    perf = performance_model(PROFILE)
    held = _llm("held", prompt=300, output=20, not_before_s=time.time() + 3600)
    held = held.model_copy(update={"predicted_s": 0.7})
    async with stack.bus.subscribe(HEARTBEATS, group="t-hb") as heartbeats:
        await stack.send(held)
        beat = await _heartbeat_where(heartbeats, lambda h: h.queue_length == 1)
    assert beat.predicted_work_s == pytest.approx(0.7)
    assert [e.remaining_s for e in beat.outstanding] == [pytest.approx(0.7)]
    assert beat.queued_work_s == pytest.approx(perf.idle_service_s(300, 20) / 1000.0)


async def test_an_assignment_its_record_shows_superseded_or_answered_does_not_run(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    # A worker restarted under its id resumes its inbox's unread assignments: this one was
    # re-assigned elsewhere (epoch 1 recorded) meanwhile, that one already answered, and
    # the last one this worker's earlier incarnation took already.
    state = stack.state
    ledger = RequestLedger(state)
    worker = stack.worker
    moved_on = _llm("moved-on")
    await _record(state, moved_on)
    elsewhere = moved_on.model_copy(update={"worker_id": "w2", "epoch": 1})
    assert (await ledger.assign(Assign(elsewhere, replaces_epoch=0))).result == "assigned"
    answered = _llm("answered")
    await _record(state, answered)
    done = Completion(
        request_id="answered",
        app=MODEL,
        worker_id="w1",
        worker_type="a100-80gb",
        variant=MODEL,
        epoch=0,
        status=CompletionStatus.OK,
        result=LLMResult(output_tokens=8, text=""),
        timeline=RequestTimeline(arrival_s=answered.request.arrival_s, finished_s=time.time()),
    )
    assert await ledger.finish_many([done]) == ["finished"]
    taken = _llm("taken-before")
    await _record(state, taken)
    assert await ledger.start_many([Fence("taken-before", 0, "w1")], time.time()) == ["started"]

    for assignment in (moved_on, answered, taken):
        request_id = assignment.request.request_id
        assert await worker.intake.take([(assignment, None)]) == 0, request_id
        assert request_id not in worker.queue
    # The records are as they were: the refused assignments changed nothing.
    record = await _read(state, "moved-on")
    assert (record.status, record.worker_id, record.epoch) == ("assigned", "w2", 1)
    assert (await _read(state, "taken-before")).status == "running"
    assert (await _read(state, "answered")).completion == done
    # Dropping a superseded assignment counts; the others were only repeats.
    assert _counted(stack.metrics, "switchyard.worker.superseded", "w1") == 1

    # The request's current assignment, and one nobody recorded (with a warning), run.
    current = _llm("current", not_before_s=time.time() + 3600)
    await _record(state, current)
    assert await worker.intake.take([(current, None)]) == 1
    with caplog.at_level(logging.WARNING, logger="switchyard.worker"):
        unrecorded = _llm("unrecorded", not_before_s=time.time() + 3600)
        assert await worker.intake.take([(unrecorded, None)]) == 1
    assert "assignment of unrecorded has no request record" in caplog.text
    assert {"current", "unrecorded"} <= set(worker.holdings.held)
    record = await _read(state, "current")
    assert (record.status, record.worker_id, record.epoch) == ("running", "w1", 0)


async def test_an_answer_of_a_request_given_to_another_worker_meanwhile_is_discarded(
    stack: Stack,
) -> None:
    # A slower emulation (time scale 10): the request runs for about half a second, and
    # meanwhile this worker is declared dead and the request re-assigned to w2.
    bus = stack.bus
    metrics = InMemoryMetricReader()
    ctx = _context(bus, stack.state, metrics=metrics, worker_id="cut-off")
    worker = WorkerService(ctx, EmulatedLlmBackend(performance_model(PROFILE), time_scale=10.0))
    await _start(worker)
    ledger = RequestLedger(stack.state)
    try:
        async with stack.answers("t-cut-off") as answers:
            ran = _llm("taken-away", output=400, stream=True, worker_id="cut-off")
            await _record(stack.state, ran)
            await _send(worker, ran)
            await _chunk(answers)  # running now
            again = ran.model_copy(
                update={"worker_id": "w2", "epoch": 1, "assigned_at_s": time.time()}
            )
            reassigned = await ledger.assign(
                Assign(again, replaces_epoch=0, replaces_worker="cut-off")
            )
            assert reassigned.result == "assigned"
            ctx.stopping.set()
            await worker.drain()  # what ran has finished, its answer recorded or discarded
            after = [d.message for d in await drain_for(answers, 0.1)]
    finally:
        ctx.stopping.set()
        await worker.cancel_routines()
        ctx.telemetry.shutdown()
    # Its answer was never sent, and the record still shows w2's assignment, with the run
    # that should not have happened counted.
    assert not [m for m in after if isinstance(m, Completion)]
    record = await _read(stack.state, "taken-away")
    assert (record.status, record.worker_id, record.epoch) == ("assigned", "w2", 1)
    assert record.completion is None
    assert record.superseded_runs == 1
    assert await stack.state.hget(keys.CLUSTER_STATS, "superseded") == "1"
    assert await stack.state.hget(keys.worker("cut-off"), "completed") is None
    assert _counted(metrics, "switchyard.worker.superseded", "cut-off") == 1


async def test_migrating_a_waiting_request_reassigns_it_with_the_new_epoch(stack: Stack) -> None:
    held = _llm("mover", output=5, not_before_s=time.time() + 3600, epoch=2)
    target = await _elsewhere(stack.worker)
    async with _inbox_of(stack.bus, "w2", target, "t-observer") as w2:
        await stack.send(held)
        await _until_queued(stack.worker, "mover")
        before = time.time()
        await _send(
            stack.worker,
            _migration(
                "mover",
                from_worker_id="w1",
                epoch=3,
                cost_s=0.5,
                decided_at_s=before,
                to_inbox_partition=target,
            ),
        )
        moved = await _next_in_inbox(w2)
        after = time.time()
    assert isinstance(moved, Assignment)
    assert moved.worker_id == "w2"
    assert moved.epoch == 3
    assert moved.request == held.request
    assert moved.generated_tokens == 0
    assert moved.not_before_s is not None
    assert before + 0.5 <= moved.not_before_s <= after + 0.5
    assert "mover" not in stack.worker.queue
    # Recorded where a WorkerDown of the target would look for it, and gone from here.
    state = stack.state
    recorded = await _read(state, "mover")
    assert recorded.assignment == moved
    assert (recorded.status, recorded.worker_id, recorded.epoch) == ("assigned", "w2", 3)
    assert await state.zcard(keys.assigned("w2")) == 1
    assert await state.zcard(keys.assigned(stack.worker.worker_id)) == 0


class _AssignmentsFail(MemoryStateStore):
    """A state store that records no assignment once ``down`` (an outage, as a move sees
    it)."""

    down = False

    async def run_script_many(
        self, script: Script, calls: Sequence[tuple[Sequence[str], Sequence[str]]]
    ) -> list[list[str]]:
        if self.down and script is scripts.ASSIGN:
            raise ConnectionError("the state store is down (test)")
        return await super().run_script_many(script, calls)


async def test_a_move_that_cannot_be_recorded_does_not_happen(stack: Stack) -> None:
    bus = stack.bus
    state = _AssignmentsFail("t-stuck:")
    ctx = _context(bus, state, worker_id="stuck")
    worker = WorkerService(ctx, EmulatedLlmBackend(performance_model(PROFILE), time_scale=1000.0))
    await _start(worker)
    target = await _elsewhere(worker)
    try:
        async with (
            _inbox_of(bus, "w2", target, "t-obs-stuck") as w2,
            stack.answers("t-done-stuck") as answers,
        ):
            held = _llm("stays", output=5, worker_id="stuck", not_before_s=time.time() + 0.5)
            await _record(state, held)
            await _send(worker, held)
            await _until_queued(worker, "stays")
            state.down = True
            moved = await worker.intake.migrate(
                _migration(
                    "stays",
                    from_worker_id="stuck",
                    epoch=1,
                    cost_s=0.1,
                    to_inbox_partition=target,
                )
            )
            # Unrecorded, the move would leave the request on neither worker's books:
            # it stays, nothing is sent to w2, and it runs here when its time comes.
            assert moved is False
            assert "stays" in worker.queue
            state.down = False
            done = await _completion(answers)
            assert await w2.next_within(0.2) is None
    finally:
        ctx.stopping.set()
        await worker.drain()
        await worker.cancel_routines()
    assert (done.request_id, done.worker_id, done.epoch) == ("stays", "stuck", 0)
    assert done.status is CompletionStatus.OK
    record = await _read(state, "stays")
    assert (record.status, record.worker_id, record.epoch) == ("ok", "stuck", 0)
    assert await state.zcard(keys.assigned("w2")) == 0


async def test_migrating_a_running_request_moves_its_tokens_and_kv(stack: Stack) -> None:
    perf = performance_model(PROFILE)
    # A slow emulation (time scale 1) so the request is still running when it moves.
    slow = EmulatedLlmBackend(perf, time_scale=1.0)
    bus = stack.bus
    ctx = _context(bus, stack.state, worker_id="slow")
    worker = WorkerService(ctx, slow)
    await _start(worker)
    target = await _elsewhere(worker)
    try:
        async with (
            _inbox_of(bus, "w2", target, "t-obs2") as w2,
            stack.answers("t-chunks2") as answers,
        ):
            runner = _llm("runner", output=2000, prompt=500, stream=True, worker_id="slow")
            await _record(stack.state, runner)
            await _send(worker, runner)
            await _chunk(answers)  # it has generated tokens
            await _send(
                worker,
                _migration(
                    "runner",
                    from_worker_id="slow",
                    epoch=1,
                    cost_s=9.0,
                    to_inbox_partition=target,
                ),
            )
            moved = await _next_in_inbox(w2)
    finally:
        ctx.stopping.set()
        await worker.drain()
    assert isinstance(moved, Assignment)
    assert moved.worker_id == "w2"
    assert moved.epoch == 1
    assert moved.generated_tokens >= CHUNK_TOKENS
    assert moved.not_before_s is not None
    transfer_s = perf.kv_transfer_s(500 + moved.generated_tokens)
    assert moved.not_before_s - moved.assigned_at_s == pytest.approx(transfer_s, abs=1e-5)
    assert not slow.has_running()
    record = await _read(stack.state, "runner")
    assert (record.status, record.worker_id, record.epoch) == ("assigned", "w2", 1)
    assert await stack.state.zcard(keys.assigned("slow")) == 0


async def test_draining_finishes_running_work_and_says_so(stack: Stack) -> None:
    bus = stack.bus
    async with (
        stack.answers("t-drain") as answers,
        bus.subscribe(HEARTBEATS, group="t-drain-hb") as heartbeats,
    ):
        await stack.send(_llm("last", output=200, stream=True))
        await _chunk(answers)  # running now
        stack.ctx.stopping.set()
        await stack.worker.drain()
        done = await _completion(answers)
        final = await _heartbeat_where(heartbeats, lambda h: h.draining)
    assert done.request_id == "last"
    assert done.status is CompletionStatus.OK
    assert done.result == LLMResult(output_tokens=200, text="")
    assert final.running == 0
    assert (await _read(stack.state, "last")).status == "ok"


async def test_a_draining_worker_heartbeats_until_what_runs_is_done(stack: Stack) -> None:
    # A slower emulation (time scale 10): the long request runs for about half a second,
    # ten heartbeat intervals, so a worker silent while draining would look dead.
    bus = stack.bus
    ctx = _context(bus, stack.state, worker_id="leaving")
    worker = WorkerService(ctx, EmulatedLlmBackend(performance_model(PROFILE), time_scale=10.0))
    await _start(worker)

    def mine(beat: Heartbeat) -> bool:
        return beat.worker_id == "leaving"

    try:
        async with (
            stack.answers("t-leave") as answers,
            bus.subscribe(HEARTBEATS, group="t-leave-hb") as heartbeats,
        ):
            long = _llm("long", output=400, stream=True, worker_id="leaving")
            await _record(stack.state, long)
            await _send(worker, long)
            await _chunk(answers)  # running now
            later = _llm("later", worker_id="leaving", not_before_s=time.time() + 3600)
            await _record(stack.state, later)
            await _send(worker, later)
            await _heartbeat_where(heartbeats, lambda h: mine(h) and h.queue_length == 1)
            ctx.stopping.set()
            draining = asyncio.create_task(worker.drain())
            beats = [await _heartbeat_where(heartbeats, lambda h: mine(h) and h.draining)]
            while beats[-1].running:
                beats.append(await _heartbeat_where(heartbeats, mine))
            done = await _completion(answers)
            await draining
            assert await answers.next_within(0.2) is None  # "later" never ran here
    finally:
        ctx.stopping.set()
        await worker.cancel_routines()
    first, last = beats[0], beats[-1]
    # At once: what runs and what only waits, for the waiting to move now.
    assert [(e.request_id, e.running) for e in first.outstanding] == [
        ("long", True),
        ("later", False),
    ]
    # Every interval while the long request ran, each saying draining.
    assert len(beats) >= 4, [b.running for b in beats]
    assert all(b.draining for b in beats)
    assert [b.sequence for b in beats] == sorted({b.sequence for b in beats})
    # The last: nothing runs, and what still waits is listed for re-assignment.
    assert last.running == 0
    assert [(e.request_id, e.running) for e in last.outstanding] == [("later", False)]
    assert (done.request_id, done.status) == ("long", CompletionStatus.OK)


async def test_a_torch_worker_serves_the_tiny_language_model() -> None:
    bus = Bus(MemoryTransport())
    await bus.start()
    state = MemoryStateStore("t:")
    ctx = _context(bus, state, worker_backend="torch", worker_device="cpu", worker_id="t1")
    worker = await create(ctx, ServingCatalogue(llm={}, classification={}))
    assert isinstance(worker, WorkerService)
    await _start(worker)
    try:
        async with _answers(bus, "t-torch") as answers:
            tiny = _llm("tiny", model=TINY_LM_MODEL, output=5, worker_id="t1")
            await _record(state, tiny)
            await _send(worker, tiny)
            done = await _completion(answers)
    finally:
        ctx.stopping.set()
        await worker.drain()
        await bus.stop()
        ctx.telemetry.shutdown()
    assert done.status is CompletionStatus.OK
    assert not done.emulated
    assert done.worker_type == "cpu"
    assert isinstance(done.result, LLMResult)
    assert done.result.output_tokens == 5
    assert done.result.text is not None
    assert done.result.text != ""
