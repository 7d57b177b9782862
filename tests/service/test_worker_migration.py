"""Migrations out of the worker service: a waiting or a running request is recorded
and sent to its target's inbox partition under the new epoch (a running one with its
generated tokens and the time its KV cache takes to move), and a move the ledger cannot
record does not happen.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import pytest
from switchyard.bus import Bus, Envelope, Subscription
from switchyard.contracts.messages import (
    Assignment,
    CompletionStatus,
    Migration,
    PlacementOrder,
)
from switchyard.contracts.topics import WORKER_INBOX
from switchyard.lifecycle import scripts
from switchyard.perf import performance_model
from switchyard.state import MemoryStateStore, keys
from switchyard.state.base import Script

from services.worker.backends.emulated_llm import EmulatedLlmBackend
from services.worker.reporting import CHUNK_TOKENS
from services.worker.service import WorkerService
from tests.service.worker_support import (
    PROFILE,
    WAIT_S,
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

Inboxes = Subscription[Assignment | Migration | PlacementOrder]


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


async def _next_in_inbox(subscription: Inboxes) -> Assignment | Migration | PlacementOrder:
    delivery = await subscription.next_within(WAIT_S)
    assert delivery is not None, f"nothing on {subscription.topic.name} within {WAIT_S} s"
    return delivery.message


def _migration(
    request_id: str,
    *,
    from_worker_id: str,
    epoch: int,
    cost_s: float,
    to_inbox_partition: int | None,
    to_worker_id: str = "w2",
    decided_at_s: float | None = None,
    predicted_s: float | None = None,
) -> Migration:
    return Migration(
        predicted_s=predicted_s,
        predicted_raw_s=None if predicted_s is None else predicted_s / 2,
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
                predicted_s=0.8,
            ),
        )
        moved = await _next_in_inbox(w2)
        after = time.time()
    assert isinstance(moved, Assignment)
    assert moved.worker_id == "w2"
    assert moved.epoch == 3
    assert moved.request == held.request
    # The target's own type's predictions (what it reports and calibrates on).
    assert (moved.predicted_s, moved.predicted_raw_s) == (0.8, 0.4)
    assert moved.first_assigned_s == held.assigned_at_s
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
