"""Pipeline stages in the scheduler service over the in-memory bus: each routed by the
placement policy's router to a worker whose heartbeat lists its model, spread over the
holders, held while nobody holds it (and counted for the placement service), failed
when the catalogue has no such model, and routed again when its worker dies.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from switchyard.bus import Subscription
from switchyard.contracts.messages import (
    Completion,
    CompletionStatus,
    Heartbeat,
    InferenceRequest,
    OutputChunk,
    PlacedModel,
    PlacedState,
    ResourceVector,
    StagePayload,
)
from switchyard.contracts.topics import ANSWERS, STAGE_REQUESTS
from switchyard.state import keys

from tests.service.scheduler_support import Stack, llm_request
from tests.support.services import eventually, store_worker

GIB = 1024**3


def stage_request(
    request_id: str,
    model: str = "prompt-encoder",
    *,
    stage: str = "encode",
    pipeline: str = "txt2img",
    deadline_in_s: float | None = None,
) -> InferenceRequest:
    """A ready stage of a pipeline call, as the ingress publishes it."""
    now_s = time.time()
    return InferenceRequest(
        request_id=request_id,
        app=pipeline,
        payload=StagePayload(pipeline=pipeline, stage=stage, model=model),
        arrival_s=now_s,
        deadline_s=None if deadline_in_s is None else now_s + deadline_in_s,
        reply_to="ingress-0",
        reply_partition=0,
    )


class StageStack(Stack):
    """A :class:`Stack` with emulated-models workers and a reader of the answers the
    scheduler gives itself (the ingress replica's partition 0)."""

    def __init__(self) -> None:
        super().__init__("jsq")
        self._answers: Subscription[Completion | OutputChunk] | None = None

    def models_beat(
        self,
        worker_id: str,
        placed: dict[str, PlacedState],
        *,
        sequence: int = 1,
        utilization: float = 0.0,
    ) -> Heartbeat:
        beat = self.beat(worker_id, profile=None, models=(), sequence=sequence)
        return beat.model_copy(
            update={
                "backend": "emulated-models",
                "worker_type": "emulated-models",
                "utilization": utilization,
                "capacity": ResourceVector(cpu=8, gpu=1, mem_bytes=64 * GIB),
                "placed": [PlacedModel(model=m, state=s) for m, s in placed.items()],
                "sent_at_s": time.time(),
            }
        )

    async def models_worker(
        self, worker_id: str, placed: dict[str, PlacedState], *, status: str = "alive", **kw: int
    ) -> None:
        await store_worker(self.state, self.models_beat(worker_id, placed, **kw), status=status)

    async def start_stages(self) -> None:
        await self.start()
        self._answers = self.client.subscribe(ANSWERS, group="test-ingress", partitions=[0])
        await self._answers.open()

    async def answer(self) -> Completion:
        assert self._answers is not None
        delivery = await self._answers.next_within(10.0)
        assert delivery is not None, "no answer came"
        assert isinstance(delivery.message, Completion)
        return delivery.message

    async def stop(self) -> None:
        await super().stop()
        if self._answers is not None:
            await self._answers.close()

    async def demand(self) -> dict[str, int]:
        found = await self.state.hgetall(keys.PLACEMENT_DEMAND)
        return {model: int(count) for model, count in found.items()}

    async def waiting(self, instance: str = "scheduler-0") -> dict[str, int]:
        found = await self.state.hgetall(keys.placement_waiting(instance))
        return {model: int(count) for model, count in found.items()}


@pytest.fixture(name="stages")
async def stages_fixture() -> AsyncIterator[StageStack]:
    stack = StageStack()
    yield stack
    await stack.stop()


READY = PlacedState.READY


async def test_a_stage_goes_to_the_worker_whose_heartbeat_lists_its_model_ready(
    stages: StageStack,
) -> None:
    await stages.models_worker("encoder", {"prompt-encoder": READY})
    await stages.models_worker("generator", {"sd15-base": READY})
    await stages.worker("llm")  # an LLM worker: never a stage's
    await stages.start_stages()
    await stages.submit(stage_request("call-1.encode", deadline_in_s=12.0))
    (assignment,) = await stages.assignments(1)
    assert assignment.worker_id == "encoder"
    assert assignment.variant == "prompt-encoder"
    assert assignment.policy == "adaptive-balanced"  # the placement policy's name
    assert assignment.epoch == 0
    assert assignment.deadline_s == assignment.request.deadline_s
    assert assignment.predicted_s == pytest.approx(0.1)  # exec_s at speed 1, scale 1
    record = await stages.record("call-1.encode")
    assert (record.status, record.worker_id) == ("assigned", "encoder")
    assert await stages.assigned_to("encoder", "call-1.encode")
    await stages.submit(stage_request("call-1.generate", "sd15-base", stage="generate"))
    (second,) = await stages.assignments(1)
    assert (second.worker_id, second.variant) == ("generator", "sd15-base")


async def test_a_burst_of_one_models_stages_is_spread_over_its_holders(
    stages: StageStack,
) -> None:
    await stages.models_worker("a", {"prompt-encoder": READY})
    await stages.models_worker("b", {"prompt-encoder": READY})
    await stages.start_stages()
    for i in range(4):
        await stages.submit(stage_request(f"call-{i}.encode"))
    got = await stages.assignments(4)
    by_worker = {w: sum(1 for a in got if a.worker_id == w) for w in ("a", "b")}
    # Between heartbeats the stages routed to a holder count as queued there.
    assert by_worker == {"a": 2, "b": 2}


async def test_a_draining_model_or_worker_takes_no_stage(stages: StageStack) -> None:
    await stages.models_worker("unloading", {"prompt-encoder": PlacedState.DRAINING})
    await stages.models_worker("ready", {"prompt-encoder": READY})
    await stages.start_stages()
    for i in range(3):
        await stages.submit(stage_request(f"call-{i}.encode"))
    got = await stages.assignments(3)
    assert {a.worker_id for a in got} == {"ready"}


async def test_a_stage_nobody_holds_is_held_counted_and_assigned_once_a_heartbeat_shows_it(
    stages: StageStack,
) -> None:
    await stages.models_worker("w", {"prompt-encoder": READY})
    await stages.start_stages()
    # Past its deadline it still waits: placement may load the model later.
    await stages.submit(stage_request("call-1.generate", "sd15-base", deadline_in_s=0.01))
    await stages.submit(stage_request("call-2.generate", "sd15-base"))
    await stages.submit(stage_request("call-3.encode"))
    (encode,) = await stages.assignments(1)
    assert encode.request.request_id == "call-3.encode"

    async def held() -> bool:
        return await stages.waiting() == {"sd15-base": 2}

    await eventually(held)
    assert await stages.demand() == {"sd15-base": 2, "prompt-encoder": 1}
    ttl_s = await stages.state.ttl_s(keys.placement_waiting("scheduler-0"))
    assert ttl_s is not None
    assert 0 < ttl_s <= keys.PLACEMENT_WAITING_TTL_S
    assert (await stages.record("call-1.generate")).status == "queued"
    await asyncio.sleep(0.3)
    assert await stages.sent_meanwhile() == []

    # The placement service loaded it: the next heartbeat says so (loading counts).
    await stages.models_worker(
        "w", {"prompt-encoder": READY, "sd15-base": PlacedState.LOADING}, sequence=2
    )
    got = await stages.assignments(2)
    assert [a.request.request_id for a in got] == ["call-1.generate", "call-2.generate"]
    assert {a.worker_id for a in got} == {"w"}

    async def emptied() -> bool:
        return not await stages.state.exists(keys.placement_waiting("scheduler-0"))

    await eventually(emptied)
    # Counted once each, when first decided, not again when assigned after waiting.
    assert await stages.demand() == {"sd15-base": 2, "prompt-encoder": 1}


async def test_demand_grows_with_every_stage_routed(stages: StageStack) -> None:
    await stages.models_worker("w", {"prompt-encoder": READY, "safety-checker": READY})
    await stages.start_stages()
    for i in range(5):
        await stages.submit(stage_request(f"call-{i}.encode"))
    await stages.submit(stage_request("call-0.check", "safety-checker", stage="check"))
    await stages.assignments(6)

    async def counted() -> bool:
        return await stages.demand() == {"prompt-encoder": 5, "safety-checker": 1}

    await eventually(counted)
    await stages.submit(stage_request("call-9.encode"))
    await stages.assignments(1)

    async def grown() -> bool:
        return (await stages.demand())["prompt-encoder"] == 6

    await eventually(grown)


async def test_a_stage_of_a_model_the_catalogue_lacks_fails_at_once_naming_it(
    stages: StageStack,
) -> None:
    await stages.models_worker("w", {"prompt-encoder": READY})
    await stages.start_stages()
    await stages.submit(stage_request("call-1.paint", "no-such-model", stage="paint"))
    answer = await stages.answer()
    assert answer.request_id == "call-1.paint"
    assert answer.status is CompletionStatus.FAILED
    assert answer.error is not None
    assert "no-such-model" in answer.error
    assert "paint" in answer.error
    assert "prompt-encoder" in answer.error  # the models it could have named
    assert (await stages.record("call-1.paint")).status == "failed"
    assert await stages.sent_meanwhile() == []
    assert await stages.waiting() == {}
    assert "no-such-model" not in await stages.demand()


async def test_a_dead_workers_stage_is_routed_again_to_another_holder(
    stages: StageStack,
) -> None:
    await stages.models_worker("doomed", {"prompt-encoder": READY})
    await stages.start_stages()
    await stages.submit(stage_request("call-1.encode"))
    (first,) = await stages.assignments(1)
    assert first.worker_id == "doomed"
    await stages.models_worker("doomed", {"prompt-encoder": READY}, sequence=2, status="down")
    await stages.models_worker("survivor", {"prompt-encoder": READY})
    await asyncio.sleep(0.3)  # a cluster read sees the survivor
    await stages.worker_down("doomed", ["call-1.encode"], reason="heartbeat-timeout")
    (again,) = await stages.assignments(1)
    assert again.request.request_id == "call-1.encode"
    assert (again.worker_id, again.variant, again.epoch) == ("survivor", "prompt-encoder", 1)
    record = await stages.record("call-1.encode")
    assert (record.status, record.worker_id, record.epoch) == ("assigned", "survivor", 1)
    assert not await stages.assigned_to("doomed", "call-1.encode")


async def test_a_dead_workers_stage_with_no_other_holder_waits_for_one(
    stages: StageStack,
) -> None:
    await stages.models_worker("doomed", {"prompt-encoder": READY})
    await stages.start_stages()
    await stages.submit(stage_request("call-1.encode"))
    (first,) = await stages.assignments(1)
    await stages.models_worker("doomed", {"prompt-encoder": READY}, sequence=2, status="down")
    await asyncio.sleep(0.3)
    await stages.worker_down("doomed", ["call-1.encode"], reason="heartbeat-timeout")

    async def held() -> bool:
        return await stages.waiting() == {"prompt-encoder": 1}

    await eventually(held)
    await stages.models_worker("newcomer", {"prompt-encoder": READY})
    (again,) = await stages.assignments(1)
    assert (again.worker_id, again.epoch) == ("newcomer", 1)
    assert first.worker_id == "doomed"


async def test_held_stages_are_handed_back_when_the_scheduler_stops(
    stages: StageStack,
) -> None:
    await stages.start_stages()
    await stages.submit(stage_request("call-1.generate", "sd15-base"))

    async def held() -> bool:
        return await stages.waiting() == {"sd15-base": 1}

    await eventually(held)
    reader = stages.client.subscribe(STAGE_REQUESTS, group="scheduler-stages")
    await stages.stop()
    # Its successor (here: a reader in the same group) gets it again; nothing is waiting.
    async with reader:
        delivery = await reader.next_within(10.0)
    assert delivery is not None
    assert delivery.message.request_id == "call-1.generate"
    assert await stages.waiting() == {}


async def test_llm_requests_are_still_placed_by_the_llm_policy_beside_stages(
    stages: StageStack,
) -> None:
    await stages.worker("llm")
    await stages.models_worker("models", {"prompt-encoder": READY})
    await stages.start_stages()
    await stages.submit(llm_request("chat"))
    await stages.submit(stage_request("call-1.encode"))
    got = {a.request.request_id: a for a in await stages.assignments(2)}
    assert (got["chat"].worker_id, got["chat"].policy) == ("llm", "jsq")
    assert (got["call-1.encode"].worker_id, got["call-1.encode"].policy) == (
        "models",
        "adaptive-balanced",
    )


async def test_bytes_or_a_request_that_is_no_stage_do_not_stop_stage_routing(
    stages: StageStack,
) -> None:
    await stages.models_worker("w", {"prompt-encoder": READY})
    await stages.start_stages()
    await stages.client.publish_bytes(STAGE_REQUESTS, b"not a message", key=b"junk")
    chat = llm_request("chat-on-the-wrong-topic")
    assert (await stages.ledger.accept(chat)).accepted
    await stages.client.publish(STAGE_REQUESTS, chat)
    answer = await stages.answer()
    assert answer.request_id == "chat-on-the-wrong-topic"
    assert answer.status is CompletionStatus.FAILED
    assert answer.error is not None
    assert "pipeline stages only" in answer.error
    await stages.submit(stage_request("call-1.encode"))
    (assignment,) = await stages.assignments(1)
    assert (assignment.request.request_id, assignment.worker_id) == ("call-1.encode", "w")
