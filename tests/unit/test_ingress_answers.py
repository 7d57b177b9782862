"""The ingress's building blocks: the answer registry, request records and token counts."""

from __future__ import annotations

import asyncio
import time

import pytest
from switchyard.bus import Bus, MemoryTransport
from switchyard.contracts.messages import (
    Completion,
    CompletionStatus,
    InferenceRequest,
    LLMPayload,
    LLMResult,
    OutputChunk,
    RequestTimeline,
)
from switchyard.contracts.topics import COMPLETIONS
from switchyard.state.memory import MemoryStateStore

from services.cluster_state import REQUEST_TTL_S, record_completion, request_key
from services.ingress import records
from services.ingress.answers import AnswerRegistry
from services.ingress.routing import route_completions
from services.ingress.tokens import approximate_tokens, chat_prompt


def completion(request_id: str = "r-1", *, epoch: int = 0, text: str = "hi") -> Completion:
    return Completion(
        request_id=request_id,
        app="chat",
        worker_id="w-1",
        worker_type="a100",
        variant="llama-2-7b",
        epoch=epoch,
        status=CompletionStatus.OK,
        result=LLMResult(output_tokens=1, text=text),
        timeline=RequestTimeline(arrival_s=1.0, finished_s=2.0),
        deadline_s=3.0,
        reply_to="me",
    )


def chunk(request_id: str = "r-1", *, index: int = 0, epoch: int = 0) -> OutputChunk:
    return OutputChunk(
        request_id=request_id,
        epoch=epoch,
        index=index,
        text=f"t{index}",
        tokens=1,
        reply_to="me",
        sent_at_s=time.time(),
    )


# -- the registry ------------------------------------------------------------------------


async def test_answers_for_nobody_are_dropped() -> None:
    answers = AnswerRegistry("me")
    assert answers.deliver(completion()) is False
    assert answers.deliver(chunk()) is False


async def test_only_answers_addressed_to_this_replica_are_its_own() -> None:
    answers = AnswerRegistry("me")
    assert answers.is_mine("me")
    assert not answers.is_mine("someone-else")
    assert not answers.is_mine(None)


async def test_a_duplicate_completion_resolves_once() -> None:
    answers = AnswerRegistry("me")
    with answers.waiting("r-1") as waiter:
        first = completion(text="first")
        assert answers.deliver(first) is True
        assert answers.deliver(completion(text="second")) is False
        assert await waiter.completion(0.1) is first
    assert len(answers) == 0
    assert answers.deliver(completion()) is False  # released: nobody waits any more


async def test_a_stream_gets_new_chunks_in_order_then_the_completion() -> None:
    answers = AnswerRegistry("me")
    with answers.waiting("r-1", stream=True) as waiter:
        assert answers.deliver(chunk(index=0))
        assert answers.deliver(chunk(index=1))
        assert not answers.deliver(chunk(index=0))  # redelivered
        done = completion()
        assert answers.deliver(done)
        assert answers.deliver(chunk(index=2))  # late, after the completion overtook it
        events = [await waiter.next_event(0.1) for _ in range(4)]
        assert [getattr(e, "index", None) for e in events] == [0, 1, None, 2]
        assert events[2] is done
        assert await waiter.next_event(0.01) is None
        assert waiter.pending_event() is None


async def test_a_completion_older_than_the_newest_chunk_epoch_is_stale() -> None:
    answers = AnswerRegistry("me")
    with answers.waiting("r-1", stream=True) as waiter:
        answers.deliver(chunk(index=0, epoch=1))
        assert answers.deliver(completion(epoch=0)) is False
        newer = completion(epoch=1)
        assert answers.deliver(newer) is True
        assert await waiter.completion(0.1) is newer


async def test_every_waiter_of_a_request_gets_the_answer() -> None:
    answers = AnswerRegistry("me")
    with answers.waiting("r-1") as one, answers.waiting("r-1") as two:
        answers.deliver(completion())
        assert await one.completion(0.1) is not None
        assert await two.completion(0.1) is not None
        assert answers.is_waited_for("r-1")
    assert not answers.is_waited_for("r-1")


async def test_waiting_times_out_with_none() -> None:
    answers = AnswerRegistry("me")
    with answers.waiting("r-1", stream=True) as waiter:
        assert await waiter.completion(0.01) is None
        assert await waiter.next_event(0.01) is None


# -- records -------------------------------------------------------------------------------


def request(request_id: str = "r-1") -> InferenceRequest:
    return InferenceRequest(
        request_id=request_id,
        app="chat",
        payload=LLMPayload(model="llama-2-7b", prompt_tokens=7, max_output_tokens=4),
        arrival_s=100.0,
        deadline_s=130.0,
        reply_to="me",
    )


async def test_a_record_goes_from_queued_to_its_completion() -> None:
    state = MemoryStateStore()
    assert await records.read(state, "r-1") is None
    await records.write_accepted(state, request())
    queued = await records.read(state, "r-1")
    assert queued is not None
    assert (queued.app, queued.kind, queued.status, queued.reply_to) == (
        "chat",
        "llm",
        "queued",
        "me",
    )
    assert (queued.arrival_s, queued.deadline_s, queued.prompt_tokens) == (100.0, 130.0, 7)
    assert queued.completion is None
    ttl = await state.ttl_s(request_key("r-1"))
    assert ttl is not None
    assert 0 < ttl <= REQUEST_TTL_S

    done = completion()
    assert await record_completion(state, done) is True
    assert await record_completion(state, done) is False  # a redelivery
    finished = await records.read(state, "r-1")
    assert finished is not None
    assert finished.status == "ok"
    assert finished.worker_id == "w-1"
    assert finished.completion == done
    assert finished.prompt_tokens == 7


async def test_a_stale_completion_does_not_replace_a_newer_one() -> None:
    state = MemoryStateStore()
    await records.write_accepted(state, request())
    newer = completion(epoch=2, text="newer")
    await record_completion(state, newer)
    assert await record_completion(state, completion(epoch=1, text="older")) is False
    stored = await records.read(state, "r-1")
    assert stored is not None
    assert stored.completion == newer


async def test_a_claim_is_taken_once_and_forget_frees_it() -> None:
    state = MemoryStateStore()
    assert await records.claim(state, "r-1", "me") is True
    assert await records.claim(state, "r-1", "other") is False
    await records.write_accepted(state, request())
    await records.forget(state, "r-1")
    assert await records.read(state, "r-1") is None
    assert await records.claim(state, "r-1", "other") is True


# -- tokens ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "tokens"),
    [("", 1), ("a", 1), ("abcd", 1), ("abcde", 2), ("é" * 4, 2), ("x" * 400, 100)],
)
def test_prompt_tokens_are_utf8_bytes_over_four_rounded_up(text: str, tokens: int) -> None:
    assert approximate_tokens(text) == tokens


def test_chat_prompt_is_one_line_per_message_then_the_assistant_cue() -> None:
    assert chat_prompt([("user", "Hi")]) == "user: Hi\nassistant:"
    assert chat_prompt([]) == "assistant:"


# -- the answer loops ----------------------------------------------------------------------


async def test_a_replica_reads_only_the_answers_since_it_started() -> None:
    bus = Bus(MemoryTransport())
    await bus.start()
    state = MemoryStateStore()
    answers = AnswerRegistry("me")
    # History: an answer for this replica id from long before this process started.
    await bus.publish(COMPLETIONS, completion("r-old"))
    await asyncio.sleep(0.05)
    since_s = time.time()
    stopping = asyncio.Event()
    loop = asyncio.create_task(
        route_completions(bus, state, answers, stopping=stopping, since_s=since_s)
    )
    try:
        with answers.waiting("r-new") as waiter:
            await bus.publish(COMPLETIONS, completion("r-new"))
            assert await waiter.completion(5.0) is not None
    finally:
        stopping.set()
        await loop
        await bus.stop()
    # The old one was passed over, not recorded again; the new one was recorded.
    assert await records.read(state, "r-old") is None
    recorded = await records.read(state, "r-new")
    assert recorded is not None
    assert recorded.status == "ok"
