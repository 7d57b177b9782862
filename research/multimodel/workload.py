"""Multi-model workloads: from the Alibaba GenAI LoRA request trace, and synthetic mixes.

Both build a :class:`~switchyard.multimodel.model.Workload` (catalogue + requests,
arrivals sorted, the first at 0.0 s) and are deterministic for a seed.

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
  the same base model ``M``, one of two with equal chance: ``M+upscale`` (two stages:
  ``generate`` -> ``upscale``) or ``M+full`` (``encode`` -> ``generate`` ->
  {``upscale``, ``safety``}: the generated image is an intermediate shared by two
  downstream stages). The added models, :data:`AUXILIARY_MODELS`, are assumptions sized
  like a CLIP text encoder, a Real-ESRGAN x4 upscaler and a CLIP-vision safety checker.

**Synthetic mixes** (:func:`synthetic_workload`): see its docstring for the exact
definitions of ``fluctuation``, ``invocation_ratio`` and the load step.
"""

from __future__ import annotations

import csv
import functools
import math
import os
import random
import statistics
from collections import Counter, defaultdict
from collections.abc import Mapping
from datetime import datetime
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

from research.multimodel.cluster import BUNDLED_DATA_DIR, TraceFileError, alibaba_trace_file

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

LORA_FILE = "v2026-GenAI_lora_request_trace.csv"
LORA_SAMPLE = BUNDLED_DATA_DIR / "alibaba_lora_sample.csv"

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

_TIME_FORMAT = "%Y-%m-%d %H:%M:%S"


def _pipeline(
    name: str, stages: tuple[Stage, ...], models: Mapping[str, ModelSpec], slo_factor: float
) -> PipelineSpec:
    draft = PipelineSpec(name=name, stages=stages, slo_s=1.0)
    return PipelineSpec(name=name, stages=stages, slo_s=slo_factor * critical_path_s(draft, models))


def _positive(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name}: must be a finite number > 0, got {value!r}")


def _share(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name}: must be within [0, 1], got {value!r}")


class _Row:
    __slots__ = ("at", "exec_s", "model", "steps")  # steps: inference steps x images

    def __init__(self, at: datetime, exec_s: float, model: str, steps: float) -> None:
        self.at = at
        self.exec_s = exec_s
        self.model = model
        self.steps = steps


@functools.lru_cache(maxsize=4)
def _read_lora(file: Path) -> tuple[_Row, ...]:
    """The trace's rows, sorted by time; read once per file and process (a sweep builds
    a workload per setting and seed from the same file)."""
    try:
        handle = file.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise TraceFileError(f"LoRA trace {file}: cannot read: {exc.strerror}") from None
    needed = {
        "gmt_create",
        "predict_status",
        "exec_time_seconds",
        "num_inference_steps",
        "checkpoint_model_version_id",
    }
    rows: list[_Row] = []
    with handle:
        reader = csv.DictReader(handle)
        missing = needed - set(reader.fieldnames or ())
        if missing:
            raise TraceFileError(
                f"LoRA trace {file}: missing column(s) {', '.join(sorted(missing))}"
            )
        for row in reader:
            if row["predict_status"] != "SUCCEED":
                continue
            try:
                at = datetime.strptime(row["gmt_create"], _TIME_FORMAT)
                exec_s = float(row["exec_time_seconds"])
                steps = float(row["num_inference_steps"] or "nan") * float(
                    row.get("num_images_per_prompt") or "1"
                )
            except ValueError as exc:
                raise TraceFileError(f"LoRA trace {file} line {reader.line_num}: {exc}") from None
            model = row["checkpoint_model_version_id"].strip()
            if not (math.isfinite(exec_s) and exec_s > 0) or not model:
                raise TraceFileError(
                    f"LoRA trace {file} line {reader.line_num}: a SUCCEED row needs a "
                    "positive exec_time_seconds and a checkpoint_model_version_id"
                )
            rows.append(_Row(at, exec_s, model, steps))
    rows.sort(key=lambda r: r.at)  # stable: rows of the same second keep file order
    return tuple(rows)


def _base_models(rows: list[_Row], names: list[str]) -> dict[str, ModelSpec]:
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
    _positive("time_scale", time_scale)
    _positive("slo_factor", slo_factor)
    _share("pipeline_share", pipeline_share)
    if models is not None and models < 1:
        raise ValueError(f"models: must be >= 1, got {models}")
    if max_requests is not None and max_requests < 1:
        raise ValueError(f"max_requests: must be >= 1, got {max_requests}")
    file = Path(path) if path is not None else alibaba_trace_file(LORA_FILE, LORA_SAMPLE)
    rows = list(_read_lora(file))
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
        name: _pipeline(name, (Stage(name="generate", model=name),), catalogue, slo_factor)
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
            pipelines[f"{name}+upscale"] = _pipeline(f"{name}+upscale", two, catalogue, slo_factor)
            pipelines[f"{name}+full"] = _pipeline(f"{name}+full", full, catalogue, slo_factor)

    rng = random.Random(seed)
    multi = set(rng.sample(range(len(rows)), round(pipeline_share * len(rows))))
    start = rows[0].at
    requests = []
    for index, row in enumerate(rows):
        pipeline = row.model
        if index in multi:
            pipeline += "+upscale" if rng.random() < 0.5 else "+full"
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
        pipelines[name] = _pipeline(name, stages, models, slo_factor)
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
    _positive("rate_rps", rate_rps)
    _positive("duration_s", duration_s)
    _positive("period_s", period_s)
    _positive("slo_factor", slo_factor)
    _share("fluctuation", fluctuation)
    _share("invocation_ratio", invocation_ratio)
    if popularity_skew < 0 or not math.isfinite(popularity_skew):
        raise ValueError(f"popularity_skew: must be a finite number >= 0, got {popularity_skew!r}")
    if (step_factor is None) != (step_at_s is None):
        raise ValueError("step_factor and step_at_s: give both or neither")
    if step_factor is not None and step_at_s is not None:
        _positive("step_factor", step_factor)
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
        name: _pipeline(name, (Stage(name="s0", model=name),), catalogue, slo_factor)
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
