"""One request, one trace: from the HTTP call through the scheduler and the worker and
back to the ingress, on the embedded stack (in-memory bus and state, one emulated LLM
worker, ``SWITCHYARD_LLM_DISPATCH=scheduler`` so that every hop is there); the same
without the scheduler under the default direct dispatch; and the metrics the stack
serves on ``GET /metrics``.

The stack's telemetry is built with an in-memory span exporter, so spans are recorded
without an OTLP endpoint (``configure_telemetry`` samples nothing otherwise).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import httpx
import pytest
import pytest_asyncio
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from switchyard.config import load_settings
from switchyard.contracts.messages import InferenceRequest
from switchyard.policies.base import NoWorkerError
from switchyard.telemetry import configure_telemetry

from services.embedded import EmbeddedPlan, EmbeddedStack
from services.ingress.service import IngressService
from services.scheduler.service import SchedulerService

WAIT_S = 10.0


class _Traced:
    def __init__(self, stack: EmbeddedStack, spans: InMemorySpanExporter) -> None:
        self.stack = stack
        self.spans = spans


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def traced() -> AsyncIterator[_Traced]:
    settings = load_settings(
        {},
        worker_time_scale=50.0,
        log_level="WARNING",
        heartbeat_interval_s=0.2,
        llm_dispatch="scheduler",
    )
    spans = InMemorySpanExporter()
    telemetry = configure_telemetry(
        "switchyard-embedded", settings, span_exporter=spans, install_global=False
    )
    plan = EmbeddedPlan(llm_workers=("a100-80gb/llama-2-7b",), torch_workers=0, http_port=0)
    stack = EmbeddedStack(settings, plan, telemetry=telemetry)
    await stack.start()
    made = _Traced(stack, spans)
    try:
        # The first call may come before the scheduler has seen the worker alive: it then
        # waits, unplaced (a path of its own, tested below); the other tests want the
        # usual path.
        async with httpx.AsyncClient(base_url=stack.url, timeout=60.0) as http:
            first = await http.post(
                "/v1/completions", json={"model": "llama-2-7b", "prompt": "first", "max_tokens": 4}
            )
        assert first.status_code == 200, first.text
        yield made
    finally:
        assert await stack.stop() == 0
        telemetry.shutdown()


@pytest_asyncio.fixture(loop_scope="module")
async def client(traced: _Traced) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=traced.stack.url, timeout=60.0) as http:
        yield http


pytestmark = pytest.mark.asyncio(loop_scope="module")


def _group(span: ReadableSpan) -> str | None:
    value = (span.attributes or {}).get("messaging.consumer.group.name")
    return value if isinstance(value, str) else None


def _topic(span: ReadableSpan) -> str:
    return str((span.attributes or {}).get("messaging.destination.name", ""))


def _message_type(span: ReadableSpan) -> str:
    return str((span.attributes or {}).get("switchyard.message_type", ""))


async def _eventually_spans(
    spans: InMemorySpanExporter,
    trace_id: int,
    done: Callable[[Sequence[ReadableSpan]], bool],
) -> list[ReadableSpan]:
    """The finished spans of ``trace_id`` once ``done`` says all expected are there (a
    consumer's span ends when its handler returned, which may be after the HTTP answer)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        found = [s for s in spans.get_finished_spans() if s.context.trace_id == trace_id]
        if done(found) or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.02)


def _one(
    found: Sequence[ReadableSpan], what: str, test: Callable[[ReadableSpan], bool]
) -> ReadableSpan:
    matching = [s for s in found if test(s)]
    names = sorted(f"{s.name} [{s.kind.name}] group={_group(s)}" for s in found)
    assert matching, f"no {what} span in the trace; it has: {names}"
    return matching[0]


def _path_complete(found: Sequence[ReadableSpan]) -> bool:
    groups = {_group(s) for s in found if s.kind is SpanKind.CONSUMER}
    return {"scheduler", "worker-llm-0", "ingress-ingress-0"} <= groups


def _check_the_request_path(found: Sequence[ReadableSpan], route: str) -> ReadableSpan:
    """Every hop of one request is in ``found`` and each is the child of the one before."""
    server = _one(found, "ingress SERVER", lambda s: s.kind is SpanKind.SERVER)
    assert server.name == f"POST {route}"
    assert server.attributes is not None
    assert server.attributes["http.request.method"] == "POST"
    assert server.attributes["http.route"] == route
    assert server.attributes["http.response.status_code"] == 200
    assert server.attributes["switchyard.app"] == "llama-2-7b"
    assert server.attributes["switchyard.outcome"] == "ok"

    def child_of(parent: ReadableSpan) -> Callable[[ReadableSpan], bool]:
        return lambda s: s.parent is not None and s.parent.span_id == parent.context.span_id

    request_sent = _one(
        found,
        "request PRODUCER",
        lambda s: (
            s.kind is SpanKind.PRODUCER and _topic(s).endswith("requests") and child_of(server)(s)
        ),
    )
    scheduled = _one(
        found,
        "scheduler CONSUMER",
        lambda s: (
            _group(s) == "scheduler"
            and _topic(s).endswith("requests")
            and child_of(request_sent)(s)
        ),
    )
    assigned = _one(
        found,
        "assignment PRODUCER",
        lambda s: (
            s.kind is SpanKind.PRODUCER
            and _topic(s).endswith("worker-inbox")
            and child_of(scheduled)(s)
        ),
    )
    taken = _one(
        found,
        "worker CONSUMER",
        lambda s: _group(s) == "worker-llm-0" and child_of(assigned)(s),
    )
    executed = _one(
        found,
        "worker execution",
        lambda s: s.name == "execute llama-2-7b" and child_of(taken)(s),
    )
    completed = _one(
        found,
        "completion PRODUCER",
        lambda s: (
            s.kind is SpanKind.PRODUCER
            and _topic(s).endswith("answers")
            and _message_type(s) == "completion"
            and child_of(executed)(s)
        ),
    )
    _one(
        found,
        "ingress answer CONSUMER",
        lambda s: _group(s) == "ingress-ingress-0" and child_of(completed)(s),
    )
    return server


def _trace_of_request(spans: InMemorySpanExporter, request_id: str) -> int:
    servers = [
        s
        for s in spans.get_finished_spans()
        if s.kind is SpanKind.SERVER
        and (s.attributes or {}).get("switchyard.request_id") == request_id
    ]
    assert len(servers) == 1
    return int(servers[0].context.trace_id)


async def test_a_call_that_waited_unplaced_keeps_its_trace(
    traced: _Traced, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request no worker could take at first is assigned on a later cluster refresh,
    outside its batch's CONSUMER span: it still continues the call's trace."""
    scheduler = traced.stack.service("scheduler")
    assert isinstance(scheduler, SchedulerService)
    place = scheduler.placer.place
    refused: list[str] = []

    def refuse_once(request: InferenceRequest, *args: Any, **kwargs: Any) -> Any:
        if not refused:
            refused.append(request.request_id)
            raise NoWorkerError("no worker yet (test)")
        return place(request, *args, **kwargs)

    monkeypatch.setattr(scheduler.placer, "place", refuse_once)
    trace_id = 0x5B8EFFF798038103D269B633813FC60C
    answer = await client.post(
        "/v1/completions",
        json={"model": "llama-2-7b", "prompt": "wait for me", "max_tokens": 4},
        headers={"traceparent": f"00-{trace_id:032x}-eee19b7ec3c1b174-01"},
    )
    assert answer.status_code == 200, answer.text
    assert refused == [answer.json()["switchyard"]["request_id"]]
    found = await _eventually_spans(
        traced.spans,
        trace_id,
        lambda spans: {"worker-llm-0", "ingress-ingress-0"} <= {_group(s) for s in spans},
    )
    request_sent = _one(
        found,
        "request PRODUCER",
        lambda s: s.kind is SpanKind.PRODUCER and _topic(s).endswith("requests"),
    )
    # Published from the retry, in the request's kept context: a child of its PRODUCER.
    assigned = _one(
        found,
        "assignment PRODUCER",
        lambda s: s.kind is SpanKind.PRODUCER and _topic(s).endswith("worker-inbox"),
    )
    assert assigned.parent is not None
    assert assigned.parent.span_id == request_sent.context.span_id
    _one(found, "worker CONSUMER", lambda s: _group(s) == "worker-llm-0")
    _one(found, "ingress answer CONSUMER", lambda s: _group(s) == "ingress-ingress-0")


async def test_one_http_call_is_one_trace_through_scheduler_and_worker_and_back(
    traced: _Traced, client: httpx.AsyncClient
) -> None:
    answer = await client.post(
        "/v1/completions",
        json={"model": "llama-2-7b", "prompt": "Tell me about trains", "max_tokens": 16},
    )
    assert answer.status_code == 200, answer.text
    trace_id = _trace_of_request(traced.spans, answer.json()["switchyard"]["request_id"])
    found = await _eventually_spans(traced.spans, trace_id, _path_complete)
    _check_the_request_path(found, "/v1/completions")
    # Three hops read the request and nothing else does: the predictor learns from
    # batched observations and the monitor from heartbeats, outside the request's path.
    consumers = {_group(s) for s in found if s.kind is SpanKind.CONSUMER}
    assert consumers == {"scheduler", "worker-llm-0", "ingress-ingress-0"}


async def test_an_incoming_traceparent_is_the_parent_of_the_call(
    traced: _Traced, client: httpx.AsyncClient
) -> None:
    trace_id = 0x4BF92F3577B34DA6A3CE929D0E0E4736
    parent_id = 0x00F067AA0BA902B7
    answer = await client.post(
        "/v1/chat/completions",
        json={
            "model": "llama-2-7b",
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 8,
        },
        headers={"traceparent": f"00-{trace_id:032x}-{parent_id:016x}-01"},
    )
    assert answer.status_code == 200, answer.text
    found = await _eventually_spans(traced.spans, trace_id, _path_complete)
    server = _check_the_request_path(found, "/v1/chat/completions")
    assert server.parent is not None
    assert server.parent.span_id == parent_id
    assert server.parent.is_remote


async def test_a_streamed_answer_continues_the_trace_through_its_chunks(
    traced: _Traced, client: httpx.AsyncClient
) -> None:
    trace_id = 0x0AF7651916CD43DD8448EB211C80319C
    async with client.stream(
        "POST",
        "/v1/completions",
        json={"model": "llama-2-7b", "prompt": "stream", "max_tokens": 12, "stream": True},
        headers={"traceparent": f"00-{trace_id:032x}-b7ad6b7169203331-01"},
    ) as answer:
        assert answer.status_code == 200
        body = (await answer.aread()).decode()
    assert body.rstrip().endswith("data: [DONE]")
    found = await _eventually_spans(
        traced.spans,
        trace_id,
        lambda spans: (
            any(_message_type(s) == "output-chunk" for s in spans) and _path_complete(spans)
        ),
    )
    chunk_spans = [
        s for s in found if s.kind is SpanKind.PRODUCER and _message_type(s) == "output-chunk"
    ]
    assert chunk_spans, "no output chunk was published in the request's trace"


async def test_the_metrics_of_the_whole_process_count_calls_but_not_on_the_api_port(
    traced: _Traced, client: httpx.AsyncClient
) -> None:
    ok = await client.post(
        "/v1/completions", json={"model": "llama-2-7b", "prompt": "count me", "max_tokens": 4}
    )
    assert ok.status_code == 200, ok.text
    unknown = await client.post("/v1/completions", json={"model": "no-such", "prompt": "x"})
    assert unknown.status_code == 404
    # Clients of the API do not see the metrics; the health port serves them.
    assert (await client.get("/metrics")).status_code == 404
    lines = traced.stack.metrics().splitlines()
    names = {line.split("{")[0].split(" ")[0] for line in lines if not line.startswith("#")}
    ok_line = (
        'switchyard_ingress_requests_total{app="llama-2-7b",deadline="met",kind="llm",'
        'outcome="ok",status_class="2xx"}'
    )
    assert any(line.startswith(ok_line) for line in lines), [
        line for line in lines if "ingress_requests" in line
    ]
    refused = (
        'switchyard_ingress_requests_total{app="unknown",deadline="none",kind="llm",'
        'outcome="bad_request",status_class="4xx"} 1.0'
    )
    assert refused in lines
    # Answers judged by their application's token objectives (met, unloaded).
    judged = 'switchyard_ingress_token_slo_total{app="llama-2-7b",verdict="met"}'
    assert any(line.startswith(judged) for line in lines), lines
    assert 'switchyard_ingress_in_flight{kind="llm"} 0.0' in lines
    assert 'switchyard_monitor_workers{status="alive"} 1.0' in lines
    assert any(
        line.startswith('switchyard_worker_queue_length{emulated="true",worker_id="llm-0"}')
        for line in lines
    )
    for expected in (
        "switchyard_ingress_latency_seconds_bucket",
        "switchyard_ingress_ttft_seconds_bucket",
        "switchyard_ingress_tpot_seconds_bucket",
        "switchyard_scheduler_decisions_total",
        "switchyard_scheduler_decision_latency_seconds_count",
        "switchyard_scheduler_unplaced",
        "switchyard_worker_running",
        "switchyard_worker_batch_size_bucket",
        "switchyard_worker_execution_duration_seconds_count",
        "switchyard_worker_completions_total",
        "switchyard_worker_model_swaps_total",
        "switchyard_predictor_model_version_ratio",
        "switchyard_monitor_heartbeats_total",
        "switchyard_bus_records_total",
        "switchyard_bus_published_total",
        "switchyard_bus_handler_duration_seconds_count",
    ):
        assert expected in names, f"{expected} missing from /metrics"
    decisions = [line for line in lines if line.startswith("switchyard_scheduler_decisions_total")]
    assert any('kind="llm"' in line for line in decisions)


async def test_under_direct_dispatch_one_call_is_one_trace_through_the_worker_and_back() -> None:
    """The default path: the ingress sends the assignment itself, inside the call's
    SERVER span; the worker's CONSUMER and execution, its answer and the ingress's
    CONSUMER continue the same trace."""
    settings = load_settings(
        {}, worker_time_scale=50.0, log_level="WARNING", heartbeat_interval_s=0.2
    )
    assert settings.llm_dispatch == "direct"
    spans = InMemorySpanExporter()
    telemetry = configure_telemetry(
        "switchyard-embedded", settings, span_exporter=spans, install_global=False
    )
    plan = EmbeddedPlan(llm_workers=("a100-80gb/llama-2-7b",), torch_workers=0, http_port=0)
    stack = EmbeddedStack(settings, plan, telemetry=telemetry)
    await stack.start()
    try:
        async with httpx.AsyncClient(base_url=stack.url, timeout=60.0) as http:
            # A call before the ingress has read the worker's heartbeat goes to the
            # scheduler (no worker known yet, a path of its own): wait for the read.
            ingress = stack.service("ingress")
            assert isinstance(ingress, IngressService)
            assert ingress.dispatcher is not None
            deadline = time.monotonic() + WAIT_S
            while ingress.dispatcher.placer.inbox_partition("llm-0") is None:
                assert time.monotonic() < deadline, "the ingress never saw the worker"
                await asyncio.sleep(0.02)
            body = {"model": "llama-2-7b", "prompt": "hi", "max_tokens": 4}
            answer = await http.post("/v1/completions", json=body)
        assert answer.status_code == 200, answer.text
        trace_id = _trace_of_request(spans, answer.json()["switchyard"]["request_id"])
        found = await _eventually_spans(
            spans,
            trace_id,
            lambda got: {"worker-llm-0", "ingress-ingress-0"} <= {_group(s) for s in got},
        )
    finally:
        assert await stack.stop() == 0
        telemetry.shutdown()
    server = _one(found, "ingress SERVER", lambda s: s.kind is SpanKind.SERVER)
    assigned = _one(
        found,
        "assignment PRODUCER",
        lambda s: s.kind is SpanKind.PRODUCER and _topic(s).endswith("worker-inbox"),
    )
    assert assigned.parent is not None
    assert assigned.parent.span_id == server.context.span_id
    taken = _one(found, "worker CONSUMER", lambda s: _group(s) == "worker-llm-0")
    assert taken.parent is not None
    assert taken.parent.span_id == assigned.context.span_id
    _one(found, "ingress answer CONSUMER", lambda s: _group(s) == "ingress-ingress-0")
    consumers = {_group(s) for s in found if s.kind is SpanKind.CONSUMER}
    assert consumers == {"worker-llm-0", "ingress-ingress-0"}, "no scheduler on the path"
