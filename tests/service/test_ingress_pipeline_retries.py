"""Pipeline calls that do not simply run through: retries (no stage runs twice, a call
resumes), a store that fails mid-call, admission control refusing a call before any
stage starts, and a client that goes away. Over the in-memory bus and state, with the
fake stage worker of ``tests/service/pipeline_support.py``; the catalogue is the default
one (``tests/service/test_ingress_pipelines.py`` runs calls that go through).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from starlette.types import Message
from switchyard.cluster import ClusterView, WorkerRecord, WorkerStatus
from switchyard.contracts.messages import (
    Heartbeat,
    PlacedModel,
    PlacedState,
)
from switchyard.errors import StateError
from switchyard.lifecycle import RequestLedger

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
