"""Small graph helpers for pipelines of model stages (a DAG given as stage -> ``after``).

Pure functions on plain mappings so that both the registry (which validates files) and
the multi-model catalogue (which builds :class:`~switchyard.multimodel.model.PipelineSpec`
objects in code) share one definition of "a cycle" and of "the critical path".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from switchyard.multimodel.model import ModelSpec, PipelineSpec

__all__ = ["critical_path_s", "find_cycle", "topological_order"]


def find_cycle(after: Mapping[str, Sequence[str]]) -> tuple[str, ...] | None:
    """A cycle of the graph ``stage -> stages it runs after``, or ``None`` when acyclic.

    The cycle is returned in dependency order, its first stage repeated at the end
    (``("a", "b", "a")``: ``a`` runs after ``b``, which runs after ``a``). Names in
    ``after`` that are not keys are ignored (an unknown stage is a different error).
    """
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for root in after:
        if state.get(root):
            continue
        path: list[str] = [root]
        state[root] = 1
        iterators = [iter(after[root])]
        while iterators:
            child = next(iterators[-1], None)
            if child is None:
                iterators.pop()
                state[path.pop()] = 2
                continue
            if child not in after:
                continue
            if state.get(child) == 1:
                start = path.index(child)
                return (*path[start:], child)
            if not state.get(child):
                state[child] = 1
                path.append(child)
                iterators.append(iter(after[child]))
    return None


def topological_order(after: Mapping[str, Sequence[str]]) -> tuple[str, ...]:
    """The stages in an order where each comes after every stage it depends on (ties
    keep the mapping's order).

    Raises:
        ValueError: naming the stages of a cycle.
    """
    cycle = find_cycle(after)
    if cycle is not None:
        raise ValueError(f"cycle {' -> '.join(cycle)}")
    order: list[str] = []
    placed: set[str] = set()
    remaining = list(after)
    while remaining:
        still: list[str] = []
        for stage in remaining:
            if all(dep in placed or dep not in after for dep in after[stage]):
                order.append(stage)
                placed.add(stage)
            else:
                still.append(stage)
        remaining = still
    return tuple(order)


def critical_path_s(pipeline: PipelineSpec, models: Mapping[str, ModelSpec]) -> float:
    """The seconds of the pipeline's longest chain of stages at speed 1.0 and mean
    service times (its latency on an idle cluster with every model loaded)."""
    after = {stage.name: stage.after for stage in pipeline.stages}
    exec_s = {stage.name: models[stage.model].exec_s for stage in pipeline.stages}
    finish: dict[str, float] = {}
    for name in topological_order(after):
        start = max((finish[dep] for dep in after[name] if dep in finish), default=0.0)
        finish[name] = start + exec_s[name]
    return max(finish.values(), default=0.0)
