"""What the ingress API tests share: the ingress HTTP API driven in process (httpx over
ASGI) on the in-memory bus and state store, with a fake worker that answers from
``switchyard.requests`` (the ``stack`` fixture, and ``ingress``, a replica on it: a test
file imports ``stack_fixture`` and ``ingress_fixture`` to use them), the catalogue, and
helpers that build calls and read their answers.

Each replica leases a partition of ``switchyard.answers`` of its own and reads it with
the service's routine (:func:`services.ingress.routing.route_answers`), as the ingress
service does. The fake worker stands in for the scheduler and a worker: it decides each
request in the request ledger (so a request published twice runs once, as with the real
scheduler), runs it, records its answer there, then sends the answer (a streamed
request's chunks first) to the asking replica's partition.

It reads markers from the prompt (LLM) or the client's request id (classification):
``SLOW`` is never decided (it stays queued, unanswered), ``DELAY`` answers 0.3 s after it
started, ``FAIL`` fails, ``EXPIRE`` expires, ``EMULATED`` answers as an emulated backend,
``DUP`` publishes every chunk and the completion twice (a redelivery), ``LATE`` publishes
the completion before the chunks, ``NOTEXT`` leaves the text out of the completion (only
the chunks carry it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import httpx
import pytest
from switchyard.apps.registry import Registry
from switchyard.bus import Bus, MemoryTransport
from switchyard.config import load_settings
from switchyard.contracts.messages import (
    Assignment,
    ClassificationResult,
    Completion,
    CompletionStatus,
    InferenceRequest,
    LLMPayload,
    LLMResult,
    OutputChunk,
    RequestTimeline,
)
from switchyard.contracts.topics import (
    ANSWERS,
    CLASSIFICATION_REQUESTS,
    REQUESTS,
    Topic,
    requests_topic,
)
from switchyard.lifecycle import Assign, Fence, RequestLedger
from switchyard.runtime.inbox import Inbox
from switchyard.runtime.service import ServiceContext
from switchyard.serving import ServingCatalogue
from switchyard.state.base import StateStore
from switchyard.state.memory import MemoryStateStore

from services.ingress.answers import AnswerRegistry
from services.ingress.api import ApiOptions, build_app
from services.ingress.drain import Admission
from services.ingress.pipeline_admission import PipelineGate
from services.ingress.quotas import Quotas
from services.ingress.routing import answer_subscription, route_answers
from services.ingress.tenants import KeyRing
from tests.support.services import mark_restored

if TYPE_CHECKING:
    from switchyard.telemetry import Telemetry

# -- the catalogue -----------------------------------------------------------------------

WINE_FEATURES = 13
CHAT_MAX_PROMPT = 64
CHAT_MAX_OUTPUT = 32
CHAT_SLO_S = 30.0


def make_catalogue() -> ServingCatalogue:
    """One LLM application (``chat``) and one classification application (``wine``)."""
    registry = Registry.model_validate(
        {
            "llm_applications": [
                {
                    "name": "chat",
                    "model": "llama-2-7b",
                    "slo_s": CHAT_SLO_S,
                    "max_prompt_tokens": CHAT_MAX_PROMPT,
                    "max_output_tokens": CHAT_MAX_OUTPUT,
                    "workload": "conversation",
                },
                {
                    "name": "coder",
                    "model": "llama-2-13b",
                    "slo_s": 60,
                    "workload": "code",
                    "ttft_slo_s": 0.25,
                },
            ],
            "applications": [
                {
                    "name": "wine",
                    "classes": ["class_0", "class_1", "class_2"],
                    "deadline_s": 0.15,
                    "penalty": {"kind": "step"},
                    "stream_class_mix": [0.8, 0.1, 0.1],
                    "dataset": "wine-dominant",
                    "feature_dim": WINE_FEATURES,
                    "variants": {
                        "mlp-small": {
                            "latency_s": {"cpu": {"1": 0.0001}},
                            "memory_bytes": 1000,
                            "load_s": 0.001,
                            "accuracy": 0.9,
                            "recall": [0.9, 0.9, 0.9],
                            "model_file": "wine/mlp-small.json",
                        }
                    },
                }
            ],
        }
    )
    return ServingCatalogue.from_registry(registry)


# -- the fake worker ---------------------------------------------------------------------

TOKENS = ("Hello", " from", " switchyard")
WORKER_ID = "worker-1"


def answer_text(request_id: str) -> str:
    return "".join(TOKENS) + f" [{request_id}]"


def _pieces(request_id: str) -> list[str]:
    return [*TOKENS[:-1], TOKENS[-1] + f" [{request_id}]"]


def _variant(request: InferenceRequest) -> str:
    return "mlp-small" if request.payload.kind == "classification" else "llama-2-7b"


def make_completion(
    request: InferenceRequest,
    *,
    status: CompletionStatus = CompletionStatus.OK,
    emulated: bool = False,
    error: str | None = None,
    assigned_s: float | None = None,
) -> Completion:
    """The answer of ``request``, finished now (assigned and started now too, unless
    ``assigned_s`` says when it was taken)."""
    now = time.time()
    taken_s = now if assigned_s is None else assigned_s
    result: LLMResult | ClassificationResult
    if isinstance(request.payload, LLMPayload):
        text = (
            None if "NOTEXT" in (request.payload.prompt or "") else answer_text(request.request_id)
        )
        result = LLMResult(output_tokens=len(TOKENS), text=text)
    else:
        result = ClassificationResult(label=1, probabilities=[0.1, 0.8, 0.1])
    return Completion(
        request_id=request.request_id,
        app=request.app,
        worker_id=WORKER_ID,
        worker_type="cpu",
        variant=_variant(request),
        status=status,
        result=result if status is CompletionStatus.OK else None,
        error=error,
        timeline=RequestTimeline(
            arrival_s=request.arrival_s,
            assigned_s=taken_s,
            started_s=taken_s,
            first_token_s=now,
            finished_s=now,
        ),
        deadline_s=request.deadline_s,
        emulated=emulated,
        reply_to=request.reply_to,
    )


class FakeWorker:
    """Decides, runs and answers every request published (both request topics) as its markers
    say (see the module docstring).

    Attributes:
        seen: every request published, copies included.
        ran: the requests it ran: each once, however often it was published.
    """

    def __init__(self, bus: Bus, state: StateStore) -> None:
        self.bus = bus
        self.ledger = RequestLedger(state)
        self.seen: list[InferenceRequest] = []
        self.ran: list[InferenceRequest] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self, stopping: asyncio.Event) -> None:
        await asyncio.gather(
            *(self._read(topic, stopping) for topic in (REQUESTS, CLASSIFICATION_REQUESTS))
        )

    async def _read(self, topic: Topic[InferenceRequest], stopping: asyncio.Event) -> None:
        async with self.bus.subscribe(
            topic, group=f"fake-worker-{topic.name}", stopping=stopping
        ) as sub:
            async for delivery in sub:
                self.seen.append(delivery.message)
                task = asyncio.create_task(self.serve(delivery.message))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    def requests_with_id(self, request_id: str) -> list[InferenceRequest]:
        """The copies of the request published to ``switchyard.requests``."""
        return [r for r in self.seen if r.request_id == request_id]

    def runs_of(self, request_id: str) -> list[InferenceRequest]:
        """The times the request ran."""
        return [r for r in self.ran if r.request_id == request_id]

    async def serve(self, request: InferenceRequest) -> None:
        payload = request.payload
        marker = payload.prompt or "" if isinstance(payload, LLMPayload) else request.request_id
        if "SLOW" in marker:
            return  # never decided: it stays queued
        if not await self._take(request):
            return  # decided before (a copy published again): it runs once
        taken_s = time.time()
        if "DELAY" in marker:
            await asyncio.sleep(0.3)
        if "FAIL" in marker:
            failed = make_completion(
                request, status=CompletionStatus.FAILED, error="CUDA out of memory"
            )
            await self._answer(request, failed)
            return
        if "EXPIRE" in marker:
            await self._answer(request, make_completion(request, status=CompletionStatus.EXPIRED))
            return
        emulated = "EMULATED" in marker
        completion = make_completion(request, emulated=emulated, assigned_s=taken_s)
        copies = 2 if "DUP" in marker else 1
        streaming = isinstance(payload, LLMPayload) and payload.stream
        if "LATE" in marker:
            await self._answer(request, completion)
            await asyncio.sleep(0.05)
        if streaming:
            for index, text in enumerate(_pieces(request.request_id)):
                chunk = OutputChunk(
                    request_id=request.request_id,
                    index=index,
                    text=text,
                    tokens=1,
                    reply_to=request.reply_to,
                    emulated=emulated,
                    sent_at_s=time.time(),
                )
                for _ in range(copies):
                    await self._send(request, chunk)
                await asyncio.sleep(0.005)
        if "LATE" not in marker:
            await self._answer(request, completion, copies=copies)

    async def _take(self, request: InferenceRequest) -> bool:
        """Decide the request for this worker and start it, as the scheduler and a worker
        do in the ledger; False when it was decided before."""
        now = time.time()
        assignment = Assignment(
            request=request,
            worker_id=WORKER_ID,
            variant=_variant(request),
            order=request.arrival_s,
            policy="fake",
            deadline_s=request.deadline_s,
            assigned_at_s=now,
        )
        if (await self.ledger.assign(Assign(assignment))).result != "assigned":
            return False
        await self.ledger.start_many([Fence(request.request_id, 0, WORKER_ID)], now)
        self.ran.append(request)
        return True

    async def _answer(
        self, request: InferenceRequest, completion: Completion, copies: int = 1
    ) -> None:
        """Record the answer in the ledger, then send it: a worker's order."""
        await self.ledger.finish_many([completion])
        for _ in range(copies):
            await self._send(request, completion)

    async def _send(self, request: InferenceRequest, answer: Completion | OutputChunk) -> None:
        if request.reply_partition is not None:
            await self.bus.publish(ANSWERS, answer, partition=request.reply_partition)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


# -- the stack ---------------------------------------------------------------------------


async def routed_answers(
    bus: Bus, state: StateStore, instance_id: str, stopping: asyncio.Event
) -> tuple[AnswerRegistry, asyncio.Task[None]]:
    """An ingress replica's answer registry and the routine delivering it what comes to
    the partition of ``switchyard.answers`` it leased, set up as the ingress service does:
    reading the partition before any request names it."""
    ctx = ServiceContext(
        name="ingress",
        settings=load_settings({}, instance_id=instance_id),
        bus=bus,
        state=state,
        telemetry=cast("Telemetry", object()),  # the inbox never touches it
        logger=logging.getLogger("tests.ingress"),
        stopping=stopping,
    )
    inbox: Inbox[Completion | OutputChunk] = Inbox(ctx, ANSWERS, instance_id)
    await inbox.open()
    answers = AnswerRegistry(instance_id)
    subscription = answer_subscription(inbox, answers, stopping)
    await subscription.open()
    answers.reply_partition = inbox.partition
    task = asyncio.create_task(route_answers(subscription, inbox, answers, stopping=stopping))
    return answers, task


@dataclass
class Replica:
    """One ingress replica: its app, its answer routine and a client for it."""

    instance_id: str
    answers: AnswerRegistry
    admission: Admission
    client: httpx.AsyncClient


@dataclass
class Stack:
    bus: Bus
    state: MemoryStateStore
    catalogue: ServingCatalogue
    worker: FakeWorker
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    clients: list[httpx.AsyncClient] = field(default_factory=list)

    async def publish(self, request: InferenceRequest) -> None:
        """What the ingress service publishes a request with."""
        await self.bus.publish(requests_topic(request), request)

    async def replica(
        self,
        instance_id: str = "ingress-a",
        *,
        options: ApiOptions | None = None,
        publish: Callable[[InferenceRequest], Awaitable[object]] | None = None,
        keys: KeyRing | None = None,
        clock: Callable[[], float] = time.time,
        pipeline_gate: PipelineGate | None = None,
    ) -> Replica:
        """A replica; with ``keys``, its tenants' limits kept in the stack's state; with
        ``pipeline_gate``, pipeline calls pass it first."""
        answers, routing = await routed_answers(self.bus, self.state, instance_id, self.stopping)
        self.tasks.append(routing)
        admission = Admission()
        app = build_app(
            self.catalogue,
            publish or self.publish,
            answers,
            self.state,
            options=options or ApiOptions(answer_timeout_s=5.0),
            admission=admission,
            clock=clock,
            keys=keys,
            quotas=Quotas(self.state, hold_s=30.0) if keys is not None else None,
            pipeline_gate=pipeline_gate,
        )
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://ingress", timeout=10.0
        )
        self.clients.append(client)
        return Replica(instance_id, answers, admission, client)


@pytest.fixture(name="stack")
async def stack_fixture() -> AsyncIterator[Stack]:
    bus = Bus(MemoryTransport(), commit_interval_s=0.05)
    await bus.start()
    state = MemoryStateStore()
    await mark_restored(state)
    made = Stack(bus, state, make_catalogue(), FakeWorker(bus, state))
    made.tasks.append(asyncio.create_task(made.worker.run(made.stopping)))
    try:
        yield made
    finally:
        made.stopping.set()
        for client in made.clients:
            await client.aclose()
        await made.worker.close()
        for task in made.tasks:  # quicker than waiting for their fetches to notice the stop
            task.cancel()
        await asyncio.gather(*made.tasks, return_exceptions=True)
        await bus.stop()


@pytest.fixture(name="ingress")
async def ingress_fixture(stack: Stack) -> Replica:
    return await stack.replica()


# -- helpers -----------------------------------------------------------------------------


def completion_body(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "chat", "prompt": "Say hello", "max_tokens": 8}
    body.update(overrides)
    return body


def features(value: float = 0.5) -> list[float]:
    return [value] * WINE_FEATURES


def assert_error(
    response: httpx.Response, status: int, *, param: str | None, names: str | None = None
) -> dict[str, Any]:
    """The response is an OpenAI error with ``status`` about ``param``, whose message
    names ``names`` (default: the param)."""
    assert response.status_code == status, response.text
    body = response.json()
    error = body["error"]
    assert set(error) >= {"message", "type", "param", "code"}
    assert error["param"] == param
    expected = names if names is not None else param
    if expected is not None:
        assert expected in error["message"], error["message"]
    assert "Traceback" not in response.text
    return error  # type: ignore[no-any-return]


def sse_events(text: str) -> list[Any]:
    """The ``data:`` payloads of an event stream, JSON-decoded ("[DONE]" kept as is)."""
    events: list[Any] = []
    assert text.endswith("\n\n")
    for block in text.split("\n\n")[:-1]:
        assert block.startswith("data: "), block
        data = block.removeprefix("data: ")
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


async def _stream(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> httpx.Response:
    return await client.post(path, json={**body, "stream": True})
