"""A state store that lost its data gets its answers back from the answers topic and its
unanswered requests from the requests topics and the worker inbox, and a request naming
its id waits for that rather than running a second time."""

from __future__ import annotations

import asyncio
import time

from switchyard.contracts.messages import (
    Assignment,
    Completion,
    CompletionStatus,
    InferenceRequest,
    LLMPayload,
    LLMResult,
    OutputChunk,
    RequestTimeline,
)
from switchyard.contracts.topics import ANSWERS, REQUESTS, WORKER_INBOX

from tests.service.monitor_support import (
    Stack,
    stack_fixture,  # noqa: F401 (the ``stack`` fixture)
)


def request(request_id: str) -> InferenceRequest:
    return InferenceRequest(
        request_id=request_id,
        app="chat",
        payload=LLMPayload(model="llama-2-7b", prompt_tokens=12, max_output_tokens=8),
        arrival_s=time.time(),
        reply_to="ingress-a",
    )


def answer(request_id: str, text: str) -> Completion:
    now_s = time.time()
    return Completion(
        request_id=request_id,
        app="chat",
        worker_id="w1",
        worker_type="emulated-llm",
        variant="llama-2-7b",
        epoch=1,
        status=CompletionStatus.OK,
        result=LLMResult(output_tokens=3, text=text),
        timeline=RequestTimeline(arrival_s=now_s - 1, started_s=now_s - 0.5, finished_s=now_s),
    )


async def test_the_answers_come_back_and_a_named_retry_waits_for_them(stack: Stack) -> None:
    monitor = await stack.monitor(run=False)
    watch = monitor.state_watch
    await watch.check()
    await watch.settled()  # a new store: nothing to restore, then marked
    for request_id in ("answered", "also-answered"):
        assert (await stack.ledger.accept(request(request_id), named=True)).accepted
    sent = [answer("answered", "first run"), answer("also-answered", "its answer")]
    for completion in sent:
        await stack.bus.publish(ANSWERS, completion, partition=0)
    await stack.bus.publish(
        ANSWERS,
        OutputChunk(request_id="answered", index=0, tokens=1, sent_at_s=time.time()),
        partition=1,
    )

    # Redis restarted empty.
    await stack.state.clear_prefix()
    # Until the answers are back, a retry naming its id is refused (it would run the
    # request again); a call with an id the ingress made up is new and goes on.
    refused = await stack.ledger.accept(request("answered"), named=True)
    assert (refused.accepted, refused.restoring) == (False, True)
    assert (await stack.ledger.accept(request("req-fresh"))).accepted

    # Answers keep coming while the restore reads: it ends all the same, once it has
    # read what the topic held when it began.
    async def keep_answering() -> None:
        for n in range(10_000):
            await stack.bus.publish(ANSWERS, answer(f"later-{n}", "x"), partition=0)
            await asyncio.sleep(0.005)

    answering = asyncio.create_task(keep_answering())
    try:
        assert await watch.check()  # the loss, reported; the restore starts
        await asyncio.wait_for(watch.settled(), 10.0)
    finally:
        answering.cancel()
    assert watch.restored >= 2

    retry = await stack.ledger.accept(request("answered"), named=True)
    assert not retry.accepted
    assert retry.record is not None
    assert retry.record.final
    assert retry.record.completion == sent[0]
    # A request recorded again since the loss keeps its record.
    fresh = await stack.ledger.read("req-fresh")
    assert fresh is not None
    assert fresh.status == "queued"
    # New ids that name themselves are accepted again.
    assert (await stack.ledger.accept(request("next"), named=True)).accepted
    assert not await watch.check()


async def test_unanswered_requests_come_back_so_a_retry_never_runs_one_twice(
    stack: Stack,
) -> None:
    monitor = await stack.monitor(run=False)
    watch = monitor.state_watch
    await watch.check()
    await watch.settled()
    # Before the loss: "waiting" was accepted and not yet decided, "running" was placed
    # on w1 and is running there, "answered" has its answer.
    asked = {name: request(name) for name in ("waiting", "running", "answered")}
    for name in asked:
        await stack.bus.publish(REQUESTS, asked[name])
    placed = Assignment(
        request=asked["running"],
        worker_id="w1",
        variant="llama-2-7b",
        order=1.0,
        policy="jsq",
        epoch=1,
        assigned_at_s=time.time(),
    )
    await stack.bus.publish(WORKER_INBOX, placed, partition=0)
    await stack.bus.publish(ANSWERS, answer("answered", "its answer"), partition=0)

    await stack.state.clear_prefix()
    assert await watch.check()
    await asyncio.wait_for(watch.settled(), 10.0)

    # A retry of each finds its request where it was, waiting for its one answer.
    for name, status in (("waiting", "queued"), ("running", "assigned")):
        retry = await stack.ledger.accept(asked[name], named=True)
        assert not retry.accepted, name
        assert retry.record is not None
        assert retry.record.status == status
    # The worker running it records its answer under the fence it was given.
    finished = answer("running", "ran once").model_copy(update={"epoch": 1})
    assert await stack.ledger.finish_many([finished]) == ["finished"]
    # The answered one knows what was asked, so another body under its id is told apart.
    record = await stack.ledger.read("answered")
    assert record is not None
    assert record.request == asked["answered"]
