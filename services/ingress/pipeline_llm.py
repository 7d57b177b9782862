"""LLM stages of a pipeline call: what a stage served by the LLM workers asks for.

An LLM stage (:class:`~switchyard.multimodel.model.LlmStage`) is a completion by the
workers of one LLM application, scheduled as any LLM request (``switchyard.requests``).
Its prompt is the call's input followed by the output of each stage it runs after, one
``"{stage}: {output}"`` paragraph each, so a verifier sees both the question and the
draft it judges; its prompt tokens are counted as the ingress counts a completion's
(:func:`~services.ingress.tokens.approximate_tokens`), its KV blocks named as a
completion's, and it asks for the stage's ``output_tokens`` (an emulated worker
generates exactly that many). With ``choices`` it answers one label, which conditional
stages after it branch on, as they branch on a classifier stage's.

A model stage after an LLM stage gets that stage's text as one of its ``inputs``; an
input longer than a stage payload carries keeps its last :data:`STAGE_INPUT_CHARS`
characters (emulated models read none of it; the end is what a generation adds last).
"""

from __future__ import annotations

from collections.abc import Mapping

from switchyard.contracts.messages import Completion, LLMPayload, LLMResult, StageResult
from switchyard.multimodel.model import LlmStage
from switchyard.serving.catalogue import LlmApplication

from services.ingress.errors import ApiError
from services.ingress.tokens import approximate_tokens, prompt_blocks

__all__ = [
    "STAGE_INPUT_CHARS",
    "llm_stage_payload",
    "stage_inputs",
    "stage_label",
    "stage_output",
    "stage_prompt",
]

STAGE_INPUT_CHARS = 4096
"""The most characters of one input a model stage's payload carries."""


def stage_prompt(call_input: str, outputs: Mapping[str, str]) -> str:
    """An LLM stage's prompt: the call's input, then ``"{stage}: {output}"`` for each stage
    it runs after (``outputs``, in its ``after`` order), paragraphs apart."""
    return "\n\n".join([call_input, *(f"{name}: {text}" for name, text in outputs.items())])


def llm_stage_payload(
    app: LlmApplication, llm: LlmStage, prompt: str, *, time_scale: float, what: str
) -> LLMPayload:
    """The request of an LLM stage whose prompt is ``prompt`` (``what`` names the stage
    and its pipeline in errors).

    Raises:
        ApiError: 400 ``context_length_exceeded`` when the prompt is longer than the
            application accepts (a long input, or a long answer of an earlier stage).
    """
    prompt_tokens = approximate_tokens(prompt)
    if prompt_tokens > app.max_prompt_tokens:
        raise ApiError(
            400,
            f"{what} has a prompt of {prompt_tokens} tokens (the call's input and the "
            f"outputs of the stages before it; approximated as ceil(UTF-8 bytes / 4)); LLM "
            f"application {app.name!r} accepts at most {app.max_prompt_tokens}",
            param="input",
            code="context_length_exceeded",
        )
    return LLMPayload(
        model=app.model,
        prompt_tokens=prompt_tokens,
        max_output_tokens=llm.output_tokens,
        output_tokens_hint=llm.output_tokens,
        workload=app.workload,
        prompt=prompt,
        prefix_blocks=prompt_blocks(prompt),
        ttft_slo_s=app.objectives.ttft_s / time_scale,
        choices=dict(llm.choices),
    )


def stage_inputs(outputs: Mapping[str, str]) -> dict[str, str]:
    """A model stage's ``inputs`` from the outputs it runs after, each cut to its last
    :data:`STAGE_INPUT_CHARS` characters."""
    return {name: text[-STAGE_INPUT_CHARS:] for name, text in outputs.items()}


def stage_output(completion: Completion | None) -> str:
    """What a stage's answer hands the stages after it: a model stage's output, an LLM
    stage's text (its label, for one with choices)."""
    result = completion.result if completion is not None else None
    if isinstance(result, StageResult):
        return result.output
    if isinstance(result, LLMResult):
        return result.text or ""
    return ""


def stage_label(completion: Completion | None) -> str | None:
    """The label a stage answered (a classifier model, an LLM stage with choices), or
    ``None``."""
    result = completion.result if completion is not None else None
    return result.label if isinstance(result, StageResult | LLMResult) else None
