"""Hand-built multi-model snapshots for policy tests, and a stand-in for the shell that
carries a plan out."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import replace

from switchyard.multimodel.model import (
    ZERO,
    ModelSpec,
    PipelineSpec,
    ResourceVector,
    Stage,
    WorkerSpec,
)
from switchyard.multimodel.snapshot import (
    PlacementPlan,
    PlacementSnapshot,
    ResidentModel,
    WorkerState,
)

CAPACITY = ResourceVector(16.0, 1.0, 64.0)


def model(name: str, *, gpu: float = 0.25, exec_s: float = 1.0, load_s: float = 2.0) -> ModelSpec:
    return ModelSpec(
        name=name,
        resources=ResourceVector(2.0, gpu, 8.0),
        load_s=load_s,
        exec_s=exec_s,
    )


def worker_spec(
    worker_id: str, *, speed: float = 1.0, capacity: ResourceVector = CAPACITY
) -> WorkerSpec:
    return WorkerSpec(
        worker_id=worker_id, gpu_type=f"gpu-x{speed:g}", capacity=capacity, speed=speed
    )


def resident(
    name: str, *, ready_at_s: float = -100.0, queued: int = 0, running: int = 0
) -> ResidentModel:
    return ResidentModel(model=name, ready_at_s=ready_at_s, queued=queued, running=running)


def used(residents: Sequence[ResidentModel], models: Mapping[str, ModelSpec]) -> ResourceVector:
    total = ZERO
    for item in residents:
        total = total + models[item.model].resources
    return total


def worker_state(
    spec: WorkerSpec,
    residents: Sequence[ResidentModel],
    models: Mapping[str, ModelSpec],
    *,
    utilization: float = 0.0,
) -> WorkerState:
    work = sum((r.queued + r.running) * models[r.model].exec_s / spec.speed for r in residents)
    return WorkerState(
        spec=spec,
        resident=tuple(residents),
        free=spec.capacity - used(residents, models),
        queued_work_s=work,
        utilization=utilization,
    )


def snapshot(
    models: Sequence[ModelSpec],
    workers: Sequence[tuple[WorkerSpec, Sequence[ResidentModel]]],
    *,
    demand: Mapping[str, float] | None = None,
    waiting: Mapping[str, int] | None = None,
    now_s: float = 100.0,
    utilization: Mapping[str, float] | None = None,
) -> PlacementSnapshot:
    catalogue = {m.name: m for m in models}
    pipelines = {
        f"app-{m.name}": PipelineSpec(
            name=f"app-{m.name}", stages=(Stage(name="s", model=m.name),), slo_s=5.0
        )
        for m in models
    }
    util = utilization or {}
    return PlacementSnapshot(
        now_s=now_s,
        workers=tuple(
            worker_state(spec, res, catalogue, utilization=util.get(spec.worker_id, 0.0))
            for spec, res in workers
        ),
        models=catalogue,
        pipelines=pipelines,
        demand_rps=dict(demand or {}),
        waiting=dict(waiting or {}),
    )


def random_snapshot(rng: random.Random, n_workers: int, n_models: int) -> PlacementSnapshot:
    """Heterogeneous workers (4 kinds), models of varied size, skewed demand, and a
    random placement that fits, some replicas still loading, some queues."""
    kinds = [
        (1.0, ResourceVector(16.0, 1.0, 64.0)),
        (2.0, ResourceVector(32.0, 2.0, 128.0)),
        (0.5, ResourceVector(8.0, 1.0, 32.0)),
        (3.0, ResourceVector(32.0, 4.0, 256.0)),
    ]
    models = [
        ModelSpec(
            name=f"m{i:03d}",
            resources=ResourceVector(
                rng.choice([1.0, 2.0, 4.0]),
                rng.choice([0.1, 0.25, 0.5, 1.0]),
                rng.choice([4.0, 8.0, 16.0, 30.0]),
            ),
            load_s=rng.uniform(0.5, 8.0),
            exec_s=rng.uniform(0.05, 2.0),
        )
        for i in range(n_models)
    ]
    catalogue = {m.name: m for m in models}
    specs = []
    for j in range(n_workers):
        speed, capacity = kinds[rng.randrange(len(kinds))]
        specs.append(
            WorkerSpec(
                worker_id=f"w{j:02d}", gpu_type=f"kind-{speed:g}", capacity=capacity, speed=speed
            )
        )
    now = 50.0
    placed: list[tuple[WorkerSpec, list[ResidentModel]]] = []
    for spec in specs:
        residents: list[ResidentModel] = []
        free = spec.capacity
        for m in rng.sample(models, k=min(len(models), rng.randrange(0, 6))):
            if m.resources.fits_in(free):
                free = free - m.resources
                residents.append(
                    ResidentModel(
                        model=m.name,
                        ready_at_s=now + rng.choice([-60.0, -1.0, 0.0, 1.5]),
                        queued=rng.choice([0, 0, 1, 5]),
                        running=rng.choice([0, 1]),
                    )
                )
        placed.append((spec, residents))
    demand = {m.name: (rng.paretovariate(1.2) - 1.0) * 0.5 for m in models if rng.random() < 0.8}
    waiting = {m.name: rng.choice([0, 0, 0, 3]) for m in models}
    return PlacementSnapshot(
        now_s=now,
        workers=tuple(
            worker_state(spec, res, catalogue, utilization=rng.random()) for spec, res in placed
        ),
        models=catalogue,
        pipelines={},
        demand_rps=demand,
        waiting=waiting,
    )


def apply_plan(snap: PlacementSnapshot, plan: PlacementPlan) -> PlacementSnapshot:
    """Carry ``plan`` out as the shell does (evictions, then loads checked against free
    resources; an evicted replica's queue goes back to ``waiting``), time unchanged.

    Raises:
        AssertionError: the plan evicts what is not held, loads what is held or unknown,
            or overflows a worker.
    """
    residents = {w.spec.worker_id: list(w.resident) for w in snap.workers}
    waiting = dict(snap.waiting)
    for worker_id, name in plan.evict:
        held = [r for r in residents[worker_id] if r.model == name]
        assert held, f"evicts {name} from {worker_id}, which does not hold it"
        residents[worker_id].remove(held[0])
        waiting[name] = waiting.get(name, 0) + held[0].queued
    for worker_id, name in plan.load:
        assert name in snap.models, f"loads unknown model {name}"
        assert all(r.model != name for r in residents[worker_id]), (
            f"{worker_id} already holds {name}"
        )
        residents[worker_id].append(
            ResidentModel(
                model=name, ready_at_s=snap.now_s + snap.models[name].load_s, queued=0, running=0
            )
        )
    workers = []
    for worker in snap.workers:
        spec = worker.spec
        total = used(residents[spec.worker_id], snap.models)
        assert total.fits_in(spec.capacity), (
            f"{spec.worker_id} overflows: {total} > {spec.capacity}"
        )
        workers.append(
            worker_state(
                spec, residents[spec.worker_id], snap.models, utilization=worker.utilization
            )
        )
    return replace(snap, workers=tuple(workers), waiting=waiting)


def advance(snap: PlacementSnapshot, seconds: float) -> PlacementSnapshot:
    """The same placement ``seconds`` later."""
    return replace(snap, now_s=snap.now_s + seconds)
