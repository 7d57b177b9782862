"""Prefill/decode disaggregation on emulated workers: a request whose assignment names a
decode worker leaves its prefill worker with its first token and its KV cache, is
recorded and sent there as a move (epoch + 1), and is decoded there without a second
prefill; a hand-off that cannot go out is decoded where it was prefilled.

Backend durations are asserted on the modelled clock, not on wall time.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from switchyard.contracts.messages import (
    Assignment,
    CompletionStatus,
    DecodeTarget,
    LLMResult,
    OutputChunk,
)
from switchyard.lifecycle import Assign, RequestLedger
from switchyard.perf import PerformanceModel, performance_model
from switchyard.state import keys

from services.worker.backends.emulated_llm import EmulatedLlmBackend
from services.worker.queue import LocalQueue
from services.worker.service import WorkerService
from tests.service.test_worker_emulated import SCALE, _assignment, _enqueue, _run_all, _times
from tests.service.test_worker_migration import _AssignmentsFail
from tests.service.worker_support import (
    PROFILE,
    Stack,
    _completion,
    _context,
    _llm,
    _next,
    _read,
    _record,
    _send,
    _start,
    stack_fixture,  # noqa: F401 (the ``stack`` fixture)
)
from tests.support.worker import Sink


@pytest.fixture
def perf() -> PerformanceModel:
    return performance_model(PROFILE)


def _for_decode(
    assignment: Assignment, worker_id: str = "d1", partition: int = 3, predicted_s: float = 0.5
) -> Assignment:
    target = DecodeTarget(
        worker_id=worker_id,
        inbox_partition=partition,
        predicted_s=predicted_s,
        predicted_raw_s=predicted_s / 2,
    )
    return assignment.model_copy(update={"decode": target, "predicted_s": 0.1})


@pytest.mark.parametrize("chunked", [None, 512])
async def test_a_prefill_for_a_decode_worker_ends_with_its_first_token_and_kv(
    perf: PerformanceModel, chunked: int | None
) -> None:
    backend = EmulatedLlmBackend(perf, time_scale=SCALE, chunked_prefill_tokens=chunked)
    queue, sink = LocalQueue(), Sink()
    item = _enqueue(backend, queue, _for_decode(_assignment("p", prompt=1000, output=50)))
    _enqueue(backend, queue, _assignment("local", prompt=100, output=5))
    await _run_all(backend, queue, sink)
    handoff = sink.handoffs["p"]
    assert handoff.item is item
    assert handoff.kv_tokens == 1001  # the prompt and the first token
    assert handoff.transfer_s == pytest.approx(perf.kv_transfer_s(1001) / SCALE)
    assert sink.token_counts["p"] == 1
    assert "p" not in sink.results  # its decode is the decode worker's
    assert item.emulated is not None
    assert item.emulated.first_token_s is not None
    # Out of the batch with its memory: what it shared the worker with ran to the end.
    assert not backend.has_running()
    assert backend.load([]).kv_used_tokens == 0
    assert sink.token_counts["local"] == 5
    assert "local" not in sink.handoffs


async def test_a_one_token_answer_finishes_where_it_was_prefilled(perf: PerformanceModel) -> None:
    backend = EmulatedLlmBackend(perf, time_scale=SCALE)
    queue, sink = LocalQueue(), Sink()
    _enqueue(backend, queue, _for_decode(_assignment("one", prompt=300, output=1)))
    await _run_all(backend, queue, sink)
    assert "one" in sink.results
    assert sink.handoffs == {}


async def test_a_handed_off_request_joins_the_decode_batch_without_a_prefill(
    perf: PerformanceModel,
) -> None:
    backend = EmulatedLlmBackend(perf, time_scale=SCALE)
    queue, sink = LocalQueue(), Sink()
    running = _enqueue(backend, queue, _assignment("running", prompt=400, output=40))
    await backend.step(queue, sink, admit=True)  # its prefill
    came = _enqueue(backend, queue, _assignment("came", prompt=2000, output=8, generated=1))
    before = backend.modelled_now_s
    await backend.step(queue, sink, admit=True)  # admits the newcomer: no prefill to spend
    assert backend.modelled_now_s == before
    await _run_all(backend, queue, sink)
    started, first, finished = _times(came)
    assert first == started
    assert sink.token_counts["came"] == 7
    # Only decode steps with the running request (2,000 prompt tokens never prefilled here).
    assert finished - started < perf.prefill_s([2000])
    assert _times(running)[2] > finished


async def _decode_worker(stack: Stack) -> WorkerService:
    ctx = _context(stack.bus, stack.state, worker_id="d1", worker_role="decode")
    worker = WorkerService(ctx, EmulatedLlmBackend(performance_model(PROFILE), time_scale=1000.0))
    await _start(worker)
    return worker


async def _stop(worker: WorkerService) -> None:
    worker.ctx.stopping.set()
    await worker.drain()
    await worker.cancel_routines()


async def test_a_streamed_request_is_prefilled_on_one_worker_and_decoded_on_another(
    stack: Stack,
) -> None:
    decoder = await _decode_worker(stack)
    try:
        async with stack.answers("t-disaggregated") as answers:
            sent = _llm("split", prompt=800, output=12, stream=True)
            await stack.send(_for_decode(sent, "d1", decoder.inbox.partition))
            chunks: list[OutputChunk] = []
            while True:
                event = await _next(answers)
                if not isinstance(event, OutputChunk):
                    done = event
                    break
                chunks.append(event)
    finally:
        await _stop(decoder)
    assert done.status is CompletionStatus.OK
    assert (done.worker_id, done.epoch) == ("d1", 1)
    # The first token came from the prefill worker (epoch 0), the rest from d1 (epoch 1).
    assert [(c.epoch, c.tokens) for c in chunks if c.epoch == 0] == [(0, 1)]
    assert sum(c.tokens for c in chunks) == 12
    timeline = done.timeline
    assert timeline.started_s is not None
    assert timeline.first_token_s is not None
    # Its decision is the first one, not the hand-off (which came after its first token).
    assert timeline.assigned_s == sent.assigned_at_s
    assert sent.assigned_at_s <= timeline.started_s <= timeline.first_token_s
    record = await _read(stack.state, "split")
    assert (record.status, record.worker_id, record.epoch) == ("ok", "d1", 1)
    assert record.assignment is not None
    assert record.assignment.generated_tokens == 1
    assert record.assignment.first_assigned_s == sent.assigned_at_s
    # The decode worker's own type's predictions (what it reports and calibrates on).
    assert (record.assignment.predicted_s, record.assignment.predicted_raw_s) == (0.5, 0.25)
    assert record.assignment.decode is None
    # The decode worker was not asked to prefill: its assignment started at the prefill
    # worker's start, and its first token is the prefill worker's.
    assert record.assignment.started_s == timeline.started_s
    assert record.assignment.first_token_s == timeline.first_token_s
    assert await stack.state.zcard(keys.assigned("w1")) == 0


async def test_a_hand_off_the_ledger_cannot_record_is_decoded_here_and_answered_once(
    stack: Stack,
) -> None:
    state = _AssignmentsFail("t-refused:")
    ctx = _context(stack.bus, state, worker_id="p1", worker_role="prefill")
    worker = WorkerService(ctx, EmulatedLlmBackend(performance_model(PROFILE), time_scale=1000.0))
    await _start(worker)
    try:
        async with stack.answers("t-refused") as answers:
            sent = _for_decode(_llm("kept", prompt=300, output=6, worker_id="p1"), "d1", 3)
            await _record(state, sent)
            state.down = True  # the move's record fails; the start (another script) works
            await _send(worker, sent)
            done = await _completion(answers)
            assert await answers.next_within(0.3) is None
    finally:
        state.down = False
        await _stop(worker)
    assert (done.request_id, done.worker_id, done.epoch) == ("kept", "p1", 0)
    assert done.status is CompletionStatus.OK
    assert isinstance(done.result, LLMResult)
    assert done.result.output_tokens == 6
    record = await _read(state, "kept")
    assert (record.status, record.worker_id, record.epoch) == ("ok", "p1", 0)
    assert await state.zcard(keys.assigned("d1")) == 0


async def test_a_hand_off_of_a_request_given_away_meanwhile_is_dropped(stack: Stack) -> None:
    # Real time (scale 1): a 4,000-token prefill lasts about 0.3 s, time enough to give
    # the request to another worker, as a WorkerDown would, before its hand-off.
    ctx = _context(stack.bus, stack.state, worker_id="p2", worker_role="prefill")
    perf = performance_model(PROFILE)
    backend = EmulatedLlmBackend(perf, time_scale=1.0)
    worker = WorkerService(ctx, backend)
    await _start(worker)
    try:
        async with stack.answers("t-given-away") as answers:
            sent = _for_decode(_llm("away", prompt=4000, output=6, worker_id="p2"), "d1", 3)
            await _record(stack.state, sent)
            await _send(worker, sent)
            deadline = time.monotonic() + 5.0
            while "away" not in worker.holdings.held or "away" in worker.queue:
                assert time.monotonic() < deadline, "its prefill did not begin"
                await asyncio.sleep(0.005)
            elsewhere = sent.model_copy(update={"worker_id": "x", "epoch": 1, "decode": None})
            ledger = RequestLedger(stack.state)
            given = await ledger.assign(Assign(elsewhere, replaces_epoch=0, replaces_worker="p2"))
            assert given.result == "assigned"
            # Its prefill ends, the hand-off finds it gone: dropped, not decoded here (its
            # worker spent one prefill and nothing since).
            assert await answers.next_within(1.0) is None
            assert "away" not in worker.holdings.held
            assert backend.modelled_now_s == pytest.approx(perf.prefill_s([4000]))
    finally:
        await _stop(worker)
    record = await _read(stack.state, "away")
    assert (record.status, record.worker_id, record.epoch) == ("assigned", "x", 1)
    assert await stack.state.zcard(keys.assigned("d1")) == 0
