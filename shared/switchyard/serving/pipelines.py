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

``emulated-models`` workers serve these models: they spend the load and service times
rather than run a model.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

from switchyard.multimodel.model import (
    ModelSpec,
    PipelineSpec,
    ResourceVector,
    Stage,
    StageCondition,
)

__all__ = [
    "ALIBABA_LORA_OPTIONS",
    "DEFAULT_PIPELINES",
    "DEFAULT_PIPELINE_MODELS",
    "PIPELINE_CATALOGUES",
    "pipeline_catalogue",
]

PIPELINE_CATALOGUES: Final = ("txt2img", "alibaba-lora")
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
    if name == "alibaba-lora":
        from switchyard.multimodel.alibaba import lora_workload
        from switchyard.traces.alibaba import LORA_SAMPLE

        workload = lora_workload(LORA_SAMPLE, **ALIBABA_LORA_OPTIONS)
        return MappingProxyType(dict(workload.models)), MappingProxyType(dict(workload.pipelines))
    raise ValueError(
        f"unknown pipeline catalogue {name!r}; known: {', '.join(PIPELINE_CATALOGUES)}"
    )
