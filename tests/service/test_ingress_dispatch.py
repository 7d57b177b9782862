"""Direct dispatch (``SWITCHYARD_LLM_DISPATCH=direct``): the ingress places LLM requests
itself, records the decision in the ledger and sends the assignment to the worker's
partition; what it cannot place goes to the scheduler."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import pytest_asyncio
from switchyard.bus import Bus, MemoryTransport, Subscription
from switchyard.cluster import ClusterReader
from switchyard.config import load_settings
from switchyard.contracts.messages import (
    Assignment,
    ClassificationPayload,
    InferenceRequest,
    LLMPayload,
    Migration,
    PlacementOrder,
)
from switchyard.contracts.topics import CLASSIFICATION_REQUESTS, REQUESTS, WORKER_INBOX
from switchyard.lifecycle import Assign, Fence, RequestLedger, RequestStatus
from switchyard.policies.registry import make_llm_policy
from switchyard.state.base import Script
from switchyard.state.memory import MemoryStateStore

from services.embedded import EmbeddedPlan, EmbeddedStack
from services.ingress.answers import AnswerRegistry
from services.ingress.calls import CallOptions, RequestDesk
from services.ingress.dispatch import DirectDispatcher
from services.ingress.errors import ApiError
from services.ingress.service import IngressService
from services.scheduler.service import SchedulerService
from tests.support.services import heartbeat, mark_restored, store_worker

INBOX_PARTITION = 3


def llm_request(request_id: str) -> InferenceRequest:
    return InferenceRequest(
        request_id=request_id,
        app="llama",
        payload=LLMPayload(model="llama-2-7b", prompt_tokens=12, max_output_tokens=8),
        arrival_s=time.time(),
        reply_to="ingress-a",
        reply_partition=0,
    )


@dataclass
class Setup:
    bus: Bus
    state: MemoryStateStore
    dispatcher: DirectDispatcher
    inbox: Subscription[Assignment | Migration | PlacementOrder]
    requests: Subscription[InferenceRequest]

    @property
    def ledger(self) -> RequestLedger:
        return RequestLedger(self.state)

    async def worker(
        self,
        worker_id: str,
        partition: int | None = INBOX_PARTITION,
        dispatcher: DirectDispatcher | None = None,
    ) -> None:
        beat = heartbeat(worker_id).model_copy(update={"inbox_partition": partition})
        await store_worker(self.state, beat)
        cluster = await ClusterReader(self.state).read(time.time())
        await (dispatcher or self.dispatcher).observe(cluster)

    def desk(self, dispatcher: DirectDispatcher | None = None) -> RequestDesk:
        """A replica's desk that places with ``dispatcher`` (the setup's by default)."""
        dispatcher = dispatcher or self.dispatcher
        return RequestDesk(
            self.ledger,
            dispatcher.publish,
            AnswerRegistry("ingress-a"),
            CallOptions(),
            decisions=dispatcher,
        )

    async def submit(self, request: InferenceRequest) -> None:
        assert (await self.ledger.accept(request)).accepted
        await self.dispatcher.publish(request)


@pytest.fixture
async def setup() -> AsyncIterator[Setup]:
    bus = Bus(MemoryTransport(), commit_interval_s=0.05)
    await bus.start()
    state = MemoryStateStore()
    await mark_restored(state)
    dispatcher = DirectDispatcher(
        bus, state, make_llm_policy("jsq"), worker_timeout_s=2.0, model_interval_s=1.0
    )
    inbox = bus.subscribe(WORKER_INBOX, group="test-inbox", partitions=[INBOX_PARTITION])
    requests = bus.subscribe(REQUESTS, group="test-scheduler")
    await inbox.open()
    await requests.open()
    try:
        yield Setup(bus, state, dispatcher, inbox, requests)
    finally:
        await inbox.close()
        await requests.close()
        await bus.stop()


async def test_a_request_goes_straight_to_its_workers_partition(setup: Setup) -> None:
    await setup.worker("w1")

    await setup.submit(llm_request("r1"))

    delivery = await setup.inbox.next_within(2.0)
    assert delivery is not None
    sent = delivery.message
    assert isinstance(sent, Assignment)
    assert (sent.request.request_id, sent.worker_id, sent.epoch) == ("r1", "w1", 0)
    assert sent.policy == "jsq"
    record = await setup.ledger.read("r1")
    assert record is not None
    assert (record.status, record.worker_id, record.epoch) == (RequestStatus.ASSIGNED, "w1", 0)
    assert await setup.requests.next_within(0.2) is None, "the scheduler never sees it"


async def test_without_a_live_worker_the_request_goes_to_the_scheduler(setup: Setup) -> None:
    await setup.submit(llm_request("r1"))

    delivery = await setup.requests.next_within(2.0)
    assert delivery is not None
    assert delivery.message.request_id == "r1"
    record = await setup.ledger.read("r1")
    assert record is not None
    assert record.status == RequestStatus.QUEUED, "the scheduler decides it"


async def test_a_worker_that_names_no_partition_is_not_chosen(setup: Setup) -> None:
    await setup.worker("w1", partition=None)

    await setup.submit(llm_request("r1"))

    delivery = await setup.requests.next_within(2.0)
    assert delivery is not None
    assert delivery.message.request_id == "r1"


async def test_a_republished_request_gets_its_recorded_assignment_again(setup: Setup) -> None:
    await setup.worker("w1")
    request = llm_request("r1")
    await setup.submit(request)
    first = await setup.inbox.next_within(2.0)
    assert first is not None

    await setup.dispatcher.publish(request)  # a retry after "outcome unknown"

    again = await setup.inbox.next_within(2.0)
    assert again is not None
    assert again.message.message_id == first.message.message_id, (
        "the recorded decision is sent again, not a new one"
    )
    record = await setup.ledger.read("r1")
    assert record is not None
    assert record.epoch == 0


async def test_an_answered_request_is_not_sent_again(setup: Setup) -> None:
    await setup.worker("w1")
    request = llm_request("r1")
    await setup.submit(request)
    assert await setup.inbox.next_within(2.0) is not None
    await setup.state.hset("request:r1", {"status": "ok"})

    await setup.dispatcher.publish(request)

    assert await setup.inbox.next_within(0.2) is None


async def test_classification_requests_go_to_the_scheduler(setup: Setup) -> None:
    await setup.worker("w1")
    windows = setup.bus.subscribe(CLASSIFICATION_REQUESTS, group="test-windows")
    await windows.open()
    request = InferenceRequest(
        request_id="c1",
        app="wine",
        payload=ClassificationPayload(features=[0.1] * 13),
        arrival_s=time.time(),
        reply_to="ingress-a",
    )
    try:
        await setup.submit(request)
        delivery = await windows.next_within(2.0)
    finally:
        await windows.close()
    assert delivery is not None
    assert delivery.message.request_id == "c1"


async def test_concurrent_requests_share_the_ledger_round_trip(setup: Setup) -> None:
    await setup.worker("w1")
    requests = [llm_request(f"r{n}") for n in range(8)]
    for request in requests:
        assert (await setup.ledger.accept(request)).accepted

    await asyncio.gather(*(setup.dispatcher.publish(r) for r in requests))

    got = [await setup.inbox.next_within(2.0) for _ in requests]
    sent = [d.message for d in got if d is not None]
    assert sorted(a.request.request_id for a in sent if isinstance(a, Assignment)) == sorted(
        r.request_id for r in requests
    )
    assert setup.dispatcher._assigns.batches < len(requests)


async def test_a_call_is_accepted_with_its_decision_in_one_ledger_round_trip(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    await setup.worker("w1")
    scripts_run: list[str] = []
    run_script_many = setup.state.run_script_many

    async def counting(script: Script, calls: Any) -> Any:
        scripts_run.append(script.name)
        return await run_script_many(script, calls)

    monkeypatch.setattr(setup.state, "run_script_many", counting)
    desk = setup.desk()

    accepted = await desk.accept("r1", llm_request, stream=False)

    assert accepted.waiter is not None
    assert scripts_run == ["accept-decided"], "one round trip records both"
    delivery = await setup.inbox.next_within(2.0)
    assert delivery is not None
    assert isinstance(delivery.message, Assignment)
    assert (delivery.message.request.request_id, delivery.message.worker_id) == ("r1", "w1")
    record = await setup.ledger.read("r1")
    assert record is not None
    assert (record.status, record.worker_id) == (RequestStatus.ASSIGNED, "w1")
    assert await setup.requests.next_within(0.2) is None, "the scheduler never sees it"

    # A retry of it finds the record: nothing decided or sent again.
    again = await desk.accept("r1", llm_request, stream=False)
    assert again.waiter is not None
    assert await setup.inbox.next_within(0.2) is None


# -- the policy's admission, before anything is recorded --------------------------------------


def long_prompt_request(request_id: str) -> InferenceRequest:
    # 4,000 tokens take 0.30 s to prefill on an idle A100: past a 0.25 s objective.
    payload = LLMPayload(
        model="llama-2-7b", prompt_tokens=4000, max_output_tokens=8, ttft_slo_s=0.25
    )
    return llm_request(request_id).model_copy(update={"payload": payload})


async def test_a_request_no_worker_can_start_in_time_is_refused_unrecorded(
    setup: Setup,
) -> None:
    dispatcher = DirectDispatcher(
        setup.bus,
        setup.state,
        make_llm_policy("switchyard"),
        worker_timeout_s=2.0,
        model_interval_s=1.0,
    )
    await setup.worker("w1", dispatcher=dispatcher)
    desk = setup.desk(dispatcher)

    with pytest.raises(ApiError) as refused:
        await desk.accept("long", long_prompt_request, stream=False, what="model 'chat'")

    assert refused.value.status == 400
    assert refused.value.code == "ttft_objective_unattainable"
    assert "0.25 s time-to-first-token objective" in str(refused.value.message)
    assert await setup.ledger.read("long") is None, "nothing was recorded"
    assert await setup.inbox.next_within(0.2) is None, "nothing was sent"
    # A prompt it can prefill in time is taken.
    accepted = await desk.accept("short", llm_request, stream=False)
    assert accepted.waiter is not None


async def test_a_policy_without_admission_takes_the_long_prompt(setup: Setup) -> None:
    await setup.worker("w1")
    accepted = await setup.desk().accept("long", long_prompt_request, stream=False)
    assert accepted.waiter is not None


# -- a retry re-sends a decision whose assignment never went out -----------------------------


@pytest.mark.parametrize(
    ("started", "republished"), [(False, True), (True, False)], ids=["assigned", "running"]
)
async def test_a_retry_republishes_a_request_decided_but_not_started(
    started: bool, republished: bool
) -> None:
    # Direct dispatch records the decision before it sends the assignment: a call whose
    # send was not confirmed leaves the record assigned, and its retry must send it.
    state = MemoryStateStore()
    await mark_restored(state)
    ledger = RequestLedger(state)
    request = llm_request("r1")
    await ledger.accept(request)
    assignment = Assignment(
        request=request,
        worker_id="w1",
        variant="llama-2-7b",
        order=request.arrival_s,
        policy="jsq",
        assigned_at_s=time.time(),
    )
    assert (await ledger.assign(Assign(assignment))).result == "assigned"
    if started:
        assert await ledger.start_many([Fence("r1", 0, "w1")], time.time()) == ["started"]
    published: list[str] = []

    async def publish(sent: InferenceRequest) -> None:
        published.append(sent.request_id)

    desk = RequestDesk(ledger, publish, AnswerRegistry("ingress-b"), CallOptions())

    accepted = await desk.accept("r1", lambda rid: llm_request(rid), stream=False)

    assert accepted.record is not None
    assert published == (["r1"] if republished else [])


# -- end to end: the embedded stack with direct dispatch --------------------------------------


@pytest_asyncio.fixture(loop_scope="function")
async def direct_stack() -> AsyncIterator[EmbeddedStack]:
    settings = load_settings(
        {},
        worker_time_scale=50.0,
        log_level="WARNING",
        heartbeat_interval_s=0.2,
        llm_dispatch="direct",
    )
    plan = EmbeddedPlan(llm_workers=("a100-80gb/llama-2-7b",), torch_workers=0, http_port=0)
    embedded = EmbeddedStack(settings, plan)
    await embedded.start()
    try:
        yield embedded
    finally:
        assert await embedded.stop() == 0


async def test_the_embedded_stack_answers_with_the_ingress_placing(
    direct_stack: EmbeddedStack,
) -> None:
    ingress = direct_stack.service("ingress")
    scheduler = direct_stack.service("scheduler")
    assert isinstance(ingress, IngressService)
    assert isinstance(scheduler, SchedulerService)
    assert ingress.dispatcher is not None
    placer = ingress.dispatcher.placer
    deadline = time.monotonic() + 10
    while not placer.cluster("llama-2-7b", time.time()).eligible():
        assert time.monotonic() < deadline, "the ingress never saw a live worker"
        await asyncio.sleep(0.05)

    async with httpx.AsyncClient(base_url=direct_stack.url, timeout=30.0) as client:
        answers = await asyncio.gather(
            *(
                client.post(
                    "/v1/completions",
                    json={"model": "llama-2-7b", "prompt": "Tell me about trains", "max_tokens": 8},
                )
                for _ in range(5)
            )
        )

    assert [a.status_code for a in answers] == [200] * 5, [a.text for a in answers]
    for answer in answers:
        info = answer.json()["switchyard"]
        assert info["worker_id"] == "llm-0"
        timeline = info["timeline"]
        assert timeline["arrival_s"] <= timeline["assigned_s"] <= timeline["started_s"]
    assert scheduler.decided == 0, "every request was placed by the ingress"
