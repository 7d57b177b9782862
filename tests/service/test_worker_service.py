"""The worker service over the in-memory bus and state store: the answers it sends.
A completion carries an ordered emulated timeline and is recorded before it is sent, a
streamed request's chunks arrive in order before it, a bad assignment fails without
stopping the worker, and the torch backend serves the tiny language model.
"""

from __future__ import annotations

import time

from switchyard.bus import Bus, MemoryTransport
from switchyard.contracts.messages import (
    Assignment,
    ClassificationPayload,
    Completion,
    CompletionStatus,
    InferenceRequest,
    LLMResult,
    OutputChunk,
)
from switchyard.serving import TINY_LM_MODEL, ServingCatalogue
from switchyard.state import MemoryStateStore, keys

from services.worker import create
from services.worker.backends.emulated_llm import emulated_text
from services.worker.reporting import CHUNK_TOKENS
from services.worker.service import WorkerService
from tests.service.worker_support import (
    MODEL,
    REPLY_PARTITION,
    Stack,
    _answers,
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


async def test_completions_carry_an_ordered_emulated_timeline(stack: Stack) -> None:
    async with stack.answers("t-completions") as answers:
        await stack.send(_llm("r1", output=6))
        done = await _completion(answers)
    assert done.request_id == "r1"
    assert done.status is CompletionStatus.OK
    assert done.result == LLMResult(output_tokens=6, text=emulated_text(0, 6))
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
