"""The ingress HTTP API, driven in process (httpx over ASGI) on the in-memory bus and
state store, with a fake worker that answers from ``switchyard.requests``.

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
import contextlib
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import httpx
import pytest
from switchyard.apps.registry import Registry
from switchyard.bus import Bus, MemoryTransport
from switchyard.config import load_settings
from switchyard.contracts.messages import (
    Assignment,
    ClassificationPayload,
    ClassificationResult,
    Completion,
    CompletionStatus,
    InferenceRequest,
    LLMPayload,
    LLMResult,
    OutputChunk,
    RequestTimeline,
    WorkloadType,
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
from services.ingress.routing import answer_subscription, route_answers
from services.ingress.tokens import chat_prompt

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
                {"name": "coder", "model": "llama-2-13b", "slo_s": 60, "workload": "code"},
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
) -> Completion:
    now = time.time()
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
            assigned_s=now,
            started_s=now,
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
        async with self.bus.subscribe(topic, group="fake-worker", stopping=stopping) as sub:
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
        completion = make_completion(request, emulated=emulated)
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
    ) -> Replica:
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
        )
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://ingress", timeout=10.0
        )
        self.clients.append(client)
        return Replica(instance_id, answers, admission, client)


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    bus = Bus(MemoryTransport(), commit_interval_s=0.05)
    await bus.start()
    state = MemoryStateStore()
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


@pytest.fixture
async def ingress(stack: Stack) -> Replica:
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


# -- /v1/completions ---------------------------------------------------------------------


async def test_completion_answers_in_openai_shape(stack: Stack, ingress: Replica) -> None:
    before = time.time()
    response = await ingress.client.post("/v1/completions", json=completion_body())
    assert response.status_code == 200, response.text
    body = response.json()
    request_id = body["switchyard"]["request_id"]
    assert request_id.startswith("req-")
    assert body["id"] == request_id
    assert response.headers["X-Switchyard-Request-Id"] == request_id
    assert "X-Switchyard-Emulated" not in response.headers
    assert body["object"] == "text_completion"
    assert body["model"] == "chat"
    assert isinstance(body["created"], int)
    assert body["choices"] == [
        {"index": 0, "text": answer_text(request_id), "finish_reason": "length", "logprobs": None}
    ]
    # "Say hello" is 9 bytes: ceil(9 / 4) = 3 prompt tokens.
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
    block = body["switchyard"]
    assert block["status"] == "ok"
    assert block["worker_id"] == "worker-1"
    assert block["worker_type"] == "cpu"
    assert block["variant"] == "llama-2-7b"
    assert block["emulated"] is False
    assert block["deadline_met"] is True
    assert set(block["timeline"]) == {
        "arrival_s",
        "assigned_s",
        "started_s",
        "first_token_s",
        "finished_s",
    }
    # The request the worker got, addressed back to this replica's answer partition.
    [request] = stack.worker.requests_with_id(request_id)
    assert request.app == "chat"
    assert request.reply_to == "ingress-a"
    assert request.reply_partition == ingress.answers.reply_partition
    assert request.priority == 0
    assert before <= request.arrival_s <= time.time()
    assert request.deadline_s == pytest.approx(request.arrival_s + CHAT_SLO_S)
    assert block["deadline_s"] == pytest.approx(request.deadline_s)
    payload = request.payload
    assert isinstance(payload, LLMPayload)
    assert payload.model == "llama-2-7b"
    assert payload.prompt == "Say hello"
    assert payload.prompt_tokens == 3
    assert payload.max_output_tokens == 8
    assert payload.workload == "conversation"
    assert payload.stream is False


async def test_the_default_deadline_runs_in_the_emulated_time_scale(stack: Stack) -> None:
    replica = await stack.replica(options=ApiOptions(answer_timeout_s=5.0, llm_time_scale=10.0))
    response = await replica.client.post("/v1/completions", json=completion_body())
    assert response.status_code == 200, response.text
    [request] = stack.worker.requests_with_id(response.json()["id"])
    assert request.deadline_s == pytest.approx(request.arrival_s + CHAT_SLO_S / 10.0)


async def test_max_tokens_defaults_to_16(stack: Stack, ingress: Replica) -> None:
    body = completion_body()
    del body["max_tokens"]
    response = await ingress.client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    [request] = stack.worker.requests_with_id(response.json()["id"])
    assert isinstance(request.payload, LLMPayload)
    assert request.payload.max_output_tokens == 16


async def test_switchyard_block_sets_tokens_deadline_and_priority(
    stack: Stack, ingress: Replica
) -> None:
    body = completion_body(
        prompt="",
        switchyard={
            "deadline_ms": 2500,
            "priority": 7,
            "prompt_tokens": 50,
            "output_tokens_hint": 100,
            "workload": "code",
        },
    )
    response = await ingress.client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    [request] = stack.worker.requests_with_id(response.json()["id"])
    payload = request.payload
    assert isinstance(payload, LLMPayload)
    assert payload.prompt_tokens == 50
    # The predictor's workload feature: the client's class, not the application's.
    assert payload.workload is WorkloadType.CODE
    assert payload.output_tokens_hint == 8  # capped at max_tokens
    assert request.priority == 7
    assert request.deadline_s == pytest.approx(request.arrival_s + 2.5)
    assert response.json()["usage"]["prompt_tokens"] == 50


async def test_prompt_may_be_left_out_when_prompt_tokens_is_given(
    stack: Stack, ingress: Replica
) -> None:
    body = {"model": "chat", "max_tokens": 4, "switchyard": {"prompt_tokens": 12}}
    response = await ingress.client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    [request] = stack.worker.requests_with_id(response.json()["id"])
    assert isinstance(request.payload, LLMPayload)
    assert request.payload.prompt is None
    assert request.payload.prompt_tokens == 12


async def test_headers_give_deadline_and_priority_and_the_body_wins(
    stack: Stack, ingress: Replica
) -> None:
    headers = {"X-Switchyard-Deadline-Ms": "1500", "X-Switchyard-Priority": "42"}
    response = await ingress.client.post("/v1/completions", json=completion_body(), headers=headers)
    assert response.status_code == 200, response.text
    [request] = stack.worker.requests_with_id(response.json()["id"])
    assert request.priority == 42
    assert request.deadline_s == pytest.approx(request.arrival_s + 1.5)

    body = completion_body(switchyard={"deadline_ms": 3000, "priority": 1})
    response = await ingress.client.post("/v1/completions", json=body, headers=headers)
    assert response.status_code == 200, response.text
    [request] = stack.worker.requests_with_id(response.json()["id"])
    assert request.priority == 1
    assert request.deadline_s == pytest.approx(request.arrival_s + 3.0)


async def test_other_openai_fields_are_ignored(ingress: Replica) -> None:
    body = completion_body(temperature=0.2, top_p=0.9, n=1, user="someone")
    response = await ingress.client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text


# -- /v1/chat/completions ----------------------------------------------------------------


async def test_chat_completion(stack: Stack, ingress: Replica) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "!"}],
        },
    ]
    body = {"model": "chat", "messages": messages, "max_tokens": 5}
    response = await ingress.client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["object"] == "chat.completion"
    request_id = answer["id"]
    assert answer["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": answer_text(request_id)},
            "finish_reason": "length",
        }
    ]
    [request] = stack.worker.requests_with_id(request_id)
    assert isinstance(request.payload, LLMPayload)
    expected = chat_prompt([("system", "Be brief."), ("user", "Hi!")])
    assert expected == "system: Be brief.\nuser: Hi!\nassistant:"
    assert request.payload.prompt == expected
    assert answer["usage"]["prompt_tokens"] == math.ceil(len(expected.encode()) / 4)


async def test_chat_max_completion_tokens_wins(stack: Stack, ingress: Replica) -> None:
    body = {
        "model": "chat",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 5,
        "max_completion_tokens": 9,
    }
    response = await ingress.client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    [request] = stack.worker.requests_with_id(response.json()["id"])
    assert isinstance(request.payload, LLMPayload)
    assert request.payload.max_output_tokens == 9


# -- streaming ---------------------------------------------------------------------------


async def _stream(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> httpx.Response:
    return await client.post(path, json={**body, "stream": True})


async def test_stream_sends_chunks_in_order_then_the_final_chunk_and_done(
    stack: Stack, ingress: Replica
) -> None:
    response = await _stream(ingress.client, "/v1/completions", completion_body())
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    *chunks, final = events[:-1]
    request_id = final["switchyard"]["request_id"]
    assert response.headers["X-Switchyard-Request-Id"] == request_id
    assert [c["choices"][0]["text"] for c in chunks] == _pieces(request_id)
    for chunk in chunks:
        assert chunk["object"] == "text_completion"
        assert chunk["id"] == request_id
        assert chunk["choices"][0]["finish_reason"] is None
    assert final["choices"][0]["finish_reason"] == "length"
    assert final["choices"][0]["text"] == ""
    assert final["usage"]["completion_tokens"] == 3
    assert final["switchyard"]["status"] == "ok"
    [request] = stack.worker.requests_with_id(request_id)
    assert isinstance(request.payload, LLMPayload)
    assert request.payload.stream is True


async def test_stream_drops_redelivered_chunks_and_completions(ingress: Replica) -> None:
    response = await _stream(ingress.client, "/v1/completions", completion_body(prompt="DUP"))
    assert response.status_code == 200, response.text
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    request_id = events[-2]["switchyard"]["request_id"]
    texts = [e["choices"][0]["text"] for e in events[:-2]]
    assert texts == _pieces(request_id)
    assert sum(1 for e in events if e != "[DONE]" and "switchyard" in e) == 1


async def test_stream_waits_for_chunks_the_completion_overtook(ingress: Replica) -> None:
    response = await _stream(ingress.client, "/v1/completions", completion_body(prompt="LATE"))
    assert response.status_code == 200, response.text
    events = sse_events(response.text)
    request_id = events[-2]["switchyard"]["request_id"]
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == answer_text(request_id)
    assert events[-2]["choices"][0]["finish_reason"] == "length"


async def test_stream_waits_for_chunks_a_completion_without_text_overtook(
    ingress: Replica,
) -> None:
    body = completion_body(prompt="LATE NOTEXT")
    response = await _stream(ingress.client, "/v1/completions", body)
    assert response.status_code == 200, response.text
    events = sse_events(response.text)
    request_id = events[-2]["switchyard"]["request_id"]
    assert [e["choices"][0]["text"] for e in events[:-2]] == _pieces(request_id)


async def test_chat_stream_uses_chunk_objects_with_deltas(ingress: Replica) -> None:
    body = {"model": "chat", "messages": [{"role": "user", "content": "Hi"}]}
    response = await _stream(ingress.client, "/v1/chat/completions", body)
    assert response.status_code == 200, response.text
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    *chunks, final = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in events[:-1])
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    content = "".join(c["choices"][0]["delta"]["content"] for c in chunks)
    assert content == answer_text(final["id"])
    assert final["choices"][0] == {"index": 0, "delta": {}, "finish_reason": "length"}


async def test_stream_of_a_failed_request_is_a_502(ingress: Replica) -> None:
    response = await _stream(ingress.client, "/v1/completions", completion_body(prompt="FAIL"))
    error = assert_error(response, 502, param=None, names="CUDA out of memory")
    assert error["code"] == "worker_failed"


# -- emulated ----------------------------------------------------------------------------


async def test_emulated_answers_carry_the_header(ingress: Replica) -> None:
    response = await ingress.client.post("/v1/completions", json=completion_body(prompt="EMULATED"))
    assert response.status_code == 200, response.text
    assert response.headers["X-Switchyard-Emulated"] == "true"
    assert response.json()["switchyard"]["emulated"] is True

    streamed = await _stream(ingress.client, "/v1/completions", completion_body(prompt="EMULATED"))
    assert streamed.status_code == 200, streamed.text
    assert streamed.headers["X-Switchyard-Emulated"] == "true"
    assert sse_events(streamed.text)[-2]["switchyard"]["emulated"] is True


# -- classification ----------------------------------------------------------------------


async def test_infer_answers_the_label(stack: Stack, ingress: Replica) -> None:
    response = await ingress.client.post("/v1/apps/wine/infer", json={"features": features()})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["app"] == "wine"
    assert body["label"] == 1
    assert body["class_name"] == "class_1"
    assert body["probabilities"] == [0.1, 0.8, 0.1]
    assert body["variant"] == "mlp-small"
    assert body["worker_id"] == "worker-1"
    assert body["emulated"] is False
    assert body["deadline_met"] is True
    assert body["timeline"]["finished_s"] is not None
    [request] = stack.worker.requests_with_id(body["request_id"])
    assert isinstance(request.payload, ClassificationPayload)
    assert request.payload.features == features()
    assert request.deadline_s == pytest.approx(request.arrival_s + 0.150)
    assert body["deadline_s"] == pytest.approx(request.deadline_s)


async def test_infer_takes_deadline_priority_and_request_id(stack: Stack, ingress: Replica) -> None:
    body = {"features": features(), "deadline_ms": 40, "priority": 900, "request_id": "wine-1"}
    response = await ingress.client.post("/v1/apps/wine/infer", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["request_id"] == "wine-1"
    [request] = stack.worker.requests_with_id("wine-1")
    assert request.priority == 900
    assert request.deadline_s == pytest.approx(request.arrival_s + 0.040)


async def test_infer_failure_is_a_502_and_expiry_a_504(ingress: Replica) -> None:
    failed = await ingress.client.post(
        "/v1/apps/wine/infer", json={"features": features(), "request_id": "FAIL-1"}
    )
    assert_error(failed, 502, param=None, names="CUDA out of memory")
    expired = await ingress.client.post(
        "/v1/apps/wine/infer", json={"features": features(), "request_id": "EXPIRE-1"}
    )
    error = assert_error(expired, 504, param=None, names="EXPIRE-1")
    assert error["code"] == "deadline_expired"
    assert expired.json()["switchyard"]["status"] == "expired"


# -- failures, timeouts, status ------------------------------------------------------------


async def test_failed_completion_is_a_502_with_the_workers_error(ingress: Replica) -> None:
    response = await ingress.client.post("/v1/completions", json=completion_body(prompt="FAIL"))
    error = assert_error(response, 502, param=None, names="CUDA out of memory")
    assert "worker-1" in error["message"]
    assert response.json()["switchyard"]["status"] == "failed"


async def test_expired_completion_is_a_504(ingress: Replica) -> None:
    response = await ingress.client.post("/v1/completions", json=completion_body(prompt="EXPIRE"))
    error = assert_error(response, 504, param=None, names="expired")
    assert error["code"] == "deadline_expired"


async def test_no_answer_in_time_is_a_504_naming_the_request_id(stack: Stack) -> None:
    replica = await stack.replica(options=ApiOptions(answer_timeout_s=0.2))
    body = completion_body(prompt="SLOW", switchyard={"request_id": "slow-1"})
    response = await replica.client.post("/v1/completions", json=body)
    error = assert_error(response, 504, param=None, names="slow-1")
    assert error["code"] == "answer_timeout"
    assert "/v1/requests/slow-1" in error["message"]
    assert response.headers["X-Switchyard-Request-Id"] == "slow-1"
    assert response.json()["switchyard"]["request_id"] == "slow-1"
    assert len(replica.answers) == 0  # the waiter was released

    # Accepted and kept: nothing decided it yet.
    status = await replica.client.get("/v1/requests/slow-1")
    assert status.status_code == 200
    assert status.json()["status"] == "queued"
    assert status.json()["worker_id"] is None


async def test_stream_without_an_answer_in_time_is_a_504(stack: Stack) -> None:
    replica = await stack.replica(options=ApiOptions(answer_timeout_s=0.2))
    response = await _stream(replica.client, "/v1/completions", completion_body(prompt="SLOW"))
    error = assert_error(response, 504, param=None, names="no answer")
    assert error["code"] == "answer_timeout"


async def test_status_before_and_after_the_answer(stack: Stack, ingress: Replica) -> None:
    body = completion_body(prompt="DELAY", switchyard={"request_id": "status-1"})
    call = asyncio.create_task(ingress.client.post("/v1/completions", json=body))
    # The record follows the request through its life: accepted (queued), decided
    # (assigned), then running on its worker for the 0.3 s it takes.
    seen: list[str] = []
    for _ in range(100):
        before = await ingress.client.get("/v1/requests/status-1")
        if before.status_code == 200:
            seen.append(before.json()["status"])
            if seen[-1] == "running":
                break
        await asyncio.sleep(0.01)
    assert before.status_code == 200, before.text
    assert set(seen) <= {"queued", "assigned", "running"}, seen
    running = before.json()
    assert running["request_id"] == "status-1"
    assert running["app"] == "chat"
    assert running["kind"] == "llm"
    assert running["status"] == "running"
    assert running["worker_id"] == "worker-1"
    assert running["timeline"]["arrival_s"] is not None
    assert running.get("result") is None

    response = await call
    assert response.status_code == 200, response.text
    after = (await ingress.client.get("/v1/requests/status-1")).json()
    assert after["status"] == "ok"
    assert after["worker_id"] == "worker-1"
    assert after["result"] == {"kind": "llm", "output_tokens": 3, "text": answer_text("status-1")}
    assert after["timeline"]["finished_s"] is not None
    assert after["deadline_met"] is True


async def test_status_of_a_request_id_with_a_slash(ingress: Replica) -> None:
    body = completion_body(switchyard={"request_id": "tenant/42"})
    assert (await ingress.client.post("/v1/completions", json=body)).status_code == 200
    status = await ingress.client.get("/v1/requests/tenant/42")
    assert status.status_code == 200, status.text
    assert status.json()["request_id"] == "tenant/42"


async def test_status_of_an_unknown_request_is_a_404(ingress: Replica) -> None:
    response = await ingress.client.get("/v1/requests/nope")
    error = assert_error(response, 404, param="request_id", names="nope")
    assert error["code"] == "request_not_found"


async def test_status_can_be_read_on_another_replica(stack: Stack, ingress: Replica) -> None:
    other = await stack.replica("ingress-b")
    body = completion_body(switchyard={"request_id": "shared-1"})
    assert (await ingress.client.post("/v1/completions", json=body)).status_code == 200
    status = await other.client.get("/v1/requests/shared-1")
    assert status.status_code == 200
    assert status.json()["status"] == "ok"


# -- idempotent retries --------------------------------------------------------------------


async def test_retry_with_the_same_request_id_returns_the_stored_answer(
    stack: Stack, ingress: Replica
) -> None:
    body = completion_body(switchyard={"request_id": "retry-1"})
    first = await ingress.client.post("/v1/completions", json=body)
    second = await ingress.client.post("/v1/completions", json=body)
    assert first.status_code == second.status_code == 200
    assert first.json() == second.json()
    # Answered from the record: not published, let alone run, again.
    assert len(stack.worker.requests_with_id("retry-1")) == 1
    assert len(stack.worker.runs_of("retry-1")) == 1

    # Streamed, the retry gets the stored answer as one chunk.
    streamed = await _stream(ingress.client, "/v1/completions", body)
    events = sse_events(streamed.text)
    assert events[-1] == "[DONE]"
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == answer_text("retry-1")
    assert len(stack.worker.requests_with_id("retry-1")) == 1


async def test_concurrent_retries_share_one_run(stack: Stack, ingress: Replica) -> None:
    body = completion_body(prompt="DELAY", switchyard={"request_id": "retry-2"})
    first, second = await asyncio.gather(
        ingress.client.post("/v1/completions", json=body),
        ingress.client.post("/v1/completions", json=body),
    )
    assert first.status_code == second.status_code == 200, (first.text, second.text)
    assert first.json()["choices"] == second.json()["choices"]
    # The second call waits with the first on this replica: one publish, one run.
    assert len(stack.worker.requests_with_id("retry-2")) == 1
    assert len(stack.worker.runs_of("retry-2")) == 1
    assert len(ingress.answers) == 0


async def test_retry_on_another_replica_waits_for_the_first(stack: Stack, ingress: Replica) -> None:
    other = await stack.replica("ingress-b")
    body = completion_body(prompt="DELAY", switchyard={"request_id": "retry-3"})
    first = asyncio.create_task(ingress.client.post("/v1/completions", json=body))
    await asyncio.sleep(0.05)
    second = await other.client.post("/v1/completions", json=body)
    assert second.status_code == 200, second.text
    assert (await first).json()["choices"] == second.json()["choices"]
    assert len(stack.worker.runs_of("retry-3")) == 1
    # The answer went to the first call's replica; the retry found it in the record.
    [request] = stack.worker.runs_of("retry-3")
    assert request.reply_to == "ingress-a"
    assert len(other.answers) == 0


async def test_one_id_sent_to_two_replicas_at_once_is_accepted_and_run_once(
    stack: Stack, ingress: Replica
) -> None:
    # The ledger's accept is one atomic create-or-return: whichever replica records the
    # id first publishes it; the other serves the same request (maybe publishing it once
    # more: the ledger decides it once).
    other = await stack.replica("ingress-b")
    body = completion_body(prompt="DELAY", switchyard={"request_id": "both-1"})
    first, second = await asyncio.gather(
        ingress.client.post("/v1/completions", json=body),
        other.client.post("/v1/completions", json=body),
    )
    assert first.status_code == second.status_code == 200, (first.text, second.text)
    assert first.json()["choices"] == second.json()["choices"]
    assert first.json()["choices"][0]["text"] == answer_text("both-1")
    assert len(stack.worker.runs_of("both-1")) == 1
    assert len(ingress.answers) == len(other.answers) == 0


async def test_classification_retry_is_idempotent(stack: Stack, ingress: Replica) -> None:
    body = {"features": features(), "request_id": "wine-retry"}
    first = await ingress.client.post("/v1/apps/wine/infer", json=body)
    second = await ingress.client.post("/v1/apps/wine/infer", json=body)
    assert first.status_code == second.status_code == 200
    assert first.json() == second.json()
    assert len(stack.worker.requests_with_id("wine-retry")) == 1
    assert len(stack.worker.runs_of("wine-retry")) == 1


# -- publishing failures and the drain -----------------------------------------------------


class FlakyPublish:
    """A publisher that fails (``ConnectionError``) or hangs (``hang``) while ``broken``;
    ``lost_after_send``: it hangs only after the request reached the bus (the broker
    stored it, its acknowledgement never came)."""

    def __init__(self, stack: Stack, *, hang: bool = False, lost_after_send: bool = False) -> None:
        self.stack = stack
        self.hang = hang
        self.lost_after_send = lost_after_send
        self.broken = True
        self.attempts: list[str] = []

    async def __call__(self, request: InferenceRequest) -> None:
        self.attempts.append(request.request_id)
        if not self.broken:
            await self.stack.publish(request)
            return
        if self.lost_after_send:
            await self.stack.publish(request)
        if self.hang or self.lost_after_send:
            await asyncio.Event().wait()
        raise ConnectionError("broker unreachable")


def assert_outcome_unknown(response: httpx.Response, request_id: str, *, names: str) -> None:
    """503 ``outcome_unknown`` with ``Retry-After``, naming the request id to retry with."""
    error = assert_error(response, 503, param=None, names=names)
    assert error["code"] == "outcome_unknown"
    assert request_id in error["message"]
    assert "retry with the same request_id" in error["message"]
    assert response.headers["Retry-After"] == "1"
    assert response.json()["switchyard"] == {"request_id": request_id, "status": "unknown"}


async def test_a_failed_publish_is_outcome_unknown_and_the_retry_gets_the_one_answer(
    stack: Stack,
) -> None:
    publish = FlakyPublish(stack)
    replica = await stack.replica(publish=publish)
    body = completion_body(switchyard={"request_id": "unpublished"})
    response = await replica.client.post("/v1/completions", json=body)
    assert_outcome_unknown(response, "unpublished", names="broker unreachable")
    assert len(replica.answers) == 0  # the call stopped waiting
    # The record is kept (the request may yet go out): the id is taken, still queued.
    status = await replica.client.get("/v1/requests/unpublished")
    assert status.status_code == 200, status.text
    assert status.json()["status"] == "queued"
    assert stack.worker.requests_with_id("unpublished") == []

    # The retry, on another replica, publishes the still-queued request and gets its answer.
    working = await stack.replica("ingress-b")
    retry = await working.client.post("/v1/completions", json=body)
    assert retry.status_code == 200, retry.text
    assert retry.json()["choices"][0]["text"] == answer_text("unpublished")
    assert len(stack.worker.runs_of("unpublished")) == 1
    # ... and a retry after that gets the same answer from the record.
    again = await replica.client.post("/v1/completions", json=body)
    assert again.status_code == 200, again.text
    assert again.json() == retry.json()
    assert len(stack.worker.runs_of("unpublished")) == 1
    assert publish.attempts == ["unpublished"]  # an answered request is not published again


async def test_a_timed_out_publish_is_outcome_unknown_and_the_same_replica_serves_the_retry(
    stack: Stack,
) -> None:
    publish = FlakyPublish(stack, hang=True)
    options = ApiOptions(answer_timeout_s=5.0, publish_timeout_s=0.1)
    replica = await stack.replica(options=options, publish=publish)
    body = completion_body(switchyard={"request_id": "hung-1"})
    response = await replica.client.post("/v1/completions", json=body)
    assert_outcome_unknown(response, "hung-1", names="hung-1")
    assert len(replica.answers) == 0
    assert (await replica.client.get("/v1/requests/hung-1")).json()["status"] == "queued"

    publish.broken = False  # the broker is back
    retry = await replica.client.post("/v1/completions", json=body)
    assert retry.status_code == 200, retry.text
    assert retry.json()["choices"][0]["text"] == answer_text("hung-1")
    assert publish.attempts == ["hung-1", "hung-1"]
    assert len(stack.worker.runs_of("hung-1")) == 1
    assert len(replica.answers) == 0


async def test_a_publish_whose_ack_was_lost_runs_once_whatever_the_retries(
    stack: Stack,
) -> None:
    # The broker stored the request but the call timed out waiting for its ack: the
    # request goes on, and retries (re-publishing it while it is still queued) neither
    # run it twice nor get another answer.
    publish = FlakyPublish(stack, lost_after_send=True)
    options = ApiOptions(answer_timeout_s=5.0, publish_timeout_s=0.1)
    replica = await stack.replica(options=options, publish=publish)
    body = completion_body(prompt="DELAY", switchyard={"request_id": "acked-late"})
    response = await replica.client.post("/v1/completions", json=body)
    assert_outcome_unknown(response, "acked-late", names="acked-late")

    publish.broken = False
    other = await stack.replica("ingress-b")
    retries = await asyncio.gather(
        replica.client.post("/v1/completions", json=body),
        other.client.post("/v1/completions", json=body),
    )
    for retry in retries:
        assert retry.status_code == 200, retry.text
        assert retry.json()["choices"][0]["text"] == answer_text("acked-late")
    assert retries[0].json() == retries[1].json()
    assert len(stack.worker.runs_of("acked-late")) == 1
    final = await replica.client.get("/v1/requests/acked-late")
    assert final.json()["status"] == "ok"


async def test_draining_refuses_new_calls(ingress: Replica) -> None:
    ingress.admission.stop_accepting()
    response = await ingress.client.post("/v1/completions", json=completion_body())
    assert_error(response, 503, param=None, names="draining")
    assert response.headers["Retry-After"] == "1"
    health = await ingress.client.get("/healthz")
    assert health.status_code == 503
    assert health.json()["status"] == "draining"


# -- several replicas ----------------------------------------------------------------------


async def test_two_replicas_on_one_bus_each_get_their_own_answers(stack: Stack) -> None:
    a = await stack.replica("ingress-a")
    b = await stack.replica("ingress-b")

    async def call(replica: Replica, n: int) -> tuple[str, httpx.Response]:
        request_id = f"{replica.instance_id}-{n}"
        body = completion_body(switchyard={"request_id": request_id})
        return request_id, await replica.client.post("/v1/completions", json=body)

    results = await asyncio.gather(*(call(r, n) for r in (a, b) for n in range(5)))
    for request_id, response in results:
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["text"] == answer_text(request_id)
        [request] = stack.worker.requests_with_id(request_id)
        assert request.reply_to == request_id.rsplit("-", 1)[0]
        replica = a if request.reply_to == a.instance_id else b
        assert request.reply_partition == replica.answers.reply_partition
    # Each replica reads a partition of its own: answers go to the replica that asked.
    assert a.answers.reply_partition != b.answers.reply_partition

    streams = await asyncio.gather(
        _stream(a.client, "/v1/completions", completion_body()),
        _stream(b.client, "/v1/completions", completion_body()),
    )
    for response in streams:
        events = sse_events(response.text)
        request_id = events[-2]["switchyard"]["request_id"]
        assert [e["choices"][0]["text"] for e in events[:-2]] == _pieces(request_id)
    assert len(a.answers) == len(b.answers) == 0


# -- bad input -----------------------------------------------------------------------------


async def test_invalid_json_is_a_400(ingress: Replica) -> None:
    response = await ingress.client.post(
        "/v1/completions",
        content=b'{"model": "chat",',
        headers={"content-type": "application/json"},
    )
    error = assert_error(response, 400, param=None, names="not valid JSON")
    assert error["code"] == "invalid_json"


async def test_empty_body_is_a_400(ingress: Replica) -> None:
    response = await ingress.client.post(
        "/v1/completions", content=b"", headers={"content-type": "application/json"}
    )
    assert_error(response, 400, param=None, names="empty")


async def test_a_body_that_is_not_an_object_is_a_400(ingress: Replica) -> None:
    response = await ingress.client.post("/v1/completions", json=["chat"])
    assert_error(response, 400, param=None, names="JSON object")


async def test_a_list_of_prompts_is_a_400_naming_prompt(ingress: Replica) -> None:
    response = await ingress.client.post(
        "/v1/completions", json=completion_body(prompt=["one", "two"])
    )
    error = assert_error(response, 400, param="prompt")
    assert "list" in error["message"]


async def test_missing_model_is_a_400(ingress: Replica) -> None:
    body = completion_body()
    del body["model"]
    error = assert_error(
        await ingress.client.post("/v1/completions", json=body), 400, param="model"
    )
    assert error["code"] == "missing_field"


async def test_missing_prompt_is_a_400(ingress: Replica) -> None:
    body = completion_body()
    del body["prompt"]
    response = await ingress.client.post("/v1/completions", json=body)
    error = assert_error(response, 400, param="prompt")
    assert error["code"] == "missing_field"


@pytest.mark.parametrize("max_tokens", [0, -1])
async def test_zero_or_negative_max_tokens_is_a_400(ingress: Replica, max_tokens: int) -> None:
    response = await ingress.client.post(
        "/v1/completions", json=completion_body(max_tokens=max_tokens)
    )
    assert_error(response, 400, param="max_tokens")


@pytest.mark.parametrize("value", ["16", 1.5, True])
async def test_max_tokens_of_the_wrong_type_is_a_400(ingress: Replica, value: object) -> None:
    response = await ingress.client.post("/v1/completions", json=completion_body(max_tokens=value))
    assert_error(response, 400, param="max_tokens")


async def test_max_tokens_above_the_models_limit_is_a_400(ingress: Replica) -> None:
    response = await ingress.client.post(
        "/v1/completions", json=completion_body(max_tokens=CHAT_MAX_OUTPUT + 1)
    )
    error = assert_error(response, 400, param="max_tokens")
    assert str(CHAT_MAX_OUTPUT) in error["message"]


async def test_a_prompt_too_long_is_a_400(ingress: Replica) -> None:
    prompt = "x" * (CHAT_MAX_PROMPT * 4 + 1)
    response = await ingress.client.post("/v1/completions", json=completion_body(prompt=prompt))
    error = assert_error(response, 400, param="prompt")
    assert error["code"] == "context_length_exceeded"


async def test_prompt_tokens_above_the_limit_is_a_400(ingress: Replica) -> None:
    body = completion_body(switchyard={"prompt_tokens": CHAT_MAX_PROMPT + 1})
    response = await ingress.client.post("/v1/completions", json=body)
    assert_error(response, 400, param="switchyard.prompt_tokens")


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("prompt_tokens", 0),
        ("prompt_tokens", -3),
        ("output_tokens_hint", 0),
        ("deadline_ms", 0),
        ("deadline_ms", -5),
        ("deadline_ms", "100"),
        ("priority", 1001),
        ("priority", -1),
        ("workload", "poetry"),
        ("request_id", "has space"),
        ("request_id", ""),
    ],
)
async def test_bad_switchyard_options_are_400s(
    ingress: Replica, option: str, value: object
) -> None:
    body = completion_body(switchyard={option: value})
    response = await ingress.client.post("/v1/completions", json=body)
    assert_error(response, 400, param=f"switchyard.{option}")


async def test_an_unknown_switchyard_option_is_a_400(ingress: Replica) -> None:
    body = completion_body(switchyard={"deadline": 100})
    error = assert_error(
        await ingress.client.post("/v1/completions", json=body), 400, param="switchyard.deadline"
    )
    assert error["code"] == "unknown_field"


@pytest.mark.parametrize("value", ["abc", "-1", "0", "nan", "inf", ""])
async def test_a_bad_deadline_header_is_a_400(ingress: Replica, value: str) -> None:
    response = await ingress.client.post(
        "/v1/completions", json=completion_body(), headers={"X-Switchyard-Deadline-Ms": value}
    )
    assert_error(response, 400, param="X-Switchyard-Deadline-Ms")


@pytest.mark.parametrize("value", ["high", "-1", "1001", "1.5"])
async def test_a_bad_priority_header_is_a_400(ingress: Replica, value: str) -> None:
    response = await ingress.client.post(
        "/v1/completions", json=completion_body(), headers={"X-Switchyard-Priority": value}
    )
    assert_error(response, 400, param="X-Switchyard-Priority")


async def test_stream_of_the_wrong_type_is_a_400(ingress: Replica) -> None:
    response = await ingress.client.post("/v1/completions", json=completion_body(stream="yes"))
    assert_error(response, 400, param="stream")


async def test_an_unknown_model_is_a_404_listing_the_served_ones(ingress: Replica) -> None:
    response = await ingress.client.post("/v1/completions", json=completion_body(model="gpt-9"))
    error = assert_error(response, 404, param="model", names="unknown model 'gpt-9'")
    assert "served models: chat, coder" in error["message"]
    assert error["code"] == "model_not_found"


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([], "messages"),
        ("hello", "messages"),
        ([{"role": "wizard", "content": "hi"}], "messages[0].role"),
        ([{"role": "user", "content": 5}], "messages[0].content"),
        ([{"role": "user", "content": "a"}, {"content": "b"}], "messages[1].role"),
    ],
)
async def test_bad_chat_messages_are_400s(ingress: Replica, messages: object, param: str) -> None:
    body = {"model": "chat", "messages": messages}
    response = await ingress.client.post("/v1/chat/completions", json=body)
    assert_error(response, 400, param=param)


async def test_missing_chat_messages_is_a_400(ingress: Replica) -> None:
    response = await ingress.client.post("/v1/chat/completions", json={"model": "chat"})
    assert_error(response, 400, param="messages")


async def test_an_unknown_app_is_a_404(ingress: Replica) -> None:
    response = await ingress.client.post("/v1/apps/beer/infer", json={"features": features()})
    error = assert_error(response, 404, param="app", names="unknown application 'beer'")
    assert "wine" in error["message"]


@pytest.mark.parametrize("count", [WINE_FEATURES - 1, WINE_FEATURES + 1])
async def test_the_wrong_feature_count_is_a_400(ingress: Replica, count: int) -> None:
    response = await ingress.client.post("/v1/apps/wine/infer", json={"features": [0.0] * count})
    error = assert_error(response, 400, param="features")
    assert f"takes exactly {WINE_FEATURES}" in error["message"]


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
async def test_non_finite_features_are_400s(ingress: Replica, literal: str) -> None:
    values = ["0.5"] * WINE_FEATURES
    values[3] = literal
    raw = '{"features": [' + ", ".join(values) + "]}"
    response = await ingress.client.post(
        "/v1/apps/wine/infer", content=raw.encode(), headers={"content-type": "application/json"}
    )
    error = assert_error(response, 400, param="features[3]")
    assert "finite" in error["message"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "features"),
        ({"features": "0.5"}, "features"),
        ({"features": [True] * WINE_FEATURES}, "features[0]"),
        ({"features": ["0.5"] * WINE_FEATURES}, "features[0]"),
        ({"features": features(), "deadline_ms": 0}, "deadline_ms"),
        ({"features": features(), "priority": 5000}, "priority"),
    ],
)
async def test_bad_infer_bodies_are_400s(
    ingress: Replica, body: dict[str, Any], param: str
) -> None:
    response = await ingress.client.post("/v1/apps/wine/infer", json=body)
    assert_error(response, 400, param=param)


async def test_a_body_over_the_limit_is_a_413(stack: Stack) -> None:
    replica = await stack.replica(options=ApiOptions(max_body_bytes=1024))
    big = completion_body(prompt="x" * 2000)
    response = await replica.client.post("/v1/completions", json=big)
    error = assert_error(response, 413, param=None, names="1024 bytes")
    assert error["code"] == "body_too_large"


async def test_a_body_over_the_limit_without_content_length_is_a_413(stack: Stack) -> None:
    replica = await stack.replica(options=ApiOptions(max_body_bytes=1024))
    sent: list[int] = []

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"model": "chat", "prompt": "'
        for _ in range(100):  # 100 KiB, far past the limit: reading must stop early
            sent.append(1)
            yield b"x" * 1024
        yield b'"}'

    response = await replica.client.post(
        "/v1/completions", content=chunks(), headers={"content-type": "application/json"}
    )
    assert "content-length" not in response.request.headers
    assert_error(response, 413, param=None, names="1024 bytes")


async def test_a_non_json_content_type_is_a_415(ingress: Replica) -> None:
    response = await ingress.client.post(
        "/v1/completions",
        content=json.dumps(completion_body()).encode(),
        headers={"content-type": "text/plain"},
    )
    error = assert_error(response, 415, param="Content-Type", names="text/plain")
    assert error["code"] == "unsupported_media_type"


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/v1/completions"), ("POST", "/v1/models"), ("DELETE", "/v1/apps/wine/infer")],
)
async def test_the_wrong_method_is_a_405(ingress: Replica, method: str, path: str) -> None:
    response = await ingress.client.request(method, path)
    error = assert_error(response, 405, param=None, names=method)
    assert error["code"] == "method_not_allowed"


async def test_an_unknown_path_is_a_404_in_the_error_shape(ingress: Replica) -> None:
    response = await ingress.client.get("/v2/nothing")
    assert_error(response, 404, param=None, names="/v2/nothing")


# -- catalogue, OpenAPI, health --------------------------------------------------------------


async def test_models_lists_the_llm_applications(ingress: Replica) -> None:
    response = await ingress.client.get("/v1/models")
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == ["chat", "coder"]
    chat = body["data"][0]
    assert chat["object"] == "model"
    assert chat["owned_by"] == "switchyard"
    assert chat["switchyard"]["max_prompt_tokens"] == CHAT_MAX_PROMPT
    assert chat["switchyard"]["served_model"] == "llama-2-7b"


async def test_apps_lists_the_classification_applications(ingress: Replica) -> None:
    response = await ingress.client.get("/v1/apps")
    assert response.status_code == 200
    assert response.json()["data"] == [
        {
            "name": "wine",
            "feature_dim": WINE_FEATURES,
            "classes": ["class_0", "class_1", "class_2"],
            "deadline_ms": 150.0,
            "variants": ["mlp-small"],
        }
    ]


async def test_openapi_describes_every_endpoint(ingress: Replica) -> None:
    response = await ingress.client.get("/openapi.json")
    assert response.status_code == 200
    document = response.json()
    assert document["openapi"] == "3.1.0"
    assert set(document["paths"]) == {
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/apps/{app}/infer",
        "/v1/requests/{request_id}",
        "/v1/models",
        "/v1/apps",
        "/openapi.json",
        "/healthz",
    }
    schemas = document["components"]["schemas"]
    assert {"CompletionBody", "ChatBody", "InferBody", "SwitchyardOptions", "Error"} <= set(schemas)
    assert "deadline_ms" in schemas["SwitchyardOptions"]["properties"]

    def refs(node: object) -> Iterator[str]:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "$ref":
                    yield value
                else:
                    yield from refs(value)
        elif isinstance(node, list):
            for item in node:
                yield from refs(item)

    for ref in refs(document):  # every reference resolves
        assert ref.removeprefix("#/components/schemas/") in schemas, ref


async def test_healthz(ingress: Replica) -> None:
    response = await ingress.client.get("/healthz")
    assert response.status_code == 200
    assert response.json()["status"] == "ok"


async def test_the_state_store_being_down_is_a_503(stack: Stack) -> None:
    replica = await stack.replica()

    async def refuse(*args: object, **kwargs: object) -> bool:
        raise ConnectionError("state store unreachable")

    with contextlib.ExitStack() as patches:
        monkeypatch = pytest.MonkeyPatch()
        patches.callback(monkeypatch.undo)
        # Reading a record (a retry's look-up, a status) and every ledger transition.
        monkeypatch.setattr(stack.state, "hgetall", refuse)
        monkeypatch.setattr(stack.state, "run_script", refuse)
        monkeypatch.setattr(stack.state, "run_script_many", refuse)
        for body in (completion_body(), completion_body(switchyard={"request_id": "x-1"})):
            response = await replica.client.post("/v1/completions", json=body)
            assert_error(response, 503, param=None, names="unreachable")
            assert response.headers["Retry-After"] == "1"
        status = await replica.client.get("/v1/requests/x-1")
        assert_error(status, 503, param=None, names="unreachable")
    # Nothing was published: nothing was recorded.
    assert stack.worker.seen == []
    assert len(replica.answers) == 0
