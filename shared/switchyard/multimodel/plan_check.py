"""The check a placement plan passes before any of it is carried out (pure).

Shared by the multi-model simulator and the live placement service: a plan is carried
out whole or not at all, so :func:`plan_problem` looks at all of it first and names the
first thing wrong (an unknown worker or model, evicting what is not there, loading what
is, or loads that do not fit after the plan's evictions). Each caller turns the answer
into its own refusal: the simulator raises, the service logs and counts it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from switchyard.multimodel.model import ModelSpec, ResourceVector
from switchyard.multimodel.snapshot import PlacementPlan, PlacementSnapshot

__all__ = ["WorkerRoom", "plan_problem", "snapshot_rooms"]


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerRoom:
    """One worker as the check sees it: its capacity, what is free, and the models it
    holds (those a plan may evict) with the resources each gives back when evicted."""

    capacity: ResourceVector
    free: ResourceVector
    held: Mapping[str, ResourceVector]


def snapshot_rooms(snapshot: PlacementSnapshot) -> dict[str, WorkerRoom]:
    """Each worker of ``snapshot`` by id: its resident models are what it holds (a model
    the catalogue does not know holds nothing)."""
    models = snapshot.models
    return {
        worker.spec.worker_id: WorkerRoom(
            capacity=worker.spec.capacity,
            free=worker.free,
            held={
                resident.model: models[resident.model].resources
                for resident in worker.resident
                if resident.model in models
            },
        )
        for worker in snapshot.workers
    }


def plan_problem(
    plan: PlacementPlan, rooms: Mapping[str, WorkerRoom], models: Mapping[str, ModelSpec]
) -> str | None:
    """What is wrong with ``plan`` over the workers ``rooms`` (by id), in one line naming
    the worker, the models and the capacity; None when it may be carried out whole.

    Evictions come first: what they give back is free for the loads of the same worker.
    """
    free: dict[str, ResourceVector] = {}
    placed: dict[str, set[str]] = {}
    evicted: dict[str, list[str]] = {}
    for worker_id, model in plan.evict:
        room = rooms.get(worker_id)
        if room is None:
            return f"plan evicts {model!r} from unknown worker {worker_id!r}"
        names = placed.setdefault(worker_id, set(room.held))
        if model not in names:
            return f"plan evicts {model!r} from worker {worker_id}, which does not hold it"
        names.discard(model)
        evicted.setdefault(worker_id, []).append(model)
        free[worker_id] = free.get(worker_id, room.free) + room.held[model]
    loads: dict[str, list[str]] = {}
    for worker_id, model in plan.load:
        room = rooms.get(worker_id)
        if room is None:
            return f"plan loads {model!r} onto unknown worker {worker_id!r}"
        spec = models.get(model)
        if spec is None:
            return f"plan loads unknown model {model!r} onto worker {worker_id}"
        names = placed.setdefault(worker_id, set(room.held))
        if model in names:
            return f"plan loads {model!r} onto worker {worker_id}, which already holds it"
        names.add(model)
        loads.setdefault(worker_id, []).append(model)
        left = free.get(worker_id, room.free)
        if not spec.resources.fits_in(left):
            gone = evicted.get(worker_id, [])
            after = f" after evicting {', '.join(gone)}" if gone else ""
            return (
                f"plan overflows worker {worker_id}: loading {', '.join(loads[worker_id])} "
                f"does not fit in its capacity {_vec(room.capacity)}{after} "
                f"({model} needs {_vec(spec.resources)}, {_vec(left)} free)"
            )
        free[worker_id] = left - spec.resources
    return None


def _vec(v: ResourceVector) -> str:
    return f"[cpu {v.cpu:g}, gpu {v.gpu:g}, mem {v.mem_gib:g} GiB]"
