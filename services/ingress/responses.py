"""The bodies the ingress answers with: OpenAI completion objects, stream chunks and the
classification answer, each with Switchyard's ``switchyard`` block.

The ``switchyard`` block (non-streaming answers, and the final chunk of a stream)::

    {"request_id", "status", "worker_id", "worker_type", "variant", "emulated",
     "deadline_s", "deadline_met",
     "timeline": {"arrival_s", "assigned_s", "started_s", "first_token_s", "finished_s"}}

and, in LLM answers, ``"ttft_s"``, ``"tpot_s"`` and ``"token_slo_met"``: the time to
the first token and per output token after it (:mod:`switchyard.slo`; null when the
timeline lacks them, TPOT for an answer of one token) and whether both met the
application's objectives (null when its time to first token is unknown).

Times are epoch seconds. ``deadline_met`` is true when the request finished at or
before its deadline (false when it did not finish or had no deadline). ``emulated``
true means the latency is a performance model's output, not a measurement; the HTTP
answer then also carries ``X-Switchyard-Emulated: true``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from switchyard.contracts.messages import ClassificationResult, Completion, LLMResult
from switchyard.slo import TokenSlo, judge, time_per_output_token_s

from services.ingress.tenants import public_request_id

EMULATED_HEADER = "X-Switchyard-Emulated"
REQUEST_ID_HEADER = "X-Switchyard-Request-Id"


class Flavour(StrEnum):
    """Which OpenAI endpoint an LLM answer is for."""

    TEXT = "text"  # /v1/completions
    CHAT = "chat"  # /v1/chat/completions


@dataclass(frozen=True, slots=True)
class LlmCall:
    """What an LLM answer needs to know about the call it answers."""

    request_id: str
    model: str
    created: int
    prompt_tokens: int
    flavour: Flavour
    deadline_s: float | None
    include_usage: bool = False
    """A stream ends with a usage chunk (``stream_options.include_usage``)."""
    token_slo: TokenSlo | None = None
    """The application's TTFT and TPOT objectives, its answers are judged by."""

    @property
    def object_name(self) -> str:
        return "chat.completion" if self.flavour is Flavour.CHAT else "text_completion"

    @property
    def chunk_object_name(self) -> str:
        return "chat.completion.chunk" if self.flavour is Flavour.CHAT else "text_completion"


def deadline_of(completion: Completion, fallback_s: float | None) -> float | None:
    return completion.deadline_s if completion.deadline_s is not None else fallback_s


def deadline_met(completion: Completion, deadline_s: float | None) -> bool:
    finished_s = completion.timeline.finished_s
    return deadline_s is not None and finished_s is not None and finished_s <= deadline_s


def judged(completion: Completion, fallback_s: float | None) -> bool | None:
    """Whether ``completion`` met its deadline; None when it has none."""
    deadline = deadline_of(completion, fallback_s)
    return None if deadline is None else deadline_met(completion, deadline)


def timeline(completion: Completion) -> dict[str, float | None]:
    t = completion.timeline
    return {
        "arrival_s": t.arrival_s,
        "assigned_s": t.assigned_s,
        "started_s": t.started_s,
        "first_token_s": t.first_token_s,
        "finished_s": t.finished_s,
    }


def switchyard_block(completion: Completion, deadline_s: float | None) -> dict[str, Any]:
    """The ``switchyard`` block of an answer (see the module docstring)."""
    deadline = deadline_of(completion, deadline_s)
    return {
        "request_id": public_request_id(completion.request_id),
        "status": str(completion.status),
        "worker_id": completion.worker_id,
        "worker_type": completion.worker_type,
        "variant": completion.variant,
        "emulated": completion.emulated,
        "deadline_s": deadline,
        "deadline_met": deadline_met(completion, deadline),
        "timeline": timeline(completion),
    }


def token_times(completion: Completion) -> tuple[float | None, float | None]:
    """An LLM answer's time to first token and time per output token after it."""
    t = completion.timeline
    if t.first_token_s is None:
        return None, None
    ttft_s = t.first_token_s - t.arrival_s
    _, output_tokens = output_of(completion)
    if t.finished_s is None:
        return ttft_s, None
    return ttft_s, time_per_output_token_s(t.first_token_s, t.finished_s, output_tokens)


def token_block(completion: Completion, slo: TokenSlo | None) -> dict[str, Any]:
    """The ``ttft_s``, ``tpot_s`` and ``token_slo_met`` of an LLM answer's block."""
    ttft_s, tpot_s = token_times(completion)
    met = None
    if slo is not None and ttft_s is not None:
        outcome = judge(slo, ttft_s=ttft_s, tpot_s=tpot_s, latency_s=0.0)
        met = outcome.ttft_met and outcome.tpot_met
    return {"ttft_s": ttft_s, "tpot_s": tpot_s, "token_slo_met": met}


def answer_headers(request_id: str, *, emulated: bool) -> dict[str, str]:
    headers = {REQUEST_ID_HEADER: request_id}
    if emulated:
        headers[EMULATED_HEADER] = "true"
    return headers


def output_of(completion: Completion) -> tuple[str, int]:
    """The generated text ("" when the worker produced none) and output token count."""
    result = completion.result
    if isinstance(result, LLMResult):
        return result.text or "", result.output_tokens
    return "", 0


def usage(call: LlmCall, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": call.prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": call.prompt_tokens + completion_tokens,
    }


def llm_answer(call: LlmCall, completion: Completion) -> dict[str, Any]:
    """The non-streaming OpenAI answer (``text_completion`` or ``chat.completion``)."""
    text, tokens = output_of(completion)
    choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
    if call.flavour is Flavour.CHAT:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
        choice["logprobs"] = None
    return {
        "id": call.request_id,
        "object": call.object_name,
        "created": call.created,
        "model": call.model,
        "choices": [choice],
        "usage": usage(call, tokens),
        "switchyard": switchyard_block(completion, call.deadline_s)
        | token_block(completion, call.token_slo),
    }


def llm_chunk(call: LlmCall, text: str, *, first: bool) -> dict[str, Any]:
    """One streamed chunk carrying ``text``."""
    choice: dict[str, Any] = {"index": 0, "finish_reason": None}
    if call.flavour is Flavour.CHAT:
        delta: dict[str, str] = {"content": text}
        if first:
            delta = {"role": "assistant", **delta}
        choice["delta"] = delta
    else:
        choice["text"] = text
        choice["logprobs"] = None
    return {
        "id": call.request_id,
        "object": call.chunk_object_name,
        "created": call.created,
        "model": call.model,
        "choices": [choice],
    }


def llm_final_chunk(call: LlmCall, completion: Completion) -> dict[str, Any]:
    """The chunk that ends a stream's choice: no text, ``finish_reason`` and the
    switchyard block (the usage follows in :func:`llm_usage_chunk` when asked for)."""
    choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
    if call.flavour is Flavour.CHAT:
        choice["delta"] = {}
    else:
        choice["text"] = ""
        choice["logprobs"] = None
    return {
        "id": call.request_id,
        "object": call.chunk_object_name,
        "created": call.created,
        "model": call.model,
        "choices": [choice],
        "switchyard": switchyard_block(completion, call.deadline_s)
        | token_block(completion, call.token_slo),
    }


def llm_usage_chunk(call: LlmCall, completion: Completion) -> dict[str, Any]:
    """The usage chunk OpenAI sends last when ``stream_options.include_usage`` is set:
    no choices, the token counts."""
    _, tokens = output_of(completion)
    return {
        "id": call.request_id,
        "object": call.chunk_object_name,
        "created": call.created,
        "model": call.model,
        "choices": [],
        "usage": usage(call, tokens),
    }


def classification_answer(
    completion: Completion, classes: tuple[str, ...], deadline_s: float | None
) -> dict[str, Any]:
    """The answer of ``POST /v1/apps/{app}/infer``."""
    result = completion.result
    label = result.label if isinstance(result, ClassificationResult) else None
    probabilities = list(result.probabilities) if isinstance(result, ClassificationResult) else []
    class_name = classes[label] if label is not None and label < len(classes) else None
    deadline = deadline_of(completion, deadline_s)
    return {
        "request_id": public_request_id(completion.request_id),
        "app": completion.app,
        "status": str(completion.status),
        "label": label,
        "class_name": class_name,
        "probabilities": probabilities,
        "variant": completion.variant,
        "worker_id": completion.worker_id,
        "worker_type": completion.worker_type,
        "emulated": completion.emulated,
        "deadline_s": deadline,
        "deadline_met": deadline_met(completion, deadline),
        "timeline": timeline(completion),
    }
