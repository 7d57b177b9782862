"""The scheduler service over the in-memory bus: placements, the request ledger,
duplicates, predictions from the predictor's published model, and requests that wait
for a worker.
"""

from __future__ import annotations

import time

import pytest
from switchyard.contracts.messages import (
    LLMPayload,
    PredictorModel,
    ServiceObservation,
    WorkloadType,
)
from switchyard.prediction.snapshot import FittedPredictor
from switchyard.state import keys

from services.predictor.model import LivePredictor
from tests.service.scheduler_support import (
    Stack,
    jsq_fixture,  # noqa: F401 (the ``jsq`` fixture)
    llm_request,
)
from tests.support.services import eventually, heartbeat, store_worker

A100_7B = "a100-80gb/llama-2-7b"


def calibrated_model() -> str:
    """The predictor's published model (``PredictorModel`` JSON): pre-trained, and
    calibrated on the a100 by one request that took three times its raw prediction, so
    its calibrated predictions there exceed the raw ones."""
    live = LivePredictor.pretrained(1.0)
    live.observe(
        ServiceObservation(
            worker_type=A100_7B,
            model="llama-2-7b",
            prompt_tokens=100,
            workload=WorkloadType.OTHER,
            raw_predicted_s=1.0,
            execution_s=3.0,
        )
    )
    return live.snapshot(1, time.time()).model_dump_json()


def metric(text: str, name: str, **labels: str) -> float:
    """The value of the Prometheus sample ``name`` carrying ``labels`` (0 when none)."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        sample, _, value = line.rpartition(" ")
        if all(f'{key}="{want}"' in sample for key, want in labels.items()):
            total += float(value)
    return total


# -- first decisions -------------------------------------------------------------------------


async def test_requests_go_to_the_least_loaded_worker_that_serves_their_model(jsq: Stack) -> None:
    await jsq.worker("busy", waiting=5, running=8)
    await jsq.worker("idle")
    await jsq.worker("other-model", models=("llama-2-13b",))
    await jsq.start()
    await jsq.submit(llm_request("r1"))
    (assignment,) = await jsq.assignments(1)  # on idle's inbox partition
    assert assignment.worker_id == "idle"
    assert assignment.variant == "llama-2-7b"
    assert assignment.policy == "jsq"
    assert assignment.epoch == 0
    # The decision is recorded in the ledger before it is sent.
    record = await jsq.record("r1")
    assert (record.status, record.worker_id, record.epoch) == ("assigned", "idle", 0)
    assert record.assignment == assignment
    assert await jsq.assigned_to("idle", "r1")

    # Counted once its send is confirmed, which may be just after the worker has it.
    async def counted() -> bool:
        decisions = metric(jsq.metrics(), "switchyard_scheduler_decisions_total", kind="llm")
        return decisions == 1

    await eventually(counted)
    assert metric(jsq.metrics(), "switchyard_scheduler_decisions_total", policy="jsq") == 1


async def test_a_worker_naming_no_inbox_partition_is_sent_nothing(jsq: Stack) -> None:
    # Idle, but it names no partition: nothing could reach it.
    await store_worker(jsq.state, heartbeat("mute"))
    await jsq.worker("loaded", waiting=5, running=8)
    await jsq.start()
    await jsq.submit(llm_request("r1"))
    (assignment,) = await jsq.assignments(1)
    assert assignment.worker_id == "loaded"
    assert not await jsq.assigned_to("mute", "r1")


async def test_a_burst_between_heartbeats_is_spread_by_local_accounting(jsq: Stack) -> None:
    await jsq.worker("a")
    await jsq.worker("b")
    await jsq.start()
    for i in range(6):
        await jsq.submit(llm_request(f"r{i}"))
    got = await jsq.assignments(6)
    by_worker = {w: sum(1 for a in got if a.worker_id == w) for w in ("a", "b")}
    assert by_worker == {"a": 3, "b": 3}


async def test_a_request_delivered_twice_gets_its_recorded_assignment_again(jsq: Stack) -> None:
    await jsq.worker("a")
    await jsq.worker("b")
    await jsq.start()
    request = llm_request("dup")
    await jsq.submit(request)
    (first,) = await jsq.assignments(1)
    # Delivered again (a redelivery after a crash): the recorded decision is re-sent,
    # not decided anew.
    await jsq.publish(request)
    await jsq.submit(llm_request("after"))
    again, after = await jsq.assignments(2)
    assert again.message_id == first.message_id
    assert again == first
    assert after.request.request_id == "after"
    record = await jsq.record("dup")
    assert (record.worker_id, record.epoch) == (first.worker_id, 0)

    async def counted() -> bool:
        metrics = jsq.metrics()
        return (
            metric(metrics, "switchyard_scheduler_decisions_total", kind="llm") == 2
            and metric(metrics, "switchyard_scheduler_decisions_total", kind="resend") == 1
        )

    await eventually(counted)


# -- predictions -----------------------------------------------------------------------------


async def test_gaps_places_with_the_predictors_published_model() -> None:
    model = calibrated_model()
    stack = Stack("gaps")
    try:
        await stack.worker("a")
        await stack.state.set(keys.PREDICTOR_MODEL, model)
        await stack.start()
        request = llm_request("p1")
        await stack.submit(request)
        (assignment,) = await stack.assignments(1)
    finally:
        await stack.stop()
    # Predicted in-process with the published model: its calibrated prediction places
    # the request, its raw one goes to the worker (reported back for calibration).
    payload = request.payload
    assert isinstance(payload, LLMPayload)
    expected = FittedPredictor.from_model(PredictorModel.model_validate_json(model)).predict(
        prompt_tokens=payload.prompt_tokens,
        workload=payload.workload,
        model=payload.model,
        output_tokens_hint=payload.output_tokens_hint,
        arrival_s=request.arrival_s,
    )
    assert assignment.worker_id == "a"
    assert assignment.predicted_s == pytest.approx(expected.calibrated_by_worker_type_s[A100_7B])
    assert assignment.predicted_raw_s == pytest.approx(expected.raw_by_worker_type_s[A100_7B])
    assert assignment.predicted_s is not None
    assert assignment.predicted_raw_s is not None
    assert assignment.predicted_s > assignment.predicted_raw_s


async def test_without_a_published_model_gaps_decides_at_once_then_takes_the_model() -> None:
    # Waiting for predictions is gone: with no model yet, requests are decided without
    # one (a long prediction wait, which only classification estimates use, changes
    # nothing); a model published later is read within the publish interval.
    stack = Stack("gaps", prediction_wait_s=10.0, predictor_publish_interval_s=0.1)
    try:
        await stack.worker("a")
        service = await stack.start()
        await stack.submit(llm_request("blind"))
        (blind,) = await stack.assignments(1)
        assert blind.predicted_s is None
        assert blind.predicted_raw_s is None

        await stack.state.set(keys.PREDICTOR_MODEL, calibrated_model())

        async def model_read() -> bool:
            return service.placer.predictor is not None

        await eventually(model_read)
        await stack.submit(llm_request("seen"))
        (seen,) = await stack.assignments(1)
    finally:
        await stack.stop()
    assert seen.predicted_s is not None
    assert seen.predicted_raw_s is not None


# -- no worker yet ---------------------------------------------------------------------------


async def test_a_request_for_a_model_nobody_serves_waits_for_a_worker(jsq: Stack) -> None:
    await jsq.start()
    await jsq.submit(llm_request("early"))

    async def parked() -> bool:
        return metric(jsq.metrics(), "switchyard_scheduler_unplaced") == 1

    await eventually(parked)
    assert (await jsq.record("early")).status == "queued"
    await jsq.worker("late")
    (assignment,) = await jsq.assignments(1)
    assert assignment.worker_id == "late"
    assert metric(jsq.metrics(), "switchyard_scheduler_unplaced") == 0


async def test_a_request_waits_until_its_worker_names_an_inbox_partition(jsq: Stack) -> None:
    # A worker whose heartbeats name no partition yet (it has not leased one) serves the
    # model but cannot be sent anything: the request waits for it.
    await store_worker(jsq.state, heartbeat("starting"))
    await jsq.start()
    await jsq.submit(llm_request("early"))

    async def parked() -> bool:
        return metric(jsq.metrics(), "switchyard_scheduler_unplaced") == 1

    await eventually(parked)
    await jsq.worker("starting", sequence=2)  # now it names its partition
    (assignment,) = await jsq.assignments(1)
    assert assignment.worker_id == "starting"
