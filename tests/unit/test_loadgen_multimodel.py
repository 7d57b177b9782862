"""The ``multimodel`` mix: the plan of the Alibaba LoRA sample, reading a pipeline answer,
a replay of pipeline calls against an in-process fake ingress, the summary and report of
pipeline calls, and the command line's rules for the mix."""

from __future__ import annotations

import json
import math
from collections import Counter
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from switchyard.multimodel.alibaba import lora_workload
from switchyard.serving.pipelines import ALIBABA_LORA_OPTIONS, pipeline_catalogue
from switchyard.traces.alibaba import LORA_SAMPLE

from loadgen.__main__ import main
from loadgen.mixes import PIPELINE_PROMPT, PlanError, PlannedRequest, multimodel_plan
from loadgen.replay import replay
from loadgen.replay_answers import parse_answer
from loadgen.replay_records import HTTP_ERROR, OK, REJECTED, TIMEOUT, RequestRecord
from loadgen.replay_summary import per_app_summaries, summarize
from loadgen.replay_text import format_report

CATALOGUE_PIPELINES = set(pipeline_catalogue("alibaba-lora")[1])

# ----------------------------------------------------------------------------- the plan


def test_the_plan_calls_the_pipelines_the_stack_serves() -> None:
    plan = multimodel_plan()

    used = Counter(request.app for request in plan)
    assert set(used) == CATALOGUE_PIPELINES  # every pipeline is called, none unknown
    assert {request.kind for request in plan} == {"pipeline"}
    assert [request.index for request in plan] == list(range(len(plan)))
    # The synthetic multi-stage share (0.3 of the calls) is replayed too.
    multi = sum(n for name, n in used.items() if name.endswith(("-upscale", "-full")))
    assert multi == round(0.3 * len(plan))


def test_the_plan_replays_the_workload_in_arrival_order() -> None:
    workload = lora_workload(LORA_SAMPLE, **ALIBABA_LORA_OPTIONS)

    plan = multimodel_plan()

    assert len(plan) == len(workload.requests)
    arrivals = [request.arrival_s for request in plan]
    assert arrivals == sorted(arrivals)
    assert arrivals[0] == 0.0
    # Simulator seconds: the ~23 days of the sample compressed 1000x, about half an hour.
    assert 1000.0 < arrivals[-1] < 3600.0
    for request, source in zip(plan, workload.requests, strict=True):
        assert request.app == source.pipeline
        assert request.arrival_s == source.arrival_s
        assert request.exec_scale == source.exec_scale


def test_a_pipeline_call_posts_its_exec_scale_and_a_prompt() -> None:
    request = next(r for r in multimodel_plan() if r.app.endswith("-full"))

    body = request.body("run3")

    assert request.path == f"/v1/apps/{request.app}/infer"
    assert body == {
        "request_id": f"run3-{request.index}",
        "exec_scale": request.exec_scale,
        "input": PIPELINE_PROMPT,
    }
    assert request.exec_scale is not None
    assert math.isfinite(request.exec_scale)
    assert request.exec_scale > 0
    json.dumps(body)  # sendable as it is


def test_limit_keeps_the_first_calls_of_the_whole_replay() -> None:
    whole = multimodel_plan()

    first = multimodel_plan(limit=25)

    assert first == whole[:25]
    with pytest.raises(PlanError, match="--limit must be at least 1"):
        multimodel_plan(limit=0)


def test_the_seed_redraws_the_multi_stage_calls_within_the_catalogue() -> None:
    default = multimodel_plan(limit=300)
    other = multimodel_plan(limit=300, seed=7)

    assert multimodel_plan(limit=300, seed=0) == default
    assert [r.app for r in other] != [r.app for r in default]
    assert {r.app for r in other} <= CATALOGUE_PIPELINES
    # Only which pipeline of the same base model is drawn; times and scales stay.
    for mine, theirs in zip(default, other, strict=True):
        assert mine.app.split("-")[0] == theirs.app.split("-")[0]
        assert (mine.arrival_s, mine.exec_scale) == (theirs.arrival_s, theirs.exec_scale)


# ----------------------------------------------------------------------- the answers

STAGES = [
    {
        "stage": "generate",
        "model": "M0001",
        "worker_id": "worker-3",
        "status": "completed",
        "queued_s": 0.25,
        "exec_s": 1.5,
        "note": None,
        "extra": {"nested": 1},
    },
    {"stage": "upscale", "model": "upscaler", "worker_id": "worker-1", "status": "completed"},
]


def pipeline_answer(**changes: object) -> bytes:
    body: dict[str, object] = {
        "id": "run-0",
        "object": "pipeline.result",
        "app": "M0001-upscale",
        "output": {"generate": "an image", "upscale": "a larger image"},
        "stages": STAGES,
        "latency_s": 2.5,
        "slo_s": 8.0,
        "met_slo": True,
        "emulated": True,
    }
    body.update(changes)
    return json.dumps(body).encode()


def test_a_pipeline_result_is_read_with_its_slo_verdict_and_stages() -> None:
    fields = parse_answer("pipeline", 200, pipeline_answer(), {})

    assert fields["outcome"] == OK
    assert fields["slo_s"] == 8.0
    assert fields["deadline_met"] is True
    assert fields["server_latency_s"] == 2.5
    assert fields["emulated"] is True
    generate, upscale = fields["stages"]
    assert generate == {
        "stage": "generate",
        "model": "M0001",
        "worker_id": "worker-3",
        "status": "completed",
        "queued_s": 0.25,
        "exec_s": 1.5,
    }
    assert upscale["worker_id"] == "worker-1"
    assert "timeline" not in fields  # a pipeline call stays out of the breakdown


def test_a_missed_slo_and_odd_fields_are_read_tolerantly() -> None:
    content = pipeline_answer(met_slo=False, slo_s="soon", latency_s=None, stages="none")

    fields = parse_answer("pipeline", 200, content, {})

    assert fields["deadline_met"] is False
    for left_out in ("slo_s", "server_latency_s", "stages"):
        assert left_out not in fields
    assert "deadline_met" not in parse_answer("pipeline", 200, pipeline_answer(met_slo="yes"), {})


def test_a_failed_stage_is_an_error_naming_the_stage() -> None:
    body = {
        "error": {
            "message": "stage 'upscale' of M0001-upscale failed: worker-1 lost",
            "type": "stage_failed",
            "param": None,
            "code": "stage_failed",
        }
    }

    fields = parse_answer("pipeline", 502, json.dumps(body).encode(), {})

    assert fields["outcome"] == HTTP_ERROR
    assert "stage 'upscale'" in fields["error_message"]
    assert fields["error_type"] == "stage_failed"
    assert fields["error_code"] == "stage_failed"
    assert "deadline_met" not in fields


def test_a_shed_pipeline_call_is_a_rejection() -> None:
    body = {"error": {"message": "no worker holds M0001", "type": "unavailable"}}

    fields = parse_answer("pipeline", 503, json.dumps(body).encode(), {"retry-after": "2"})

    assert fields["outcome"] == REJECTED
    assert fields["retry_after_s"] == 2.0


@pytest.mark.parametrize(
    ("status", "content", "expected"),
    [
        (200, b"<html>ok</html>", {"outcome": OK}),
        (200, b"[1, 2]", {"outcome": OK}),
        (502, b"Bad Gateway", {"outcome": HTTP_ERROR, "error_message": "Bad Gateway"}),
        (500, b"", {"outcome": HTTP_ERROR}),
    ],
)
def test_a_body_that_is_not_a_pipeline_result_is_never_an_error(
    status: int, content: bytes, expected: dict[str, object]
) -> None:
    assert parse_answer("pipeline", status, content, {}) == expected


def test_a_pipeline_record_round_trips_through_json() -> None:
    fields = parse_answer("pipeline", 200, pipeline_answer(), {})
    record = RequestRecord(
        index=0,
        request_id="run-0",
        kind="pipeline",
        app="M0001-upscale",
        workload="pipeline",
        arrival_s=0.0,
        scheduled_s=0.0,
        exec_scale=0.8,
        **fields,
    )

    saved = json.loads(json.dumps(record.to_json(), allow_nan=False))

    assert RequestRecord.from_json(saved) == record
    assert saved["stages"][0]["stage"] == "generate"


# ------------------------------------------------------------------------ the replay


def fake_ingress(received: list[dict[str, Any]]) -> Starlette:
    """Pipeline calls: ``M0001`` meets its SLO below ``exec_scale`` 1; call 2 fails its
    ``generate`` stage, call 3 is shed, an unknown pipeline is a 404."""

    async def infer(request: Request) -> JSONResponse:
        body = await request.json()
        received.append({"path": request.url.path, **body})
        app, index = request.path_params["app"], int(body["request_id"].rsplit("-", 1)[1])
        if app not in CATALOGUE_PIPELINES:
            return JSONResponse({"error": {"message": f"unknown {app!r}"}}, status_code=404)
        if index == 2:
            failed = {"message": "stage 'generate' failed: worker lost", "type": "stage_failed"}
            return JSONResponse({"error": failed}, status_code=500)
        if index == 3:
            return JSONResponse({"error": {"message": "no worker"}}, status_code=503)
        answer = {
            "object": "pipeline.result",
            "app": app,
            "output": {"generate": "an image"},
            "stages": [{"stage": "generate", "model": "M0001", "worker_id": "worker-2"}],
            "latency_s": 1.0,
            "slo_s": 8.0,
            "met_slo": body["exec_scale"] < 1.0,
            "emulated": True,
        }
        return JSONResponse(answer)

    return Starlette(routes=[Route("/v1/apps/{app}/infer", infer, methods=["POST"])])


def call(index: int, app: str = "M0001", scale: float = 1.0) -> PlannedRequest:
    return PlannedRequest(
        index=index,
        arrival_s=0.01 * index,
        kind="pipeline",
        app=app,
        workload="pipeline",
        exec_scale=scale,
    )


async def test_a_replay_sends_pipeline_calls_and_records_their_answers() -> None:
    received: list[dict[str, Any]] = []
    plan = [call(0, scale=0.5), call(1, "M0002-full", 1.5), call(2), call(3), call(4, "nope")]

    result = await replay(
        plan,
        "http://fake",
        speedup=1.0,
        timeout_s=10.0,
        progress=False,
        run_id="run",
        transport=httpx.ASGITransport(app=fake_ingress(received)),
    )

    first, second, failed, shed, unknown = result.records
    assert received[0] == {
        "path": "/v1/apps/M0001/infer",
        "request_id": "run-0",
        "exec_scale": 0.5,
        "input": PIPELINE_PROMPT,
    }
    assert (first.outcome, first.deadline_met, first.slo_s) == (OK, True, 8.0)
    assert first.exec_scale == 0.5
    assert first.stages is not None
    assert first.stages[0]["worker_id"] == "worker-2"
    assert (second.outcome, second.deadline_met) == (OK, False)
    assert failed.outcome == HTTP_ERROR
    assert failed.error_message is not None
    assert "stage 'generate'" in failed.error_message
    assert shed.outcome == REJECTED
    assert unknown.status_code == 404


# ----------------------------------------------------------------------- the summary


def record(
    index: int,
    app: str,
    outcome: str = OK,
    latency_s: float | None = 1.0,
    met: bool | None = True,
    kind: str = "pipeline",
) -> RequestRecord:
    answered = outcome == OK
    return RequestRecord(
        index=index,
        request_id=f"run-{index}",
        kind=kind,
        app=app,
        workload="pipeline" if kind == "pipeline" else "conversation",
        arrival_s=float(index),
        scheduled_s=float(index),
        sent_s=float(index),
        send_lag_s=0.0,
        latency_s=latency_s if answered else None,
        status_code={OK: 200, HTTP_ERROR: 500, REJECTED: 503}.get(outcome),
        outcome=outcome,
        deadline_met=met if answered else None,
        slo_s=8.0 if kind == "pipeline" and answered else None,
        emulated=True if answered else None,
    )


def test_the_summary_counts_pipeline_calls_by_pipeline() -> None:
    records = [
        record(0, "M0001", latency_s=1.0),
        record(1, "M0001", latency_s=3.0, met=False),
        record(2, "M0001", outcome=HTTP_ERROR),  # a failed stage
        record(3, "M0002-full", latency_s=2.0),
        record(4, "M0002-full", outcome=TIMEOUT),
        record(5, "llama-2-7b", latency_s=0.5, kind="llm"),
    ]

    summary = summarize(records, duration_s=10.0)
    per_app = per_app_summaries(records, duration_s=10.0)

    assert (summary.sent, summary.answered_ok) == (6, 4)
    assert summary.http_errors == 1
    assert summary.timeouts == 1
    # Judged by met_slo: one slow call and two without an answer miss, three meet.
    assert (summary.slo_judged, summary.slo_violations) == (6, 3)
    assert summary.goodput_rps == pytest.approx(0.3)
    single = per_app["M0001"]
    assert (single.sent, single.answered_ok, single.slo_violations) == (3, 2, 2)
    assert single.latency_p50_s == pytest.approx(2.0)
    assert single.latency_p99_s == pytest.approx(2.98)
    assert per_app["M0002-full"].slo_violation_rate == pytest.approx(0.5)
    assert summary.breakdown["execution"].count == 0  # no pipeline timeline
    assert summary.token_slo_judged == 0  # token objectives are the LLM's


def test_the_report_names_the_pipelines_and_how_to_read_the_replay() -> None:
    records = [record(0, "M0001"), record(1, "M0002-full", met=False)]
    summary = summarize(records, duration_s=4.0)
    per_app = per_app_summaries(records, duration_s=4.0)

    text = format_report(summary, per_app, {"mix": "multimodel", "speedup": "x50"})

    assert "M0001" in text
    assert "M0002-full" in text
    assert "1 of 2 judged requests violated (50.0%)" in text
    assert "--speedup is the workers' time scale" in text
    assert "time scale" not in format_report(summary, per_app, {"mix": "llm"})


# --------------------------------------------------------------------- the command line


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--mix", "multimodel", "--trace", "azure-conv-sample"], ["--trace", "takes no trace"]),
        (["--mix", "multimodel", "--app-map", "code=tiny"], ["--app-map", "multimodel"]),
        (["--mix", "multimodel", "--limit", "0"], ["--limit", "at least 1"]),
        (["--mix", "multimodel", "--classification-share", "0.5"], ["--mix mixed"]),
        (["--mix", "llm"], ["--trace is required with --mix llm"]),
        ([], ["--trace is required"]),
    ],
)
def test_the_mix_s_bad_input_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], args: list[str], fragments: list[str]
) -> None:
    code = main(["replay", "--no-progress", "--target", "http://127.0.0.1:9", *args])

    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for fragment in fragments:
        assert fragment in lines[0]
