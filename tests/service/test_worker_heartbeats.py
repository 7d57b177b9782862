"""The worker service's heartbeats over the in-memory bus: the load, resources and
held work they report (held work as the scheduler predicted it), and a draining worker's,
which go on until what runs is done.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from switchyard.contracts.messages import CompletionStatus, Heartbeat, LLMResult
from switchyard.contracts.topics import HEARTBEATS
from switchyard.perf import performance_model

from services.worker.backends.emulated_llm import EmulatedLlmBackend, emulated_text
from services.worker.service import WorkerService
from tests.service.worker_support import (
    MODEL,
    PROFILE,
    Stack,
    _chunk,
    _completion,
    _context,
    _heartbeat_where,
    _llm,
    _read,
    _record,
    _send,
    _start,
    stack_fixture,  # noqa: F401 (the ``stack`` fixture)
)


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
        # Heartbeats sent while it still ran say draining too; the last says nothing runs.
        final = await _heartbeat_where(heartbeats, lambda h: h.draining and h.running == 0)
    assert done.request_id == "last"
    assert done.status is CompletionStatus.OK
    assert done.result == LLMResult(output_tokens=200, text=emulated_text(0, 200))
    assert final.queue_length == 0
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
