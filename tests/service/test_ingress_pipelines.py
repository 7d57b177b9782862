"""Pipeline calls to the ingress (``POST /v1/apps/{pipeline}/infer``) over the in-memory
bus and state store, with a fake stage worker (``tests/service/pipeline_support.py``)
standing in for the scheduler and an ``emulated-models`` worker.

The catalogue is the default one: ``txt2img`` (encode -> generate -> check) and
``txt2img-hd`` (encode -> generate -> {upscale, check}). A stage's output names its model
and its inputs, so a test sees what was passed along.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, Sum
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from starlette.types import Message
from switchyard.cluster import ClusterView, WorkerRecord, WorkerStatus
from switchyard.config import load_settings
from switchyard.contracts.messages import (
    Heartbeat,
    InferenceRequest,
    PlacedModel,
    PlacedState,
    StagePayload,
)
from switchyard.errors import StateError
from switchyard.lifecycle import RequestLedger
from switchyard.serving.pipelines import DEFAULT_PIPELINES
from switchyard.telemetry import configure_telemetry

from services.ingress.api import ApiOptions, build_app
from services.ingress.pipeline_admission import PipelineGate
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


# -- retries -----------------------------------------------------------------------------


async def test_a_retry_runs_no_stage_twice(ingress: Replica, worker: StageWorker) -> None:
    worker.delay_s.update(generate=0.2)
    body = {"input": "a boat", "request_id": "boat-1"}
    # Two calls at once with one id (a client retrying early), then one after.
    first, second = await asyncio.gather(
        ingress.client.post("/v1/apps/txt2img/infer", json=body),
        ingress.client.post("/v1/apps/txt2img/infer", json=body),
    )
    third = await ingress.client.post("/v1/apps/txt2img/infer", json=body)
    for response in (first, second, third):
        assert response.status_code == 200, response.text
    assert first.json() == second.json() == third.json()
    assert worker.stages_ran("boat-1") == ["encode", "generate", "check"]


async def test_a_retry_asking_something_else_is_a_409(
    ingress: Replica, worker: StageWorker
) -> None:
    done = await ingress.client.post(
        "/v1/apps/txt2img/infer", json={"input": "one", "request_id": "reused-1"}
    )
    assert done.status_code == 200, done.text
    other = await ingress.client.post(
        "/v1/apps/txt2img/infer", json={"input": "two", "request_id": "reused-1"}
    )
    error = assert_error(other, 409, param="request_id", names="'reused-1'")
    assert error["code"] == "request_id_reused"


async def test_a_stage_not_recorded_after_others_were_is_outcome_unknown_and_resumes(
    stack: Stack, ingress: Replica, worker: StageWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The store fails once as generate is recorded: encode has run already, so the call
    # was started, and "nothing was started" (a plain 503) would be untrue.
    real = stack.state.run_script_many
    failures = [StateError("Redis at redis://store is unreachable")]

    async def flaky(script: Any, calls: Any) -> Any:
        if failures and any(keys[0].endswith("down-1.generate") for keys, _ in calls):
            raise failures.pop()
        return await real(script, calls)

    monkeypatch.setattr(stack.state, "run_script_many", flaky)
    body = {"input": "a storm", "request_id": "down-1"}
    first = await ingress.client.post("/v1/apps/txt2img/infer", json=body)
    error = assert_error(first, 503, param=None, names="'down-1'")
    assert error["code"] == "outcome_unknown"
    assert "was started" in error["message"]
    assert "'generate'" in error["message"]
    assert worker.stages_ran("down-1") == ["encode"]
    retried = await ingress.client.post("/v1/apps/txt2img/infer", json=body)
    assert retried.status_code == 200, retried.text
    assert worker.stages_ran("down-1") == ["encode", "generate", "check"]


async def test_a_refused_call_whose_earlier_record_cannot_be_read_is_a_503(
    stack: Stack, worker: StageWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The gate refuses; looking for an accepted call of the same id fails with the store.
    busy = await stack.replica(
        options=ApiOptions(answer_timeout_s=5.0, llm_time_scale=10.0),
        pipeline_gate=_pipeline_gate(stack, upscales_queued=20),
    )

    async def unreachable(key: str) -> dict[str, str]:
        raise StateError(f"hgetall {key!r} failed: Redis is unreachable")

    monkeypatch.setattr(stack.state, "hgetall", unreachable)
    refused = await busy.client.post(
        "/v1/apps/txt2img-hd/infer", json={"input": "a red fox", "request_id": "dark-1"}
    )
    error = assert_error(refused, 503, param=None, names="state store is unavailable")
    assert error["code"] == "unavailable"
    assert worker.stages_seen("dark-1") == []


async def test_a_call_timed_out_resumes_on_retry(stack: Stack, worker: StageWorker) -> None:
    ingress = await stack.replica(options=ApiOptions(answer_timeout_s=0.3))
    worker.hold.add("generate")
    body = {"input": "slow", "request_id": "slow-1"}
    timed_out = await ingress.client.post("/v1/apps/txt2img/infer", json=body)
    error = assert_error(timed_out, 504, param=None, names="generate (sd15-base)")
    assert error["code"] == "answer_timeout"
    assert timed_out.json()["switchyard"]["pending_stages"] == ["generate"]
    worker.release()
    resumed = await ingress.client.post("/v1/apps/txt2img/infer", json=body)
    assert resumed.status_code == 200, resumed.text
    assert resumed.json()["output"]["check"].startswith("safety-checker<generate=sd15-base<")
    assert worker.stages_ran("slow-1") == ["encode", "generate", "check"]


# -- admission control ------------------------------------------------------------------


def _pipeline_gate(stack: Stack, *, upscales_queued: int) -> PipelineGate:
    """A gate that has read one live emulated-models worker (time scale 10) holding
    every model, ``upscales_queued`` upscales waiting for its upscaler."""
    models = stack.catalogue.models
    now_s = time.time()
    heartbeat = Heartbeat(
        worker_id=WORKER_ID,
        worker_type="a100",
        sequence=1,
        interval_s=0.5,
        queue_length=upscales_queued,
        queued_work_s=0.0,
        running=0,
        utilization=0.0,
        backend="emulated-models",
        placed=[
            PlacedModel(
                model=name,
                state=PlacedState.READY,
                queued=upscales_queued if name == "upscaler" else 0,
            )
            for name in models
        ],
        time_scale=10.0,
        sent_at_s=now_s,
    )
    gate = PipelineGate(models, worker_timeout_s=30.0)
    record = WorkerRecord(
        worker_id=WORKER_ID,
        status=WorkerStatus.ALIVE,
        last_seen_s=now_s,
        age_s=0.0,
        heartbeat=heartbeat,
    )
    gate.observe(ClusterView(now_s=now_s, workers=(record,)))
    return gate


async def test_a_call_its_stages_cannot_finish_in_time_is_refused_before_any_stage_starts(
    stack: Stack, worker: StageWorker
) -> None:
    # 30 model seconds of SLO at time scale 10: 3 s; 20 upscales of 0.3 s queued: 6 s.
    options = ApiOptions(answer_timeout_s=5.0, llm_time_scale=10.0)
    busy = await stack.replica(
        options=options, pipeline_gate=_pipeline_gate(stack, upscales_queued=20)
    )
    body = {"input": "a red fox", "request_id": "late-1"}
    refused = await busy.client.post("/v1/apps/txt2img-hd/infer", json=body)
    error = assert_error(refused, 429, param=None, names="pipeline 'txt2img-hd'")
    assert error["code"] == "overloaded"
    assert "critical path" in error["message"]
    assert "least-loaded" not in error["message"]
    assert int(refused.headers["Retry-After"]) >= 3
    assert worker.stages_seen("late-1") == []
    assert (await busy.client.get("/v1/requests/late-1")).status_code == 404
    # txt2img has no upscale stage: its calls still fit.
    fits = await busy.client.post("/v1/apps/txt2img/infer", json={"input": "a cat"})
    assert fits.status_code == 200, fits.text
    # The same call on an idle cluster is admitted and answered.
    idle = await stack.replica(
        "ingress-b", options=options, pipeline_gate=_pipeline_gate(stack, upscales_queued=0)
    )
    answered = await idle.client.post("/v1/apps/txt2img-hd/infer", json=body)
    assert answered.status_code == 200, answered.text
    # Accepted once, a retry is not judged again: it gets the call's answer.
    retried = await busy.client.post("/v1/apps/txt2img-hd/infer", json=body)
    assert retried.status_code == 200, retried.text
    assert retried.json()["output"] == answered.json()["output"]
    assert worker.stages_ran("late-1") == ["encode", "generate", "upscale", "check"]


# -- the client going away ---------------------------------------------------------------


async def test_a_client_that_leaves_cancels_the_stages_not_started(
    stack: Stack, worker: StageWorker
) -> None:
    answers, routing = await routed_answers(stack.bus, stack.state, "ingress-gone", stack.stopping)
    stack.tasks.append(routing)
    app = build_app(
        stack.catalogue, stack.publish, answers, stack.state, options=ApiOptions(answer_timeout_s=5)
    )
    worker.hold.add("generate")
    body = json.dumps({"input": "bye", "request_id": "gone-1"}).encode()
    sent: list[Message] = []
    received = 0

    async def receive() -> Message:
        nonlocal received
        received += 1
        if received == 1:
            return {"type": "http.request", "body": body, "more_body": False}
        await worker.holding.wait()  # generate was published, and is held
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/apps/txt2img/infer",
        "raw_path": b"/v1/apps/txt2img/infer",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"host", b"ingress")],
        "client": ("127.0.0.1", 1),
        "server": ("ingress", 80),
    }
    await asyncio.wait_for(app(scope, receive, send), 5)
    assert sent[0]["status"] == 499
    record = await RequestLedger(stack.state).read("gone-1.generate")
    assert record is not None
    assert record.status == "cancelled"
    worker.release()  # nothing runs it, nor anything after it
    await asyncio.sleep(0.1)
    assert worker.stages_ran("gone-1") == ["encode"]


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
        {"name": "encode", "model": "prompt-encoder", "after": []},
        {"name": "generate", "model": "sd15-base", "after": ["encode"]},
        {"name": "upscale", "model": "upscaler", "after": ["generate"]},
        {"name": "check", "model": "safety-checker", "after": ["generate"]},
    ]
    assert hd["models"] == ["prompt-encoder", "sd15-base", "upscaler", "safety-checker"]


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
