"""The placement policies' view of live heartbeats (switchyard.cluster.placement_view):
what is free on a worker, what is resident, the shell's own orders on top, and the
conversion of wall seconds into the catalogue's model seconds."""

from __future__ import annotations

import pytest
from switchyard.cluster.placement_view import (
    GIB,
    PlacedDelta,
    capacity_of,
    placement_snapshot,
    placement_worker,
)
from switchyard.contracts.messages import Heartbeat, PlacedModel, PlacedState, ResourceVector
from switchyard.multimodel.model import ResourceVector as Vector
from switchyard.serving.pipelines import DEFAULT_PIPELINE_MODELS, DEFAULT_PIPELINES

MODELS = DEFAULT_PIPELINE_MODELS
# prompt-encoder (1, 0.25, 4), sd15-base (2, 0.5, 16), upscaler (2, 0.5, 8),
# safety-checker (1, 0.25, 4): cores, GPUs, GiB.


def placed(model: str, state: PlacedState = PlacedState.READY, **fields: object) -> PlacedModel:
    return PlacedModel.model_validate({"model": model, "state": state, **fields})


def beat(
    worker_id: str = "w1",
    models: list[PlacedModel] | None = None,
    *,
    backend: str | None = "emulated-models",
    **overrides: object,
) -> Heartbeat:
    values: dict[str, object] = {
        "worker_id": worker_id,
        "worker_type": "emulated-models",
        "sequence": 1,
        "interval_s": 0.5,
        "queue_length": 0,
        "queued_work_s": 0.0,
        "running": 0,
        "utilization": 0.25,
        "backend": backend,
        "capacity": ResourceVector(cpu=8, gpu=1, mem_bytes=64 * GIB),
        "placed": models or [],
        "sent_at_s": 100.0,
    }
    values.update(overrides)
    return Heartbeat.model_validate(values)


def test_capacity_is_read_in_the_catalogues_units() -> None:
    assert capacity_of(beat()) == Vector(8.0, 1.0, 64.0)


def test_free_is_the_capacity_less_every_placed_model_draining_ones_included() -> None:
    worker = placement_worker(
        beat(
            models=[
                placed("sd15-base"),
                placed("prompt-encoder", PlacedState.LOADING, ready_in_s=2.0),
                placed("upscaler", PlacedState.DRAINING, queued=1),
            ]
        ),
        MODELS,
        now_wall_s=100.0,
    )
    # 8 - 2 - 1 - 2 cores, 1 - 0.5 - 0.25 - 0.5 (floored at 0) GPUs, 64 - 16 - 4 - 8 GiB.
    assert worker.free == Vector(3.0, 0.0, 36.0)
    # The draining upscaler still holds its room but is no replica to route to.
    assert [r.model for r in worker.resident] == ["sd15-base", "prompt-encoder"]
    assert worker.spec.capacity == Vector(8.0, 1.0, 64.0)
    assert worker.utilization == 0.25


def test_a_model_the_catalogue_does_not_know_is_left_out() -> None:
    worker = placement_worker(beat(models=[placed("mystery")]), MODELS, now_wall_s=0.0)
    assert worker.resident == ()
    assert worker.free == Vector(8.0, 1.0, 64.0)


def test_ordered_loads_take_their_room_and_are_resident_until_the_heartbeat_shows_them() -> None:
    worker = placement_worker(
        beat(models=[placed("sd15-base")]),
        MODELS,
        now_wall_s=100.0,
        delta=PlacedDelta(loads=frozenset({"upscaler", "sd15-base", "mystery"})),
    )
    # sd15-base is listed already: no room taken twice; mystery is unknown: ignored.
    assert [r.model for r in worker.resident] == ["sd15-base", "upscaler"]
    upscaler = worker.resident[1]
    assert upscaler.ready_at_s == pytest.approx(100.0 + MODELS["upscaler"].load_s)
    assert (upscaler.queued, upscaler.running) == (0, 0)
    assert worker.free == Vector(4.0, 0.0, 40.0)


def test_ordered_unloads_leave_the_residents_but_keep_their_room() -> None:
    worker = placement_worker(
        beat(models=[placed("sd15-base"), placed("upscaler")]),
        MODELS,
        now_wall_s=0.0,
        delta=PlacedDelta(unloads=frozenset({"upscaler"})),
    )
    assert [r.model for r in worker.resident] == ["sd15-base"]
    assert worker.free == Vector(4.0, 0.0, 40.0)  # it drains before it gives room back


def test_an_ordered_load_of_a_draining_model_keeps_it_resident_in_its_own_room() -> None:
    """The worker cancels the drain: the model serves on, so the next round must not
    order it loaded again, nor count its room twice."""
    worker = placement_worker(
        beat(models=[placed("upscaler", PlacedState.DRAINING, queued=2)]),
        MODELS,
        now_wall_s=50.0,
        delta=PlacedDelta(loads=frozenset({"upscaler"})),
    )
    assert [(r.model, r.queued, r.ready_at_s) for r in worker.resident] == [("upscaler", 2, 50.0)]
    assert worker.free == Vector(6.0, 0.5, 56.0)


def test_routed_stages_count_as_queued_and_as_work() -> None:
    worker = placement_worker(
        beat(models=[placed("sd15-base", queued=1, running=1)], speed=2.0),
        MODELS,
        now_wall_s=0.0,
        delta=PlacedDelta(routed={"sd15-base": 2, "upscaler": 5}),
    )
    (resident,) = worker.resident
    assert (resident.queued, resident.running) == (3, 1)
    # Four stages of 2 model seconds on a worker twice as fast; the upscaler is not here.
    assert worker.queued_work_s == pytest.approx(4 * 2.0 / 2.0)


def test_time_is_in_model_seconds_the_wall_times_the_scale() -> None:
    scale = 20.0
    heartbeats = [
        beat("w1", [placed("sd15-base", PlacedState.LOADING, ready_in_s=0.25)], time_scale=scale)
    ]
    snapshot = placement_snapshot(
        heartbeats,
        models=MODELS,
        pipelines=DEFAULT_PIPELINES,
        now_wall_s=10.0,
        demand_rps={"sd15-base": 4.0},
        waiting={"upscaler": 3},
        deltas={"w1": PlacedDelta(loads=frozenset({"upscaler"}))},
    )
    assert snapshot.now_s == pytest.approx(200.0)
    base, upscaler = snapshot.workers[0].resident
    # 0.25 wall seconds of loading left are 5 model seconds.
    assert base.ready_at_s == pytest.approx(205.0)
    # An ordered load takes the catalogue's load time, in model seconds.
    assert upscaler.ready_at_s == pytest.approx(200.0 + MODELS["upscaler"].load_s)
    # Four stages a wall second are a fifth of a stage a model second.
    assert snapshot.demand_rps == {"sd15-base": pytest.approx(0.2)}
    assert dict(snapshot.waiting) == {"upscaler": 3}
    assert snapshot.models is MODELS
    assert snapshot.pipelines is DEFAULT_PIPELINES


def test_only_workers_of_the_emulated_models_backend_take_part() -> None:
    heartbeats = [
        beat("w-llm", backend="emulated-llm"),
        beat("w-models"),
        beat("w-torch", backend="torch", time_scale=5.0),
    ]
    snapshot = placement_snapshot(
        heartbeats,
        models=MODELS,
        pipelines=DEFAULT_PIPELINES,
        now_wall_s=1.0,
        demand_rps={},
        waiting={},
    )
    assert [w.spec.worker_id for w in snapshot.workers] == ["w-models"]
    assert snapshot.now_s == 1.0  # the scale of the workers that take part


def test_no_workers_is_an_empty_snapshot_at_wall_time() -> None:
    snapshot = placement_snapshot(
        [], models=MODELS, pipelines=DEFAULT_PIPELINES, now_wall_s=3.0, demand_rps={}, waiting={}
    )
    assert snapshot.workers == ()
    assert snapshot.now_s == 3.0
