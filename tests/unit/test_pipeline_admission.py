"""Admission control for pipeline calls (pure): a call is admitted while its stages, each
on the worker that can finish it soonest, fit its deadline; 429 with Retry-After once
the queues of a stage's model push its critical path past it; load times of models
still loading or placed nowhere count; 503 once no emulated-models worker has been live
for the grace period; the gate fails open before its first read of the cluster."""

from __future__ import annotations

import itertools

import pytest
from switchyard.cluster import ClusterView, WorkerRecord, WorkerStatus
from switchyard.contracts.messages import Heartbeat, PlacedModel, PlacedState
from switchyard.multimodel.model import ModelSpec, PipelineSpec, ResourceVector, Stage

from services.ingress.load_shedding import NO_WORKER_RETRY_AFTER_S, Verdict
from services.ingress.pipeline_admission import PipelineGate

NOW = 1_000.0
MODELS = {
    spec.name: spec
    for spec in (
        ModelSpec(name="enc", resources=ResourceVector(1.0, 0.25, 4.0), load_s=2.0, exec_s=0.5),
        ModelSpec(name="gen", resources=ResourceVector(2.0, 0.5, 16.0), load_s=10.0, exec_s=2.0),
        ModelSpec(name="up", resources=ResourceVector(2.0, 0.5, 8.0), load_s=5.0, exec_s=3.0),
        ModelSpec(name="chk", resources=ResourceVector(1.0, 0.25, 4.0), load_s=1.0, exec_s=1.0),
    )
}
# enc -> gen -> (up, chk): the critical path on idle workers is 0.5 + 2 + 3 = 5.5 s.
PIPELINE = PipelineSpec(
    name="img",
    stages=(
        Stage(name="encode", model="enc"),
        Stage(name="generate", model="gen", after=("encode",)),
        Stage(name="upscale", model="up", after=("generate",)),
        Stage(name="check", model="chk", after=("generate",)),
    ),
    slo_s=30.0,
)
IDLE_PATH_S = 5.5


def placed(model: str, *, queued: int = 0, running: int = 0, ready_in_s: float = 0.0,
           state: PlacedState = PlacedState.READY) -> PlacedModel:  # fmt: skip
    return PlacedModel(
        model=model, state=state, ready_in_s=ready_in_s, queued=queued, running=running
    )


def beat(
    worker_id: str = "w1",
    *models: PlacedModel,
    speed: float = 1.0,
    time_scale: float = 1.0,
    sent_at_s: float = NOW,
    backend: str = "emulated-models",
) -> Heartbeat:
    return Heartbeat(
        worker_id=worker_id,
        worker_type="a100",
        sequence=1,
        interval_s=0.5,
        queue_length=sum(p.queued for p in models),
        queued_work_s=0.0,
        running=sum(p.running for p in models),
        utilization=0.0,
        backend=backend,
        placed=list(models),
        speed=speed,
        time_scale=time_scale,
        sent_at_s=sent_at_s,
    )


def every_model(**counts: int) -> list[PlacedModel]:
    """Every model ready; ``counts`` queued on the ones named."""
    return [placed(name, queued=counts.get(name, 0)) for name in MODELS]


def record(heartbeat: Heartbeat, *, seen_s: float = NOW) -> WorkerRecord:
    return WorkerRecord(
        worker_id=heartbeat.worker_id,
        status=WorkerStatus.ALIVE,
        last_seen_s=seen_s,
        age_s=max(0.0, NOW - seen_s),
        heartbeat=heartbeat,
    )


def gate_seeing(*heartbeats: Heartbeat, slack: float = 1.0) -> PipelineGate:
    gate = PipelineGate(MODELS, slack=slack, grace_s=10.0, worker_timeout_s=2.0)
    gate.observe(ClusterView(now_s=NOW, workers=tuple(record(h) for h in heartbeats)))
    return gate


_calls = itertools.count()


def judge(gate: PipelineGate, deadline_in_s: float, *, exec_scale: float = 1.0,
          now_s: float = NOW, call_id: str | None = None) -> Verdict:  # fmt: skip
    return gate.decide(
        PIPELINE,
        exec_scale=exec_scale,
        arrival_s=now_s,
        deadline_s=now_s + deadline_in_s,
        now_s=now_s,
        call_id=call_id or f"call-{next(_calls)}",
    ).verdict


def test_before_the_first_read_of_the_cluster_every_call_is_admitted() -> None:
    gate = PipelineGate(MODELS)
    assert judge(gate, 0.001) is Verdict.ADMIT


def test_on_idle_workers_a_call_is_admitted_exactly_when_its_critical_path_fits() -> None:
    gate = gate_seeing(beat("w1", *every_model()))
    assert judge(gate, IDLE_PATH_S + 0.01) is Verdict.ADMIT
    # Late even on idle workers, it waits behind no one: admitted (it delays nobody).
    assert judge(gate_seeing(beat("w1", *every_model())), 1.0) is Verdict.ADMIT


def test_a_stage_queue_that_pushes_the_path_past_the_deadline_refuses_with_retry_after() -> None:
    # Four upscales queued: the call's upscale waits 4 x 3 s after its generate.
    busy = beat("w1", *every_model(up=4))
    decision = gate_seeing(busy).decide(
        PIPELINE, exec_scale=1.0, arrival_s=NOW, deadline_s=NOW + 10.0, now_s=NOW, call_id="c"
    )
    assert decision.verdict is Verdict.OVERLOADED
    # Upscale is free after 12 s, then runs 3 s: 15 s expected, 5 s over.
    assert decision.wait_s + decision.service_s == pytest.approx(15.0)
    assert decision.retry_after_s == 5
    # The same queue on one of two workers: the other serves upscale at once.
    assert judge(gate_seeing(busy, beat("w2", *every_model())), 10.0) is Verdict.ADMIT


def test_the_queue_drains_as_time_passes_since_the_heartbeat() -> None:
    gate = PipelineGate(MODELS, grace_s=10.0, worker_timeout_s=20.0)
    later_s = NOW + 9.0
    gate.observe(
        ClusterView(now_s=later_s, workers=(record(beat("w1", *every_model(up=4)), seen_s=NOW),))
    )
    # 12 s of upscales queued, 9 s of it done since: 3 s left, ready by the time the
    # call's generate is (2.5 s): 3 + 3 = 6 s expected.
    assert judge(gate, 6.1, now_s=later_s) is Verdict.ADMIT
    assert judge(gate, 5.5, now_s=later_s) is Verdict.OVERLOADED


def test_a_model_still_loading_or_placed_nowhere_counts_its_load_time() -> None:
    loading = [placed("enc", state=PlacedState.LOADING, ready_in_s=8.0)]
    loading += [placed(name) for name in ("gen", "up", "chk")]
    gate = gate_seeing(beat("w1", *loading))
    # encode starts after the 8 s load: 8 + 5.5 = 13.5 s.
    assert judge(gate, 13.6) is Verdict.ADMIT
    assert judge(gate_seeing(beat("w1", *loading)), 13.0) is Verdict.OVERLOADED
    # Nothing placed: the slowest chain of loads and services is gen's 10 s load, then
    # generate 2 s and upscale 3 s (its 5 s load is done by then): 15 s.
    nothing = gate_seeing(beat("w1"))
    assert judge(nothing, 15.1) is Verdict.ADMIT
    assert judge(gate_seeing(beat("w1")), 14.0) is Verdict.OVERLOADED


def test_a_draining_model_serves_no_new_stage() -> None:
    draining = [placed(n) for n in ("enc", "gen", "chk")]
    draining.append(placed("up", state=PlacedState.DRAINING))
    # Upscale waits for up to load again (5 s, past generate's end at 2.5 s), then
    # runs 3 s: 8 s.
    assert judge(gate_seeing(beat("w1", *draining)), 7.5) is Verdict.OVERLOADED
    assert judge(gate_seeing(beat("w1", *draining)), 8.1) is Verdict.ADMIT


def test_times_follow_the_workers_speed_the_time_scale_and_the_calls_exec_scale() -> None:
    fast = beat("w1", *every_model(up=4), speed=2.0, time_scale=10.0)
    # Everything 20 times faster: 15 s expected becomes 0.75 s.
    assert judge(gate_seeing(fast), 0.8) is Verdict.ADMIT
    assert judge(gate_seeing(fast), 0.7) is Verdict.OVERLOADED
    # Twice the work per stage: 1.5 s.
    assert judge(gate_seeing(fast), 1.4, exec_scale=2.0) is Verdict.OVERLOADED
    assert judge(gate_seeing(fast), 1.6, exec_scale=2.0) is Verdict.ADMIT


def test_admitted_calls_count_until_they_end_or_a_heartbeat_lists_their_stages() -> None:
    gate = gate_seeing(beat("w1", *every_model()))
    # Each admitted call's stages are work to come on their models (3 s of upscale
    # each): the fifth call's upscale starts after 12 s of them, 15 s in all.
    verdicts = [judge(gate, 12.0, call_id=f"c{i}") for i in range(5)]
    assert verdicts == [Verdict.ADMIT] * 4 + [Verdict.OVERLOADED]
    # Two calls end (answered, or their client gone): their stages not sent never will be.
    gate.call_ended("c0")
    gate.call_ended("c1")
    assert judge(gate, 12.0, call_id="c5") is Verdict.ADMIT  # behind c2, c3: 9 s
    # A skipped stage is no work to come; sent stages count until a heartbeat lists them.
    gate.stage_dropped("c2", "upscale")
    for call_id in ("c2", "c3", "c5"):
        for stage in PIPELINE.stages:
            gate.stage_sent(call_id, stage.name, NOW + 0.01)
    # Still to come: 1.5 s of encodes, 6 s of generates and 6 s of upscales (c2's was
    # skipped, else 9 s): a new call's upscale is ready at 8 s, free at 6 s, done at 11 s.
    assert judge(gate, 10.5) is Verdict.OVERLOADED
    assert judge(gate, 11.5, call_id="c6") is Verdict.ADMIT
    sent_after = beat("w1", *every_model(), sent_at_s=NOW + 0.05)
    gate.observe(ClusterView(now_s=NOW + 0.1, workers=(record(sent_after),)))
    # That heartbeat lists whatever of the sent stages still waits (here: nothing); only
    # c6, not sent yet, is still to come: 0.5 + 2 + 3 s ahead of the next call, 7 s.
    assert judge(gate, 6.9) is Verdict.OVERLOADED
    assert judge(gate, 7.1) is Verdict.ADMIT


def test_no_live_emulated_models_worker_admits_within_the_grace_then_answers_503() -> None:
    llm_only = beat("w1", backend="emulated-llm")
    gate = PipelineGate(MODELS, grace_s=10.0, worker_timeout_s=2.0)
    gate.observe(ClusterView(now_s=NOW, workers=(record(llm_only),)))
    assert judge(gate, 30.0, now_s=NOW + 5.0) is Verdict.ADMIT
    decision = gate.decide(
        PIPELINE,
        exec_scale=1.0,
        arrival_s=NOW + 11.0,
        deadline_s=NOW + 41.0,
        now_s=NOW + 11.0,
        call_id="c",
    )
    assert decision.verdict is Verdict.NO_WORKER
    assert decision.retry_after_s == NO_WORKER_RETRY_AFTER_S


def test_slack_below_one_keeps_headroom() -> None:
    assert judge(gate_seeing(beat("w1", *every_model()), slack=0.5), 12.0) is Verdict.ADMIT
    busy = beat("w1", *every_model(up=1))  # upscale free after 3 s: 6 s expected
    assert judge(gate_seeing(busy, slack=1.0), 10.0) is Verdict.ADMIT
    assert judge(gate_seeing(busy, slack=0.5), 10.0) is Verdict.OVERLOADED


def _admit_and_answer(gate: PipelineGate, calls: int, late_by_s: float) -> float:
    """``calls`` calls admitted on idle workers (deadline 30 s), one after the other,
    each answered ``late_by_s`` after its estimate; returns when the last was answered."""
    answered_at_s = NOW
    for _ in range(calls):
        call_id = f"calibration-{next(_calls)}"
        assert judge(gate, 30.0, call_id=call_id) is Verdict.ADMIT
        answered_at_s = NOW + IDLE_PATH_S + late_by_s
        gate.call_ended(call_id, answered_at_s)
    return answered_at_s


def test_calls_answered_later_than_estimated_widen_every_later_estimate() -> None:
    gate = gate_seeing(beat("w1", *every_model()))
    assert judge(gate, IDLE_PATH_S + 2.0, call_id="before") is Verdict.ADMIT
    gate.call_ended("before")  # failed: it teaches nothing
    _admit_and_answer(gate, 40, late_by_s=4.0)
    assert gate.margin_s(NOW) == pytest.approx(4.0)
    # 5.5 s estimated + 4 s learned > 7.5 s left, though on idle workers it fits.
    decision = gate.decide(
        PIPELINE, exec_scale=1.0, arrival_s=NOW, deadline_s=NOW + 7.5, now_s=NOW, call_id="c"
    )
    assert decision.verdict is Verdict.OVERLOADED
    assert "calibration +4.000 s" in decision.reason
    assert judge(gate, IDLE_PATH_S + 4.5) is Verdict.ADMIT


def test_the_margin_is_the_quantile_of_the_errors_never_below_zero() -> None:
    gate = gate_seeing(beat("w1", *every_model()))
    _admit_and_answer(gate, 90, late_by_s=-1.0)  # answered early: no negative margin
    assert gate.margin_s(NOW) == 0.0
    _admit_and_answer(gate, 10, late_by_s=6.0)  # a tenth late: the 0.9 quantile is late
    assert gate.margin_s(NOW) == pytest.approx(6.0)
    # Only the latest 200 count: of 200 late ones, 20 are left after 180 early ones (the
    # 0.9 quantile is still late), and 19 after one more (it is not).
    _admit_and_answer(gate, 200, late_by_s=6.0)
    _admit_and_answer(gate, 180, late_by_s=-1.0)  # 20 late ones left: the 0.9 quantile
    assert gate.margin_s(NOW) == pytest.approx(6.0)
    _admit_and_answer(gate, 1, late_by_s=-1.0)
    assert gate.margin_s(NOW) == 0.0


def test_a_few_late_calls_are_no_margin_and_an_old_margin_lapses() -> None:
    gate = gate_seeing(beat("w1", *every_model()))
    _admit_and_answer(gate, 5, late_by_s=20.0)  # a handful: their worst is no quantile
    assert gate.margin_s(NOW) == 0.0
    assert judge(gate, IDLE_PATH_S + 1.0, call_id="after") is Verdict.ADMIT
    gate.call_ended("after")
    answered_at_s = _admit_and_answer(gate, 40, late_by_s=20.0)
    assert gate.margin_s(answered_at_s) == pytest.approx(20.0)
    # An error counts for 4 relative deadlines (4 x 30 s) after its answer: with nothing
    # admitted since, the margin lapses and calls are admitted again.
    assert gate.margin_s(answered_at_s + 119.0) == pytest.approx(20.0)
    assert gate.margin_s(answered_at_s + 121.0) == 0.0


def test_calls_that_wait_for_a_model_placed_nowhere_teach_nothing() -> None:
    # A cold start: no worker holds the upscaler yet, so every call also waits for the
    # placement service's next round, which no estimate includes.
    gate = gate_seeing(beat("w1", *(p for p in every_model() if p.model != "up")))
    for _ in range(40):
        call_id = f"cold-{next(_calls)}"
        assert judge(gate, 60.0, call_id=call_id) is Verdict.ADMIT
        gate.call_ended(call_id, NOW + 30.0)
    assert gate.margin_s(NOW) == 0.0
