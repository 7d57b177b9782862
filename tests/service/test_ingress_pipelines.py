"""Pipeline calls to the ingress (``POST /v1/apps/{pipeline}/infer``) over the in-memory
bus and state store, with a fake stage worker (``tests/service/pipeline_support.py``)
standing in for the scheduler and an ``emulated-models`` worker.

The catalogue is the default one: ``txt2img`` (encode -> generate -> check) and
``txt2img-hd`` (encode -> generate -> {upscale, check}). A stage's output names its model
and its inputs, so a test sees what was passed along.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, Sum
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from switchyard.config import load_settings
from switchyard.contracts.messages import (
    InferenceRequest,
    StagePayload,
)
from switchyard.serving.pipelines import DEFAULT_PIPELINES
from switchyard.telemetry import configure_telemetry

from services.ingress.api import ApiOptions, build_app
from tests.service.ingress_support import (
    Replica,
    Stack,
    assert_error,
    ingress_fixture,  # noqa: F401 (the ``ingress`` fixture)
    routed_answers,
    stack_fixture,  # noqa: F401 (the ``stack`` fixture)
)
from tests.service.pipeline_support import (
    WORKER_ID,
    StageWorker,
    worker_fixture,  # noqa: F401 (the ``worker`` fixture)
)
from tests.service.pipeline_support import stage_of as _stage
from tests.support.services import eventually


def _requests(worker: StageWorker, call_id: str) -> dict[str, InferenceRequest]:
    return {_stage(r): r for _, r in worker.seen if r.request_id.startswith(f"{call_id}.")}


# -- running a pipeline ------------------------------------------------------------------


async def test_txt2img_runs_its_stages_in_order_passing_outputs_along(
    stack: Stack, worker: StageWorker
) -> None:
    ingress = await stack.replica(options=ApiOptions(answer_timeout_s=5.0, llm_time_scale=10.0))
    response = await ingress.client.post(
        "/v1/apps/txt2img/infer",
        json={"input": "a red fox", "exec_scale": 1.5, "request_id": "fox-1"},
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert response.headers["X-Switchyard-Request-Id"] == "fox-1"
    assert response.headers["X-Switchyard-Emulated"] == "true"
    encoded = "prompt-encoder<input=a red fox>"
    generated = f"sd15-base<encode={encoded}>"
    assert body["id"] == "fox-1"
    assert body["object"] == "pipeline.result"
    assert body["app"] == "txt2img"
    assert body["output"] == {"check": f"safety-checker<generate={generated}>"}
    assert [s["stage"] for s in body["stages"]] == ["encode", "generate", "check"]
    assert [s["model"] for s in body["stages"]] == ["prompt-encoder", "sd15-base", "safety-checker"]
    assert {s["worker_id"] for s in body["stages"]} == {WORKER_ID}
    assert {s["status"] for s in body["stages"]} == {"ok"}
    assert body["emulated"] is True
    # In order: each stage was published only once the one before it had finished.
    assert worker.stages_seen("fox-1") == ["encode", "generate", "check"]
    finish = [s["finished_s"] for s in body["stages"]]
    arrival = [s["arrival_s"] for s in body["stages"]]
    assert finish[0] <= arrival[1]
    assert finish[1] <= arrival[2]
    # Each stage its own request: app the pipeline, the call's scale, the call's deadline
    # (12 model seconds at a time scale of 10), back to this replica.
    requests = _requests(worker, "fox-1")
    for name, request in requests.items():
        assert request.request_id == f"fox-1.{name}"
        assert request.app == "txt2img"
        assert isinstance(request.payload, StagePayload)
        assert request.payload.pipeline == "txt2img"
        assert request.payload.exec_scale == 1.5
        assert request.reply_to == ingress.instance_id
        assert request.reply_partition == ingress.answers.reply_partition
    first = requests["encode"]
    assert first.deadline_s == pytest.approx(first.arrival_s + 1.2)
    assert {r.deadline_s for r in requests.values()} == {first.deadline_s}
    assert body["slo_s"] == pytest.approx(1.2)
    assert body["deadline_s"] == pytest.approx(first.deadline_s)
    assert body["latency_s"] == pytest.approx(finish[2] - first.arrival_s)
    assert body["met_slo"] is True
    assert requests["generate"].payload.inputs == {"encode": encoded}  # type: ignore[union-attr]
    # Each stage's record is there to read, under its own id.
    status = await ingress.client.get("/v1/requests/fox-1.generate")
    assert status.status_code == 200
    assert status.json()["result"]["output"] == generated
    # And the call's own id reads the whole call back, put together from its stages.
    call = await ingress.client.get("/v1/requests/fox-1")
    assert call.status_code == 200, call.text
    assert call.json() == {
        "request_id": "fox-1",
        "app": "txt2img",
        "kind": "pipeline",
        "status": "ok",
        "stages": [
            {
                "stage": s["stage"],
                "model": s["model"],
                "request_id": f"fox-1.{s['stage']}",
                "status": "ok",
                "worker_id": WORKER_ID,
            }
            for s in body["stages"]
        ],
        "output": body["output"],
    }


async def test_txt2img_hd_runs_upscale_and_check_concurrently_after_generate(
    stack: Stack, ingress: Replica, worker: StageWorker
) -> None:
    worker.delay_s.update(upscale=0.3, check=0.3)
    started = time.monotonic()
    response = await ingress.client.post(
        "/v1/apps/txt2img-hd/infer", json={"input": "a lighthouse", "request_id": "hd-1"}
    )
    took_s = time.monotonic() - started
    assert response.status_code == 200, response.text
    body = response.json()
    generated = "sd15-base<encode=prompt-encoder<input=a lighthouse>>"
    assert body["output"] == {
        "upscale": f"upscaler<generate={generated}>",
        "check": f"safety-checker<generate={generated}>",
    }
    assert [s["stage"] for s in body["stages"]] == ["encode", "generate", "upscale", "check"]
    seen = {_stage(r): at for at, r in worker.seen if r.request_id.startswith("hd-1.")}
    # Both were sent before either finished: they ran side by side, not one after another.
    assert max(seen["upscale"], seen["check"]) < min(
        worker.finished["hd-1.upscale"], worker.finished["hd-1.check"]
    )
    assert took_s < 0.55
    # And only after generate had finished.
    assert worker.finished["hd-1.generate"] <= min(seen["upscale"], seen["check"])


@pytest.mark.parametrize(
    ("mode", "answered", "status", "code", "reason"),
    [
        ("fail", "failed", 502, "worker_failed", "model weights corrupt"),
        ("expire", "expired", 504, "deadline_expired", "expired"),
    ],
)
async def test_a_stage_not_served_answers_an_error_naming_it_and_starts_nothing_after(
    ingress: Replica,
    worker: StageWorker,
    mode: str,
    answered: str,
    status: int,
    code: str,
    reason: str,
) -> None:
    getattr(worker, mode).add("generate")
    response = await ingress.client.post(
        "/v1/apps/txt2img-hd/infer", json={"input": "x", "request_id": f"{mode}-1"}
    )
    error = assert_error(response, status, param=None, names="'generate'")
    assert error["code"] == code
    assert "'sd15-base'" in error["message"]
    assert reason in error["message"]
    assert "not started: upscale, check" in error["message"]
    block = response.json()["switchyard"]
    assert block["request_id"] == f"{mode}-1"
    assert (block["stage"], block["model"], block["status"]) == ("generate", "sd15-base", answered)
    assert [s["stage"] for s in block["stages"]] == ["encode", "generate"]
    await asyncio.sleep(0.1)
    assert worker.stages_seen(f"{mode}-1") == ["encode", "generate"]
    # A retry gets the same answer, from the record: nothing runs again.
    again = await ingress.client.post(
        "/v1/apps/txt2img-hd/infer", json={"input": "x", "request_id": f"{mode}-1"}
    )
    assert again.status_code == status
    assert again.json()["error"]["message"] == error["message"]
    assert worker.stages_ran(f"{mode}-1") == ["encode", "generate"]
    # The call's status names the stage; the stages never started have no status.
    call = (await ingress.client.get(f"/v1/requests/{mode}-1")).json()
    assert call["status"] == answered
    assert call["error"].startswith(f"stage 'generate' {answered}: ")
    assert [s["status"] for s in call["stages"]] == ["ok", answered, None, None]
    assert "output" not in call


@pytest.mark.parametrize(("label", "ran"), [("safe", True), ("unsafe", False)])
async def test_a_conditional_stage_runs_only_on_the_label_it_names(
    ingress: Replica, worker: StageWorker, label: str, ran: bool
) -> None:
    """``txt2img-checked`` upscales an image only when the checker labels it safe."""
    worker.labels["check"] = label
    call_id = f"checked-{label}"
    response = await ingress.client.post(
        "/v1/apps/txt2img-checked/infer", json={"input": "a cat", "request_id": call_id}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    generated = "sd15-base<encode=prompt-encoder<input=a cat>>"
    checked = f"safety-checker<generate={generated}>"
    if ran:
        assert worker.stages_ran(call_id) == ["encode", "generate", "check", "upscale"]
        assert body["skipped"] == []
        # The upscaler read both the image and the checker's verdict.
        assert body["output"] == {"upscale": f"upscaler<check={checked};generate={generated}>"}
    else:
        assert worker.stages_ran(call_id) == ["encode", "generate", "check"]
        assert body["skipped"] == ["upscale"]
        assert body["output"] == {"check": checked}
    # Read back, the call says the same.
    status = (await ingress.client.get(f"/v1/requests/{call_id}")).json()
    assert status["status"] == "ok"
    assert status["output"] == body["output"]
    upscale = next(s for s in status["stages"] if s["stage"] == "upscale")
    assert upscale["status"] == ("ok" if ran else "skipped")


async def test_a_call_in_progress_reads_as_running_and_an_unknown_one_is_a_404(
    ingress: Replica, worker: StageWorker
) -> None:
    worker.delay_s.update(generate=0.5)
    call = asyncio.ensure_future(
        ingress.client.post("/v1/apps/txt2img/infer", json={"input": "x", "request_id": "slow-1"})
    )

    async def generating() -> bool:
        return "generate" in worker.stages_seen("slow-1")

    await eventually(generating, timeout_s=5.0)
    status = (await ingress.client.get("/v1/requests/slow-1")).json()
    assert status["status"] == "running"
    assert [s["status"] for s in status["stages"]][::2] == ["ok", None]
    assert (await call).status_code == 200
    assert (await ingress.client.get("/v1/requests/slow-1")).json()["status"] == "ok"
    missing = await ingress.client.get("/v1/requests/no-such-call")
    assert missing.status_code == 404


# -- bad calls ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"features": [0.5]}, "features"),
        ({"input": "x", "deadline_ms": 100}, "deadline_ms"),
        ({"input": 5}, "input"),
        ({"input": "x" * 4097}, "input"),
        ({"exec_scale": 0}, "exec_scale"),
        ({"exec_scale": -1.5}, "exec_scale"),
        ({"exec_scale": "2"}, "exec_scale"),
        ({"exec_scale": 5000}, "exec_scale"),
        ({"request_id": "has space"}, "request_id"),
        ({"request_id": "x" * 129}, "request_id"),
    ],
)
async def test_bad_bodies_get_a_400_naming_the_field(
    ingress: Replica, worker: StageWorker, body: dict[str, Any], param: str
) -> None:
    response = await ingress.client.post("/v1/apps/txt2img/infer", json=body)
    assert_error(response, 400, param=param)
    assert worker.seen == []  # nothing was started


async def test_a_body_that_is_no_object_is_refused(ingress: Replica) -> None:
    response = await ingress.client.post("/v1/apps/txt2img/infer", json=["a"])
    assert_error(response, 400, param=None, names="JSON object")


async def test_an_unknown_app_is_a_404_naming_the_pipelines_too(ingress: Replica) -> None:
    response = await ingress.client.post("/v1/apps/img2txt/infer", json={"input": "x"})
    error = assert_error(response, 404, param="app", names="'img2txt'")
    assert error["code"] == "app_not_found"
    for name in ("wine", "txt2img", "txt2img-hd"):
        assert name in error["message"]


# -- the catalogue -----------------------------------------------------------------------


async def test_apps_lists_the_pipelines_with_their_stages_and_slo(stack: Stack) -> None:
    ingress = await stack.replica(options=ApiOptions(llm_time_scale=4.0))
    response = await ingress.client.get("/v1/apps")
    assert response.status_code == 200
    document = response.json()
    assert [app["name"] for app in document["data"]] == ["wine"]
    pipelines = {p["name"]: p for p in document["pipelines"]}
    assert set(pipelines) == set(DEFAULT_PIPELINES)
    hd = pipelines["txt2img-hd"]
    assert hd["slo_s"] == 30.0
    assert hd["deadline_ms"] == pytest.approx(30.0 / 4.0 * 1000)
    assert hd["stages"] == [
        {"name": "encode", "model": "prompt-encoder", "after": [], "kind": "model"},
        {"name": "generate", "model": "sd15-base", "after": ["encode"], "kind": "model"},
        {"name": "upscale", "model": "upscaler", "after": ["generate"], "kind": "model"},
        {"name": "check", "model": "safety-checker", "after": ["generate"], "kind": "model"},
    ]
    assert hd["models"] == ["prompt-encoder", "sd15-base", "upscaler", "safety-checker"]
    assert hd["llm_applications"] == []
    checked = {s["name"]: s for s in pipelines["txt2img-checked"]["stages"]}
    assert checked["upscale"]["when"] == {"stage": "check", "label": "safe"}


async def test_openapi_documents_the_pipeline_call(ingress: Replica) -> None:
    document = (await ingress.client.get("/openapi.json")).json()
    operation = document["paths"]["/v1/apps/{app}/infer"]["post"]
    assert {"txt2img", "txt2img-hd", "wine"} <= set(operation["parameters"][0]["schema"]["enum"])
    schemas = document["components"]["schemas"]
    assert set(schemas["PipelineBody"]["properties"]) == {"input", "exec_scale", "request_id"}
    assert schemas["PipelineBody"]["additionalProperties"] is False
    answer = operation["responses"]["200"]["content"]["application/json"]["schema"]
    assert {"$ref": "#/components/schemas/PipelineAnswer"} in answer["anyOf"]


# -- tracing -----------------------------------------------------------------------------


def _pipeline_calls(reader: InMemoryMetricReader) -> dict[tuple[Any, ...], int]:
    """``switchyard.ingress.requests`` of kind ``pipeline``: (app, outcome, deadline) ->
    calls."""
    data = reader.get_metrics_data()
    counted: dict[tuple[Any, ...], int] = {}
    for resource in data.resource_metrics if data is not None else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name != "switchyard.ingress.requests" or not isinstance(metric.data, Sum):
                    continue
                for point in metric.data.data_points:
                    attributes = point.attributes or {}
                    if attributes.get("kind") == "pipeline":
                        key = tuple(attributes.get(k) for k in ("app", "outcome", "deadline"))
                        counted[key] = int(point.value)
    return counted


async def test_one_trace_holds_every_stage_of_a_call_counted_as_a_pipeline_call(
    stack: Stack, worker: StageWorker
) -> None:
    spans = InMemorySpanExporter()
    metrics = InMemoryMetricReader()
    telemetry = configure_telemetry(
        "ingress",
        load_settings({}),
        span_exporter=spans,
        metric_reader=metrics,
        install_global=False,
    )
    published_in: dict[str, int] = {}

    async def publish(request: InferenceRequest) -> None:
        published_in[request.request_id] = trace.get_current_span().get_span_context().span_id
        await stack.publish(request)

    answers, routing = await routed_answers(stack.bus, stack.state, "ingress-t", stack.stopping)
    stack.tasks.append(routing)
    app = build_app(
        stack.catalogue,
        publish,
        answers,
        stack.state,
        options=ApiOptions(answer_timeout_s=5.0),
        telemetry=telemetry,
    )
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://ingress"
        ) as client:
            response = await client.post(
                "/v1/apps/txt2img-hd/infer", json={"input": "t", "request_id": "traced-1"}
            )
        assert response.status_code == 200, response.text
        finished = spans.get_finished_spans()
        [server] = [s for s in finished if s.kind is SpanKind.SERVER]
        assert server.attributes is not None
        assert server.attributes["switchyard.app"] == "txt2img-hd"
        stages = {
            str((s.attributes or {})["switchyard.stage"]): s
            for s in finished
            if s.name.startswith("stage ")
        }
        assert set(stages) == {"encode", "generate", "upscale", "check"}
        for name, span in stages.items():
            assert span.context.trace_id == server.context.trace_id
            assert span.parent is not None
            assert span.parent.span_id == server.context.span_id
            assert span.attributes is not None
            assert span.attributes["switchyard.model"] == next(
                s.model for s in DEFAULT_PIPELINES["txt2img-hd"].stages if s.name == name
            )
            # Each stage's request was published inside its span.
            assert published_in[f"traced-1.{name}"] == span.context.span_id
        assert _pipeline_calls(metrics) == {("txt2img-hd", "ok", "met"): 1}
    finally:
        telemetry.shutdown()
