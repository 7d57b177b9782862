"""The placement policies' view of the live cluster, built from heartbeats (pure).

A worker of the ``emulated-models`` backend lists what is placed on it
(:class:`~switchyard.contracts.messages.PlacedModel`) and its resource vector in each
heartbeat; :func:`placement_snapshot` turns the latest heartbeats into the
:class:`~switchyard.multimodel.snapshot.PlacementSnapshot` the simulator builds, so the
live placement service and the scheduler's stage routing run the simulator's policy
objects unchanged.

Time: the catalogue's ``load_s`` and ``exec_s`` are in the model's seconds, and an
emulated worker runs ``time_scale`` times faster than them. The snapshot is in model
seconds, as in the simulator: ``now_s`` is the wall clock times the scale, a model's
load time left and a worker's queued work are multiplied by it, and request rates
(per wall second) divided by it.

Resources: a worker's ``free`` vector is its capacity less the catalogue's resource
vector of every model placed on it, draining ones included (they hold their resources
until they have finished what they hold). Draining models are not *resident* in the
snapshot: no router sends them new stages, and no policy counts them as replicas,
unless the shell has since ordered them loaded again (a :class:`PlacedDelta` load): the
worker then cancels the drain, so the model is resident again, in the room it holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from switchyard.contracts.messages import Heartbeat, PlacedState
from switchyard.multimodel.model import (
    ZERO,
    ModelSpec,
    PipelineSpec,
    ResourceVector,
    WorkerSpec,
)
from switchyard.multimodel.snapshot import PlacementSnapshot, ResidentModel, WorkerState

__all__ = [
    "GIB",
    "PlacedDelta",
    "capacity_of",
    "placement_snapshot",
    "placement_worker",
]

GIB = 1024**3


@dataclass(frozen=True, slots=True)
class PlacedDelta:
    """What one shell decided for a worker since its latest heartbeat, not yet visible
    there: models it ordered loaded or unloaded, and stages it routed per model."""

    loads: frozenset[str] = frozenset()
    unloads: frozenset[str] = frozenset()
    routed: Mapping[str, int] | None = None


def _ready_at_s(
    age_s: float, ready_in_s: float, spec: ModelSpec, now_s: float, scale: float
) -> float:
    """When a placed model was (or will be) ready, in model seconds: its load's start
    (``age_s`` ago) plus the catalogue's load time, so a policy sees how long a replica
    has been resident; from ``ready_in_s`` alone when the heartbeat gives no age."""
    if age_s > 0.0:
        return now_s - age_s * scale + spec.load_s
    return now_s + ready_in_s * scale


def capacity_of(heartbeat: Heartbeat) -> ResourceVector:
    """A heartbeat's resource vector in the catalogue's units (cores, GPUs, GiB)."""
    capacity = heartbeat.capacity
    return ResourceVector(capacity.cpu, capacity.gpu, capacity.mem_bytes / GIB)


def placement_worker(
    heartbeat: Heartbeat,
    models: Mapping[str, ModelSpec],
    *,
    now_wall_s: float,
    delta: PlacedDelta | None = None,
) -> WorkerState:
    """One worker's state as a placement policy sees it (see the module docstring).

    A model the catalogue does not know takes no resources and is left out: a worker
    and the shell that reads it disagreeing about the catalogue cannot fail a round.
    """
    scale = heartbeat.time_scale
    now_s = now_wall_s * scale
    delta = delta or PlacedDelta()
    routed = delta.routed or {}
    resident: list[ResidentModel] = []
    used = ZERO
    queued_work_s = 0.0
    listed: set[str] = set()
    speed = heartbeat.speed
    for placed in heartbeat.placed:
        spec = models.get(placed.model)
        if spec is None:
            continue
        listed.add(placed.model)
        used = used + spec.resources
        extra = routed.get(placed.model, 0)
        queued_work_s += (placed.queued + placed.running + extra) * spec.exec_s / speed
        # An ordered load of a draining model cancels its drain on the worker: it
        # stays, with what it holds, and takes no room twice.
        if placed.model not in delta.loads and (
            placed.state is PlacedState.DRAINING or placed.model in delta.unloads
        ):
            continue
        resident.append(
            ResidentModel(
                model=placed.model,
                ready_at_s=_ready_at_s(placed.age_s, placed.ready_in_s, spec, now_s, scale),
                queued=placed.queued + extra,
                running=placed.running,
            )
        )
    for model in sorted(delta.loads - listed):
        spec = models.get(model)
        if spec is None:
            continue
        used = used + spec.resources
        resident.append(
            ResidentModel(model=model, ready_at_s=now_s + spec.load_s, queued=0, running=0)
        )
    capacity = capacity_of(heartbeat)
    return WorkerState(
        spec=WorkerSpec(
            worker_id=heartbeat.worker_id,
            gpu_type=heartbeat.gpu_type or heartbeat.worker_type,
            capacity=capacity,
            speed=speed,
        ),
        resident=tuple(resident),
        free=capacity - used,
        queued_work_s=queued_work_s,
        utilization=heartbeat.utilization,
    )


def placement_snapshot(
    heartbeats: Iterable[Heartbeat],
    *,
    models: Mapping[str, ModelSpec],
    pipelines: Mapping[str, PipelineSpec],
    now_wall_s: float,
    demand_rps: Mapping[str, float],
    waiting: Mapping[str, int],
    deltas: Mapping[str, PlacedDelta] | None = None,
) -> PlacementSnapshot:
    """The snapshot of the live workers ``heartbeats`` (emulated-models workers only:
    those reporting a GPU or CPU capacity), in model seconds.

    ``demand_rps`` is per wall second, as the shells count it; it is divided by the
    workers' time scale (the first worker's: a stack runs one scale). ``deltas`` holds
    the shell's own decisions per worker id since that worker's heartbeat.
    """
    beats = [beat for beat in heartbeats if beat.placed or beat.backend == "emulated-models"]
    scale = beats[0].time_scale if beats else 1.0
    deltas = deltas or {}
    workers = tuple(
        placement_worker(beat, models, now_wall_s=now_wall_s, delta=deltas.get(beat.worker_id))
        for beat in beats
    )
    return PlacementSnapshot(
        now_s=now_wall_s * scale,
        workers=workers,
        models=models,
        pipelines=pipelines,
        demand_rps={model: rate / scale for model, rate in demand_rps.items()},
        waiting=dict(waiting),
    )
