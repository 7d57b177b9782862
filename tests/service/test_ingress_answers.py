"""The ingress's building blocks: the answer registry, the request records it reads, token
counts, and the loops that bring answers back to a replica.

Answers come to a replica on its own partition of ``switchyard.answers`` (leased at start,
named in every request as ``reply_partition``), recorded by the worker in the request
ledger before they are sent; the ingress writes nothing when one comes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from switchyard.bus import Bus, MemoryBroker, MemoryTransport
from switchyard.config import load_settings
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
from switchyard.contracts.topics import ANSWERS
from switchyard.lifecycle import REQUEST_TTL_S, Assign, Fence, RequestLedger
from switchyard.runtime.inbox import Inbox
from switchyard.runtime.service import ServiceContext
from switchyard.state import keys
from switchyard.state.memory import MemoryStateStore
from switchyard.telemetry import Telemetry

from services.ingress import routing
from services.ingress.answers import AnswerRegistry
from services.ingress.routing import (
    answer_group,
    answer_subscription,
    route_answers,
    sweep_overdue,
)
from services.ingress.tokens import approximate_tokens, chat_prompt
from tests.support.services import mark_restored

WAIT_S = 10.0  # generous: these waits end on an event, the timeout only bounds a failure


def completion(
    request_id: str = "r-1", *, epoch: int = 0, text: str = "hi", reply_to: str = "me"
) -> Completion:
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
        reply_to=reply_to,
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
        # Late, after the completion overtook it (an overdue call's answer is delivered
        # from its record, not from the partition its chunks come on).
        assert answers.deliver(chunk(index=2))
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


# -- records, as the ingress reads them --------------------------------------------------


def request(request_id: str = "r-1") -> InferenceRequest:
    return InferenceRequest(
        request_id=request_id,
        app="chat",
        payload=LLMPayload(model="llama-2-7b", prompt_tokens=7, max_output_tokens=4),
        arrival_s=100.0,
        deadline_s=130.0,
        reply_to="me",
        reply_partition=0,
    )


def assignment(request_id: str = "r-1", *, epoch: int = 0) -> Assignment:
    return Assignment(
        request=request(request_id),
        worker_id="w-1",
        variant="llama-2-7b",
        order=0.0,
        policy="test",
        epoch=epoch,
        assigned_at_s=101.0 + epoch,
    )


async def answered(ledger: RequestLedger, done: Completion) -> None:
    """Take ``done``'s request through its life as the scheduler and worker w-1 do."""
    assert (await ledger.accept(request(done.request_id))).accepted
    assert (await ledger.assign(Assign(assignment(done.request_id)))).result == "assigned"
    assert await ledger.start_many([Fence(done.request_id, 0, "w-1")], 102.0) == ["started"]
    assert await ledger.finish_many([done]) == ["finished"]


async def test_a_record_goes_from_queued_to_its_completion() -> None:
    state = MemoryStateStore()
    await mark_restored(state)
    ledger = RequestLedger(state)
    assert await ledger.read("r-1") is None
    accepted = request()
    assert (await ledger.accept(accepted)).accepted
    queued = await ledger.read("r-1")
    assert queued is not None
    assert (queued.app, queued.kind, queued.status, queued.reply_to) == (
        "chat",
        "llm",
        "queued",
        "me",
    )
    assert (queued.arrival_s, queued.deadline_s, queued.prompt_tokens) == (100.0, 130.0, 7)
    assert queued.request == accepted
    assert queued.completion is None
    assert not queued.final
    ttl = await state.ttl_s(keys.request("r-1"))
    assert ttl is not None
    assert 0 < ttl <= REQUEST_TTL_S

    assert (await ledger.assign(Assign(assignment()))).result == "assigned"
    assert await ledger.start_many([Fence("r-1", 0, "w-1")], 102.0) == ["started"]
    done = completion()
    assert await ledger.finish_many([done]) == ["finished"]
    assert await ledger.finish_many([done]) == ["duplicate"]  # a redelivery
    finished = await ledger.read("r-1")
    assert finished is not None
    assert finished.status == "ok"
    assert finished.final
    assert finished.worker_id == "w-1"
    assert finished.completion == done
    assert finished.prompt_tokens == 7


async def test_a_stale_completion_does_not_replace_a_newer_one() -> None:
    state = MemoryStateStore()
    await mark_restored(state)
    ledger = RequestLedger(state)
    await ledger.accept(request())
    await ledger.assign(Assign(assignment(epoch=1)))
    # Re-assigned (epoch 2) while epoch 1 still ran.
    assert (await ledger.assign(Assign(assignment(epoch=2), replaces_epoch=1))).result == (
        "assigned"
    )
    assert await ledger.finish_many([completion(epoch=1, text="older")]) == ["superseded"]
    newer = completion(epoch=2, text="newer")
    assert await ledger.finish_many([newer]) == ["finished"]
    # Once the newer is recorded, the older is still superseded, never a duplicate (a
    # worker would take that for its own earlier write and publish it).
    assert await ledger.finish_many([completion(epoch=1, text="older")]) == ["superseded"]
    stored = await ledger.read("r-1")
    assert stored is not None
    assert stored.completion == newer
    assert stored.superseded_runs == 2  # each stale answer that arrives is counted


async def test_a_request_id_is_accepted_once_and_a_retry_finds_the_record() -> None:
    state = MemoryStateStore()
    await mark_restored(state)
    ledger = RequestLedger(state)
    first = request()
    assert (await ledger.accept(first)).accepted is True
    again = await ledger.accept(request().model_copy(update={"reply_to": "other"}))
    assert again.accepted is False
    assert again.record is not None
    assert (again.record.status, again.record.reply_to) == ("queued", "me")
    assert again.record.request == first  # what a retry re-publishes


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


@dataclass
class Replica:
    """An ingress replica's answer path: its partition, registry and routing loop."""

    bus: Bus
    inbox: Inbox[Completion | OutputChunk]
    answers: AnswerRegistry
    stopping: asyncio.Event

    @property
    def partition(self) -> int:
        return self.inbox.partition

    async def publish(self, answer: Completion | OutputChunk) -> None:
        """Send ``answer`` to this replica, as a worker does."""
        await self.bus.publish(ANSWERS, answer, partition=self.partition)

    def counted(self, outcome: str) -> int:
        """Records of its partition read by its loop: ``decoded`` or ``skipped``."""
        group = answer_group(self.answers.instance_id)
        return self.bus.record_counts[(self.bus.topic_name(ANSWERS), group, outcome)]


@asynccontextmanager
async def replica(
    broker: MemoryBroker,
    state: MemoryStateStore,
    instance_id: str,
    *,
    addressed_partitions: int = 64,
    before_routing: Callable[[Replica], Awaitable[None]] | None = None,
) -> AsyncIterator[Replica]:
    """A replica ``instance_id`` (its own bus on ``broker``) leasing its answer partition,
    with its routing loop running (after ``before_routing``, when given, was called)."""
    bus = Bus(MemoryTransport(broker), addressed_partitions=addressed_partitions)
    await bus.start()
    stopping = asyncio.Event()
    ctx = ServiceContext(
        name="ingress",
        settings=load_settings({}, instance_id=instance_id),
        bus=bus,
        state=state,
        telemetry=Telemetry(TracerProvider(), MeterProvider()),
        logger=logging.getLogger("tests.ingress"),
        stopping=stopping,
    )
    inbox: Inbox[Completion | OutputChunk] = Inbox(ctx, ANSWERS, instance_id)
    answers = AnswerRegistry(instance_id, reply_partition=(await inbox.open()).partition)
    this = Replica(bus, inbox, answers, stopping)
    if before_routing is not None:
        await before_routing(this)
    subscription = answer_subscription(inbox, answers, stopping)
    await subscription.open()  # as the service does: reading before requests name it
    loop = asyncio.create_task(route_answers(subscription, inbox, answers, stopping=stopping))
    try:
        yield this
    finally:
        stopping.set()
        await loop
        await inbox.close()
        await bus.stop()


async def settled(this: Replica) -> None:
    """Wait until ``this`` replica's loop reads its partition (it starts at the
    partition's end once it runs: an answer is sent again until one is delivered), and
    then until it has read everything sent to it so far."""
    instance_id = this.answers.instance_id
    with this.answers.waiting(f"ready-{instance_id}") as ready:
        deadline = time.monotonic() + WAIT_S
        while not ready.done:
            assert time.monotonic() < deadline, f"{instance_id} reads nothing"
            await this.publish(completion(ready.request_id, reply_to=instance_id))
            await ready.completion(0.05)
    # Now it reads: one answer sent comes after everything sent before it.
    with this.answers.waiting(f"settled-{instance_id}") as marker:
        await this.publish(completion(marker.request_id, reply_to=instance_id))
        assert await marker.completion(WAIT_S) is not None


async def test_an_answer_reaches_the_call_waiting_for_it_and_nothing_is_written() -> None:
    state = MemoryStateStore()
    await mark_restored(state)
    async with replica(MemoryBroker(), state, "me") as me:
        await settled(me)
        with me.answers.waiting("r-1", stream=True) as waiter:
            await me.publish(chunk("r-1", index=0))
            done = completion("r-1")
            await me.publish(done)
            first = await waiter.next_event(WAIT_S)
            last = await waiter.next_event(WAIT_S)
    assert isinstance(first, OutputChunk)
    assert first.index == 0
    assert last == done
    # The worker records the answer before sending it; the ingress writes nothing.
    assert await RequestLedger(state).read("r-1") is None


async def test_a_replica_reads_only_the_answers_since_it_started() -> None:
    state = MemoryStateStore()
    await mark_restored(state)

    async def history(this: Replica) -> None:
        # An answer on this partition from before this replica started reading it (its
        # previous owner's, or this replica id's from long ago).
        await this.publish(completion("r-old"))

    async with replica(MemoryBroker(), state, "me", before_routing=history) as me:
        with me.answers.waiting("r-old") as old:
            await settled(me)
            # Same partition, in order: had it been read, it would have come first.
            assert not old.done


async def test_a_replica_sharing_its_partition_reads_only_its_own_answers() -> None:
    # One partition for two replicas: the second shares it (every partition is leased).
    broker = MemoryBroker()
    state = MemoryStateStore()
    await mark_restored(state)
    async with (
        replica(broker, state, "me", addressed_partitions=1) as me,
        replica(broker, state, "other", addressed_partitions=1) as other,
    ):
        assert me.inbox.leased.exclusive
        assert not other.inbox.leased.exclusive
        assert me.partition == other.partition
        await settled(other)
        await settled(me)  # it has passed over what was sent to the other
        skipped_before = me.counted("skipped")
        decoded_before = me.counted("decoded")
        with (
            me.answers.waiting("r-shared") as mine,
            other.answers.waiting("r-shared") as theirs,
        ):
            # The same request id on both (a client's own id): the address decides.
            await other.publish(completion("r-shared", reply_to="other", text="theirs"))
            await me.publish(completion("r-shared", reply_to="me", text="mine"))
            got_mine = await mine.completion(WAIT_S)
            got_theirs = await theirs.completion(WAIT_S)
        # Passed over undecoded by the replica it was not for.
        assert me.counted("skipped") == skipped_before + 1
        assert me.counted("decoded") == decoded_before + 1
    assert got_mine is not None
    assert got_theirs is not None
    assert got_mine.result == LLMResult(output_tokens=1, text="mine")
    assert got_theirs.result == LLMResult(output_tokens=1, text="theirs")


async def test_an_answer_that_did_not_come_over_the_bus_is_read_from_its_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Calls waiting longer than OVERDUE_S look at their records (shortened here).
    monkeypatch.setattr(routing, "OVERDUE_S", 0.05)
    state = MemoryStateStore()
    await mark_restored(state)
    ledger = RequestLedger(state)
    done = completion("r-lost")
    await answered(ledger, done)  # recorded, but its publish was lost
    await ledger.accept(request("r-waits"))  # not answered yet
    answers = AnswerRegistry("me", reply_partition=0)
    stopping = asyncio.Event()
    with answers.waiting("r-waits") as waits, answers.waiting("r-lost") as lost:
        sweep = asyncio.create_task(sweep_overdue(ledger, answers, stopping=stopping))
        try:
            assert await lost.completion(WAIT_S) == done
            # Waiting longer, it was looked at in the same round: an unanswered record
            # delivers nothing.
            assert not waits.done
        finally:
            stopping.set()
            await sweep
