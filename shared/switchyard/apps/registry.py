"""The application registry: which classification applications exist and their variants.

A registry file is JSON (YAML too, for a ``.yaml``/``.yml`` name, when PyYAML is
installed)::

    {"applications": [{
        "name": "digits",
        "classes": ["0", "1", ..., "9"],
        "deadline_s": 0.15,
        "penalty": {"kind": "sigmoid", "steepness_per_s": 100, "midpoint_s": 0.05},
        "prior": {"kind": "jeffreys"},
        "stream_class_mix": [0.1, ..., 0.1],
        "dataset": "digits",
        "feature_dim": 64,
        "variants": {"mlp-small": {
            "latency_s": {"cpu": {"1": 2e-05, "32": 5e-05}},
            "memory_bytes": 11048, "load_s": 0.0012, "accuracy": 0.97,
            "recall": [1.0, ..., 0.96], "model_file": "digits/mlp-small.json"}}}]}

The same file also holds the multi-model applications (one registry for all
applications): ``models`` (name -> resource vector, load and execution seconds) and
``pipelines`` (DAGs of model stages, each with an SLO)::

    {"models": {"encoder": {"resources": {"cpu": 2, "gpu": 0.25, "mem_gib": 4},
                            "load_s": 3, "exec_s": 0.2}, ...},
     "pipelines": [{"name": "txt2img", "slo_s": 10, "stages": [
        {"name": "encode", "model": "encoder"},
        {"name": "generate", "model": "sd15", "after": ["encode"]},
        {"name": "upscale", "model": "esrgan", "after": ["generate"]}]}]}

A model with ``labels`` (label -> share of answers, summing to 1) is a classifier; a stage
with ``when`` runs only when the stage it names, one it runs after, answered that
label (``{"name": "upscale", "model": "esrgan", "after": ["check"], "when": {"stage":
"check", "label": "safe"}}``), and a ``when`` naming a stage it does not run after or a
label that stage's model never answers is rejected.

A stage with ``llm`` instead of ``model`` is an LLM stage: a completion of at most
``output_tokens`` tokens (128 unless given) by the LLM workers of that LLM application,
on the outputs of the stages before it; with ``choices`` (label -> share, summing to 1)
it answers one label instead (a verifier of a draft, a router), 1 output token unless
given, and a ``when`` after it can branch on them. A draft checked by a larger model::

    {"name": "draft-verify", "slo_s": 60, "stages": [
        {"name": "draft", "llm": "llama-2-7b", "output_tokens": 128},
        {"name": "verify", "llm": "llama-2-13b", "after": ["draft"],
         "choices": {"accept": 0.7, "reject": 0.3}},
        {"name": "revise", "llm": "llama-2-13b", "after": ["draft", "verify"],
         "when": {"stage": "verify", "label": "reject"}, "output_tokens": 128}],
     "answer": ["revise", "draft"]}

A pipeline's ``answer`` (optional) names the stages whose output answers a call: the
first of them that ran (here the revision when there is one, else the draft); without
it a call answers with the outputs of the stages run that no stage run after them reads.

When the registry declares ``llm_applications``, an ``llm`` must name one of them
(otherwise the serving catalogue checks it against the default LLM applications).

LLM applications name the model a client asks for (the OpenAI ``model`` field) and the
served model behind it::

    {"llm_applications": [{"name": "chat", "model": "llama-2-7b", "slo_s": 30,
                           "workload": "conversation", "ttft_slo_s": 0.8}]}

``ttft_slo_s`` and ``tpot_slo_s`` (optional) are the objectives its answers are judged by
(``token_slo_met`` in each answer); without them, its workload class's defaults
(:data:`switchyard.slo.DEFAULT_TOKEN_SLOS`).

``applications``, ``models``, ``pipelines`` and ``llm_applications`` are each optional,
but a registry needs at least one application, pipeline or LLM application. Every
application name (classification, pipeline, LLM) shares one namespace. A pipeline is rejected when it has a cycle (the message names the stages on
it), a stage names an unknown model, an ``after`` names an unknown stage, or two stages
share a name; every time must be positive. Every time is in seconds (``_s``).

The models here are frozen and validate every field (ranges, one value per class,
unique names, a known dataset whose feature count matches). :func:`~switchyard.apps.registry_file.load_registry` turns
every problem into one :class:`RegistryError` line naming the file and the field path::

    registry apps.json: applications[1].variants.mlp-small.accuracy: Input should be
    less than or equal to 1

The registry stores the prior's *specification* only; the estimation lives in
``switchyard.estimation``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from switchyard.apps.datasets import DATASET_NAMES, DATASET_SPECS, check_mix
from switchyard.apps.penalty import Penalty, PenaltyKind
from switchyard.multimodel.branching import condition_problem, labels_problem
from switchyard.multimodel.dag import find_cycle
from switchyard.multimodel.model import LlmStage, Stage, StageCondition

__all__ = [
    "Application",
    "ModelEntry",
    "PenaltySpec",
    "PipelineEntry",
    "PriorSpec",
    "Registry",
    "RegistryError",
    "ResourcesEntry",
    "StageEntry",
    "UnknownApplicationError",
    "VariantProfile",
]

Probability = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]
PositiveSeconds = Annotated[float, Field(gt=0.0, allow_inf_nan=False)]
BatchSize = Annotated[int, Field(ge=1)]
NonNegative = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
Name = Annotated[str, Field(min_length=1)]


class RegistryError(ValueError):
    """A registry file that cannot be read or is invalid; the message is one line."""


class UnknownApplicationError(KeyError):
    """An application name the registry does not hold; the message lists the known ones."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class FieldError(ValueError):
    """A cross-field problem found by a model validator, with the path below that model.

    pydantic keeps the raised exception in the error's context, so the path can be
    appended to the validator's location when the error is reported.
    """

    def __init__(self, path: tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.path = path


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PenaltySpec(_Frozen):
    """The penalty of lateness as stored: a kind and that kind's parameters."""

    kind: PenaltyKind
    span_s: float | None = None
    steepness_per_s: float | None = None
    midpoint_s: float | None = None

    @model_validator(mode="after")
    def _valid(self) -> PenaltySpec:
        try:
            self.to_penalty()
        except ValueError as exc:
            field, _, message = str(exc).partition(": ")
            raise FieldError((field,), message) from None
        return self

    def to_penalty(self) -> Penalty:
        """The :class:`Penalty` this specification describes."""
        return Penalty(
            kind=self.kind,
            span_s=self.span_s,
            steepness_per_s=self.steepness_per_s,
            midpoint_s=self.midpoint_s,
        )

    @classmethod
    def from_penalty(cls, penalty: Penalty) -> PenaltySpec:
        return cls(
            kind=penalty.kind,
            span_s=penalty.span_s,
            steepness_per_s=penalty.steepness_per_s,
            midpoint_s=penalty.midpoint_s,
        )


class PriorSpec(_Frozen):
    """Which Dirichlet prior SneakPeek uses for an application (the spec, not the maths).

    ``concentration`` scales the informative priors; ``None`` leaves the estimator's
    default. Jeffreys (every pseudo-count one half) is the default prior.
    """

    kind: Literal["jeffreys", "weak", "strong"] = "jeffreys"
    concentration: Annotated[float, Field(gt=0.0, allow_inf_nan=False)] | None = None


class VariantProfile(_Frozen):
    """One model variant's measured profile.

    Attributes:
        latency_s: worker type -> batch size -> seconds for one batch.
        memory_bytes: bytes the loaded model occupies.
        load_s: seconds to load the model from disk.
        accuracy: share of the test split classified right.
        recall: per class, the share of that class's test rows classified right.
        model_file: the model's file, relative to the registry file (``/`` separators).
    """

    latency_s: dict[str, dict[BatchSize, PositiveSeconds]] = Field(min_length=1)
    memory_bytes: int = Field(gt=0)
    load_s: float = Field(ge=0.0, allow_inf_nan=False)
    accuracy: Probability
    recall: tuple[Probability, ...]
    model_file: str = Field(min_length=1)

    @field_validator("latency_s")
    @classmethod
    def _batch_sizes(cls, value: dict[str, dict[int, float]]) -> dict[str, dict[int, float]]:
        for worker_type, by_batch in value.items():
            if not by_batch:
                raise FieldError((worker_type,), "needs at least one batch size")
        return value

    @field_validator("model_file")
    @classmethod
    def _relative(cls, value: str) -> str:
        if Path(value).is_absolute() or value.startswith(("/", "\\")):
            raise ValueError(f"must be relative to the registry file, got {value!r}")
        return value

    def latency_at(self, worker_type: str, batch_size: int) -> float:
        """The profiled seconds of one batch of ``batch_size`` on ``worker_type``.

        Raises:
            KeyError: for a worker type or batch size that was not profiled.
        """
        return self.latency_s[worker_type][batch_size]

    def model_path(self, registry_dir: Path) -> Path:
        """Where the model file lies, given the folder of the registry file."""
        return registry_dir / self.model_file


class Application(_Frozen):
    """One classification application: its classes, deadline, penalty, prior and variants."""

    name: str = Field(min_length=1)
    classes: tuple[str, ...]
    deadline_s: PositiveSeconds
    penalty: PenaltySpec
    prior: PriorSpec = PriorSpec()
    stream_class_mix: tuple[Probability, ...]
    dataset: str
    feature_dim: int = Field(gt=0)
    variants: dict[str, VariantProfile] = Field(min_length=1)

    @field_validator("classes")
    @classmethod
    def _unique_classes(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if len(value) < 2:
            raise ValueError(f"needs at least 2 classes, got {len(value)}")
        for index, name in enumerate(value):
            if name in value[:index]:
                raise FieldError((index,), f"duplicate class name {name!r}")
        return value

    @field_validator("dataset")
    @classmethod
    def _known_dataset(cls, value: str) -> str:
        if value not in DATASET_SPECS:
            raise ValueError(f"unknown dataset {value!r}; known: {', '.join(DATASET_NAMES)}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Application:
        classes = len(self.classes)
        try:
            check_mix(self.stream_class_mix, classes)
        except ValueError as exc:
            raise FieldError(("stream_class_mix",), str(exc).removeprefix("mix: ")) from None
        spec = DATASET_SPECS[self.dataset]
        if len(spec.class_names) != classes:
            raise FieldError(
                ("classes",),
                f"has {classes} classes, dataset {self.dataset!r} has {len(spec.class_names)}",
            )
        if spec.feature_dim != self.feature_dim:
            raise FieldError(
                ("feature_dim",),
                f"is {self.feature_dim}, dataset {self.dataset!r} has {spec.feature_dim} features",
            )
        for variant, profile in self.variants.items():
            if len(profile.recall) != classes:
                raise FieldError(
                    ("variants", variant, "recall"),
                    f"has {len(profile.recall)} values, expected one per class ({classes})",
                )
        return self

    def penalty_function(self) -> Penalty:
        """The application's :class:`Penalty`."""
        return self.penalty.to_penalty()


def _check_shares(value: dict[str, float]) -> dict[str, float]:
    problem = labels_problem(tuple(value.items()))
    if problem is not None:
        raise ValueError(problem)
    return value


Label = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._:/@~-]+$")]
"""A label as answers carry it (letters, digits and ``._:/@~-``, no spaces)."""

LabelShares = Annotated[dict[Label, float], AfterValidator(_check_shares)]
"""Labels and the share of answers each gets, summing to 1
(:func:`~switchyard.multimodel.branching.labels_problem`)."""


class ResourcesEntry(_Frozen):
    """A model's resource vector: cores, GPUs (fractions allowed) and GiB of memory."""

    cpu: NonNegative
    gpu: NonNegative
    mem_gib: NonNegative


class ModelEntry(_Frozen):
    """One servable model of the multi-model applications.

    Attributes:
        resources: what it takes on a worker while resident.
        load_s: seconds to load it onto a worker.
        exec_s: mean seconds to serve one request on a worker of speed 1.0.
    """

    resources: ResourcesEntry
    load_s: PositiveSeconds
    exec_s: PositiveSeconds
    labels: LabelShares = Field(default_factory=dict)
    """A classifier's answers and the share of requests each gets (summing to 1): a
    conditional stage after it branches on them."""


class ConditionEntry(_Frozen):
    """Run the stage only when stage ``stage`` (one it runs after) answered ``label``."""

    stage: Name
    label: Name


LLM_STAGE_OUTPUT_TOKENS = 128
"""An LLM stage's output tokens when it gives none (1 for a stage with ``choices``)."""


class StageEntry(_Frozen):
    """One stage of a pipeline: a ``model`` of the multi-model catalogue, or (``llm``) a
    completion by an LLM application's workers; run after the stages named in
    ``after``, and only ``when`` an earlier stage answered a given label."""

    name: Name
    model: Name | None = None
    llm: Name | None = None
    """The LLM application serving this stage (an LLM stage, instead of ``model``)."""
    after: tuple[Name, ...] = ()
    when: ConditionEntry | None = None
    output_tokens: int | None = Field(default=None, ge=1, le=1_000_000)
    """An LLM stage's most output tokens (128, or 1 with ``choices``, when not given)."""
    choices: LabelShares = Field(default_factory=dict)
    """An LLM stage that answers one of these labels, with the share of answers each
    gets from an emulated worker (summing to 1)."""

    @model_validator(mode="after")
    def _model_or_llm(self) -> StageEntry:
        if (self.model is None) == (self.llm is None):
            raise ValueError(
                "give exactly one of 'model' (a multi-model catalogue model) and 'llm' "
                "(an LLM application)"
            )
        if self.llm is None:
            for field, given in (("output_tokens", self.output_tokens), ("choices", self.choices)):
                if given:
                    raise FieldError((field,), "is for LLM stages (with 'llm'), not a model's")
        return self

    @property
    def labels(self) -> tuple[str, ...]:
        """An LLM stage's choices (a model stage's labels are its model's)."""
        return tuple(self.choices)

    def to_stage(self) -> Stage:
        """The stage as the multi-model catalogue's contract type."""
        when = None if self.when is None else StageCondition(self.when.stage, self.when.label)
        if self.llm is not None:
            default = 1 if self.choices else LLM_STAGE_OUTPUT_TOKENS
            llm = LlmStage(
                output_tokens=self.output_tokens or default, choices=tuple(self.choices.items())
            )
            return Stage(name=self.name, model=self.llm, after=self.after, when=when, llm=llm)
        assert self.model is not None
        return Stage(name=self.name, model=self.model, after=self.after, when=when)


class PipelineEntry(_Frozen):
    """A multi-model application: a DAG of stages and its latency SLO in seconds."""

    name: Name
    slo_s: PositiveSeconds
    stages: tuple[StageEntry, ...] = Field(min_length=1)
    answer: tuple[Name, ...] = ()
    """The stages whose output answers a call: the first of them that ran."""

    @model_validator(mode="after")
    def _a_dag(self) -> PipelineEntry:
        seen: dict[str, int] = {}
        for index, stage in enumerate(self.stages):
            if stage.name in seen:
                raise FieldError(
                    ("stages", index, "name"),
                    f"duplicate stage name {stage.name!r} (also stages[{seen[stage.name]}])",
                )
            seen[stage.name] = index
        for index, stage in enumerate(self.stages):
            for position, name in enumerate(stage.after):
                if name not in seen:
                    raise FieldError(
                        ("stages", index, "after", position),
                        f"unknown stage {name!r}; stages: {', '.join(seen)}",
                    )
                if name in stage.after[:position]:
                    raise FieldError(
                        ("stages", index, "after", position), f"stage {name!r} is named twice"
                    )
        cycle = find_cycle({stage.name: stage.after for stage in self.stages})
        if cycle is not None:
            raise FieldError(("stages",), f"cycle {' -> '.join(cycle)}")
        for position, name in enumerate(self.answer):
            if name not in seen:
                raise FieldError(
                    ("answer", position), f"unknown stage {name!r}; stages: {', '.join(seen)}"
                )
        return self


class LlmApplicationEntry(_Frozen):
    """An LLM application: the name clients send as the OpenAI ``model`` field.

    Attributes:
        name: the application (and OpenAI model) name.
        model: the served model: a performance-model model profile (``llama-2-7b``) for
            emulated workers, or ``tiny-lm`` for the real torch language model.
        slo_s: the latency objective; a request without a deadline gets arrival + slo_s.
        max_prompt_tokens: the longest prompt accepted.
        max_output_tokens: the most output tokens one request may ask for.
        workload: the workload class the predictor sees (``code``, ``conversation``,
            ``other``).
        ttft_slo_s, tpot_slo_s: the time-to-first-token and time-per-output-token
            objectives its answers are judged by; None: the workload class's default
            (:data:`switchyard.slo.DEFAULT_TOKEN_SLOS`).
    """

    name: Name
    model: Name
    slo_s: PositiveSeconds
    max_prompt_tokens: int = Field(default=8192, ge=1, le=10_000_000)
    max_output_tokens: int = Field(default=4096, ge=1, le=1_000_000)
    workload: Literal["code", "conversation", "other"] = "other"
    ttft_slo_s: PositiveSeconds | None = None
    tpot_slo_s: PositiveSeconds | None = None


class Registry(_Frozen):
    """Every application and pipeline, with unique names; see the module docstring for
    the format."""

    applications: tuple[Application, ...] = ()
    models: dict[Name, ModelEntry] = Field(default_factory=dict)
    pipelines: tuple[PipelineEntry, ...] = ()
    llm_applications: tuple[LlmApplicationEntry, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _something_given(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and not any(
            key in data for key in ("applications", "pipelines", "llm_applications")
        ):
            raise FieldError(
                ("applications",),
                "Field required (a registry needs applications, pipelines or llm_applications)",
            )
        return data

    @model_validator(mode="after")
    def _unique_names(self) -> Registry:
        if not self.applications and not self.pipelines and not self.llm_applications:
            raise FieldError(
                ("applications",),
                "needs at least one application, pipeline or LLM application",
            )
        seen: dict[str, str] = {}
        for index, app in enumerate(self.applications):
            if app.name in seen:
                raise FieldError(
                    ("applications", index, "name"),
                    f"duplicate application name {app.name!r} (also {seen[app.name]})",
                )
            seen[app.name] = f"applications[{index}]"
        for index, pipeline in enumerate(self.pipelines):
            if pipeline.name in seen:
                raise FieldError(
                    ("pipelines", index, "name"),
                    f"duplicate application name {pipeline.name!r} (also {seen[pipeline.name]})",
                )
            seen[pipeline.name] = f"pipelines[{index}]"
            llm_names = [app.name for app in self.llm_applications]
            for position, stage in enumerate(pipeline.stages):
                if stage.llm is not None:
                    if llm_names and stage.llm not in llm_names:
                        raise FieldError(
                            ("pipelines", index, "stages", position, "llm"),
                            f"unknown LLM application {stage.llm!r}; llm_applications: "
                            f"{', '.join(llm_names)}",
                        )
                    continue
                if stage.model not in self.models:
                    known = ", ".join(self.models) if self.models else "none (no models given)"
                    raise FieldError(
                        ("pipelines", index, "stages", position, "model"),
                        f"unknown model {stage.model!r}; known: {known}",
                    )
            labels_of = {
                s.name: s.labels if s.model is None else tuple(self.models[s.model].labels)
                for s in pipeline.stages
            }
            for position, stage in enumerate(pipeline.stages):
                problem = condition_problem(stage.to_stage(), labels_of)
                if problem is not None:
                    raise FieldError(("pipelines", index, "stages", position, "when"), problem)
        for index, llm_app in enumerate(self.llm_applications):
            if llm_app.name in seen:
                raise FieldError(
                    ("llm_applications", index, "name"),
                    f"duplicate application name {llm_app.name!r} (also {seen[llm_app.name]})",
                )
            seen[llm_app.name] = f"llm_applications[{index}]"
        return self

    def pipeline_names(self) -> tuple[str, ...]:
        """The pipeline names, in file order."""
        return tuple(pipeline.name for pipeline in self.pipelines)

    def names(self) -> tuple[str, ...]:
        """The application names, in file order."""
        return tuple(app.name for app in self.applications)

    def application(self, name: str) -> Application:
        """The application called ``name``.

        Raises:
            UnknownApplicationError: listing the known names.
        """
        for app in self.applications:
            if app.name == name:
                return app
        raise UnknownApplicationError(
            f"unknown application {name!r}; known: {', '.join(self.names())}"
        )
