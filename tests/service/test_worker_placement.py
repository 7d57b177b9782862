"""An emulated-models worker over the in-memory bus: placement orders on its inbox
partition load and unload models (its heartbeats list them loading, ready, draining),
and pipeline stages assigned to it are answered with a StageResult.

The catalogue is the default one (``switchyard.serving.pipelines``): sd15-base takes
half the GPU and 16 GiB, loads in 10 s and serves a stage in 2 s; at a time scale of 20
that is 0.5 s and 0.1 s of wall time.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from switchyard.bus import Bus, MemoryTransport
from switchyard.contracts.messages import (
    Assignment,
    CompletionStatus,
    Heartbeat,
    InferenceRequest,
    PlacedState,
    PlacementOrder,
    StagePayload,
    StageResult,
)
from switchyard.contracts.topics import HEARTBEATS
from switchyard.lifecycle import RequestStatus
from switchyard.serving.catalogue import ServingCatalogue
from switchyard.state import MemoryStateStore

from services.worker import create
from services.worker.service import WorkerService
from tests.service.worker_support import (
    REPLY_PARTITION,
    Stack,
    _completion,
    _context,
    _heartbeat_where,
    _read,
    _record,
    _send,
    _start,
)

GIB = 1024**3
MODEL = "sd15-base"


async def _stack(**settings: object) -> Stack:
    bus = Bus(MemoryTransport())
    await bus.start()
    state = MemoryStateStore("test:")
    values: dict[str, object] = {
        "worker_id": "m1",
        "worker_backend": "emulated-models",
        "worker_time_scale": 20.0,
        # A one-GPU node: sd15-base (half a GPU) and the encoder (a quarter) fit together.
        "worker_cpu_cores": 8.0,
        "worker_gpus": 1.0,
        "worker_host_mem_gib": 64.0,
    }
    values.update(settings)
    metrics = InMemoryMetricReader()
    ctx = _context(bus, state, metrics=metrics, **values)
    worker = await create(ctx, ServingCatalogue(llm={}, classification={}))
    assert isinstance(worker, WorkerService)
    await _start(worker)
    return Stack(ctx, worker, state, metrics)


async def _stop(stack: Stack) -> None:
    stack.ctx.stopping.set()
    await stack.worker.drain()
    await stack.worker.cancel_routines()
    await stack.bus.stop()
    stack.ctx.telemetry.shutdown()


@pytest.fixture(name="models")
async def models_fixture() -> AsyncIterator[Stack]:
    stack = await _stack()
    yield stack
    await _stop(stack)


def _order(*, load: tuple[str, ...] = (), unload: tuple[str, ...] = ()) -> PlacementOrder:
    return PlacementOrder(
        worker_id="m1",
        load=list(load),
        unload=list(unload),
        policy="test",
        plan_id=f"plan-{time.monotonic_ns()}",
        decided_at_s=time.time(),
    )


def _stage(request_id: str, model: str = MODEL, stage: str = "generate") -> Assignment:
    now = time.time()
    request = InferenceRequest(
        request_id=request_id,
        app="txt2img",
        payload=StagePayload(
            pipeline="txt2img", stage=stage, model=model, inputs={"encode": "a red fox"}
        ),
        arrival_s=now - 0.01,
        reply_to="ingress-1",
        reply_partition=REPLY_PARTITION,
    )
    return Assignment(
        request=request, worker_id="m1", variant=model, order=now, policy="test", assigned_at_s=now
    )


async def _assign(stack: Stack, assignment: Assignment) -> None:
    await _record(stack.state, assignment)
    await _send(stack.worker, assignment)


def _placed(beat: Heartbeat) -> dict[str, PlacedState]:
    return {placed.model: placed.state for placed in beat.placed}


async def test_an_order_loads_a_model_that_then_serves_stages(models: Stack) -> None:
    async with (
        models.bus.subscribe(HEARTBEATS, group="t-hb") as beats,
        models.answers("t-answers") as answers,
    ):
        await _send(models.worker, _order(load=(MODEL,)))
        loading = await _heartbeat_where(beats, lambda h: bool(h.placed))
        assert _placed(loading) == {MODEL: PlacedState.LOADING}
        assert 0.0 < loading.placed[0].ready_in_s <= 0.5
        # It holds its resources from the moment its load starts.
        assert loading.capacity.gpu == 1.0
        assert loading.capacity.mem_bytes == 64 * GIB
        assert loading.free.gpu == pytest.approx(0.5)
        assert loading.free.mem_bytes == 48 * GIB
        assert (loading.backend, loading.gpu_type, loading.worker_type) == (
            "emulated-models",
            "a100",
            "a100",
        )
        assert loading.emulated
        assert loading.time_scale == 20.0
        ready = await _heartbeat_where(beats, lambda h: _placed(h) == {MODEL: PlacedState.READY})
        assert ready.resident_models == [MODEL]

        started_s = time.monotonic()
        await _assign(models, _stage("call-1.generate"))
        answer = await _completion(answers)
        took_s = time.monotonic() - started_s
    assert answer.status is CompletionStatus.OK, answer.error
    assert answer.emulated
    assert isinstance(answer.result, StageResult)
    assert answer.result.model == MODEL
    assert "call-1.generate" in answer.result.output
    assert took_s >= 0.1  # 2 s of service at a time scale of 20
    record = await _read(models.state, "call-1.generate")
    assert record.status == RequestStatus.OK


async def test_an_unload_drains_the_stages_the_model_holds_then_frees_it(models: Stack) -> None:
    async with (
        models.bus.subscribe(HEARTBEATS, group="t-hb") as beats,
        models.answers("t-answers") as answers,
    ):
        await _send(models.worker, _order(load=(MODEL,)))
        await _heartbeat_where(beats, lambda h: _placed(h) == {MODEL: PlacedState.READY})
        held = [_stage(f"call-{index}.generate") for index in range(3)]  # 0.3 s of work
        for assignment in held:
            await _assign(models, assignment)
        await _heartbeat_where(beats, lambda h: any(p.running for p in h.placed))
        await _send(models.worker, _order(unload=(MODEL,)))
        draining = await _heartbeat_where(
            beats, lambda h: _placed(h) == {MODEL: PlacedState.DRAINING}
        )
        assert draining.placed[0].queued + draining.placed[0].running >= 1
        assert draining.free.gpu == pytest.approx(0.5)  # still held while it drains
        answered = {(await _completion(answers)).request_id for _ in held}
        freed = await _heartbeat_where(beats, lambda h: not h.placed)
    assert answered == {a.request.request_id for a in held}
    for assignment in held:
        assert (await _read(models.state, assignment.request.request_id)).status == RequestStatus.OK
    assert freed.free == freed.capacity
    assert freed.resident_models == []


async def test_a_model_that_cannot_fit_is_refused_and_another_loads_on_demand() -> None:
    stack = await _stack(worker_host_mem_gib=8.0)  # sd15-base needs 16 GiB
    try:
        async with (
            stack.bus.subscribe(HEARTBEATS, group="t-hb") as beats,
            stack.answers("t-answers") as answers,
        ):
            await _send(stack.worker, _order(load=(MODEL,)))
            await _assign(stack, _stage("call-1.generate"))
            failed = await _completion(answers)
            # No order placed prompt-encoder: the stage routed here loads it.
            await _assign(stack, _stage("call-2.encode", "prompt-encoder", "encode"))
            served = await _completion(answers)
            beat = await _heartbeat_where(
                beats, lambda h: bool(h.placed) and h.placed[0].served_total == 1
            )
        assert failed.status is CompletionStatus.FAILED
        assert failed.error is not None
        assert "'sd15-base'" in failed.error
        assert "[cpu 8, gpu 1, mem 8 GiB]" in failed.error
        assert served.status is CompletionStatus.OK, served.error
        assert isinstance(served.result, StageResult)
        assert served.result.model == "prompt-encoder"
        assert _placed(beat) == {"prompt-encoder": PlacedState.READY}
    finally:
        await _stop(stack)
