"""The request gate learns from its own errors: a worker slower than its profile is
admitted to only as far as its answers show it can serve, per model, and the
correction lapses when the errors stop counting (pure; no store, no bus)."""

from __future__ import annotations

import pytest
from switchyard.contracts.messages import (
    Completion,
    CompletionStatus,
    RequestTimeline,
)

from services.ingress import load_shedding
from services.ingress.calibration import (
    CALIBRATION_HORIZON,
    CALIBRATION_MIN_CALLS,
    CALIBRATION_WINDOW,
    EstimateErrors,
)
from services.ingress.load_shedding import JUDGED_KEPT, AdmissionGate, Demand, Verdict
from tests.unit.test_ingress_load_shedding import IDLE_S, NOW, beat, gate, llm, record, view


def answer(
    request_id: str,
    finished_s: float,
    status: CompletionStatus = CompletionStatus.OK,
    *,
    assigned_s: float | None = None,
) -> Completion:
    return Completion(
        request_id=request_id,
        app="chat",
        worker_id="w1",
        worker_type="a100-80gb",
        variant="llama-2-7b",
        status=status,
        timeline=RequestTimeline(arrival_s=NOW, assigned_s=assigned_s, finished_s=finished_s),
    )


def slow_answers(
    made: AdmissionGate, ratio: float, count: int, *, model: str = "llama-2-7b"
) -> float:
    """Admit ``count`` requests on an idle worker and answer each after ``ratio`` times
    its estimate; returns when the last was answered. Afterwards the worker is idle
    again (a heartbeat sent after the admissions)."""
    finished_s = NOW
    models = ("llama-2-7b", "llama-2-13b")
    for i in range(count):
        made.observe(view(record(beat(models=models, sent_at_s=NOW + 1.0))))
        decision = made.decide(llm(60.0, model=model), NOW, f"r{i}")
        assert decision.admitted
        assert decision.expected_s == pytest.approx(
            IDLE_S if model == "llama-2-7b" else decision.expected_s
        )
        finished_s = NOW + ratio * decision.expected_s
        made.answered(answer(f"r{i}", finished_s))
    made.observe(view(record(beat(models=models, sent_at_s=NOW + 1.0))))
    return finished_s


def test_estimate_errors_give_no_quantile_from_a_handful() -> None:
    errors = EstimateErrors()
    for i in range(CALIBRATION_MIN_CALLS - 1):
        errors.add(float(i), until_s=100.0)
    assert errors.quantile(0.0) is None
    errors.add(5.0, until_s=100.0)
    assert errors.quantile(0.0) is not None


def test_estimate_errors_quantile_and_lapse() -> None:
    errors = EstimateErrors()
    for i in range(100):  # 0..99, the first 50 counting until 10 s, the rest until 20 s
        errors.add(float(i), until_s=10.0 if i < 50 else 20.0)
    assert errors.quantile(0.0) == 90.0
    assert errors.quantile(10.0) == 90.0  # an error counts up to its time
    assert errors.quantile(10.5) == 95.0  # only 50..99 still count
    assert errors.quantile(20.5) is None
    errors.add(1.0, until_s=100.0)  # learning invalidates what was computed
    assert errors.quantile(20.5) is None
    assert len(errors) == 101


def test_estimate_errors_keep_only_the_latest_window() -> None:
    errors = EstimateErrors()
    for _ in range(CALIBRATION_WINDOW):
        errors.add(100.0, until_s=1e9)
    for _ in range(CALIBRATION_WINDOW):
        errors.add(1.0, until_s=1e9)
    assert errors.quantile(0.0) == 1.0
    assert len(errors) == CALIBRATION_WINDOW


def test_a_worker_slower_than_its_profile_is_refused_what_it_would_finish_late() -> None:
    made = gate(record(beat()))
    # Uncalibrated, a request due in 1.5 idle service times is admitted.
    assert made.decide(llm(1.5 * IDLE_S), NOW).admitted
    slow_answers(made, ratio=2.0, count=CALIBRATION_MIN_CALLS)
    assert made.margin_s("llama-2-7b", NOW) == pytest.approx(IDLE_S)  # a whole service late
    refused = made.decide(llm(1.5 * IDLE_S), NOW)
    assert refused.verdict is Verdict.OVERLOADED
    assert refused.expected_s == pytest.approx(2.0 * IDLE_S)
    assert f"calibration +{IDLE_S:.3f} s" in refused.reason
    # What it can still finish in time is admitted.
    assert made.decide(llm(2.5 * IDLE_S), NOW).admitted


def test_the_correction_lapses_when_its_errors_stop_counting() -> None:
    made = gate(record(beat()))
    last_s = slow_answers(made, ratio=3.0, count=CALIBRATION_MIN_CALLS)
    assert made.margin_s("llama-2-7b", last_s) == pytest.approx(2.0 * IDLE_S)
    first_lapse_s = NOW + 3.0 * IDLE_S + CALIBRATION_HORIZON * 60.0
    assert made.margin_s("llama-2-7b", first_lapse_s + 1.0) == 0.0


def test_a_worker_faster_than_its_profile_is_not_given_more_than_the_model() -> None:
    made = gate(record(beat()))
    slow_answers(made, ratio=0.5, count=CALIBRATION_MIN_CALLS)
    assert made.margin_s("llama-2-7b", NOW) == 0.0
    assert made.decide(llm(0.9 * IDLE_S), NOW).verdict is Verdict.ADMIT  # late even idle
    made.observe(view(record(beat(sent_at_s=NOW + 1.0))))
    assert made.decide(llm(30.0), NOW).expected_s == pytest.approx(IDLE_S)


def test_calibration_is_per_model() -> None:
    made = gate(record(beat(models=("llama-2-7b", "llama-2-13b"))))
    slow_answers(made, ratio=2.0, count=CALIBRATION_MIN_CALLS, model="llama-2-7b")
    assert made.margin_s("llama-2-7b", NOW) == pytest.approx(IDLE_S)
    assert made.margin_s("llama-2-13b", NOW) == 0.0


def test_failed_forgotten_and_unknown_answers_teach_nothing() -> None:
    made = gate(record(beat()))
    for i in range(CALIBRATION_MIN_CALLS):
        made.decide(llm(60.0), NOW, f"failed-{i}")
        made.answered(answer(f"failed-{i}", NOW + 100.0, CompletionStatus.FAILED))
        made.decide(llm(60.0), NOW, f"retry-{i}")
        made.forget(f"retry-{i}")  # not accepted: a retry of an earlier request
        made.answered(answer(f"retry-{i}", NOW + 100.0))
        made.answered(answer(f"elsewhere-{i}", NOW + 100.0))  # never judged here
        made.decide(llm(60.0), NOW)  # no id: nothing to learn from
    assert made.margin_s("llama-2-7b", NOW) == 0.0


def test_classification_requests_are_not_calibrated() -> None:
    worker = record(beat("cpu-0", models=("wine/mlp-small",), profile=None))
    made = gate(worker)
    for i in range(CALIBRATION_MIN_CALLS):
        demand = Demand(
            kind="classification",
            model="wine",
            arrival_s=NOW,
            deadline_s=NOW + 0.15,
            service_s=0.002,
        )
        assert made.decide(demand, NOW, f"c{i}").admitted
        made.answered(answer(f"c{i}", NOW + 0.1))  # 50 times the estimate
    assert made.margin_s("wine", NOW) == 0.0
    assert made.decide(demand, NOW, "next").admitted


def test_requests_never_answered_here_are_forgotten_beyond_a_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert JUDGED_KEPT >= 10_000  # enough for every request in flight at 1,000/s
    monkeypatch.setattr(load_shedding, "JUDGED_KEPT", 50)
    made = gate(record(beat()))
    for i in range(60):
        made.decide(llm(1e9), NOW, f"old{i}")
    slow_answers(made, ratio=2.0, count=CALIBRATION_MIN_CALLS)  # still learns
    assert made.margin_s("llama-2-7b", NOW) == pytest.approx(IDLE_S)
    # 50 kept: old10 .. old59 after the 60, then r0 took old10's place.
    learnt = made._errors["llama-2-7b"]
    for i in range(11):  # the forgotten: their answers teach nothing
        made.answered(answer(f"old{i}", NOW + 1e6))
    assert len(learnt) == CALIBRATION_MIN_CALLS
    assert made.margin_s("llama-2-7b", NOW) == pytest.approx(IDLE_S)
    made.answered(answer("old11", NOW + 1e6))  # one still kept does
    assert len(learnt) == CALIBRATION_MIN_CALLS + 1


def test_a_delay_before_assignment_is_the_control_planes_and_teaches_nothing() -> None:
    # A scheduler's failover held every request 5 s before it was assigned; each then
    # ran as estimated: the worker is as its profile says.
    made = gate(record(beat()))
    for i in range(CALIBRATION_MIN_CALLS):
        made.observe(view(record(beat(sent_at_s=NOW + 1.0))))
        decision = made.decide(llm(60.0), NOW, f"r{i}")
        late = NOW + 5.0 + decision.expected_s
        made.answered(answer(f"r{i}", late, assigned_s=NOW + 5.0))
    assert made.margin_s("llama-2-7b", NOW) == 0.0
