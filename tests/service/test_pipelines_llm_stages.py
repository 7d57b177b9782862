"""Pipelines with LLM stages end to end on the embedded stack (in-memory bus and state):
the ``assistant`` catalogue's ``triage`` (a classifier on a multi-model worker whose
label sends the call to one of two LLMs) and ``draft-verify`` (a draft by the small LLM
that the larger one judges and, when it rejects it, writes again), on emulated LLM
workers scheduled as any LLM request."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from switchyard.config import load_settings
from switchyard.multimodel.branching import label_at, unit_of
from switchyard.serving.pipelines import ASSISTANT_MODELS, ASSISTANT_PIPELINES
from switchyard.telemetry import configure_telemetry

from services.embedded import EmbeddedPlan, EmbeddedStack

SMALL = "a100-80gb/llama-2-7b"
LARGE = "h100-80gb/llama-2-13b"


SPANS = InMemorySpanExporter()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack() -> AsyncIterator[EmbeddedStack]:
    settings = load_settings(
        {},
        worker_time_scale=50.0,
        log_level="WARNING",
        heartbeat_interval_s=0.2,
        placement_update_hz=4.0,
        pipeline_catalogue="assistant",
    )
    telemetry = configure_telemetry(
        "switchyard-embedded", settings, span_exporter=SPANS, install_global=False
    )
    plan = EmbeddedPlan(llm_workers=(SMALL, LARGE), torch_workers=0, model_workers=1, http_port=0)
    embedded = EmbeddedStack(settings, plan, telemetry=telemetry)
    await embedded.start()
    try:
        yield embedded
    finally:
        assert await embedded.stop() == 0
        telemetry.shutdown()


pytestmark = pytest.mark.asyncio(loop_scope="module")


async def _calls(
    stack: EmbeddedStack, pipeline: str, prefix: str, calls: int, **extra: object
) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=stack.url, timeout=60.0) as client:
        return await asyncio.gather(
            *(
                client.post(
                    f"/v1/apps/{pipeline}/infer",
                    json={"input": f"how do I sort a list, take {i}", "request_id": f"{prefix}-{i}"}
                    | extra,
                )
                for i in range(calls)
            )
        )


async def test_a_rejected_draft_is_written_again_by_the_larger_model_and_an_accepted_one_answers(
    stack: EmbeddedStack,
) -> None:
    answers = await _calls(stack, "draft-verify", "dv", 10)
    shares = dict(ASSISTANT_PIPELINES["draft-verify"].stages[1].llm.choices)  # type: ignore[union-attr]
    verdicts = []
    for i, answer in enumerate(answers):
        assert answer.status_code == 200, answer.text
        body = answer.json()
        stages = {s["stage"]: s for s in body["stages"]}
        # Each stage ran on the LLM worker of its application's model.
        assert stages["draft"]["worker_id"] == "llm-0"
        assert stages["verify"]["worker_id"] == "llm-1"
        verdict = stages["verify"]["label"]
        # The emulated verifier's verdict is fixed by its stage's request id.
        assert verdict == label_at(tuple(shares.items()), unit_of(f"dv-{i}.verify"))
        assert stages["verify"]["started_s"] >= stages["draft"]["finished_s"]
        verdicts.append(verdict)
        if verdict == "accept":
            assert body["skipped"] == ["revise"]
            # The accepted draft is the answer: 128 emulated tokens of filler text.
            (text,) = body["output"].values()
            assert list(body["output"]) == ["draft"]
            assert len(text.split()) == 128
        else:
            assert body["skipped"] == []
            assert list(body["output"]) == ["revise"]
            assert stages["revise"]["worker_id"] == "llm-1"
            assert stages["revise"]["started_s"] >= stages["verify"]["finished_s"]
        assert body["emulated"] is True
    assert set(verdicts) == {"accept", "reject"}  # both branches were taken


async def test_the_classifier_sends_each_call_to_the_llm_its_label_names(
    stack: EmbeddedStack,
) -> None:
    answers = await _calls(stack, "triage", "tr", 8)
    shares = ASSISTANT_MODELS["intent-classifier"].labels
    routes = []
    for i, answer in enumerate(answers):
        assert answer.status_code == 200, answer.text
        body = answer.json()
        stages = {s["stage"]: s for s in body["stages"]}
        label = label_at(shares, unit_of(f"tr-{i}.classify"))
        assert stages["classify"]["label"] == label
        assert stages["classify"]["worker_id"] == "models-0"
        assert set(body["output"]) == {label}
        assert body["skipped"] == ["chat" if label == "code" else "code"]
        # code goes to the larger model's worker, chat to the smaller one's.
        assert stages[label]["worker_id"] == ("llm-1" if label == "code" else "llm-0")
        routes.append(label)
    assert set(routes) == {"code", "chat"}


async def test_an_llm_stage_is_an_llm_request_of_its_own_and_the_call_reads_back_whole(
    stack: EmbeddedStack,
) -> None:
    (answer,) = await _calls(stack, "draft-verify", "read", 1)
    assert answer.status_code == 200, answer.text
    async with httpx.AsyncClient(base_url=stack.url, timeout=10.0) as client:
        draft = (await client.get("/v1/requests/read-0.draft")).json()
        verify = (await client.get("/v1/requests/read-0.verify")).json()
        call = (await client.get("/v1/requests/read-0")).json()
    assert draft["kind"] == "llm", draft
    assert draft["status"] == "ok", draft
    assert draft["worker_id"] == "llm-0"
    assert draft["emulated"] is True
    assert draft["result"]["output_tokens"] == 128
    assert verify["kind"] == "llm", verify
    assert verify["worker_id"] == "llm-1", verify
    assert verify["result"]["output_tokens"] == 1
    assert verify["result"]["label"] == verify["result"]["text"]
    assert verify["result"]["label"] in ("accept", "reject")
    # The stage ran after the draft: its request arrived once the draft had finished.
    assert verify["timeline"]["arrival_s"] >= draft["timeline"]["finished_s"]
    assert call["status"] == "ok", call
    assert call["output"] == answer.json()["output"]


async def test_apps_lists_llm_stages_with_their_application_tokens_and_choices(
    stack: EmbeddedStack,
) -> None:
    async with httpx.AsyncClient(base_url=stack.url, timeout=10.0) as client:
        document = (await client.get("/v1/apps")).json()
    pipelines = {p["name"]: p for p in document["pipelines"]}
    assert set(pipelines) == {"triage", "draft-verify"}
    dv = pipelines["draft-verify"]
    assert dv["models"] == []
    assert dv["llm_applications"] == ["llama-2-7b", "llama-2-13b"]
    assert dv["stages"][1] == {
        "name": "verify",
        "model": "llama-2-13b",
        "after": ["draft"],
        "kind": "llm",
        "output_tokens": 1,
        "choices": {"accept": 0.7, "reject": 0.3},
    }
    assert pipelines["triage"]["models"] == ["intent-classifier"]


async def test_one_trace_holds_the_llm_stages_through_their_workers(
    stack: EmbeddedStack,
) -> None:
    (answer,) = await _calls(stack, "draft-verify", "traced", 1)
    assert answer.status_code == 200, answer.text
    ran = {s["stage"] for s in answer.json()["stages"]}
    servers = [
        s
        for s in SPANS.get_finished_spans()
        if s.kind is SpanKind.SERVER
        and (s.attributes or {}).get("switchyard.request_id") == "traced-0"
    ]
    assert len(servers) == 1
    trace_id = servers[0].context.trace_id
    deadline = asyncio.get_running_loop().time() + 10.0
    while True:
        found = [s for s in SPANS.get_finished_spans() if s.context.trace_id == trace_id]
        groups = [
            str((s.attributes or {}).get("messaging.consumer.group.name", ""))
            for s in found
            if s.kind is SpanKind.CONSUMER
        ]
        stage_spans = {s.name for s in found if s.name.startswith("stage ")}
        workers = {g for g in groups if g.startswith("worker-llm-")}
        answered = groups.count("ingress-ingress-0")
        if (len(stage_spans) == len(ran) and len(workers) == 2 and answered == len(ran)) or (
            asyncio.get_running_loop().time() > deadline
        ):
            break
        await asyncio.sleep(0.05)
    assert stage_spans == {f"stage {name}" for name in ran}
    # Each LLM stage was placed as any completion is (not by the stage routing) on the
    # worker of its model, and answered back, all in the call's trace.
    assert "scheduler-stages" not in groups
    assert groups.count("ingress-ingress-0") == len(ran), groups
    assert workers == {"worker-llm-0", "worker-llm-1"}, groups
