"""The multi-model workload of the Alibaba GenAI LoRA request trace.

It builds a :class:`~switchyard.multimodel.model.Workload` (catalogue + requests,
arrivals sorted, the first at 0.0 s), deterministic for a seed; the multi-model
simulator runs it, and the live stack serves its catalogue
(``SWITCHYARD_PIPELINE_CATALOGUE=alibaba-lora``) while the load generator replays its
requests (``--mix multimodel``).

**The LoRA trace** (:func:`lora_workload`; Lin et al., SoCC'25 and FlexPipe, EuroSys'26):
Stable-Diffusion serving, one row per request, 87 base models with skewed popularity.
Rules, with what is measured and what is assumed:

- Only ``predict_status = SUCCEED`` rows are used (the others have no meaningful
  execution time).
- Each base model (``checkpoint_model_version_id``) becomes a :class:`ModelSpec` whose
  ``exec_s`` is the mean ``exec_time_seconds`` of its rows (measured; the trace does not
  say which GPU ran them, so they are taken as speed-1.0 times).
- Resources, by size class (assumed; the trace gives no sizes). A model's mean seconds
  per image and inference step (``exec_time_seconds / (num_inference_steps *
  num_images_per_prompt)``) is the size proxy: a
  model at least :data:`LARGE_STEP_RATIO` times the median over all requests is *large*
  (SDXL-class: per-step cost about twice SD 1.5's), the others *base* (SD 1.5-class).
  Base: 2 cores, 0.5 GPU (an SD 1.5 fp16 pipeline takes ~4-5 GiB of GPU memory, so two
  share a 16-32 GiB GPU), 16 GiB, ``load_s`` 10 s. Large: 4 cores, 1 GPU, 32 GiB,
  ``load_s`` 20 s. The load times are assumptions (a 2-7 GB checkpoint from local disk
  plus moving it to the GPU).
- One single-stage pipeline per base model, named like the model (stage ``generate``),
  with ``slo_s = slo_factor * exec_s``.
- Requests: ``arrival_s = (gmt_create - first gmt_create) / time_scale`` (the default
  1000 compresses the ~23 days into ~34 minutes; execution times are not compressed, so
  the offered load grows by ``time_scale``); ``exec_scale`` = the row's execution time
  over its model's mean.
- ``models=N`` keeps the N most requested base models (and their requests);
  ``max_requests`` keeps the first requests after that.
- ``pipeline_share`` (synthetic, documented here): that share of requests (exactly
  ``round(share * n)``, drawn with ``seed``) is sent instead to a multi-stage pipeline of
  the same base model ``M``, one of two with equal chance: ``M-upscale`` (two stages:
  ``generate`` -> ``upscale``) or ``M-full`` (``encode`` -> ``generate`` ->
  {``upscale``, ``safety``}: the generated image is an intermediate shared by two
  downstream stages). The added models, :data:`AUXILIARY_MODELS`, are assumptions sized
  like a CLIP text encoder, a Real-ESRGAN x4 upscaler and a CLIP-vision safety checker.
"""

from __future__ import annotations

import math
import os
import random
import statistics
from collections import Counter, defaultdict
from collections.abc import Mapping
from pathlib import Path

from switchyard.multimodel.dag import critical_path_s
from switchyard.multimodel.model import (
    ModelSpec,
    MultiModelRequest,
    PipelineSpec,
    ResourceVector,
    Stage,
    Workload,
)
from switchyard.traces.alibaba import (
    LORA_FILE,
    LORA_SAMPLE,
    LoraRow,
    alibaba_trace_file,
    read_lora_rows,
)

__all__ = [
    "AUXILIARY_MODELS",
    "BASE_RESOURCES",
    "LARGE_RESOURCES",
    "LARGE_STEP_RATIO",
    "lora_workload",
    "pipeline_with_slo",
    "require_positive",
    "require_share",
]

LARGE_STEP_RATIO = 1.5
"""A base model is *large* (SDXL-class) when its mean seconds per image and inference step is at
least this many times the median over all (SUCCEED) requests."""
BASE_RESOURCES = (ResourceVector(2.0, 0.5, 16.0), 10.0)
"""(resources, load_s) of an SD 1.5-class base model (assumed)."""
LARGE_RESOURCES = (ResourceVector(4.0, 1.0, 32.0), 20.0)
"""(resources, load_s) of an SDXL-class base model (assumed)."""

AUXILIARY_MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="prompt-encoder",
            resources=ResourceVector(1.0, 0.25, 4.0),
            load_s=3.0,
            exec_s=0.1,
        ),
        ModelSpec(name="upscaler", resources=ResourceVector(2.0, 0.5, 8.0), load_s=5.0, exec_s=3.0),
        ModelSpec(
            name="safety-checker",
            resources=ResourceVector(1.0, 0.25, 4.0),
            load_s=3.0,
            exec_s=0.3,
        ),
    )
}
"""The models the synthetic LoRA pipelines add (assumed sizes and times)."""


def pipeline_with_slo(
    name: str, stages: tuple[Stage, ...], models: Mapping[str, ModelSpec], slo_factor: float
) -> PipelineSpec:
    """The pipeline of ``stages`` with an SLO of ``slo_factor`` times its critical path."""
    draft = PipelineSpec(name=name, stages=stages, slo_s=1.0)
    return PipelineSpec(name=name, stages=stages, slo_s=slo_factor * critical_path_s(draft, models))


def require_positive(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name}: must be a finite number > 0, got {value!r}")


def require_share(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name}: must be within [0, 1], got {value!r}")


def _base_models(rows: list[LoraRow], names: list[str]) -> dict[str, ModelSpec]:
    exec_by: dict[str, list[float]] = defaultdict(list)
    per_step_by: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        exec_by[row.model].append(row.exec_s)
        if math.isfinite(row.steps) and row.steps > 0:
            per_step_by[row.model].append(row.exec_s / row.steps)
    per_step = {m: statistics.fmean(v) for m, v in per_step_by.items()}
    # The median over requests (not over models): the typical request's cost per step,
    # which rarely used models with a handful of rows cannot drag down.
    every_step = [value for values in per_step_by.values() for value in values]
    median = statistics.median(every_step) if every_step else math.nan
    models = {}
    for name in names:
        large = name in per_step and per_step[name] >= LARGE_STEP_RATIO * median
        resources, load_s = LARGE_RESOURCES if large else BASE_RESOURCES
        models[name] = ModelSpec(
            name=name, resources=resources, load_s=load_s, exec_s=statistics.fmean(exec_by[name])
        )
    return models


def lora_workload(
    path: str | os.PathLike[str] | None = None,
    *,
    models: int | None = None,
    max_requests: int | None = None,
    time_scale: float = 1000.0,
    pipeline_share: float = 0.0,
    slo_factor: float = 4.0,
    seed: int = 0,
) -> Workload:
    """The multi-model mix of the Alibaba GenAI LoRA trace (rules in the module docstring).

    Args:
        path: the trace CSV; default the full trace (``$SWITCHYARD_TRACE_DIR/alibaba``,
            else ``../shared/traces/alibaba``), else the bundled 2,000-row sample.
        models: keep the N most requested base models (ties by name); None keeps all.
        max_requests: keep the first N requests (after ``models``); None keeps all.
        time_scale: trace seconds per simulated second of arrivals.
        pipeline_share: share of requests sent to the synthetic multi-stage pipelines.
        slo_factor: each pipeline's SLO is this times its critical path at speed 1.0.
        seed: draws which requests go to the multi-stage pipelines.

    Raises:
        TraceFileError: for a missing or malformed file.
        ValueError: for a bad argument or when no request is left.
    """
    require_positive("time_scale", time_scale)
    require_positive("slo_factor", slo_factor)
    require_share("pipeline_share", pipeline_share)
    if models is not None and models < 1:
        raise ValueError(f"models: must be >= 1, got {models}")
    if max_requests is not None and max_requests < 1:
        raise ValueError(f"max_requests: must be >= 1, got {max_requests}")
    file = Path(path) if path is not None else alibaba_trace_file(LORA_FILE, LORA_SAMPLE)
    rows = list(read_lora_rows(file))
    popularity = Counter(row.model for row in rows)
    ranked = sorted(popularity, key=lambda m: (-popularity[m], m))
    kept = ranked if models is None else ranked[:models]
    base = _base_models(rows, kept)
    kept_set = set(kept)
    rows = [row for row in rows if row.model in kept_set]
    if max_requests is not None:
        rows = rows[:max_requests]
    if not rows:
        raise ValueError(f"LoRA trace {file}: no SUCCEED request left")

    catalogue: dict[str, ModelSpec] = dict(base)
    pipelines = {
        name: pipeline_with_slo(name, (Stage(name="generate", model=name),), catalogue, slo_factor)
        for name in kept
    }
    if pipeline_share > 0:
        catalogue.update(AUXILIARY_MODELS)
        for name in kept:
            two = (
                Stage(name="generate", model=name),
                Stage(name="upscale", model="upscaler", after=("generate",)),
            )
            full = (
                Stage(name="encode", model="prompt-encoder"),
                Stage(name="generate", model=name, after=("encode",)),
                Stage(name="upscale", model="upscaler", after=("generate",)),
                Stage(name="safety", model="safety-checker", after=("generate",)),
            )
            pipelines[f"{name}-upscale"] = pipeline_with_slo(
                f"{name}-upscale", two, catalogue, slo_factor
            )
            pipelines[f"{name}-full"] = pipeline_with_slo(
                f"{name}-full", full, catalogue, slo_factor
            )

    rng = random.Random(seed)
    multi = set(rng.sample(range(len(rows)), round(pipeline_share * len(rows))))
    start = rows[0].at
    requests = []
    for index, row in enumerate(rows):
        pipeline = row.model
        if index in multi:
            pipeline += "-upscale" if rng.random() < 0.5 else "-full"
        requests.append(
            MultiModelRequest(
                request_id=f"lora-{index:06d}",
                arrival_s=(row.at - start).total_seconds() / time_scale,
                pipeline=pipeline,
                exec_scale=row.exec_s / base[row.model].exec_s,
            )
        )
    name = "alibaba-lora-sample" if file.resolve() == LORA_SAMPLE.resolve() else "alibaba-lora"
    return Workload(name=name, models=catalogue, pipelines=pipelines, requests=tuple(requests))
