"""Fencing in the worker service through the request ledger: an assignment that is a
duplicate, stale, another worker's, superseded or already answered does not run, and
the answer of a request re-assigned meanwhile is discarded (and counted).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, Sum
from switchyard.contracts.messages import (
    Assignment,
    Completion,
    CompletionStatus,
    LLMResult,
    RequestTimeline,
)
from switchyard.errors import StateError
from switchyard.lifecycle import Assign, Fence, RequestLedger
from switchyard.perf import performance_model
from switchyard.runtime.service import ServiceContext
from switchyard.state import keys

from services.worker.backends.emulated_llm import EmulatedLlmBackend
from services.worker.service import WorkerService
from services.worker.touch import Touch
from tests.service.worker_support import (
    MODEL,
    PROFILE,
    Stack,
    _chunk,
    _completion,
    _context,
    _llm,
    _read,
    _record,
    _send,
    _start,
    stack_fixture,  # noqa: F401 (the ``stack`` fixture)
)
from tests.support.bus import drain_for


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


async def _slow_worker(
    stack: Stack, worker_id: str
) -> tuple[ServiceContext, WorkerService, InMemoryMetricReader]:
    """A second worker on the stack's bus and store, its emulation at time scale 10 (a
    long request runs for about half a second), started; its context and metrics."""
    metrics = InMemoryMetricReader()
    ctx = _context(stack.bus, stack.state, metrics=metrics, worker_id=worker_id)
    worker = WorkerService(ctx, EmulatedLlmBackend(performance_model(PROFILE), time_scale=10.0))
    await _start(worker)
    return ctx, worker, metrics


async def _stop(ctx: ServiceContext, worker: WorkerService) -> None:
    ctx.stopping.set()
    await worker.cancel_routines()
    ctx.telemetry.shutdown()


async def _move(stack: Stack, ran: Assignment, to_worker_id: str) -> Assignment:
    """Re-assign ``ran`` (epoch 0) to ``to_worker_id`` at epoch 1, as after a WorkerDown;
    the new assignment."""
    again = ran.model_copy(
        update={"worker_id": to_worker_id, "epoch": 1, "assigned_at_s": time.time()}
    )
    moved = await RequestLedger(stack.state).assign(
        Assign(again, replaces_epoch=0, replaces_worker=ran.worker_id)
    )
    assert moved.result == "assigned"
    return again


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
    # The request runs for about half a second, and meanwhile this worker is declared
    # dead and the request re-assigned to w2.
    ctx, worker, metrics = await _slow_worker(stack, "cut-off")
    try:
        async with stack.answers("t-cut-off") as answers:
            ran = _llm("taken-away", output=400, stream=True, worker_id="cut-off")
            await _record(stack.state, ran)
            await _send(worker, ran)
            await _chunk(answers)  # running now
            await _move(stack, ran, "w2")
            ctx.stopping.set()
            await worker.drain()  # what ran has finished, its answer recorded or discarded
            after = [d.message for d in await drain_for(answers, 0.1)]
    finally:
        await _stop(ctx, worker)
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


async def test_a_worker_back_in_touch_stops_what_was_given_to_another_meanwhile(
    stack: Stack,
) -> None:
    # As above, but the worker was out of touch for longer than the worker timeout (its
    # clock says so): before its next step it reads its holdings' records and stops the
    # request given to w2, so that it neither finishes nor answers it.
    ctx, worker, metrics = await _slow_worker(stack, "was-frozen")
    clock = [time.monotonic()]
    worker.touch = Touch(ctx.settings.worker_timeout_s, lambda: clock[0])
    try:
        async with stack.answers("t-was-frozen") as answers:
            ran = _llm("taken-away", output=400, stream=True, worker_id="was-frozen")
            kept = _llm("still-mine", output=400, stream=True, worker_id="was-frozen")
            for assignment in (ran, kept):
                await _record(stack.state, assignment)
                await _send(worker, assignment)
            await _chunk(answers)  # running now
            await _move(stack, ran, "w2")
            clock[0] += ctx.settings.worker_timeout_s + 1.0  # out of touch
            done = await _completion(answers)
            later = [d.message for d in await drain_for(answers, 0.1)]
    finally:
        await _stop(ctx, worker)
    assert (done.request_id, done.status) == ("still-mine", CompletionStatus.OK)
    assert not [m for m in later if isinstance(m, Completion)]
    assert "taken-away" not in worker.holdings.held
    record = await _read(stack.state, "taken-away")
    assert (record.status, record.worker_id, record.epoch) == ("assigned", "w2", 1)
    assert record.superseded_runs == 0  # stopped, not run to the end
    assert _counted(metrics, "switchyard.worker.superseded", "was-frozen") == 1


async def test_a_request_given_back_to_the_worker_that_runs_it_is_answered_once(
    stack: Stack,
) -> None:
    # The worker was declared dead while it ran the request (a slow heartbeat), and the
    # scheduler gave the request back to the same worker at epoch 1. The run in progress
    # is the run of epoch 1: it goes on, and its answer is recorded and sent.
    ctx, worker, metrics = await _slow_worker(stack, "revived")
    try:
        async with stack.answers("t-revived") as answers:
            ran = _llm("given-back", output=200, stream=True, worker_id="revived")
            await _record(stack.state, ran)
            await _send(worker, ran)
            await _chunk(answers)  # running now
            again = await _move(stack, ran, "revived")
            await _send(worker, again)
            done = await _completion(answers)
            later = [d.message for d in await drain_for(answers, 0.3)]
    finally:
        await _stop(ctx, worker)
    assert (done.request_id, done.epoch, done.status) == ("given-back", 1, CompletionStatus.OK)
    assert not [m for m in later if isinstance(m, Completion)]  # answered once
    record = await _read(stack.state, "given-back")
    assert (record.status, record.worker_id, record.epoch) == ("ok", "revived", 1)
    assert record.superseded_runs == 0
    assert _counted(metrics, "switchyard.worker.superseded", "revived") == 0


async def test_a_start_whose_reply_was_lost_runs_when_its_assignment_comes_again(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The store started the request, then the reply was lost (a timeout under load): the
    # batch is handled again, and the record already says "running" on this worker. This
    # worker never took it in, so nobody else will run it: it must, once.
    lost = _lose_the_first_reply(monkeypatch, stack.worker.intake.ledger, "start_many")
    async with stack.answers("t-lost-reply") as answers:
        await stack.send(_llm("lost-reply", output=3))
        done = await _completion(answers)
        later = [d.message for d in await drain_for(answers, 0.3)]
    assert [f.request_id for f in lost] == ["lost-reply"]
    assert (done.request_id, done.status) == ("lost-reply", CompletionStatus.OK)
    assert not [m for m in later if isinstance(m, Completion)]  # run once, answered once
    assert (await _read(stack.state, "lost-reply")).status == "ok"


async def test_an_answer_recorded_by_an_attempt_whose_reply_was_lost_is_still_sent(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The store recorded the answer, then the reply was lost: the retry finds it recorded
    # ("duplicate"), and the caller, who waits on the bus, must get it all the same.
    lost = _lose_the_first_reply(monkeypatch, stack.worker.outbox.ledger, "finish_many")
    async with stack.answers("t-lost-finish") as answers:
        await stack.send(_llm("lost-finish", output=3))
        done = await _completion(answers)
    assert [c.request_id for c in lost] == ["lost-finish"]
    assert (done.request_id, done.status) == ("lost-finish", CompletionStatus.OK)
    assert (await _read(stack.state, "lost-finish")).status == "ok"


def _lose_the_first_reply(
    monkeypatch: pytest.MonkeyPatch, ledger: RequestLedger, method: str
) -> list[Any]:
    """Make ``ledger.method`` do its work, then fail its first call as a lost reply from
    the store would; returns what that call was given."""
    real = getattr(ledger, method)
    lost: list[Any] = []

    async def work_then_lose_the_reply(items: Sequence[Any], *args: Any, **kwargs: Any) -> Any:
        results = await real(items, *args, **kwargs)
        if not lost:
            lost.extend(items)
            raise StateError("Redis timed out: the reply was lost", retriable=True)
        return results

    monkeypatch.setattr(ledger, method, work_then_lose_the_reply)
    return lost
