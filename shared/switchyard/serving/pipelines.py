"""The pipelines the live stack serves when its registry declares none, by name
(``SWITCHYARD_PIPELINE_CATALOGUE``).

- ``txt2img`` (the default): three text-to-image applications over four models, the
  shape of the Alibaba GenAI trace's pipelines: a prompt encoder, a Stable Diffusion
  1.5-class base model, an upscaler and a safety checker, a classifier that labels an
  image ``safe`` or ``unsafe`` (``txt2img-checked`` upscales only a ``safe`` one).
  Resources, load and service times (and the checker's shares) are assumed figures of
  that class of model (those of the multi-model simulator's auxiliary models).
- ``alibaba-lora``: the catalogue of the Alibaba GenAI LoRA trace's bundled sample
  (:func:`switchyard.multimodel.alibaba.lora_workload` with :data:`ALIBABA_LORA_OPTIONS`):
  its four most requested base models, each a single-stage pipeline and two multi-stage
  ones (``M-upscale``, ``M-full``). The load generator's ``multimodel`` mix replays the
  same sample's requests against it.

- ``assistant``: pipelines with LLM stages, served by the LLM workers of the default
  LLM applications (``llama-2-7b``, ``llama-2-13b``): ``triage``, a small classifier
  (``intent-classifier``, on the multi-model workers) whose label sends the call to the
  larger model (``code``) or the smaller one (``chat``), and ``draft-verify``, a draft
  by ``llama-2-7b`` that ``llama-2-13b`` judges (``accept`` or ``reject``) and, when it
  rejects it, writes again (``revise``). The classifier's figures and both label shares
  are assumptions, not measurements.

``emulated-models`` workers serve the models: they spend the load and service times
rather than run a model. LLM stages run as LLM requests on the LLM workers.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

from switchyard.multimodel.model import (
    LlmStage,
    ModelSpec,
    PipelineSpec,
    ResourceVector,
    Stage,
    StageCondition,
)

__all__ = [
    "ALIBABA_LORA_OPTIONS",
    "ASSISTANT_MODELS",
    "ASSISTANT_PIPELINES",
    "DEFAULT_PIPELINES",
    "DEFAULT_PIPELINE_MODELS",
    "PIPELINE_CATALOGUES",
    "pipeline_catalogue",
]

PIPELINE_CATALOGUES: Final = ("txt2img", "alibaba-lora", "assistant")
"""The named pipeline catalogues."""

ALIBABA_LORA_OPTIONS: Mapping[str, Any] = MappingProxyType(
    {"models": 4, "pipeline_share": 0.3, "seed": 0}
)
"""How ``alibaba-lora`` is built from the bundled sample; the load generator's
``multimodel`` mix builds its requests with the same options."""

DEFAULT_PIPELINE_MODELS = MappingProxyType(
    {
        spec.name: spec
        for spec in (
            ModelSpec(
                name="prompt-encoder",
                resources=ResourceVector(1.0, 0.25, 4.0),
                load_s=3.0,
                exec_s=0.1,
            ),
            ModelSpec(
                name="sd15-base",
                resources=ResourceVector(2.0, 0.5, 16.0),
                load_s=10.0,
                exec_s=2.0,
            ),
            ModelSpec(
                name="upscaler",
                resources=ResourceVector(2.0, 0.5, 8.0),
                load_s=5.0,
                exec_s=3.0,
            ),
            ModelSpec(
                name="safety-checker",
                resources=ResourceVector(1.0, 0.25, 4.0),
                load_s=3.0,
                exec_s=0.3,
                # A classifier: the share of images it passes is an assumption.
                labels=(("safe", 0.9), ("unsafe", 0.1)),
            ),
        )
    }
)

DEFAULT_PIPELINES = MappingProxyType(
    {
        pipeline.name: pipeline
        for pipeline in (
            PipelineSpec(
                name="txt2img",
                stages=(
                    Stage(name="encode", model="prompt-encoder"),
                    Stage(name="generate", model="sd15-base", after=("encode",)),
                    Stage(name="check", model="safety-checker", after=("generate",)),
                ),
                slo_s=12.0,
            ),
            PipelineSpec(
                name="txt2img-hd",
                stages=(
                    Stage(name="encode", model="prompt-encoder"),
                    Stage(name="generate", model="sd15-base", after=("encode",)),
                    Stage(name="upscale", model="upscaler", after=("generate",)),
                    Stage(name="check", model="safety-checker", after=("generate",)),
                ),
                slo_s=30.0,
            ),
            PipelineSpec(
                name="txt2img-checked",
                stages=(
                    Stage(name="encode", model="prompt-encoder"),
                    Stage(name="generate", model="sd15-base", after=("encode",)),
                    Stage(name="check", model="safety-checker", after=("generate",)),
                    # Only an image the checker passes is upscaled.
                    Stage(
                        name="upscale",
                        model="upscaler",
                        after=("generate", "check"),
                        when=StageCondition("check", "safe"),
                    ),
                ),
                slo_s=30.0,
            ),
        )
    }
)


ASSISTANT_MODELS = MappingProxyType(
    {
        "intent-classifier": ModelSpec(
            name="intent-classifier",
            resources=ResourceVector(1.0, 0.1, 2.0),
            load_s=2.0,
            exec_s=0.05,
            labels=(("code", 0.4), ("chat", 0.6)),
        )
    }
)
"""The one multi-model catalogue model of ``assistant``: a small intent classifier."""

_ANSWER_TOKENS = 128

ASSISTANT_PIPELINES = MappingProxyType(
    {
        pipeline.name: pipeline
        for pipeline in (
            PipelineSpec(
                name="triage",
                stages=(
                    Stage(name="classify", model="intent-classifier"),
                    Stage(
                        name="code",
                        model="llama-2-13b",
                        after=("classify",),
                        when=StageCondition("classify", "code"),
                        llm=LlmStage(output_tokens=_ANSWER_TOKENS),
                    ),
                    Stage(
                        name="chat",
                        model="llama-2-7b",
                        after=("classify",),
                        when=StageCondition("classify", "chat"),
                        llm=LlmStage(output_tokens=_ANSWER_TOKENS),
                    ),
                ),
                slo_s=20.0,
            ),
            PipelineSpec(
                name="draft-verify",
                stages=(
                    Stage(
                        name="draft", model="llama-2-7b", llm=LlmStage(output_tokens=_ANSWER_TOKENS)
                    ),
                    Stage(
                        name="verify",
                        model="llama-2-13b",
                        after=("draft",),
                        llm=LlmStage(output_tokens=1, choices=(("accept", 0.7), ("reject", 0.3))),
                    ),
                    # Only a draft the verifier rejects is written again, by the larger model.
                    Stage(
                        name="revise",
                        model="llama-2-13b",
                        after=("draft", "verify"),
                        when=StageCondition("verify", "reject"),
                        llm=LlmStage(output_tokens=_ANSWER_TOKENS),
                    ),
                ),
                slo_s=30.0,
                answer=("revise", "draft"),
            ),
        )
    }
)
"""The ``assistant`` pipelines: LLM stages on the default LLM applications."""


@functools.cache
def pipeline_catalogue(
    name: str,
) -> tuple[Mapping[str, ModelSpec], Mapping[str, PipelineSpec]]:
    """``(models, pipelines)`` of the named catalogue (see the module docstring).

    Raises:
        ValueError: an unknown name, naming the known ones.
    """
    if name == "txt2img":
        return DEFAULT_PIPELINE_MODELS, DEFAULT_PIPELINES
    if name == "assistant":
        return ASSISTANT_MODELS, ASSISTANT_PIPELINES
    if name == "alibaba-lora":
        from switchyard.multimodel.alibaba import lora_workload
        from switchyard.traces.alibaba import LORA_SAMPLE

        workload = lora_workload(LORA_SAMPLE, **ALIBABA_LORA_OPTIONS)
        return MappingProxyType(dict(workload.models)), MappingProxyType(dict(workload.pipelines))
    raise ValueError(
        f"unknown pipeline catalogue {name!r}; known: {', '.join(PIPELINE_CATALOGUES)}"
    )
