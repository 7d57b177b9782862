"""The request plan of a replay: which HTTP request each trace row becomes.

A trace (:class:`~switchyard.traces.Trace`) gives arrival times and, for LLM rows, prompt
and output lengths. :func:`build_plan` turns it into a list of :class:`PlannedRequest`,
one per row, at the row's arrival time:

- ``llm``: every row is an OpenAI completion, ``POST /v1/completions``, for the
  application its workload maps to (:data:`DEFAULT_APP_MAP`: conversation ->
  ``llama-2-7b``, code -> ``llama-2-13b``, other -> ``llama-2-7b``); ``max_tokens`` is
  the row's output length and ``switchyard.prompt_tokens`` its prompt length (the
  prompt text is empty: the stack's emulated workers need only the lengths).
- ``classification``: every row is ``POST /v1/apps/{app}/infer`` with the features of a
  held-out test row of one of the bundled datasets (:data:`CLASSIFICATION_APPS`: the
  application is drawn uniformly, the row with the dataset's default class mix).
- ``mixed``: a seeded ``classification_share`` of the rows (exactly
  ``round(share * rows)``, chosen uniformly) are classification, the rest LLM.

Everything random is drawn from one ``numpy.random.Generator`` seeded with ``seed``:
one trace, mix and seed give one plan.

``multimodel`` takes no trace: :func:`multimodel_plan` replays the requests of the
Alibaba GenAI LoRA trace's bundled sample, as
:func:`switchyard.multimodel.alibaba.lora_workload` builds them with
:data:`~switchyard.serving.pipelines.ALIBABA_LORA_OPTIONS`, the options the live stack's
``alibaba-lora`` catalogue is built with (``SWITCHYARD_PIPELINE_CATALOGUE=alibaba-lora``),
so every pipeline name is one the stack serves. Each request is a ``pipeline`` call,
``POST /v1/apps/{pipeline}/infer`` with ``{"request_id", "exec_scale", "input"}``: the
row's execution time over its model's mean, and a short prompt. ``seed`` replaces the
options' seed (0), which only draws which requests go to the multi-stage pipelines
(``M-upscale``, ``M-full``): the catalogue is the same for every seed.

Time: ``arrival_s`` is the workload's, trace time already compressed 1000x: seconds of
the multi-model simulator, whose models run at their catalogue times (``load_s``,
``exec_s`` in model seconds). Emulated workers run ``SWITCHYARD_WORKER_TIME_SCALE`` (T)
times faster than model time, so replay with ``--speedup T`` for the offered load, in
requests per model second, to be the simulator's.

Example::

    from switchyard.traces import resolve_trace
    plan = build_plan(resolve_trace("azure-conv-sample"), "mixed", limit=200, seed=1)
    pipelines = multimodel_plan(limit=100)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from switchyard.contracts.messages import WorkloadType
from switchyard.multimodel.model import MultiModelRequest
from switchyard.traces import Trace, head

__all__ = [
    "CLASSIFICATION_APPS",
    "DEFAULT_APP_MAP",
    "MIX_NAMES",
    "MULTIMODEL_CATALOGUE",
    "PIPELINE_PROMPT",
    "PlanError",
    "PlannedRequest",
    "RequestKind",
    "build_plan",
    "check_mix_name",
    "multimodel_plan",
    "parse_app_map",
    "pipeline_calls",
]

RequestKind = Literal["llm", "classification", "pipeline"]

MIX_NAMES: tuple[str, ...] = ("llm", "classification", "mixed", "multimodel")
"""The mixes: the first three are plans of a trace (:func:`build_plan`), ``multimodel``
the plan of the bundled LoRA sample (:func:`multimodel_plan`)."""

TRACE_MIXES: tuple[str, ...] = ("llm", "classification", "mixed")
"""The mixes :func:`build_plan` makes from a trace."""

MULTIMODEL_CATALOGUE = "alibaba-lora"
"""The pipeline catalogue (``SWITCHYARD_PIPELINE_CATALOGUE``) the ``multimodel`` plan's
pipelines belong to: the stack replayed against must serve it."""

PIPELINE_PROMPT = "a watercolour lighthouse on a cliff at dusk"
"""The ``input`` of every pipeline call: the trace has no prompts, and the stack's
emulated workers need none."""

CLASSIFICATION_APPS: tuple[str, ...] = ("digits", "fraud-like", "wine-dominant")
"""The classification applications a plan draws from (the bundled datasets)."""

DEFAULT_APP_MAP: Mapping[WorkloadType, str] = {
    WorkloadType.CONVERSATION: "llama-2-7b",
    WorkloadType.CODE: "llama-2-13b",
    WorkloadType.OTHER: "llama-2-7b",
}
"""The LLM application (OpenAI ``model``) each workload is sent to unless mapped."""

LLM_PATH = "/v1/completions"


class PlanError(ValueError):
    """A mix, share, limit or application map that cannot make a plan; one line says why."""


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    """One request of a replay, before it is sent.

    Attributes:
        index: position in the plan (0-based); the request id is ``<run id>-<index>``.
        arrival_s: seconds after the trace's first row at which it is due (before the
            speedup divides it).
        kind: ``"llm"``, ``"classification"`` or ``"pipeline"``.
        app: the OpenAI ``model`` (LLM), the classification application or the pipeline.
        workload: the trace row's workload (``code``, ``conversation``, ``other``), or
            ``classification`` or ``pipeline`` for those kinds.
        prompt_tokens: the trace row's prompt length (LLM; None for classification).
        max_tokens: the trace row's output length (LLM; None for classification).
        features: the feature vector (classification; empty for LLM).
        true_label: the dataset label of the features (classification; else None).
        prefix_blocks: the trace row's prompt block ids (LLM, when the trace has them,
            as the Mooncake format does; sent so that prefix caches see shared prefixes).
        exec_scale: a pipeline call's execution time over its model's mean (pipeline;
            else None).
    """

    index: int
    arrival_s: float
    kind: RequestKind
    app: str
    workload: str
    prompt_tokens: int | None = None
    max_tokens: int | None = None
    features: tuple[float, ...] = ()
    true_label: int | None = None
    prefix_blocks: tuple[int, ...] = ()
    exec_scale: float | None = None

    @property
    def path(self) -> str:
        """The URL path the request is posted to, relative to the target."""
        if self.kind == "llm":
            return LLM_PATH
        return f"/v1/apps/{self.app}/infer"

    def request_id(self, run_id: str) -> str:
        """``<run id>-<index>``: the id the request carries, unique within a run."""
        return f"{run_id}-{self.index}"

    def body(self, run_id: str) -> dict[str, Any]:
        """The JSON body of the request in the run ``run_id``."""
        request_id = self.request_id(run_id)
        if self.kind == "llm":
            options: dict[str, Any] = {
                "prompt_tokens": self.prompt_tokens,
                # The trace's workload class: the predictor's feature, as in the simulator.
                "workload": self.workload,
                "request_id": request_id,
            }
            if self.prefix_blocks:
                options["prefix_blocks"] = list(self.prefix_blocks)
            return {
                "model": self.app,
                "prompt": "",
                "max_tokens": self.max_tokens,
                "stream": False,
                "switchyard": options,
            }
        if self.kind == "pipeline":
            return {
                "request_id": request_id,
                "exec_scale": 1.0 if self.exec_scale is None else self.exec_scale,
                "input": PIPELINE_PROMPT,
            }
        return {"features": list(self.features), "request_id": request_id}


def check_mix_name(mix: str) -> str:
    """``mix`` when it is one of :data:`MIX_NAMES`.

    Raises:
        PlanError: an unknown name.
    """
    if mix not in MIX_NAMES:
        raise PlanError(f"--mix: unknown mix {mix!r}; choose one of {', '.join(MIX_NAMES)}")
    return mix


def parse_app_map(text: str | None) -> dict[WorkloadType, str]:
    """:data:`DEFAULT_APP_MAP` with the ``workload=app,...`` entries of ``text`` applied.

    Example: ``parse_app_map("code=tiny-lm")[WorkloadType.CODE] == "tiny-lm"``.

    Raises:
        PlanError: an entry without ``=``, an unknown workload, an empty application
            name, or a workload given twice.
    """
    mapping = dict(DEFAULT_APP_MAP)
    if text is None:
        return mapping
    seen: set[WorkloadType] = set()
    known = ", ".join(w.value for w in WorkloadType)
    for item in text.split(","):
        entry = item.strip()
        if not entry:
            continue
        key, equals, value = (part.strip() for part in entry.partition("="))
        if not equals:
            raise PlanError(f"--app-map: expected WORKLOAD=APP, got {entry!r}")
        try:
            workload = WorkloadType(key)
        except ValueError:
            raise PlanError(
                f"--app-map: unknown workload {key!r} in {entry!r}; known: {known}"
            ) from None
        if not value or any(ch.isspace() or ch == "/" for ch in value):
            raise PlanError(f"--app-map: bad application name {value!r} in {entry!r}")
        if workload in seen:
            raise PlanError(f"--app-map: workload {key!r} is mapped twice")
        seen.add(workload)
        mapping[workload] = value
    if not seen:
        raise PlanError("--app-map: expected WORKLOAD=APP[,WORKLOAD=APP...], got nothing")
    return mapping


def _classification_rows(
    count: int, apps: Sequence[str], rng: np.random.Generator
) -> list[tuple[str, tuple[float, ...], int]]:
    """``count`` (application, features, label) triples: the application drawn uniformly,
    the row from its dataset's test split with the dataset's default class mix."""
    if count == 0:
        return []
    try:
        from switchyard.apps.datasets import load_dataset, sample_stream
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise PlanError(
            f"classification requests need the bundled datasets, which need scikit-learn "
            f"({exc}); install the ml extra: pip install 'switchyard[ml]'"
        ) from None
    chosen = rng.integers(0, len(apps), size=count)
    rows: list[tuple[str, tuple[float, ...], int] | None] = [None] * count
    for app_index, app in enumerate(apps):
        positions = np.flatnonzero(chosen == app_index)
        if positions.size == 0:
            continue
        try:
            dataset = load_dataset(app)
        except ImportError as exc:
            raise PlanError(
                f"classification requests need scikit-learn ({exc}); "
                "install the ml extra: pip install 'switchyard[ml]'"
            ) from None
        except ValueError as exc:  # an unknown dataset name
            raise PlanError(f"classification application: {exc}") from None
        features, labels = sample_stream(
            dataset, dataset.default_stream_mix, int(positions.size), rng
        )
        for position, vector, label in zip(positions, features, labels, strict=True):
            rows[int(position)] = (app, tuple(float(v) for v in vector), int(label))
    return [row for row in rows if row is not None]


def build_plan(
    trace: Trace,
    mix: str = "llm",
    limit: int | None = None,
    seed: int = 0,
    *,
    classification_share: float = 0.5,
    app_map: Mapping[WorkloadType, str] | None = None,
    classification_apps: Sequence[str] = CLASSIFICATION_APPS,
) -> list[PlannedRequest]:
    """The requests a replay of ``trace`` sends, one per row, in arrival order.

    Args:
        trace: arrival times, and the lengths and workload of LLM rows.
        mix: ``llm``, ``classification`` or ``mixed`` (see the module documentation).
        limit: use the first ``limit`` rows only; None uses them all.
        seed: seeds the choice of classification rows, applications and features.
        classification_share: with ``mixed``, the fraction of rows (0..1) that become
            classification requests; ignored otherwise.
        app_map: the LLM application per workload; missing workloads use
            :data:`DEFAULT_APP_MAP`.
        classification_apps: the classification applications to draw from.

    Returns:
        The plan: ``index`` 0..n-1 in arrival order, ``arrival_s`` from the trace.

    Raises:
        PlanError: an unknown mix or ``multimodel`` (which takes no trace: use
            :func:`multimodel_plan`), a limit below 1, a share outside [0, 1], no
            classification application, or missing scikit-learn.
    """
    check_mix_name(mix)
    if mix not in TRACE_MIXES:
        raise PlanError(
            f"--mix {mix} replays the bundled Alibaba LoRA sample, not a trace "
            "(loadgen.mixes.multimodel_plan)"
        )
    if limit is not None:
        if limit < 1:
            raise PlanError(f"--limit must be at least 1, got {limit}")
        trace = head(trace, limit)
    if not (math.isfinite(classification_share) and 0.0 <= classification_share <= 1.0):
        raise PlanError(
            f"--classification-share must be within [0, 1], got {classification_share:g}"
        )
    if mix != "llm" and not classification_apps:
        raise PlanError("no classification application to send requests to")
    apps_by_workload = {**DEFAULT_APP_MAP, **(app_map or {})}
    rows = trace.requests
    rng = np.random.default_rng(seed)
    if mix == "llm":
        is_classification = np.zeros(len(rows), dtype=bool)
    elif mix == "classification":
        is_classification = np.ones(len(rows), dtype=bool)
    else:
        is_classification = np.zeros(len(rows), dtype=bool)
        count = round(classification_share * len(rows))
        is_classification[rng.choice(len(rows), size=count, replace=False)] = True
    drawn = iter(_classification_rows(int(is_classification.sum()), classification_apps, rng))
    plan: list[PlannedRequest] = []
    for index, (row, classify) in enumerate(zip(rows, is_classification, strict=True)):
        if classify:
            app, features, label = next(drawn)
            plan.append(
                PlannedRequest(
                    index=index,
                    arrival_s=row.arrival_s,
                    kind="classification",
                    app=app,
                    workload="classification",
                    features=features,
                    true_label=label,
                )
            )
        else:
            plan.append(
                PlannedRequest(
                    index=index,
                    arrival_s=row.arrival_s,
                    kind="llm",
                    app=apps_by_workload[row.workload],
                    workload=row.workload.value,
                    prompt_tokens=row.prompt_tokens,
                    prefix_blocks=row.prefix_blocks,
                    max_tokens=row.output_tokens,
                )
            )
    return plan


def multimodel_plan(limit: int | None = None, seed: int = 0) -> list[PlannedRequest]:
    """The ``multimodel`` plan: one pipeline call per request of the Alibaba LoRA sample's
    workload (see the module documentation), in arrival order.

    Args:
        limit: keep the first ``limit`` requests of the whole workload (the same
            requests, to the same pipelines, as a replay of all of it begins with).
        seed: draws which requests go to the multi-stage pipelines (0: the simulator's
            and the stack's ``alibaba-lora`` default).

    Returns:
        The plan: ``index`` 0..n-1 in arrival order, ``arrival_s`` the workload's
        (simulator seconds: replay at ``--speedup`` the workers' time scale).

    Raises:
        PlanError: a limit below 1, or a bundled sample that cannot be read.
    """
    if limit is not None and limit < 1:
        raise PlanError(f"--limit must be at least 1, got {limit}")
    from switchyard.multimodel.alibaba import lora_workload
    from switchyard.serving.pipelines import ALIBABA_LORA_OPTIONS
    from switchyard.traces.alibaba import LORA_SAMPLE

    options = {**ALIBABA_LORA_OPTIONS, "seed": seed}
    try:
        workload = lora_workload(LORA_SAMPLE, **options)
    except ValueError as exc:  # TraceFileError included: a damaged installation
        raise PlanError(f"--mix multimodel: the bundled LoRA sample: {exc}") from None
    # Sorted here although the workload already is: the replay's schedule relies on it.
    requests = sorted(workload.requests, key=lambda request: request.arrival_s)
    if limit is not None:
        requests = requests[:limit]
    return pipeline_calls(requests)


def pipeline_calls(requests: Sequence[MultiModelRequest]) -> list[PlannedRequest]:
    """``requests`` (multi-model requests, in arrival order) as the pipeline calls a
    replay sends: ``POST /v1/apps/{pipeline}/infer`` with each request's ``exec_scale``."""
    return [
        PlannedRequest(
            index=index,
            arrival_s=request.arrival_s,
            kind="pipeline",
            app=request.pipeline,
            workload="pipeline",
            exec_scale=request.exec_scale,
        )
        for index, request in enumerate(requests)
    ]
