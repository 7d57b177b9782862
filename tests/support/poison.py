"""Poison for every topic a stack reads: bytes that are not a message, and messages that
pass the schema but make no sense (used by the service and the integration tier)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
from switchyard.bus import Bus, codec
from switchyard.contracts.messages import (
    AccuracyEstimate,
    Assignment,
    ClassificationPayload,
    Completion,
    CompletionStatus,
    InferenceRequest,
    LLMPayload,
    Migration,
    OutputChunk,
    PlacementOrder,
    RequestTimeline,
    ServiceObservation,
    ServiceObservations,
    StagePayload,
    WorkerDown,
    WorkloadType,
)
from switchyard.contracts.topics import (
    ANSWERS,
    CLASSIFICATION_REQUESTS,
    ESTIMATES,
    HEARTBEATS,
    OBSERVATIONS,
    REQUESTS,
    STAGE_REQUESTS,
    WORKER_EVENTS,
    WORKER_INBOX,
    Topic,
)

from services.embedded import EmbeddedStack

SERVICES = (
    "ingress",
    "monitor",
    "predictor",
    "estimator",
    "scheduler",
    "rebalancer",
    "placement",
    "worker",
)


def _request(
    request_id: str, payload: LLMPayload | ClassificationPayload | StagePayload, app: str
) -> Any:
    arrival_s = time.time() - 3600.0
    return InferenceRequest(
        request_id=request_id,
        app=app,
        payload=payload,
        arrival_s=arrival_s,
        deadline_s=arrival_s + 0.001,  # long past
        reply_to="no-such-replica",
        reply_partition=0,
    )


def _nonsense() -> list[tuple[Topic[Any], Any]]:
    """Messages every schema accepts, about things that do not exist or cannot be."""
    now_s = time.time()
    huge = LLMPayload(model="no-such-model", prompt_tokens=10_000_000, max_output_tokens=1_000_000)
    unknown_llm = _request("poison-llm", huge, "no-such-app")
    real_model_huge = _request(
        "poison-huge",
        LLMPayload(model="llama-2-7b", prompt_tokens=10_000_000, max_output_tokens=1_000_000),
        "completions",
    )
    wrong_length = _request("poison-cls", ClassificationPayload(features=[3.4e38] * 3), "digits")
    unknown_stage = _request(
        "poison-stage.encode",
        StagePayload(pipeline="no-such-pipeline", stage="encode", model="no-such-model"),
        "no-such-pipeline",
    )
    huge_stage = _request(
        "poison-huge-stage.generate",
        StagePayload(pipeline="txt2img", stage="generate", model="sd15-base", exec_scale=1000),
        "txt2img",
    )
    return [
        (REQUESTS, unknown_llm),
        (REQUESTS, real_model_huge),
        (CLASSIFICATION_REQUESTS, wrong_length),
        (STAGE_REQUESTS, unknown_stage),
        (STAGE_REQUESTS, huge_stage),
        (
            # To an LLM worker, which places no models, and of models that do not exist.
            WORKER_INBOX,
            PlacementOrder(
                worker_id="llm-0",
                load=["no-such-model", "sd15-base"],
                unload=["never-loaded"],
                policy="poison",
                plan_id="poison-plan",
                decided_at_s=now_s,
            ),
        ),
        (
            WORKER_INBOX,
            Assignment(
                request=unknown_llm,
                worker_id="llm-0",
                variant="no-such-variant",
                order=-1e300,
                policy="jsq",
                assigned_at_s=now_s,
            ),
        ),
        (
            WORKER_INBOX,
            Migration(
                request_id="poison-never-held",
                from_worker_id="llm-0",
                to_worker_id="no-such-worker",
                epoch=7,
                reason="poison",
                expected_gain_s=1e300,
                cost_s=0.0,
                decided_at_s=now_s,
            ),
        ),
        (
            ANSWERS,
            Completion(
                request_id="poison-never-asked",
                app="x",
                worker_id="w",
                worker_type="t",
                variant="v",
                status=CompletionStatus.OK,
                timeline=RequestTimeline(arrival_s=now_s),
            ),
        ),
        (ANSWERS, OutputChunk(request_id="poison-never-asked", index=10**9, tokens=0, sent_at_s=0)),
        (
            ESTIMATES,
            AccuracyEstimate(
                request_id="poison-cls",
                app="digits",
                theta=[1e300],
                expected_accuracy={"no-such-variant": 1.0},
                estimated_at_s=now_s,
            ),
        ),
        (
            OBSERVATIONS,
            ServiceObservations(
                worker_id="llm-0",
                observations=[
                    ServiceObservation(
                        worker_type="a100-80gb/llama-2-7b",
                        model="llama-2-7b",
                        prompt_tokens=10_000_000,
                        workload=WorkloadType.CONVERSATION,
                        execution_s=1e300,
                    )
                ],
                sent_at_s=now_s,
            ),
        ),
        (
            WORKER_EVENTS,
            WorkerDown(worker_id="no-such-worker", reason="heartbeat-timeout", detected_at_s=0),
        ),
    ]


async def poison_every_topic(stack: EmbeddedStack) -> None:
    """Publish the poison to every topic ``stack`` reads, each where its reader reads."""
    bus: Bus = stack.service("scheduler").ctx.bus
    worker = stack.service("worker")
    inbox_partition: int = worker.inbox.partition  # type: ignore[attr-defined]
    ingress = stack.service("ingress")
    answers_partition = ingress.answers.reply_partition  # type: ignore[attr-defined]
    answers_key = ingress.answers.instance_id.encode()  # type: ignore[attr-defined]
    keyed_topics = (
        REQUESTS,
        CLASSIFICATION_REQUESTS,
        STAGE_REQUESTS,
        ESTIMATES,
        OBSERVATIONS,
        HEARTBEATS,
        WORKER_EVENTS,
    )
    for keyed in keyed_topics:
        for key in range(16):  # spread over the topic's partitions
            await bus.publish_bytes(keyed, b"\xff not a message", key=str(key).encode())
    # Addressed topics: in the reader's own partition, under its key.
    garbage = b"\xff not a message"
    await bus.publish_bytes(WORKER_INBOX, garbage, key=b"llm-0", partition=inbox_partition)
    await bus.publish_bytes(ANSWERS, garbage, key=answers_key, partition=answers_partition)
    for topic, message in _nonsense():
        if topic is WORKER_INBOX:
            await bus.publish(topic, message, partition=inbox_partition)
        elif topic is ANSWERS:
            await bus.publish(topic, message, partition=answers_partition)
        else:
            await bus.publish(topic, message)
    # Finite as a 64-bit float, infinite as the models' 32-bit one: once, this stopped
    # the estimator. Other publishers than the ingress must not get it through either.
    overflowing = _request("poison-float32", ClassificationPayload(features=[0.5] * 64), "digits")
    value, headers = codec.encode(overflowing)
    value = value.replace(b"0.5", b"1e39", 1)
    await bus.publish_bytes(CLASSIFICATION_REQUESTS, value, key=b"poison-float32", headers=headers)


async def assert_every_service_serves(stack: EmbeddedStack, settle_s: float) -> None:
    """After ``settle_s`` (every consumer has read its share), no service has failed and
    an LLM completion and a classification call are answered."""
    await asyncio.sleep(settle_s)
    for name in SERVICES:
        service = stack.service(name)
        assert service.failure is None, f"{name} failed: {service.failure!r}"

    async with httpx.AsyncClient(base_url=stack.url, timeout=60.0) as client:
        completion = await client.post(
            "/v1/completions", json={"model": "llama-2-7b", "prompt": "next", "max_tokens": 8}
        )
        assert completion.status_code == 200, completion.text
        digits = await client.post("/v1/apps/digits/infer", json={"features": [0.0] * 64})
        assert digits.status_code == 200, digits.text
        assert digits.json()["status"] == "ok"
        pipeline = await client.post("/v1/apps/txt2img/infer", json={"input": "a lighthouse"})
        assert pipeline.status_code == 200, pipeline.text
        assert set(pipeline.json()["output"]) == {"check"}
        health = await client.get("/healthz")
        assert health.status_code == 200
    for name in SERVICES:
        assert stack.service(name).failure is None, f"{name} failed afterwards"
