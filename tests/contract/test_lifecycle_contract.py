"""The request ledger's transitions, run against the memory store and a real Redis.

Each transition is a Lua script on Redis and a Python function in memory: this suite is
what keeps the two the same. Every test runs twice, ``[memory]`` and ``[redis]``.
"""

from __future__ import annotations

import asyncio

import pytest
from switchyard.contracts.messages import (
    Assignment,
    Completion,
    CompletionStatus,
    InferenceRequest,
    LLMPayload,
    RequestTimeline,
)
from switchyard.lifecycle import (
    CANCELLED_BY_CLIENT,
    Assign,
    Fence,
    RequestLedger,
    RequestStatus,
)
from switchyard.state import StateStore, keys

from tests.contract.conftest import StoreMaker


def request(request_id: str = "r1", deadline_s: float | None = 110.0) -> InferenceRequest:
    return InferenceRequest(
        request_id=request_id,
        app="llama",
        payload=LLMPayload(model="llama-2-7b", prompt_tokens=12, max_output_tokens=8),
        arrival_s=100.0,
        deadline_s=deadline_s,
        reply_to="ingress-a",
    )


def assignment(
    worker_id: str = "w1", epoch: int = 0, of: InferenceRequest | None = None
) -> Assignment:
    return Assignment(
        request=of or request(),
        worker_id=worker_id,
        variant="llama-2-7b",
        order=1.0,
        policy="jsq",
        epoch=epoch,
        assigned_at_s=101.0 + epoch,
    )


def completion(
    worker_id: str = "w1",
    epoch: int = 0,
    finished_s: float = 105.0,
    status: CompletionStatus = CompletionStatus.OK,
    request_id: str = "r1",
) -> Completion:
    return Completion(
        request_id=request_id,
        app="llama",
        worker_id=worker_id,
        worker_type="a100-80gb/llama-2-7b",
        variant="llama-2-7b",
        epoch=epoch,
        status=status,
        timeline=RequestTimeline(arrival_s=100.0, finished_s=finished_s),
        deadline_s=110.0,
    )


@pytest.fixture
def ledger(store: StateStore) -> RequestLedger:
    return RequestLedger(store)


async def assigned_to(store: StateStore, worker_id: str) -> list[str]:
    members = await store.zrange_by_score(keys.assigned(worker_id), float("-inf"), float("inf"))
    return [member for member, _ in members]


async def test_a_request_is_accepted_once_and_a_retry_finds_its_record(
    ledger: RequestLedger,
) -> None:
    original = request()
    first = await ledger.accept(original)
    again = await ledger.accept(original.model_copy(update={"app": "other"}))

    assert first.accepted
    assert not again.accepted
    assert again.record is not None
    assert again.record.status == RequestStatus.QUEUED
    assert again.record.app == "llama", "a retry never overwrites the first record"
    assert again.record.request == original
    record = await ledger.read("r1")
    assert record is not None
    assert (record.arrival_s, record.deadline_s, record.prompt_tokens) == (100.0, 110.0, 12)
    assert await ledger.read("never") is None


async def test_a_batch_of_accepts_is_judged_request_by_request_in_order(
    ledger: RequestLedger,
) -> None:
    await ledger.accept(request("old"))
    batch = [request("a"), request("old"), request("b"), request("a")]

    results = await ledger.accept_many(batch)

    assert [r.accepted for r in results] == [True, False, True, False], (
        "a known id and a repeat inside the batch both find the record, the rest are new"
    )
    assert results[1].record is not None
    assert results[1].record.request_id == "old"
    assert results[3].record is not None
    assert results[3].record.request == batch[0]
    assert await ledger.accept_many([]) == []


async def test_a_first_decision_is_recorded_once_and_a_redelivery_gets_it_back(
    ledger: RequestLedger, store: StateStore
) -> None:
    original = request()
    await ledger.accept(original)
    decided = assignment("w1", of=original)

    first = await ledger.assign(Assign(decided, trace={"traceparent": "00-ab-cd-01"}))
    again = await ledger.assign(Assign(assignment("w2", of=original)))

    assert first.result == "assigned"
    assert again.result == "exists"
    assert again.recorded == decided, "the redelivery gets the recorded decision"
    record = await ledger.read("r1")
    assert record is not None
    assert (record.status, record.worker_id, record.epoch) == ("assigned", "w1", 0)
    assert record.assignment == decided
    assert record.trace_carrier() == {"traceparent": "00-ab-cd-01"}
    assert await assigned_to(store, "w1") == ["r1"]
    assert await assigned_to(store, "w2") == []


async def test_a_request_accepted_with_its_first_decision_is_as_if_accepted_then_assigned(
    ledger: RequestLedger, store: StateStore
) -> None:
    original = request()
    decided = assignment("w1", of=original)

    (first,) = await ledger.accept_decided_many([Assign(decided, trace={"traceparent": "00-a"})])
    (retry,) = await ledger.accept_decided_many([Assign(assignment("w2", of=original))])
    again = await ledger.assign(Assign(assignment("w3", of=original)))

    assert first.accepted
    assert not retry.accepted
    assert retry.record is not None
    assert retry.record.worker_id == "w1", "a retry finds the record, its decision unchanged"
    assert again.result == "exists"
    assert again.recorded == decided
    record = await ledger.read("r1")
    assert record is not None
    assert (record.status, record.worker_id, record.epoch) == ("assigned", "w1", 0)
    assert record.request == original
    assert record.assignment == decided
    assert record.trace_carrier() == {"traceparent": "00-a"}
    assert await assigned_to(store, "w1") == ["r1"]
    assert await assigned_to(store, "w2") == []
    # The worker starts and answers it as any assigned request.
    assert await ledger.start_many([Fence("r1", 0, "w1")], 102.0) == ["started"]
    assert await ledger.finish_many([completion("w1")]) == ["finished"]
    assert await assigned_to(store, "w1") == []


async def test_a_reassignment_moves_the_request_and_fences_the_old_worker(
    ledger: RequestLedger, store: StateStore
) -> None:
    await ledger.accept(request())
    await ledger.assign(Assign(assignment("w1")))
    assert await ledger.start_many([Fence("r1", 0, "w1")], now_s=102.0) == ["started"]

    moved = await ledger.assign(Assign(assignment("w2", epoch=1), 0, "w1"))

    assert moved.result == "assigned"
    assert await assigned_to(store, "w1") == []
    assert await assigned_to(store, "w2") == ["r1"]
    # The old worker wakes up: it can neither start the request again nor answer it,
    # and the run it finished anyway is counted.
    assert await ledger.start_many([Fence("r1", 0, "w1")], now_s=103.0) == ["superseded"]
    assert await ledger.finish_many([completion("w1", epoch=0)]) == ["superseded"]
    stale = await ledger.read("r1")
    assert stale is not None
    assert stale.superseded_runs == 1
    assert (await store.hgetall(keys.CLUSTER_STATS))["superseded"] == "1"
    assert await ledger.start_many([Fence("r1", 1, "w2")], now_s=103.0) == ["started"]
    answer = completion("w2", epoch=1)
    assert await ledger.finish_many([answer]) == ["finished"]
    record = await ledger.read("r1")
    assert record is not None
    assert record.status == "ok"
    assert record.completion == answer


async def test_an_old_epochs_answer_after_the_new_one_is_superseded_not_a_duplicate(
    ledger: RequestLedger, store: StateStore
) -> None:
    # A worker cut off from the network ran the request on; it was moved and answered
    # elsewhere before the old worker's answer got through. Its answer must not pass for
    # its own earlier write (a "duplicate" after a failed round trip is published).
    await ledger.accept(request())
    await ledger.assign(Assign(assignment("w1")))
    assert await ledger.start_many([Fence("r1", 0, "w1")], now_s=102.0) == ["started"]
    await ledger.assign(Assign(assignment("w2", epoch=1), 0, "w1"))
    assert await ledger.start_many([Fence("r1", 1, "w2")], now_s=103.0) == ["started"]
    assert await ledger.finish_many([completion("w2", epoch=1)]) == ["finished"]

    assert await ledger.finish_many([completion("w1", epoch=0)]) == ["superseded"]
    # The new run's own answer again is the duplicate.
    assert await ledger.finish_many([completion("w2", epoch=1)]) == ["duplicate"]
    record = await ledger.read("r1")
    assert record is not None
    assert (record.status, record.worker_id, record.epoch) == ("ok", "w2", 1)
    assert record.superseded_runs == 1


async def test_of_two_racing_reassignments_one_wins(
    make_store: StoreMaker, unique_prefix: str
) -> None:
    ledgers = [RequestLedger(make_store(unique_prefix)) for _ in range(4)]
    await ledgers[0].accept(request())
    await ledgers[0].assign(Assign(assignment("w1")))

    outcomes = await asyncio.gather(
        *(
            ledger.assign(Assign(assignment(f"w{2 + i}", epoch=1), 0, "w1"))
            for i, ledger in enumerate(ledgers)
        )
    )

    assert sorted(o.result for o in outcomes) == [
        "assigned",
        "superseded",
        "superseded",
        "superseded",
    ]


async def test_an_assignment_its_worker_never_took_in_is_taken_back_and_fenced(
    ledger: RequestLedger, store: StateStore
) -> None:
    for rid in ("lost", "started", "young", "moved"):
        await ledger.accept(request(rid))
        await ledger.assign(Assign(assignment("w1", of=request(rid))))  # assigned at 101 s
    await ledger.start_many([Fence("started", 0, "w1")], now_s=102.0)
    await ledger.assign(Assign(assignment("w2", epoch=1, of=request("moved")), 0, "w1"))

    # "young" was assigned after the cutoff: it may still be on its way.
    assert await ledger.disown_many("w1", ["lost", "started", "moved"], 101.0) == ["lost"]
    assert await ledger.disown_many("w1", ["young"], 100.5) == []
    # What another worker holds now, or nobody, only left its entry behind: it goes.
    await store.zadd(keys.assigned("w1"), {"moved": 101.0, "gone": 101.0})
    assert await ledger.disown_many("w1", ["moved", "gone"], 101.0) == []
    assert sorted(await assigned_to(store, "w1")) == ["lost", "started", "young"]

    record = await ledger.read("lost")
    assert record is not None
    assert (record.status, record.epoch, record.worker_id) == ("assigned", 1, "w1")
    # The lost message turns up after all: it can no longer start the request.
    assert await ledger.start_many([Fence("lost", 0, "w1")], now_s=104.0) == ["superseded"]
    # It stays the worker's until re-assigned, which replaces the new epoch.
    assert "lost" in await assigned_to(store, "w1")
    again = await ledger.assign(Assign(assignment("w2", epoch=2, of=request("lost")), 1, "w1"))
    assert again.result == "assigned"
    assert "lost" not in await assigned_to(store, "w1")
    assert await ledger.start_many([Fence("lost", 2, "w2")], now_s=105.0) == ["started"]


async def test_a_store_that_lost_its_answers_refuses_named_ids_until_they_are_restored(
    ledger: RequestLedger, store: StateStore
) -> None:
    # No generation marker: the store is new or lost its data, its answers not back yet.
    refused = await ledger.accept(request("named"), named=True)
    assert (refused.accepted, refused.restoring) == (False, True)
    decided = Assign(assignment("w1", of=request("named-decided")))
    (refused_decided,) = await ledger.accept_decided_many([decided], [True])
    assert refused_decided.restoring
    assert await assigned_to(store, "w1") == []
    assert (await ledger.accept(request("made-up"))).accepted

    answered = completion("w1", epoch=2, request_id="named")
    other = completion("w1", request_id="made-up")
    assert await ledger.restore_many([answered, other]) == 1  # made-up has a record
    await store.set_if_absent(keys.STATE_GENERATION, "g1")

    retry = await ledger.accept(request("named"), named=True)
    assert retry.record is not None
    assert (retry.record.status, retry.record.epoch) == ("ok", 2)
    assert retry.record.completion == answered
    assert retry.record.request is None  # the answers topic holds the answer only
    (accepted,) = await ledger.accept_decided_many([decided], [True])
    assert accepted.accepted
    assert await assigned_to(store, "w1") == ["named-decided"]


async def test_requests_read_back_after_a_loss_restore_what_was_asked_and_in_flight_work(
    ledger: RequestLedger, store: StateStore
) -> None:
    # After the loss: "answered" has its answer back, "made-since" was accepted again
    # since; "queued" and "moved" were accepted and not answered before the loss.
    assert await ledger.restore_many([completion("w1", epoch=0, request_id="answered")]) == 1
    assert (await ledger.accept(request("made-since"))).accepted
    asked = {name: request(name) for name in ("answered", "made-since", "queued", "moved")}
    read_back: list[InferenceRequest | Assignment] = [
        asked["answered"],
        assignment("w1", epoch=0, of=asked["answered"]),
        asked["made-since"],
        asked["queued"],
        asked["moved"],
        assignment("w1", epoch=0, of=asked["moved"]),
        latest := assignment("w2", epoch=1, of=asked["moved"]),
        assignment("w1", epoch=0, of=asked["moved"]),  # an older one, read later
    ]
    counts = await ledger.restore_requests_many(read_back)
    assert counts == {"attached": 1, "kept": 3, "pending": 2, "advanced": 2}

    answered = await ledger.read("answered")
    assert answered is not None
    assert answered.completion is not None
    assert answered.request == asked["answered"]  # a retry's body can be compared
    made_since = await ledger.read("made-since")
    assert made_since is not None
    assert made_since.fields is not None
    assert "restored" not in made_since.fields
    queued = await ledger.read("queued")
    assert queued is not None
    assert (queued.status, queued.reply_to, queued.request) == (
        "queued",
        "ingress-a",
        asked["queued"],
    )
    moved = await ledger.read("moved")
    assert moved is not None
    assert (moved.status, moved.epoch, moved.worker_id) == ("assigned", 1, "w2")
    assert moved.assignment == latest
    assert "moved" in await assigned_to(store, "w2")

    # A retry finds the request waiting for its one answer, not a new one to run.
    retry = await ledger.accept(request("moved"), named=True)
    assert not retry.accepted
    # The worker it was given to starts and finishes it under the fence it expects;
    # the earlier worker cannot.
    assert await ledger.start_many([Fence("moved", 0, "w1")], now_s=106.0) == ["superseded"]
    assert await ledger.start_many([Fence("moved", 1, "w2")], now_s=106.0) == ["started"]
    assert await ledger.finish_many([completion("w2", epoch=1, request_id="moved")]) == ["finished"]
    # A request read back pending whose answer turns up is settled by it.
    assert await ledger.restore_many([completion("w1", epoch=0, request_id="queued")]) == 1
    settled = await ledger.read("queued")
    assert settled is not None
    assert (settled.status, settled.request) == ("ok", asked["queued"])
    # Nothing read back changes a record once it is answered or made since.
    assert await ledger.restore_requests_many([assignment("w3", 5, request("moved"))]) == {
        "kept": 1
    }


async def test_a_start_is_fenced_by_epoch_and_worker(ledger: RequestLedger) -> None:
    await ledger.accept(request())
    await ledger.assign(Assign(assignment("w1")))

    results = await ledger.start_many(
        [Fence("r1", 0, "w2"), Fence("r1", 1, "w1"), Fence("r1", 0, "w1"), Fence("r1", 0, "w1")],
        now_s=102.0,
    )

    assert results == ["superseded", "superseded", "started", "running"]
    record = await ledger.read("r1")
    assert record is not None
    assert (record.status, record.started_s) == ("running", 102.0)


async def test_an_answer_is_recorded_once_and_counted(
    ledger: RequestLedger, store: StateStore
) -> None:
    await ledger.accept(request())
    await ledger.assign(Assign(assignment("w1")))
    late = completion("w1", finished_s=111.0)

    assert await ledger.finish_many([late, late]) == ["finished", "duplicate"]
    assert await ledger.start_many([Fence("r1", 0, "w1")], now_s=112.0) == ["answered"]
    assert (await ledger.assign(Assign(assignment("w3", epoch=1), 0, "w1"))).result == "answered"
    worker = await store.hgetall(keys.worker("w1"))
    assert (worker["completed"], worker["violated"]) == ("1", "1"), "it missed its deadline"
    assert await assigned_to(store, "w1") == []


async def test_the_cluster_keeps_the_outcomes_of_the_latest_completions(
    ledger: RequestLedger, store: StateStore
) -> None:
    for index in range(105):
        rid = f"r{index}"
        await ledger.accept(request(rid))
        await ledger.assign(Assign(assignment("w1", of=request(rid))))
        missed = index % 5 == 0
        done = completion("w1", finished_s=111.0 if missed else 105.0, request_id=rid)
        assert await ledger.finish_many([done]) == ["finished"]

    stats = await store.hgetall(keys.CLUSTER_STATS)

    assert (stats["completed"], stats["violated"]) == ("105", "21")
    assert len(stats["recent"]) == 100
    assert stats["recent"].count("1") == 20
    assert stats["recent"][-5:] == "10000", "oldest first, the latest last"


async def test_the_scheduler_answers_a_request_it_never_assigned(ledger: RequestLedger) -> None:
    await ledger.accept(request())
    answer = completion("short-circuit", status=CompletionStatus.FAILED)

    assert await ledger.finish_many([answer], worker_fenced=False) == ["finished"]

    record = await ledger.read("r1")
    assert record is not None
    assert record.status == "failed"


async def test_transitions_on_a_record_that_is_gone(ledger: RequestLedger) -> None:
    # The record expired, or the state store lost it: nothing is assigned or started
    # blindly, and an answer is still recorded so a retry finds it.
    assert (await ledger.assign(Assign(assignment("w1")))).result == "missing"
    assert await ledger.start_many([Fence("r1", 0, "w1")], now_s=1.0) == ["missing"]
    assert await ledger.finish_many([completion("w1")]) == ["finished"]
    record = await ledger.read("r1")
    assert record is not None
    assert record.status == "ok"


async def test_every_transition_keeps_the_record_alive(
    store: StateStore, make_store: StoreMaker, unique_prefix: str
) -> None:
    ledger = RequestLedger(store, ttl_s=60.0)
    await ledger.accept(request())
    await ledger.assign(Assign(assignment("w1")))
    await ledger.start_many([Fence("r1", 0, "w1")], now_s=1.0)
    await ledger.finish_many([completion("w1")])

    left_s = await store.ttl_s(keys.request("r1"))

    assert left_s is not None
    assert 50.0 < left_s <= 60.0


async def test_a_request_whose_client_went_away_before_it_started_is_cancelled(
    ledger: RequestLedger, store: StateStore
) -> None:
    await ledger.accept(request("queued"))
    await ledger.accept(request("r1"))
    await ledger.assign(Assign(assignment("w1")))

    assert await ledger.cancel("queued", 103.0, "the client disconnected") == "cancelled"
    assert await ledger.cancel("r1", 103.0, "the client disconnected") == "cancelled"
    record = await ledger.read("r1")
    assert record is not None
    assert record.status == "cancelled"
    answer = record.completion
    assert answer is not None
    assert answer.status is CompletionStatus.CANCELLED
    assert answer.worker_id == CANCELLED_BY_CLIENT
    assert answer.error == "the client disconnected"
    # Nothing runs it: the worker's start is refused, a re-decision too, and it left the
    # worker's assigned set; the cluster's totals do not count it.
    assert await assigned_to(store, "w1") == []
    assert await ledger.start_many([Fence("r1", 0, "w1")], now_s=104.0) == ["answered"]
    assert (await ledger.assign(Assign(assignment("w2", epoch=1), 0, "w1"))).result == "answered"
    assert "completed" not in await store.hgetall(keys.CLUSTER_STATS)
    # Once answered, a cancel changes nothing.
    assert await ledger.cancel("r1", 105.0, "again") == "answered"


async def test_a_started_request_is_not_cancelled(ledger: RequestLedger) -> None:
    await ledger.accept(request())
    await ledger.assign(Assign(assignment("w1")))
    await ledger.start_many([Fence("r1", 0, "w1")], now_s=102.0)

    assert await ledger.cancel("r1", 103.0, "the client disconnected") == "running"
    assert await ledger.finish_many([completion("w1")]) == ["finished"]
    assert await ledger.cancel("gone", 103.0, "the client disconnected") == "missing"
