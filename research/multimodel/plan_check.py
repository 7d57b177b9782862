"""The multi-model simulator's check of a placement plan before it is carried out."""

from __future__ import annotations

from collections.abc import Mapping

from switchyard.multimodel.model import ModelSpec, ResourceVector
from switchyard.multimodel.snapshot import PlacementPlan

from research.multimodel.errors import PlanError
from research.multimodel.sim_state import WorkerRun

__all__ = ["check_plan"]


def check_plan(
    plan: PlacementPlan, by_id: Mapping[str, WorkerRun], models: Mapping[str, ModelSpec]
) -> None:
    """Refuse the whole ``plan``, naming the worker and models, if any part is wrong: an
    unknown worker or model, evicting what is not there, loading what is, or loads that
    do not fit after the plan's evictions.

    Raises:
        PlanError: naming the worker, the models and the capacity.
    """
    free: dict[str, ResourceVector] = {}
    placed: dict[str, set[str]] = {}
    evicted: dict[str, list[str]] = {}
    for worker_id, model in plan.evict:
        worker = by_id.get(worker_id)
        if worker is None:
            raise PlanError(f"plan evicts {model!r} from unknown worker {worker_id!r}")
        names = placed.setdefault(worker_id, set(worker.replicas))
        if model not in names:
            raise PlanError(
                f"plan evicts {model!r} from worker {worker_id}, which does not hold it"
            )
        names.discard(model)
        evicted.setdefault(worker_id, []).append(model)
        free[worker_id] = free.get(worker_id, worker.free_vec) + worker.replicas[model].resources
    loads: dict[str, list[str]] = {}
    for worker_id, model in plan.load:
        worker = by_id.get(worker_id)
        if worker is None:
            raise PlanError(f"plan loads {model!r} onto unknown worker {worker_id!r}")
        spec = models.get(model)
        if spec is None:
            raise PlanError(f"plan loads unknown model {model!r} onto worker {worker_id}")
        names = placed.setdefault(worker_id, set(worker.replicas))
        if model in names:
            raise PlanError(f"plan loads {model!r} onto worker {worker_id}, which already holds it")
        names.add(model)
        loads.setdefault(worker_id, []).append(model)
        room = free.get(worker_id, worker.free_vec)
        if not spec.resources.fits_in(room):
            gone = evicted.get(worker_id, [])
            after = f" after evicting {', '.join(gone)}" if gone else ""
            raise PlanError(
                f"plan overflows worker {worker_id}: loading {', '.join(loads[worker_id])} "
                f"does not fit in its capacity {_vec(worker.cap)}{after} "
                f"({model} needs {_vec(spec.resources)}, {_vec(room)} free)"
            )
        free[worker_id] = room - spec.resources


def _vec(v: ResourceVector) -> str:
    return f"[cpu {v.cpu:g}, gpu {v.gpu:g}, mem {v.mem_gib:g} GiB]"
