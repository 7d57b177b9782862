"""An LLM answer judged by its application's token objectives: the ``ttft_s``, ``tpot_s``
and ``token_slo_met`` of its ``switchyard`` block, and where the objectives come from."""

from __future__ import annotations

import pytest
from switchyard.apps.registry import LlmApplicationEntry
from switchyard.contracts.messages import Completion, CompletionStatus, LLMResult, RequestTimeline
from switchyard.serving.catalogue import LlmApplication
from switchyard.slo import TokenSlo

from services.ingress.responses import token_block


def _answer(*, first_token_s: float | None, finished_s: float, tokens: int) -> Completion:
    return Completion(
        request_id="r",
        app="chat",
        worker_id="w",
        worker_type="a100",
        variant="llama-2-7b",
        status=CompletionStatus.OK,
        result=LLMResult(output_tokens=tokens, text="x " * tokens),
        timeline=RequestTimeline(
            arrival_s=100.0, first_token_s=first_token_s, finished_s=finished_s
        ),
    )


SLO = TokenSlo(ttft_s=0.5, tpot_s=0.1)


def test_an_answer_within_both_objectives_meets_them() -> None:
    block = token_block(_answer(first_token_s=100.4, finished_s=100.8, tokens=5), SLO)
    assert block["ttft_s"] == pytest.approx(0.4)
    assert block["tpot_s"] == pytest.approx(0.1)
    assert block["token_slo_met"] is True


@pytest.mark.parametrize(
    ("first_token_s", "finished_s"),
    [(100.6, 100.7), (100.2, 101.2)],  # a late first token; a slow pace after it
)
def test_missing_either_objective_misses(first_token_s: float, finished_s: float) -> None:
    block = token_block(_answer(first_token_s=first_token_s, finished_s=finished_s, tokens=5), SLO)
    assert block["token_slo_met"] is False


def test_an_answer_without_a_first_token_time_is_not_judged() -> None:
    block = token_block(_answer(first_token_s=None, finished_s=101.0, tokens=5), SLO)
    assert block == {"ttft_s": None, "tpot_s": None, "token_slo_met": None}
    one_token = token_block(_answer(first_token_s=100.3, finished_s=100.3, tokens=1), SLO)
    assert one_token["tpot_s"] is None
    assert one_token["token_slo_met"] is True  # one token meets any pace


def test_an_application_s_objectives_are_its_own_or_its_class_s_defaults() -> None:
    own = LlmApplication.from_entry(
        LlmApplicationEntry(
            name="coder", model="llama-2-13b", slo_s=60, workload="code", tpot_slo_s=0.05
        )
    )
    assert own.objectives == TokenSlo(ttft_s=0.5, tpot_s=0.05)  # code's TTFT, its TPOT
    default = LlmApplication.from_entry(
        LlmApplicationEntry(name="chat", model="llama-2-7b", slo_s=30, workload="conversation")
    )
    assert default.objectives == TokenSlo(ttft_s=1.0, tpot_s=0.1)
    with pytest.raises(ValueError, match="ttft_slo_s"):
        LlmApplicationEntry(name="x", model="llama-2-7b", slo_s=30, ttft_slo_s=0)
