"""The serving catalogue: which applications the live stack answers, and their limits.

Built from an application registry (:mod:`switchyard.apps.registry`): its
classification ``applications`` (with the profiled variants a worker loads from
``registry_dir``) and its ``llm_applications``. A registry without LLM applications gets
:data:`DEFAULT_LLM_APPLICATIONS`, so the stack always answers the OpenAI-compatible API.

The catalogue is immutable; every service builds its own from the same file
(``SWITCHYARD_REGISTRY``), so they agree without talking.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from switchyard.apps.pipelines import registry_catalogue
from switchyard.apps.registry import Application, LlmApplicationEntry, Registry
from switchyard.contracts.messages import WorkloadType
from switchyard.multimodel.model import ModelSpec, PipelineSpec
from switchyard.serving.pipelines import (
    DEFAULT_PIPELINE_MODELS,
    DEFAULT_PIPELINES,
    pipeline_catalogue,
)
from switchyard.slo import DEFAULT_TOKEN_SLOS, TokenSlo

TINY_LM_MODEL = "tiny-lm"
"""The served-model name of the real torch language model (random weights, CPU or CUDA)."""


class CatalogueError(ValueError):
    """Pipelines whose LLM stages the catalogue cannot serve; the message is one line
    naming the pipeline and the stage."""


class UnknownServedApplicationError(KeyError):
    """A request named an application (or OpenAI model) the catalogue does not serve."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown application"


@dataclass(frozen=True, slots=True)
class LlmApplication:
    """An LLM application, addressed by the OpenAI ``model`` field.

    Attributes:
        name: the application name (what clients send as ``model``).
        model: the served model: a performance-model profile's model (``llama-2-7b``) for
            emulated workers, or :data:`TINY_LM_MODEL` for the real torch model.
        slo_s: latency objective; a request without a deadline gets arrival + slo_s.
        max_prompt_tokens: the longest prompt accepted.
        max_output_tokens: the most output tokens a request may ask for.
        workload: the workload class the predictor sees.
        token_slo: its own TTFT and TPOT objectives (a registry entry's); None: its
            workload class's default. :attr:`objectives` is whichever applies.
    """

    name: str
    model: str
    slo_s: float
    max_prompt_tokens: int
    max_output_tokens: int
    workload: WorkloadType
    token_slo: TokenSlo | None = None

    @property
    def objectives(self) -> TokenSlo:
        """Its token objectives: its own, or its workload class's default."""
        return self.token_slo if self.token_slo is not None else DEFAULT_TOKEN_SLOS[self.workload]

    @classmethod
    def from_entry(cls, entry: LlmApplicationEntry) -> LlmApplication:
        workload = WorkloadType(entry.workload)
        default = DEFAULT_TOKEN_SLOS[workload]
        return cls(
            name=entry.name,
            model=entry.model,
            slo_s=entry.slo_s,
            max_prompt_tokens=entry.max_prompt_tokens,
            max_output_tokens=entry.max_output_tokens,
            workload=workload,
            token_slo=TokenSlo(
                ttft_s=entry.ttft_slo_s or default.ttft_s,
                tpot_s=entry.tpot_slo_s or default.tpot_s,
            ),
        )


@dataclass(frozen=True, slots=True)
class ClassificationApplication:
    """A classification application: one feature vector in, one label out.

    Attributes:
        name: the application name (the ``{app}`` of ``/v1/apps/{app}/infer``).
        feature_dim: the number of features a request must carry.
        deadline_s: the default relative deadline.
        classes: the class names, index = label.
        variants: the model variants that can serve it, in registry order.
        spec: the full registry entry (penalty, prior, profiled variants).
    """

    name: str
    feature_dim: int
    deadline_s: float
    classes: tuple[str, ...]
    variants: tuple[str, ...]
    spec: Application

    @classmethod
    def from_application(cls, app: Application) -> ClassificationApplication:
        return cls(
            name=app.name,
            feature_dim=app.feature_dim,
            deadline_s=app.deadline_s,
            classes=tuple(app.classes),
            variants=tuple(app.variants),
            spec=app,
        )


DEFAULT_LLM_APPLICATIONS: tuple[LlmApplication, ...] = (
    LlmApplication(
        name="llama-2-7b",
        model="llama-2-7b",
        slo_s=30.0,
        max_prompt_tokens=8192,
        max_output_tokens=4096,
        workload=WorkloadType.CONVERSATION,
    ),
    LlmApplication(
        name="llama-2-13b",
        model="llama-2-13b",
        slo_s=60.0,
        max_prompt_tokens=8192,
        max_output_tokens=4096,
        workload=WorkloadType.CODE,
    ),
    LlmApplication(
        name=TINY_LM_MODEL,
        model=TINY_LM_MODEL,
        slo_s=10.0,
        max_prompt_tokens=512,
        max_output_tokens=256,
        workload=WorkloadType.OTHER,
    ),
)
"""The LLM applications of a registry that names none: two emulated Llama 2 sizes (a
performance model, not a measurement) and the real tiny torch language model."""


@dataclass(frozen=True)
class ServingCatalogue:
    """Every application the stack serves, by name; read-only.

    Attributes:
        llm: LLM applications by name (the OpenAI ``model`` field).
        classification: classification applications by name.
        registry_dir: the folder the registry was read from; classification variants'
            model files are relative to it. None for a catalogue built in memory.
    """

    llm: Mapping[str, LlmApplication]
    classification: Mapping[str, ClassificationApplication]
    registry_dir: Path | None = None
    _registry: Registry | None = field(default=None, repr=False, compare=False)
    models: Mapping[str, ModelSpec] = field(default_factory=lambda: DEFAULT_PIPELINE_MODELS)
    """The multi-model catalogue's models (the stages' models), by name."""
    pipelines: Mapping[str, PipelineSpec] = field(default_factory=lambda: DEFAULT_PIPELINES)
    """Pipeline applications by name (``POST /v1/apps/{app}/infer``)."""

    @classmethod
    def from_registry(
        cls,
        registry: Registry,
        registry_dir: Path | None = None,
        *,
        pipeline_catalogue: str = "txt2img",
    ) -> ServingCatalogue:
        """The catalogue of ``registry``; :data:`DEFAULT_LLM_APPLICATIONS` when it has no
        LLM applications, and the named ``pipeline_catalogue``
        (:mod:`switchyard.serving.pipelines`) when it has no pipelines."""
        llm_apps = (
            tuple(LlmApplication.from_entry(entry) for entry in registry.llm_applications)
            or DEFAULT_LLM_APPLICATIONS
        )
        llm = {app.name: app for app in llm_apps}
        pipelines = _pipeline_catalogue(registry, pipeline_catalogue)
        check_llm_stages(pipelines["pipelines"], llm)
        return cls(
            llm=MappingProxyType(llm),
            classification=MappingProxyType(
                {
                    app.name: ClassificationApplication.from_application(app)
                    for app in registry.applications
                }
            ),
            registry_dir=registry_dir,
            _registry=registry,
            **pipelines,
        )

    @property
    def registry(self) -> Registry | None:
        """The registry this catalogue was built from, when it was."""
        return self._registry

    def llm_application(self, name: str) -> LlmApplication:
        """The LLM application ``name``.

        Raises:
            UnknownServedApplicationError: naming the known LLM applications.
        """
        try:
            return self.llm[name]
        except KeyError:
            raise UnknownServedApplicationError(
                f"unknown model {name!r}; served models: {', '.join(sorted(self.llm)) or 'none'}"
            ) from None

    def classification_application(self, name: str) -> ClassificationApplication:
        """The classification application ``name``.

        Raises:
            UnknownServedApplicationError: naming the known classification applications.
        """
        try:
            return self.classification[name]
        except KeyError:
            known = ", ".join(sorted(self.classification)) or "none"
            raise UnknownServedApplicationError(
                f"unknown application {name!r}; classification applications: {known}"
            ) from None

    def pipeline(self, name: str) -> PipelineSpec:
        """The pipeline application ``name``.

        Raises:
            UnknownServedApplicationError: naming the known pipelines.
        """
        try:
            return self.pipelines[name]
        except KeyError:
            known = ", ".join(sorted(self.pipelines)) or "none"
            raise UnknownServedApplicationError(
                f"unknown application {name!r}; pipelines: {known}"
            ) from None

    def llm_models(self) -> frozenset[str]:
        """Every served LLM model name (``llama-2-7b``, ``tiny-lm``, ...)."""
        return frozenset(app.model for app in self.llm.values())


def check_llm_stages(
    pipelines: Mapping[str, PipelineSpec], llm: Mapping[str, LlmApplication]
) -> None:
    """Every LLM stage names a served LLM application and asks for no more output tokens
    than it generates.

    Raises:
        CatalogueError: naming the pipeline, the stage and what is wrong.
    """
    for pipeline in pipelines.values():
        for stage in pipeline.stages:
            if stage.llm is None:
                continue
            where = f"pipeline {pipeline.name!r}, stage {stage.name!r}"
            app = llm.get(stage.model)
            if app is None:
                raise CatalogueError(
                    f"{where}: unknown LLM application {stage.model!r}; served: "
                    f"{', '.join(sorted(llm)) or 'none'}"
                )
            if stage.llm.output_tokens > app.max_output_tokens:
                raise CatalogueError(
                    f"{where}: output_tokens {stage.llm.output_tokens} exceeds the "
                    f"{app.max_output_tokens} that LLM application {app.name!r} generates"
                )


def _pipeline_catalogue(registry: Registry, name: str) -> dict[str, Any]:
    """``models`` and ``pipelines``: the registry's when it declares pipelines, else
    the named catalogue's."""
    if registry.pipelines:
        models, pipelines = registry_catalogue(registry)
        return {"models": MappingProxyType(models), "pipelines": MappingProxyType(pipelines)}
    named_models, named_pipelines = pipeline_catalogue(name)
    return {"models": named_models, "pipelines": named_pipelines}
