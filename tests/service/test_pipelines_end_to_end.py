"""Pipelines end to end on the embedded stack (in-memory bus and state): the placement
service loads the models on two emulated-models workers that start empty, the scheduler
routes every stage, and each call is answered once with every stage in its one trace
(ingress -> scheduler -> worker -> ingress, per stage)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from switchyard.config import load_settings
from switchyard.contracts.messages import PlacedState
from switchyard.multimodel.branching import label_at, unit_of
from switchyard.serving.pipelines import DEFAULT_PIPELINE_MODELS
from switchyard.telemetry import configure_telemetry

from services.embedded import EmbeddedPlan, EmbeddedStack
from services.worker.service import WorkerService

CALLS = 24


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
        placement_update_hz=4.0,
    )
    spans = InMemorySpanExporter()
    telemetry = configure_telemetry(
        "switchyard-embedded", settings, span_exporter=spans, install_global=False
    )
    plan = EmbeddedPlan(llm_workers=(), torch_workers=0, model_workers=2, http_port=0)
    stack = EmbeddedStack(settings, plan, telemetry=telemetry)
    await stack.start()
    try:
        yield _Traced(stack, spans)
    finally:
        assert await stack.stop() == 0
        telemetry.shutdown()


pytestmark = pytest.mark.asyncio(loop_scope="module")


def _group(span: ReadableSpan) -> str:
    return str((span.attributes or {}).get("messaging.consumer.group.name", ""))


async def _call_at_once(
    stack: EmbeddedStack, pipeline: str, prompt: str, prefix: str, calls: int
) -> list[httpx.Response]:
    """``calls`` calls of ``pipeline`` at once, ids ``{prefix}-{i}``."""
    async with httpx.AsyncClient(base_url=stack.url, timeout=60.0) as client:
        return await asyncio.gather(
            *(
                client.post(
                    f"/v1/apps/{pipeline}/infer",
                    json={"input": f"{prompt}, take {i}", "request_id": f"{prefix}-{i}"},
                )
                for i in range(calls)
            )
        )


def _models_workers(stack: EmbeddedStack) -> list[WorkerService]:
    return [w for w in stack.workers() if isinstance(w, WorkerService)]


async def test_concurrent_calls_are_each_answered_once_with_every_stage_on_a_placed_model(
    traced: _Traced,
) -> None:
    stack = traced.stack
    # Nothing is placed before the first calls: placement follows the demand.
    assert all(not w.heartbeat().placed for w in _models_workers(stack))
    answers = await _call_at_once(stack, "txt2img-hd", "a lighthouse", "hd", CALLS)
    bodies = []
    for answer in answers:
        assert answer.status_code == 200, answer.text
        bodies.append(answer.json())
    assert len({b["id"] for b in bodies}) == CALLS
    for body in bodies:
        stages = {s["stage"]: s for s in body["stages"]}
        assert set(stages) == {"encode", "generate", "upscale", "check"}
        assert all(s["status"] == "ok" and s["emulated"] for s in stages.values())
        # DAG order: a stage starts only after the stage it follows finished.
        assert stages["generate"]["started_s"] >= stages["encode"]["finished_s"]
        for last in ("upscale", "check"):
            assert stages[last]["started_s"] >= stages["generate"]["finished_s"]
        assert set(body["output"]) == {"upscale", "check"}
        assert "generate" in body["output"]["upscale"]  # the intermediate result travelled
    # Every stage ran where placement put its model, and both workers took part.
    placed = {
        w.worker_id: {p.model for p in w.heartbeat().placed if p.state is PlacedState.READY}
        for w in _models_workers(stack)
    }
    used = set()
    for body in bodies:
        for stage in body["stages"]:
            assert stage["model"] in placed[stage["worker_id"]], (stage, placed)
            used.add(stage["worker_id"])
    assert used == set(placed)
    # The first stages waited for their models: the scheduler's span of each says so, and
    # the assignment sent once the model was ready continues that span's trace.
    held = [
        s
        for s in traced.spans.get_finished_spans()
        if s.kind is SpanKind.CONSUMER
        and _group(s) == "scheduler-stages"
        and any(e.name == "held" for e in s.events)
    ]
    assert held
    for span in held:
        sent = [
            s
            for s in traced.spans.get_finished_spans()
            if s.parent is not None
            and s.parent.span_id == span.context.span_id
            and s.name.startswith("switchyard.worker-inbox")
        ]
        assert sent, span.name
    # Each stage is a request of its own in the ledger, final, on the worker that answered.
    first = {s["stage"]: s for s in bodies[0]["stages"]}
    async with httpx.AsyncClient(base_url=stack.url, timeout=10.0) as client:
        record = (await client.get("/v1/requests/hd-0.generate")).json()
    assert record["status"] == "ok", record
    assert record["kind"] == "stage"
    assert record["worker_id"] == first["generate"]["worker_id"]
    assert record["result"]["model"] == "sd15-base"


async def test_a_checked_call_upscales_only_what_the_emulated_checker_labels_safe(
    traced: _Traced,
) -> None:
    stack = traced.stack
    answers = await _call_at_once(stack, "txt2img-checked", "a harbour", "checked", 6)
    shares = DEFAULT_PIPELINE_MODELS["safety-checker"].labels
    labels = []
    for i, answer in enumerate(answers):
        assert answer.status_code == 200, answer.text
        body = answer.json()
        stages = {s["stage"]: s for s in body["stages"]}
        label = stages["check"]["label"]
        # The emulated checker's answer is fixed by the stage's request id.
        assert label == label_at(shares, unit_of(f"checked-{i}.check"))
        labels.append(label)
        if label == "safe":
            assert body["skipped"] == []
            assert set(body["output"]) == {"upscale"}
            assert stages["upscale"]["started_s"] >= stages["check"]["finished_s"]
        else:
            assert body["skipped"] == ["upscale"]
            assert set(body["output"]) == {"check"}
            assert "upscale" not in stages
    assert labels.count("unsafe") == 1  # call 1's: both branches were taken


async def test_one_trace_holds_every_stage_through_the_scheduler_and_a_worker(
    traced: _Traced,
) -> None:
    stack = traced.stack
    # The earlier tests' bursts may still weigh on the admission gate's view: a 429 is
    # retried after its Retry-After, as a client does, under a fresh id.
    async with httpx.AsyncClient(base_url=stack.url, timeout=60.0) as client:
        for attempt in range(5):
            request_id = f"traced-{attempt}"
            answer = await client.post(
                "/v1/apps/txt2img/infer", json={"input": "traced", "request_id": request_id}
            )
            if answer.status_code != 429:
                break
            await asyncio.sleep(float(answer.headers.get("retry-after", "1")))
    assert answer.status_code == 200, answer.text
    server = _server_span(traced.spans, request_id)
    trace_id = server.context.trace_id
    deadline = time.monotonic() + 10.0
    while True:
        found = [s for s in traced.spans.get_finished_spans() if s.context.trace_id == trace_id]
        groups = {_group(s) for s in found if s.kind is SpanKind.CONSUMER}
        workers = {g for g in groups if g.startswith("worker-models-")}
        stage_spans = [s for s in found if s.name.startswith("stage ")]
        if (len(stage_spans) == 3 and "scheduler-stages" in groups and workers) or (
            time.monotonic() > deadline
        ):
            break
        await asyncio.sleep(0.05)
    assert sorted(s.name for s in stage_spans) == [
        "stage check",
        "stage encode",
        "stage generate",
    ]
    for stage in stage_spans:
        assert stage.parent is not None
        assert stage.parent.span_id == server.context.span_id
    # Each stage's request reached the scheduler's stage routing and a worker, in the
    # call's trace.
    consumed = [s for s in found if s.kind is SpanKind.CONSUMER]
    assert sum(_group(s) == "scheduler-stages" for s in consumed) >= 3
    assert sum(_group(s).startswith("worker-models-") for s in consumed) >= 3


def _server_span(spans: InMemorySpanExporter, request_id: str) -> ReadableSpan:
    servers = [
        s
        for s in spans.get_finished_spans()
        if s.kind is SpanKind.SERVER
        and (s.attributes or {}).get("switchyard.request_id") == request_id
    ]
    assert len(servers) == 1
    return servers[0]
