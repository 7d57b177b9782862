"""From the registry file to the multi-model catalogue, and the checks done at registration.

:func:`catalogue_from_registry` turns a validated :class:`~switchyard.apps.registry.Registry`
(its ``models`` and ``pipelines``) into the contract types of
:mod:`switchyard.multimodel.model` and rejects a model that fits on no worker.
:func:`check_pipelines` repeats the registry's pipeline checks for a catalogue built in
code (synthetic workloads, tests), so the simulator can trust either source.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from switchyard.apps.registry import Registry
from switchyard.multimodel.branching import condition_problem, labels_problem
from switchyard.multimodel.dag import find_cycle
from switchyard.multimodel.model import (
    ModelSpec,
    PipelineSpec,
    ResourceVector,
    WorkerSpec,
)

__all__ = [
    "InvalidPipelineError",
    "UnplaceableModelError",
    "catalogue_from_registry",
    "check_pipelines",
    "check_placeable",
    "registry_catalogue",
]


class UnplaceableModelError(ValueError):
    """A model whose resource vector fits on no worker; the one-line message names it."""


class InvalidPipelineError(ValueError):
    """A pipeline with a cycle, an unknown model or stage, or a duplicate stage name."""


def _describe(vector: ResourceVector) -> str:
    return f"(cpu {vector.cpu:g}, gpu {vector.gpu:g}, mem {vector.mem_gib:g} GiB)"


def check_placeable(models: Mapping[str, ModelSpec], workers: Iterable[WorkerSpec]) -> None:
    """Reject the first model (in mapping order) that fits on no worker.

    A model fits on a worker when its resource vector is within the worker's capacity in
    every dimension (:meth:`ResourceVector.fits_in`).

    Raises:
        UnplaceableModelError: naming the model, its resources, the largest capacity of
            any worker in each dimension and the dimensions it exceeds (when it exceeds
            none, it is the combination that fits on no single worker).
    """
    capacities = [worker.capacity for worker in workers]
    for name, model in models.items():
        if any(model.resources.fits_in(capacity) for capacity in capacities):
            continue
        if not capacities:
            raise UnplaceableModelError(f"model {name!r} fits on no worker: there are no workers")
        largest = ResourceVector(
            max(c.cpu for c in capacities),
            max(c.gpu for c in capacities),
            max(c.mem_gib for c in capacities),
        )
        need = model.resources
        over = [
            dimension
            for dimension, used, most in (
                ("cpu", need.cpu, largest.cpu),
                ("gpu", need.gpu, largest.gpu),
                ("mem", need.mem_gib, largest.mem_gib),
            )
            if used > most + 1e-9
        ]
        why = (
            f"exceeds the largest worker in {', '.join(over)}"
            if over
            else "no single worker has all of it free"
        )
        raise UnplaceableModelError(
            f"model {name!r} fits on no worker: it needs {_describe(need)}, the largest "
            f"worker capacity is {_describe(largest)} per dimension; {why}"
        )


def check_pipelines(models: Mapping[str, ModelSpec], pipelines: Mapping[str, PipelineSpec]) -> None:
    """The registry's pipeline checks, for catalogues built in code.

    Raises:
        InvalidPipelineError: naming the pipeline and the stage: a key that differs from
            the pipeline's name, no stages, a duplicate stage name, an ``after`` naming
            an unknown stage, a stage naming an unknown model, an LLM stage with no
            output tokens or bad choices, a ``when`` naming a stage
            it does not run after or a label that stage never answers, a cycle (its
            stages), or a non-positive SLO.
    """
    for name, model in models.items():
        problem = labels_problem(model.labels)
        if problem is not None:
            raise InvalidPipelineError(f"model {name!r}: {problem}")
    for key, pipeline in pipelines.items():
        where = f"pipeline {key!r}"
        if pipeline.name != key:
            raise InvalidPipelineError(f"{where}: is keyed by a different name {pipeline.name!r}")
        if not pipeline.stages:
            raise InvalidPipelineError(f"{where}: has no stages")
        if not pipeline.slo_s > 0:
            raise InvalidPipelineError(f"{where}: slo_s must be > 0, got {pipeline.slo_s!r}")
        names = [stage.name for stage in pipeline.stages]
        for index, stage in enumerate(pipeline.stages):
            if stage.name in names[:index]:
                raise InvalidPipelineError(f"{where}: duplicate stage name {stage.name!r}")
            if stage.llm is not None:
                if not stage.llm.output_tokens >= 1:
                    raise InvalidPipelineError(
                        f"{where}: LLM stage {stage.name!r}: output_tokens must be >= 1, "
                        f"got {stage.llm.output_tokens!r}"
                    )
                problem = labels_problem(stage.llm.choices)
                if problem is not None:
                    raise InvalidPipelineError(f"{where}: LLM stage {stage.name!r}: {problem}")
            elif stage.model not in models:
                raise InvalidPipelineError(
                    f"{where}: stage {stage.name!r} names an unknown model {stage.model!r}"
                )
            for name in stage.after:
                if name not in names:
                    raise InvalidPipelineError(
                        f"{where}: stage {stage.name!r} runs after an unknown stage {name!r}"
                    )
        labels_of = {
            s.name: s.labels
            if s.labels is not None
            else tuple(label for label, _ in models[s.model].labels)
            for s in pipeline.stages
        }
        for stage in pipeline.stages:
            problem = condition_problem(stage, labels_of)
            if problem is not None:
                raise InvalidPipelineError(f"{where}: stage {stage.name!r}: {problem}")
        cycle = find_cycle({stage.name: stage.after for stage in pipeline.stages})
        if cycle is not None:
            raise InvalidPipelineError(f"{where}: cycle {' -> '.join(cycle)}")
        for name in pipeline.answer:
            if name not in names:
                raise InvalidPipelineError(f"{where}: answer names an unknown stage {name!r}")


def catalogue_from_registry(
    registry: Registry, workers: Iterable[WorkerSpec]
) -> tuple[dict[str, ModelSpec], dict[str, PipelineSpec]]:
    """The registry's models and pipelines as contract types, keyed by name (file order).

    The registry has already checked the pipelines (cycles, unknown models and stages);
    this adds the check that needs the cluster.

    Raises:
        UnplaceableModelError: for a model that fits on no worker.
    """
    models, pipelines = registry_catalogue(registry)
    check_placeable(models, workers)
    return models, pipelines


def registry_catalogue(
    registry: Registry,
) -> tuple[dict[str, ModelSpec], dict[str, PipelineSpec]]:
    """The registry's models and pipelines as contract types, keyed by name (file order),
    with no cluster to check them against (the live stack's workers come and go)."""
    models = {
        name: ModelSpec(
            name=name,
            resources=ResourceVector(
                entry.resources.cpu, entry.resources.gpu, entry.resources.mem_gib
            ),
            load_s=entry.load_s,
            exec_s=entry.exec_s,
            labels=tuple(entry.labels.items()),
        )
        for name, entry in registry.models.items()
    }
    pipelines = {
        entry.name: PipelineSpec(
            name=entry.name,
            stages=tuple(stage.to_stage() for stage in entry.stages),
            slo_s=entry.slo_s,
            answer=entry.answer,
        )
        for entry in registry.pipelines
    }
    return models, pipelines
