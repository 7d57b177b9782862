"""Multi-model workloads: from the Alibaba GenAI LoRA request trace, and synthetic mixes.

Both build a :class:`~switchyard.multimodel.model.Workload` (catalogue + requests,
arrivals sorted, the first at 0.0 s) and are deterministic for a seed. The LoRA trace's
workload (:func:`lora_workload`) lives in the library, :mod:`switchyard.multimodel.alibaba`
(its docstring gives the rules), because the live stack serves its catalogue too.

**Synthetic mixes** (:func:`synthetic_workload`): see its docstring for the exact
definitions of ``fluctuation``, ``invocation_ratio`` and the load step.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping

from switchyard.multimodel.alibaba import (
    AUXILIARY_MODELS,
    BASE_RESOURCES,
    LARGE_RESOURCES,
    LARGE_STEP_RATIO,
    lora_workload,
    pipeline_with_slo,
    require_positive,
    require_share,
)
from switchyard.multimodel.model import (
    ModelSpec,
    MultiModelRequest,
    PipelineSpec,
    ResourceVector,
    Stage,
    Workload,
)
from switchyard.traces.alibaba import LORA_FILE, LORA_SAMPLE

__all__ = [
    "AUXILIARY_MODELS",
    "BASE_RESOURCES",
    "LARGE_RESOURCES",
    "LARGE_STEP_RATIO",
    "LORA_FILE",
    "LORA_SAMPLE",
    "lora_workload",
    "synthetic_models",
    "synthetic_workload",
]


# (cpu, gpu, mem_gib), load_s range, exec_s range: small, medium, large model classes.
_SIZE_CLASSES = (
    (ResourceVector(1.0, 0.25, 4.0), (2.0, 5.0), (0.02, 0.1)),
    (ResourceVector(2.0, 0.5, 8.0), (5.0, 10.0), (0.1, 0.5)),
    (ResourceVector(4.0, 1.0, 16.0), (10.0, 20.0), (0.5, 2.0)),
)


def synthetic_models(count: int, seed: int) -> dict[str, ModelSpec]:
    """``count`` models ``m00``, ``m01``, ...: small, medium and large in turn (resources
    of :data:`_SIZE_CLASSES`: 0.25/0.5/1 GPU), ``load_s`` uniform and ``exec_s``
    log-uniform within the class's range, drawn with ``seed``."""
    if count < 1:
        raise ValueError(f"models: must be >= 1, got {count}")
    rng = random.Random(f"synthetic-models-{seed}")
    width = max(2, len(str(count - 1)))
    models = {}
    for index in range(count):
        resources, (load_lo, load_hi), (exec_lo, exec_hi) = _SIZE_CLASSES[index % 3]
        name = f"m{index:0{width}d}"
        models[name] = ModelSpec(
            name=name,
            resources=resources,
            load_s=round(rng.uniform(load_lo, load_hi), 3),
            exec_s=round(math.exp(rng.uniform(math.log(exec_lo), math.log(exec_hi))), 4),
        )
    return models


def _multi_stage(
    models: Mapping[str, ModelSpec], count: int, rng: random.Random, slo_factor: float
) -> dict[str, PipelineSpec]:
    names = list(models)
    pipelines = {}
    for index in range(count):
        shape = index % 3 if len(names) >= 3 else 0
        picked = rng.sample(names, 2 if shape == 0 else 3)
        stages: tuple[Stage, ...]
        if shape == 0:  # a -> b
            stages = (
                Stage(name="s0", model=picked[0]),
                Stage(name="s1", model=picked[1], after=("s0",)),
            )
        elif shape == 1:  # a -> b -> c
            stages = (
                Stage(name="s0", model=picked[0]),
                Stage(name="s1", model=picked[1], after=("s0",)),
                Stage(name="s2", model=picked[2], after=("s1",)),
            )
        else:  # a -> {b, c}: a's output is shared by two stages
            stages = (
                Stage(name="s0", model=picked[0]),
                Stage(name="s1", model=picked[1], after=("s0",)),
                Stage(name="s2", model=picked[2], after=("s0",)),
            )
        name = f"pipe{index:02d}"
        pipelines[name] = pipeline_with_slo(name, stages, models, slo_factor)
    return pipelines


def _zipf_weights(count: int, skew: float) -> list[float]:
    return [1.0 / (rank**skew) for rank in range(1, count + 1)]


def synthetic_workload(
    *,
    models: int | Mapping[str, ModelSpec] = 12,
    rate_rps: float,
    duration_s: float,
    fluctuation: float = 0.0,
    invocation_ratio: float = 0.0,
    step_factor: float | None = None,
    step_at_s: float | None = None,
    seed: int = 0,
    period_s: float = 60.0,
    popularity_skew: float = 1.0,
    n_pipelines: int | None = None,
    slo_factor: float = 4.0,
) -> Workload:
    """A synthetic multi-model mix; the same arguments give the same requests.

    Catalogue: ``models`` (a count, built by :func:`synthetic_models`, or given); one
    single-stage pipeline per model, named like the model; and ``n_pipelines`` multi-stage
    pipelines ``pipe00``, ... (default ``max(1, len(models) // 2)``), of three shapes in
    turn over models drawn with ``seed``: ``a -> b``, ``a -> b -> c`` and ``a -> {b, c}``
    (an intermediate shared by two stages; with fewer than 3 models, all ``a -> b``).
    SLO: ``slo_factor`` times the critical path at speed 1.0.

    Arrivals: a request at 0.0 s, then a non-homogeneous Poisson process (by thinning)
    of rate ``rate_rps * (1 + fluctuation * sin(2 pi t / period_s)) * step(t)`` up to
    ``duration_s``, where ``step(t) = step_factor`` for ``t >= step_at_s`` and 1 before.

    - ``fluctuation`` in [0, 1]: the relative amplitude of the sinusoidal modulation: 0
      is a constant rate (Poisson arrivals), 1 a rate swinging between 0 and twice the
      mean every ``period_s``. The mean rate over whole periods stays ``rate_rps``.
    - ``invocation_ratio`` in [0, 1]: the share of requests that invoke a multi-stage
      pipeline rather than a single model: exactly ``round(ratio * n)`` of the ``n``
      requests, drawn with ``seed``. Single-model requests pick a model, multi-stage ones
      a pipeline, with Zipf popularity ``1 / rank ** popularity_skew`` (0: uniform).
    - ``step_factor``/``step_at_s``: both or neither; the rate is multiplied by
      ``step_factor`` from ``step_at_s`` on (``Workload.step_at_s`` records it).

    Every request has ``exec_scale = 1.0``.
    """
    require_positive("rate_rps", rate_rps)
    require_positive("duration_s", duration_s)
    require_positive("period_s", period_s)
    require_positive("slo_factor", slo_factor)
    require_share("fluctuation", fluctuation)
    require_share("invocation_ratio", invocation_ratio)
    if popularity_skew < 0 or not math.isfinite(popularity_skew):
        raise ValueError(f"popularity_skew: must be a finite number >= 0, got {popularity_skew!r}")
    if (step_factor is None) != (step_at_s is None):
        raise ValueError("step_factor and step_at_s: give both or neither")
    if step_factor is not None and step_at_s is not None:
        require_positive("step_factor", step_factor)
        if not 0 < step_at_s < duration_s:
            raise ValueError(f"step_at_s: must be within (0, duration_s), got {step_at_s!r}")
    catalogue = synthetic_models(models, seed) if isinstance(models, int) else dict(models)
    if not catalogue:
        raise ValueError("models: needs at least one model")
    count = max(1, len(catalogue) // 2) if n_pipelines is None else n_pipelines
    if count < 0:
        raise ValueError(f"n_pipelines: must be >= 0, got {count}")
    if invocation_ratio > 0 and (count == 0 or len(catalogue) < 2):
        raise ValueError("invocation_ratio > 0 needs a multi-stage pipeline (2+ models)")

    clash = sorted(set(catalogue) & {f"pipe{index:02d}" for index in range(count)})
    if clash:
        raise ValueError(f"models: names {', '.join(clash)} clash with the pipeline names")
    rng = random.Random(f"synthetic-workload-{seed}")
    single = {
        name: pipeline_with_slo(name, (Stage(name="s0", model=name),), catalogue, slo_factor)
        for name in catalogue
    }
    multi = _multi_stage(catalogue, count if len(catalogue) >= 2 else 0, rng, slo_factor)

    factor = step_factor if step_factor is not None else 1.0
    peak = rate_rps * (1.0 + fluctuation) * max(1.0, factor)
    arrivals = [0.0]
    now = 0.0
    while True:
        now += rng.expovariate(peak)
        if now >= duration_s:
            break
        rate = rate_rps * (1.0 + fluctuation * math.sin(2.0 * math.pi * now / period_s))
        if step_at_s is not None and now >= step_at_s:
            rate *= factor
        if rng.random() * peak < rate:
            arrivals.append(now)

    n_multi = round(invocation_ratio * len(arrivals))
    to_multi = set(rng.sample(range(len(arrivals)), n_multi))
    single_names, multi_names = list(single), list(multi)
    single_weights = _zipf_weights(len(single_names), popularity_skew)
    multi_weights = _zipf_weights(len(multi_names), popularity_skew)
    requests = []
    for index, arrival in enumerate(arrivals):
        if index in to_multi:
            pipeline = rng.choices(multi_names, multi_weights)[0]
        else:
            pipeline = rng.choices(single_names, single_weights)[0]
        requests.append(
            MultiModelRequest(request_id=f"syn-{index:06d}", arrival_s=arrival, pipeline=pipeline)
        )
    return Workload(
        name=(
            f"synthetic(rate={rate_rps:g},fluctuation={fluctuation:g},"
            f"invocation={invocation_ratio:g})"
        ),
        models=catalogue,
        pipelines={**single, **multi},
        requests=tuple(requests),
        step_at_s=step_at_s,
    )
