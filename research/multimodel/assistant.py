"""The ``assistant`` workload of ``switchyard multimodel``: calls to the pipelines with LLM
stages that the live stack serves (``SWITCHYARD_PIPELINE_CATALOGUE=assistant``,
:data:`~switchyard.serving.pipelines.ASSISTANT_PIPELINES`), and the LLM workers that run
those stages.

The calls arrive as a Poisson stream of ``rate_rps`` (times ``step_factor`` from
``step_at_s`` on, for responsiveness), each to one of ``pipelines`` drawn uniformly, with
an input of ``input_tokens`` (what the first LLM stages' prompts are). The intent
classifier of ``triage`` runs on the multi-model workers, placed by the policy under
comparison; every LLM stage runs on its application's LLM workers
(:mod:`research.multimodel.llm_stages`), by default one A100 worker per LLM model the
pipelines name, as the live stack's ``bench/llm_pipeline_bench.py`` runs them.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from switchyard.contracts.fields import WorkloadType
from switchyard.multimodel.model import MultiModelRequest, Workload
from switchyard.serving.pipelines import ASSISTANT_MODELS, ASSISTANT_PIPELINES

from research.multimodel.errors import SimulationInputError
from research.multimodel.llm_stages import LlmWorkers

__all__ = [
    "ASSISTANT_INPUT_TOKENS",
    "DEFAULT_LLM_GPU",
    "assistant_workload",
    "llm_applications",
    "parse_llm_workers",
]

ASSISTANT_INPUT_TOKENS = 200
"""A call's input by default, in tokens (the live bench's prompt)."""
DEFAULT_LLM_GPU = "a100-80gb"
"""The GPU of the default LLM workers: one per LLM model, ``a100-80gb/<model>``."""


def llm_applications(pipelines: Sequence[str]) -> tuple[str, ...]:
    """The LLM applications (served models) the named pipelines' LLM stages run on, in
    first-use order."""
    names: dict[str, None] = {}
    for name in pipelines:
        for stage in ASSISTANT_PIPELINES[name].stages:
            if stage.llm is not None:
                names.setdefault(stage.model)
    return tuple(names)


def parse_llm_workers(spec: str | None, pipelines: Sequence[str]) -> tuple[LlmWorkers, ...]:
    """The LLM workers of ``spec``: comma-separated ``MODEL=PROFILE[:COUNT]`` (``PROFILE``
    a performance profile, ``gpu/model``, as ``switchyard simulate --gpu`` takes); None:
    one ``a100-80gb`` worker per LLM model of ``pipelines``. Every LLM model the
    pipelines use needs workers.

    Raises:
        SimulationInputError: a malformed entry, a count below 1, a model given twice or
            one the pipelines use left without workers, naming it.
    """
    needed = llm_applications(pipelines)
    if spec is None:
        return tuple(LlmWorkers(m, (f"{DEFAULT_LLM_GPU}/{m}",)) for m in needed)
    groups: dict[str, tuple[str, ...]] = {}
    for entry in (part.strip() for part in spec.split(",")):
        model, equals, rest = entry.partition("=")
        profile, colon, count_text = rest.partition(":")
        if not equals or not model.strip() or not profile.strip():
            raise SimulationInputError(
                f"--llm-workers: {entry!r} is not MODEL=PROFILE[:COUNT] "
                "(e.g. llama-2-13b=a100-80gb/llama-2-13b:2)"
            )
        try:
            count = int(count_text) if colon else 1
        except ValueError:
            raise SimulationInputError(
                f"--llm-workers: the count of {entry!r} is not a whole number"
            ) from None
        if count < 1:
            raise SimulationInputError(f"--llm-workers: {entry!r} needs a count of at least 1")
        model = model.strip()
        if model in groups:
            raise SimulationInputError(f"--llm-workers: {model!r} is given twice")
        groups[model] = (profile.strip(),) * count
    missing = [m for m in needed if m not in groups]
    if missing:
        raise SimulationInputError(
            f"--llm-workers: no workers for {', '.join(missing)}, which the pipelines use"
        )
    return tuple(
        LlmWorkers(model, profiles, WorkloadType.CONVERSATION) for model, profiles in groups.items()
    )


def assistant_workload(
    *,
    rate_rps: float,
    duration_s: float,
    seed: int,
    pipelines: Sequence[str] = tuple(ASSISTANT_PIPELINES),
    input_tokens: int = ASSISTANT_INPUT_TOKENS,
    step_factor: float = 1.0,
    step_at_s: float | None = None,
) -> Workload:
    """Poisson calls to ``pipelines`` (see the module docstring); deterministic for a seed.

    Raises:
        SimulationInputError: an unknown pipeline (naming the known ones), a rate,
            duration, input or step factor that is not positive.
    """
    unknown = [p for p in pipelines if p not in ASSISTANT_PIPELINES]
    if unknown or not pipelines:
        raise SimulationInputError(
            f"unknown assistant pipeline {', '.join(unknown) or '(none given)'}; "
            f"known: {', '.join(ASSISTANT_PIPELINES)}"
        )
    for name, value in {
        "rate_rps": rate_rps,
        "duration_s": duration_s,
        "step_factor": step_factor,
    }.items():
        if not value > 0:
            raise SimulationInputError(f"{name} must be > 0, got {value!r}")
    if input_tokens < 1:
        raise SimulationInputError(f"input_tokens must be at least 1, got {input_tokens!r}")
    rng = random.Random(f"assistant:{seed}")
    requests: list[MultiModelRequest] = []
    now_s = 0.0
    while now_s < duration_s:
        stepped = step_at_s is not None and now_s >= step_at_s
        pipeline = pipelines[rng.randrange(len(pipelines))]
        requests.append(
            MultiModelRequest(f"a{len(requests)}", now_s, pipeline, input_tokens=input_tokens)
        )
        now_s += rng.expovariate(rate_rps * (step_factor if stepped else 1.0))
    return Workload(
        name="assistant",
        models=ASSISTANT_MODELS,
        pipelines={name: ASSISTANT_PIPELINES[name] for name in dict.fromkeys(pipelines)},
        requests=tuple(requests),
        step_at_s=step_at_s if step_factor != 1.0 else None,
    )
