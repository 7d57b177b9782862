"""The multi-model simulator's check of a placement plan before it is carried out: the
library's :func:`~switchyard.multimodel.plan_check.plan_problem` (the live placement
service runs the same check) over the simulator's workers, raised as a
:class:`PlanError`."""

from __future__ import annotations

from collections.abc import Mapping

from switchyard.multimodel.model import ModelSpec
from switchyard.multimodel.plan_check import WorkerRoom, plan_problem
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
    named = {worker_id for worker_id, _ in plan.evict} | {worker_id for worker_id, _ in plan.load}
    rooms = {
        worker_id: WorkerRoom(
            capacity=worker.cap,
            free=worker.free_vec,
            held={model: replica.resources for model, replica in worker.replicas.items()},
        )
        for worker_id in named
        if (worker := by_id.get(worker_id)) is not None
    }
    problem = plan_problem(plan, rooms, models)
    if problem is not None:
        raise PlanError(problem)
