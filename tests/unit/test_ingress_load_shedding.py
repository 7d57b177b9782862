"""The ingress's deadline-aware admission policy (pure): admit while a worker serving the
model can finish the request before its deadline, 429 with a growing Retry-After past
that, 503 once no live worker has served the model for the grace period, and fail open
before the first read of the cluster."""

from __future__ import annotations

import pytest
from switchyard.cluster import ClusterView, WorkerRecord, WorkerStatus
from switchyard.contracts.messages import Heartbeat
from switchyard.perf.profiles import performance_model

from services.ingress.load_shedding import (
    NO_WORKER_RETRY_AFTER_S,
    AdmissionGate,
    Demand,
    Verdict,
    estimate,
)

NOW = 1_000.0
PROFILE = "a100-80gb/llama-2-7b"
PROMPT, OUTPUT = 1000, 250
IDLE_S = performance_model(PROFILE).idle_service_s(PROMPT, OUTPUT)  # about 3 s


def beat(
    worker_id: str = "w1",
    *,
    waiting: int = 0,
    running: int = 0,
    queued_work_s: float = 0.0,
    models: tuple[str, ...] = ("llama-2-7b",),
    profile: str | None = PROFILE,
    time_scale: float = 1.0,
    sent_at_s: float = NOW,
    draining: bool = False,
    decode_step_s: float = 0.0,
    kv_capacity: int = 0,
    queued_tokens: int = 0,
) -> Heartbeat:
    return Heartbeat(
        worker_id=worker_id,
        worker_type="a100-80gb",
        sequence=1,
        interval_s=0.5,
        queue_length=waiting,
        queued_work_s=queued_work_s,
        running=running,
        utilization=1.0 if waiting else 0.0,
        servable_models=list(models),
        profile=profile,
        time_scale=time_scale,
        draining=draining,
        decode_step_s=decode_step_s,
        kv_capacity_tokens=kv_capacity,
        queued_tokens=queued_tokens,
        sent_at_s=sent_at_s,
    )


def record(
    heartbeat: Heartbeat, *, seen_s: float = NOW, status: WorkerStatus = WorkerStatus.ALIVE
) -> WorkerRecord:
    return WorkerRecord(
        worker_id=heartbeat.worker_id,
        status=status,
        last_seen_s=seen_s,
        age_s=max(0.0, NOW - seen_s),
        heartbeat=heartbeat,
    )


def view(*records: WorkerRecord, now_s: float = NOW) -> ClusterView:
    return ClusterView(now_s=now_s, workers=tuple(records))


def llm(deadline_in_s: float = 30.0, *, at_s: float = NOW, model: str = "llama-2-7b") -> Demand:
    return Demand(
        kind="llm",
        model=model,
        arrival_s=at_s,
        deadline_s=at_s + deadline_in_s,
        prompt_tokens=PROMPT,
        output_tokens=OUTPUT,
    )


def saturated(queued_work_s: float, worker_id: str = "w1") -> WorkerRecord:
    """A worker whose batch is full and whose queue holds ``queued_work_s`` of work."""
    return record(beat(worker_id, waiting=200, running=94, queued_work_s=queued_work_s))


def gate(*records: WorkerRecord, slack: float = 1.0, grace_s: float = 10.0) -> AdmissionGate:
    made = AdmissionGate(slack=slack, grace_s=grace_s, worker_timeout_s=2.0)
    made.observe(view(*records))
    return made


def test_an_idle_worker_admits_at_its_idle_service_time() -> None:
    decision = gate(record(beat())).decide(llm(), NOW)
    assert decision.verdict is Verdict.ADMIT
    assert decision.worker_id == "w1"
    assert decision.wait_s == 0.0
    assert decision.service_s == pytest.approx(IDLE_S)
    assert decision.retry_after_s == 0


def test_emulated_time_is_divided_by_the_heartbeats_time_scale() -> None:
    decision = gate(record(beat(time_scale=20.0))).decide(llm(30.0 / 20), NOW)
    assert decision.admitted
    assert decision.service_s == pytest.approx(IDLE_S / 20)


def test_a_backlog_beyond_the_deadline_is_refused_with_429_and_retry_after() -> None:
    decision = gate(saturated(2_000.0)).decide(llm(30.0), NOW)
    assert decision.verdict is Verdict.OVERLOADED
    assert decision.worker_id == "w1"
    assert decision.expected_s > 30.0
    assert decision.wait_s > 0
    # A full batch runs each request slower than alone.
    assert decision.service_s > IDLE_S
    assert decision.retry_after_s == pytest.approx(decision.expected_s - 30.0, abs=1.0)
    assert decision.retry_after_s >= 1
    assert "w1" in decision.reason


def test_retry_after_grows_with_the_backlog() -> None:
    after = [gate(saturated(work)).decide(llm(30.0), NOW).retry_after_s for work in (1e3, 2e3, 4e3)]
    assert 1 <= after[0] < after[1] < after[2]


def test_the_wait_is_the_backlog_drained_at_the_full_batch_rate() -> None:
    one = estimate(llm(), saturated(1_000.0), NOW)
    two = estimate(llm(), saturated(2_000.0), NOW)
    rate = 1_000.0 / (two.wait_s - one.wait_s)
    # Dozens of sequences in a batch, each slower than alone: many times one at a time.
    assert 5.0 < rate < 94.0
    assert one.wait_s == pytest.approx(1_000.0 / rate)


def test_a_worker_with_a_free_slot_starts_the_request_at_once() -> None:
    # Work queued, but the batch has room: no wait, only a slightly slower service.
    found = estimate(llm(), record(beat(running=10, queued_work_s=40.0)), NOW)
    assert found.wait_s == 0.0
    assert IDLE_S < found.service_s < 2 * IDLE_S


def test_the_backlog_drains_while_the_heartbeat_ages() -> None:
    fresh = estimate(llm(), saturated(1_000.0), NOW)
    later = estimate(llm(), saturated(1_000.0), NOW + 5.0)
    assert later.wait_s == pytest.approx(fresh.wait_s - 5.0)


def test_slack_trades_lateness_against_refusals() -> None:
    workers = saturated(400.0)
    expected_s = estimate(llm(), workers, NOW).expected_s
    assert 30.0 < expected_s < 90.0
    assert not gate(workers, slack=1.0).decide(llm(30.0), NOW).admitted
    assert gate(workers, slack=3.0).decide(llm(30.0), NOW).admitted
    # Below 1 it keeps headroom: refuses what would just fit.
    deadline_s = expected_s / 0.75
    assert gate(workers, slack=1.0).decide(llm(deadline_s), NOW).admitted
    assert not gate(workers, slack=0.5).decide(llm(deadline_s), NOW).admitted


def test_the_least_loaded_worker_of_the_model_decides() -> None:
    made = gate(saturated(4_000.0, "busy"), record(beat("idle")))
    decision = made.decide(llm(30.0), NOW)
    assert decision.admitted
    assert decision.worker_id == "idle"


def test_an_idle_decode_worker_does_not_admit_what_the_prefill_pool_cannot_start() -> None:
    idle_decoder = record(beat("decoder").model_copy(update={"role": "decode"}))
    made = gate(saturated(4_000.0, "prefill"), idle_decoder)
    decision = made.decide(llm(30.0), NOW)
    assert decision.verdict is Verdict.OVERLOADED
    assert decision.worker_id == "prefill"


def test_admissions_since_the_heartbeat_count_until_the_next_one() -> None:
    # A free batch slot for each of 94 requests, then a queue: a burst between two
    # heartbeats fills the worker by local accounting alone.
    made = gate(record(beat(sent_at_s=NOW - 0.2)))
    verdicts = [made.decide(llm(10.0), NOW).verdict for _ in range(400)]
    assert verdicts[0] is Verdict.ADMIT
    assert Verdict.OVERLOADED in verdicts
    admitted = verdicts.index(Verdict.OVERLOADED)
    assert 10 < admitted < 400
    # Once refused, the rest of the burst is refused too: the accounted work stays.
    assert set(verdicts[admitted:]) == {Verdict.OVERLOADED}
    # A heartbeat sent after those admissions covers them: the worker is idle again.
    made.observe(view(record(beat(sent_at_s=NOW + 1.0), seen_s=NOW + 1.0), now_s=NOW + 1.0))
    assert made.decide(llm(10.0, at_s=NOW + 1.0), NOW + 1.0).admitted


def test_a_request_that_cannot_meet_its_deadline_even_idle_is_not_overload() -> None:
    decision = gate(record(beat())).decide(llm(IDLE_S / 2), NOW)
    assert decision.admitted
    assert "idle" in decision.reason


def test_a_free_batch_slot_is_no_use_while_the_kv_cache_is_taken() -> None:
    capacity = performance_model(PROFILE).kv_capacity_tokens
    roomy = estimate(llm(), record(beat(running=2, kv_capacity=capacity)), NOW)
    assert roomy.wait_s == 0.0
    # Two running requests hold (or will hold) all but a few hundred tokens of the cache.
    full = beat(running=2, queued_work_s=40.0, kv_capacity=capacity, queued_tokens=capacity - 300)
    taken = estimate(llm(), record(full), NOW)
    assert taken.wait_s > 0.0


def test_late_requests_that_would_wait_are_refused_so_they_cannot_starve_others() -> None:
    """Giant requests whose deadline no worker could meet: the first start at once (they
    delay no one), the ones that would queue are refused; a normal request that comes
    after still gets an answer at once: admitted, or a 429 saying when to retry, never
    a wait behind work that is late whatever happens."""
    capacity = performance_model(PROFILE).kv_capacity_tokens
    made = gate(record(beat(kv_capacity=capacity, sent_at_s=NOW - 0.2)))
    giant = Demand(
        kind="llm",
        model="llama-2-7b",
        arrival_s=NOW,
        deadline_s=NOW + 0.001,
        prompt_tokens=2000,
        output_tokens=2000,
    )
    verdicts = [made.decide(giant, NOW).verdict for _ in range(60)]
    started = verdicts.count(Verdict.ADMIT)
    # As many as the KV cache holds at once, then refusals.
    assert 1 <= started <= capacity // 4000
    assert verdicts[started:] == [Verdict.OVERLOADED] * (60 - started)
    normal = made.decide(llm(5.0), NOW)
    assert normal.verdict is Verdict.OVERLOADED
    assert normal.retry_after_s >= 1


def test_fails_open_before_the_first_refresh() -> None:
    made = AdmissionGate(slack=1.0, grace_s=0.0)
    assert not made.ready
    decision = made.decide(llm(0.001), NOW)
    assert decision.admitted
    assert "fail open" in decision.reason


def test_no_worker_for_the_model_is_503_after_the_grace_period() -> None:
    made = gate(record(beat(models=("llama-2-13b",))), grace_s=5.0)
    # Within the grace (counted from the first refresh) the scheduler holds it.
    assert made.decide(llm(), NOW + 4.0).admitted
    decision = made.decide(llm(at_s=NOW + 6.0), NOW + 6.0)
    assert decision.verdict is Verdict.NO_WORKER
    assert decision.retry_after_s == NO_WORKER_RETRY_AFTER_S


def test_an_empty_cluster_is_503_only_after_the_grace_period() -> None:
    made = gate(grace_s=5.0)
    assert made.ready
    assert made.decide(llm(), NOW + 1.0).admitted
    assert made.decide(llm(), NOW + 6.0).verdict is Verdict.NO_WORKER


def test_the_grace_runs_from_when_a_live_worker_last_served_the_model() -> None:
    made = gate(record(beat()), grace_s=5.0)
    made.observe(view(record(beat(), seen_s=NOW + 10.0), now_s=NOW + 10.0))
    made.observe(view(now_s=NOW + 11.0))  # the worker is gone
    assert made.decide(llm(at_s=NOW + 14.0), NOW + 14.0).admitted
    assert made.decide(llm(at_s=NOW + 16.0), NOW + 16.0).verdict is Verdict.NO_WORKER


@pytest.mark.parametrize(
    "dead",
    [
        record(beat(), status=WorkerStatus.DOWN),
        record(beat(), seen_s=NOW - 30.0),  # silent past the worker timeout
        record(beat(draining=True)),
    ],
    ids=["down", "silent", "draining"],
)
def test_dead_silent_and_draining_workers_do_not_serve(dead: WorkerRecord) -> None:
    made = gate(dead, grace_s=0.0)
    assert made.decide(llm(), NOW + 0.5).verdict is Verdict.NO_WORKER


def test_classification_uses_the_profiled_latency_and_the_app_prefix() -> None:
    worker = record(
        beat(
            "cpu-0",
            models=("wine/mlp-small", "digits/logreg"),
            profile=None,
            waiting=50,
            running=8,
            queued_work_s=1.0,
        )
    )
    made = gate(worker)

    def wine(deadline_in_s: float) -> Demand:
        return Demand(
            kind="classification",
            model="wine",
            arrival_s=NOW,
            deadline_s=NOW + deadline_in_s,
            service_s=0.002,
        )

    # A classification worker's queued work is already wall seconds to drain.
    ok = made.decide(wine(2.0), NOW)
    assert ok.admitted
    assert ok.wait_s == pytest.approx(1.0)
    assert ok.service_s == pytest.approx(0.002)
    refused = made.decide(wine(0.5), NOW)
    assert refused.verdict is Verdict.OVERLOADED
    assert refused.retry_after_s == 1
    missing = Demand(kind="classification", model="fraud", arrival_s=NOW, deadline_s=NOW + 1)
    assert AdmissionGate(grace_s=0.0).decide(missing, NOW).admitted  # not refreshed yet
    assert gate(worker, grace_s=0.0).decide(missing, NOW + 1).verdict is Verdict.NO_WORKER


def test_an_llm_worker_without_a_profile_is_timed_by_its_decode_step() -> None:
    worker = record(beat(models=("tiny-lm",), profile=None, decode_step_s=0.01))
    found = estimate(llm(model="tiny-lm"), worker, NOW)
    assert found.service_s == pytest.approx(0.01 * (OUTPUT + 1))


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="slack"):
        AdmissionGate(slack=0.0)
    with pytest.raises(ValueError, match="grace_s"):
        AdmissionGate(grace_s=-1.0)
