"""The latency objectives (switchyard.slo): TPOT's definition, judging one request, and
the defaults every workload class gets."""

from __future__ import annotations

import pytest
from switchyard.contracts.messages import WorkloadType
from switchyard.slo import DEFAULT_TOKEN_SLOS, TokenSlo, judge, time_per_output_token_s


def test_tpot_is_the_pace_after_the_first_token() -> None:
    # 11 tokens: the first at 0.5 s, the last at 1.5 s -> ten gaps of 0.1 s.
    assert time_per_output_token_s(0.5, 1.5, 11) == pytest.approx(0.1)


def test_a_one_token_answer_has_no_tpot_and_meets_any_tpot_objective() -> None:
    assert time_per_output_token_s(0.5, 0.5, 1) is None
    outcome = judge(TokenSlo(ttft_s=1.0, tpot_s=1e-9), ttft_s=0.5, tpot_s=None, latency_s=0.5)
    assert outcome.tpot_met
    assert outcome.met


@pytest.mark.parametrize(
    ("ttft_s", "tpot_s", "latency_s", "missed"),
    [
        (0.9, 0.05, 5.0, None),
        (1.1, 0.05, 5.0, "ttft"),
        (0.9, 0.2, 5.0, "tpot"),
        (0.9, 0.05, 11.0, "latency"),
    ],
)
def test_a_request_meets_its_slo_only_when_it_meets_every_objective(
    ttft_s: float, tpot_s: float, latency_s: float, missed: str | None
) -> None:
    outcome = judge(
        TokenSlo(ttft_s=1.0, tpot_s=0.1),
        ttft_s=ttft_s,
        tpot_s=tpot_s,
        latency_s=latency_s,
        latency_slo_s=10.0,
    )
    met = {"ttft": outcome.ttft_met, "tpot": outcome.tpot_met, "latency": outcome.latency_met}
    assert [name for name, ok in met.items() if not ok] == ([] if missed is None else [missed])
    assert outcome.met is (missed is None)


def test_without_an_end_to_end_objective_latency_is_not_judged() -> None:
    outcome = judge(TokenSlo(ttft_s=1.0, tpot_s=0.1), ttft_s=0.1, tpot_s=0.01, latency_s=1e6)
    assert outcome.met


def test_every_workload_class_has_a_default_and_code_waits_least_for_its_first_token() -> None:
    assert set(DEFAULT_TOKEN_SLOS) == set(WorkloadType)
    code = DEFAULT_TOKEN_SLOS[WorkloadType.CODE]
    assert all(code.ttft_s <= slo.ttft_s for slo in DEFAULT_TOKEN_SLOS.values())


@pytest.mark.parametrize(("ttft_s", "tpot_s", "named"), [(0.0, 0.1, "TTFT"), (1.0, -1.0, "TPOT")])
def test_an_objective_must_be_positive(ttft_s: float, tpot_s: float, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        TokenSlo(ttft_s=ttft_s, tpot_s=tpot_s)
