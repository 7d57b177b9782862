"""The discrete-event simulator: its batching physics, its determinism, and what the
policies it drives achieve on real trace rows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from switchyard.contracts.messages import WorkloadType
from switchyard.perf import performance_model
from switchyard.policies import PolicyOptions, make_llm_policy
from switchyard.policies.base import DecisionContext, MigrationPlan
from switchyard.policies.gaps import GapsRebalanceConfig
from switchyard.policies.snapshot import (
    QueueScope,
    RebalanceSnapshot,
    RequestPhase,
    RequestView,
    WorkerRole,
)
from switchyard.slo import TokenSlo
from switchyard.traces import TraceRequest, resolve_trace, scale_load

from research.llm import RunMetrics, SimulationConfig, SimulationError, Simulator
from research.llm.experiment import ExperimentConfig, run_experiment
from research.llm.instance import SimInstance
from research.llm.request import SimRequest

A100 = "a100-80gb/llama-2-7b"
H100 = "h100-80gb/llama-2-7b"


@dataclass(frozen=True)
class Row:
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    workload: WorkloadType = WorkloadType.CONVERSATION
    prefix_blocks: tuple[int, ...] = ()


def simulate(
    policy: str, rows: Sequence[Row] | Sequence[TraceRequest], **config: Any
) -> tuple[Simulator, RunMetrics]:
    sim = Simulator(make_llm_policy(policy), SimulationConfig(**{"workers": 1, **config}))
    return sim, sim.run(rows)


@pytest.fixture(scope="module")
def busy_conv() -> Sequence[TraceRequest]:
    # The bundled conversation sample at ten times its rate keeps 4 workers busy.
    return scale_load(resolve_trace("azure-conv-sample"), 10.0).requests


def test_a_lone_request_takes_exactly_its_idle_service_time() -> None:
    perf = performance_model(A100)
    sim, metrics = simulate("jsq", [Row(0.0, 1200, 300)])
    assert metrics.completed == 1
    assert metrics.p50_s == pytest.approx(perf.idle_service_s(1200, 300), rel=1e-9)
    (request,) = sim.completed
    assert request.first_token_s == pytest.approx(perf.prefill_s([1200]), rel=1e-9)


def test_batching_shares_a_worker_faster_than_taking_turns() -> None:
    perf = performance_model(A100)
    alone = [perf.idle_service_s(800, 200), perf.idle_service_s(600, 400)]
    sim, metrics = simulate("jsq", [Row(0.0, 800, 200), Row(0.0, 600, 400)])
    finished = sorted(r.finished_s for r in sim.completed)
    assert metrics.completed == 2
    assert finished[-1] < sum(alone)  # together beats one after the other
    assert finished[0] > min(alone)  # but each is slower than alone


def test_a_request_arriving_mid_decode_joins_the_running_batch() -> None:
    sim, _ = simulate("jsq", [Row(0.0, 500, 2000), Row(1.0, 500, 10)])
    second = next(r for r in sim.completed if r.output_tokens == 10)
    first = next(r for r in sim.completed if r.output_tokens == 2000)
    assert second.finished_s < first.finished_s  # it did not wait for the long one


def test_the_kv_cache_limits_how_many_run_at_once() -> None:
    perf = performance_model(A100)
    # Each request reserves about half the cache: the second must wait for the first.
    half = perf.kv_capacity_tokens // 2 + 1
    sim, _ = simulate("jsq", [Row(0.0, half - 100, 100), Row(0.0, half - 100, 100)])
    first, second = sorted(sim.completed, key=lambda r: r.finished_s)
    assert second.started_s >= first.finished_s


def test_a_request_larger_than_the_cache_is_reported_not_simulated() -> None:
    perf = performance_model(A100)
    _, metrics = simulate("jsq", [Row(0.0, perf.kv_capacity_tokens, 10), Row(0.1, 100, 10)])
    assert (metrics.requests, metrics.completed, metrics.rejected) == (2, 1, 1)


def test_ttft_tpot_and_goodput_follow_the_token_objectives() -> None:
    perf = performance_model(A100)
    rows = [Row(0.0, 1200, 300), Row(10.0, 800, 100), Row(20.0, perf.kv_capacity_tokens, 10)]
    sim, metrics = simulate("jsq", rows)
    ttfts = [r.first_token_s - r.arrival_s for r in sim.completed]
    tpots = [(r.finished_s - r.first_token_s) / (r.output_tokens - 1) for r in sim.completed]
    assert ttfts[0] == pytest.approx(perf.prefill_s([1200]))
    assert metrics.ttft_p50_s == pytest.approx(sum(ttfts) / 2)  # median of two
    assert metrics.tpot_p50_s == pytest.approx(sum(tpots) / 2)
    # Two of three met every (default) objective; the rejected one is a miss.
    assert metrics.slo_attainment == pytest.approx(2 / 3)
    assert metrics.goodput_rps == pytest.approx(2 / 20.0)  # per second of arrivals
    strict = {w: TokenSlo(ttft_s=1e-3, tpot_s=1.0) for w in WorkloadType}
    _, missed = simulate("jsq", rows, token_slos=strict)
    assert (missed.ttft_attainment, missed.slo_attainment, missed.goodput_rps) == (0, 0, 0)
    assert missed.tpot_attainment == pytest.approx(2 / 3)
    assert missed.slo_violation_rate == metrics.slo_violation_rate  # end to end only


@pytest.mark.parametrize(
    "policy",
    ["round-robin", "random", "jsq", "power-of-two", "least-work", "llumnix", "splitwise",
     "flashgen", "gaps", "gaps-nopred", "gaps-norebal", "gaps-noglobal", "oracle"],
)  # fmt: skip
def test_every_policy_completes_every_request(
    policy: str, busy_conv: Sequence[TraceRequest]
) -> None:
    _, metrics = simulate(policy, busy_conv[:400], workers=4)
    assert metrics.completed == metrics.requests == 400
    assert 0 < metrics.p50_s <= metrics.p90_s <= metrics.p99_s
    assert 0.0 < metrics.mean_utilization <= 1.0


def test_the_same_seed_gives_the_same_runs(busy_conv: Sequence[TraceRequest]) -> None:
    config = ExperimentConfig(
        trace="azure-conv-sample", policies=("random", "gaps", "llumnix"), workers=(4,), seeds=2
    )

    def once() -> list[dict[str, object]]:
        runs = run_experiment(config, lambda _: busy_conv[:300])
        return [
            {k: v for k, v in r.items() if k not in ("sim_wall_s", "simulated_rps")} for r in runs
        ]

    first, second = once(), once()
    assert first == second
    assert first[0]["p99_s"] != first[3]["p99_s"]  # but seeds differ (random policy)


def test_the_oracle_never_loses_to_round_robin_on_p99(busy_conv: Sequence[TraceRequest]) -> None:
    for workers in (2, 4):
        _, oracle = simulate("oracle", busy_conv, workers=workers)
        _, blind = simulate("round-robin", busy_conv, workers=workers)
        assert oracle.p99_s <= blind.p99_s


def test_rebalancing_migrates_only_when_the_gain_beats_the_cost(
    busy_conv: Sequence[TraceRequest],
) -> None:
    # No hysteresis here: the cost alone decides.
    cheap = PolicyOptions(
        gaps_rebalance=GapsRebalanceConfig(fixed_overhead_s=0.05, min_gain_fraction=0.0)
    )
    dear = PolicyOptions(
        gaps_rebalance=GapsRebalanceConfig(fixed_overhead_s=1e6, min_gain_fraction=0.0)
    )
    config = SimulationConfig(workers=4)
    moved = Simulator(make_llm_policy("gaps", cheap), config)
    moved_metrics = moved.run(busy_conv)
    kept = Simulator(make_llm_policy("gaps", dear), config).run(busy_conv)
    assert moved_metrics.migrations > 0
    assert moved_metrics.migration_cost_s == pytest.approx(0.05 * moved_metrics.migrations)
    assert kept.migrations == 0
    assert sum(r.migrations for r in moved.completed) == moved_metrics.migrations


def test_llumnix_pays_for_the_kv_cache_it_moves(busy_conv: Sequence[TraceRequest]) -> None:
    _, metrics = simulate("llumnix", busy_conv, workers=4)
    # This load makes Llumnix migrate (34 times): each move costs its KV transfer.
    assert metrics.migrations > 0
    assert metrics.migration_cost_s > 0.02 * metrics.migrations


def test_a_mixed_cluster_gives_the_faster_gpu_more_work(busy_conv: Sequence[TraceRequest]) -> None:
    sim, metrics = simulate("gaps", busy_conv, workers=2, profiles=(A100, H100))
    served = [r.served_by for r in sim.completed]
    assert metrics.completed == len(busy_conv)
    assert served.count(H100) > served.count(A100)


def test_more_workers_cut_the_tail(busy_conv: Sequence[TraceRequest]) -> None:
    _, small = simulate("gaps", busy_conv, workers=2)
    _, large = simulate("gaps", busy_conv, workers=8)
    assert large.p99_s < small.p99_s


def test_bad_settings_are_named() -> None:
    with pytest.raises(SimulationError, match="workers"):
        SimulationConfig(workers=0)
    with pytest.raises(SimulationError, match="predictor-error"):
        SimulationConfig(workers=1, predictor_error=2.0)
    with pytest.raises(SimulationError, match="b200"):
        Simulator(make_llm_policy("jsq"), SimulationConfig(workers=1, profiles=("b200/x",)))
    with pytest.raises(SimulationError, match="no requests"):
        Simulator(make_llm_policy("jsq"), SimulationConfig(workers=1)).run([])


def test_splitwise_hands_every_request_from_a_prefill_to_a_decode_worker(
    busy_conv: Sequence[TraceRequest],
) -> None:
    sim, metrics = simulate("splitwise", busy_conv[:200], workers=4)
    decode_ids = {i.worker_id for i in sim.instances if i.role.value == "decode"}
    assert len(decode_ids) == 3
    assert metrics.completed == 200
    long_ones = [r for r in sim.completed if r.output_tokens > 1]
    assert long_ones
    assert {r.served_on for r in long_ones} <= decode_ids
    assert all(r.prefill_s >= r.arrival_s for r in long_ones)


def _exact_request(index: int, prompt_tokens: int, output_tokens: int) -> SimRequest:
    service_s = performance_model(A100).idle_service_s(prompt_tokens, output_tokens)
    view = RequestView(
        request_id=f"r{index}",
        arrival_s=0.0,
        prompt_tokens=prompt_tokens,
        workload=WorkloadType.CONVERSATION,
        model="llama-2-7b",
        calibrated_s={A100: service_s},
    )
    return SimRequest(
        index=index,
        arrival_s=0.0,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        workload=WorkloadType.CONVERSATION,
        view=view,
        slo_s=10 * service_s,
    )


def test_queued_work_follows_tokens_generated_not_wall_time() -> None:
    # Sixteen requests decoding together run slower than the idle worker their
    # predictions are for. Once a request's predicted idle time has passed on the wall
    # clock it still has tokens to go, and the worker must still count that work.
    perf = performance_model(A100)
    inst = SimInstance(0, "w0", perf, WorkerRole.MIXED)
    requests = [_exact_request(i, 500, 400) for i in range(16)]  # one prefill batch
    for request in requests:
        inst.enqueue(request, 0.0)
    inst.wake(0.0)  # admit: one prefill of all 16
    inst.wake(inst.busy_until_s)  # the prefill ends, the batch decodes
    idle_s = perf.idle_service_s(500, 400)
    later_s = idle_s * 1.2  # past every prediction on the wall clock
    inst.sync(later_s)
    generated = 1 + inst.steps_done
    assert 1 < generated < 400  # the batch is slower than one request alone

    per_step_s = perf.decode_step_s(1, 501)
    expected_each_s = idle_s - perf.prefill_s([500]) - (generated - 1) * per_step_s
    assert inst.queued_work_s() == pytest.approx(16 * expected_each_s, rel=1e-9)
    assert inst.remaining_work_s(requests[0]) == pytest.approx(expected_each_s, rel=1e-9)


@dataclass
class RecordingRebalancer:
    """Moves nothing; keeps every snapshot the simulator hands it."""

    queue_scope: QueueScope
    name: str = "recording"
    period_s: float = 1.0
    snapshots: list[RebalanceSnapshot] = field(default_factory=list)

    def spike(self, recent_slo_violation_rate: float) -> bool:
        return False

    def plan(self, snapshot: RebalanceSnapshot, ctx: DecisionContext) -> tuple[MigrationPlan, ...]:
        self.snapshots.append(snapshot)
        return ()


def test_a_rebalancer_sees_the_tail_of_each_queue_it_asked_for() -> None:
    # One worker whose cache holds three of these at a time: the rest wait, and the
    # rebalancer, asking for a tail of two, sees exactly the last two waiting, each with
    # the predicted work of everything queued ahead of it.
    rows = [Row(0.01 * i, 30_000, 2_000) for i in range(12)]
    recorder = RecordingRebalancer(QueueScope(waiting_tail=2, running=False))
    policy = replace(make_llm_policy("gaps"), rebalancer=recorder)
    sim = Simulator(policy, SimulationConfig(workers=1))
    sim.run(rows)

    busy = [s for s in recorder.snapshots if len(s.queued) == 2]
    assert busy, "no round saw a queue"
    snapshot = busy[0]
    first, second = snapshot.queued
    assert all(q.phase is RequestPhase.WAITING for q in snapshot.queued)
    assert [q.request.request_id for q in snapshot.queued] == ["r10", "r11"]
    assert second.work_ahead_s == pytest.approx(first.work_ahead_s + first.remaining_s)
    (worker_view,) = snapshot.cluster.workers
    assert second.work_ahead_s + second.remaining_s == pytest.approx(worker_view.queued_work_s)


@dataclass
class _TickRecorder:
    """A rebalancer that plans nothing and notes when it was asked."""

    asked_s: list[float] = field(default_factory=list)
    name: str = "recorder"
    period_s: float = 1.0
    queue_scope: QueueScope = field(default_factory=QueueScope)

    def spike(self, recent_slo_violation_rate: float) -> bool:
        return False

    def plan(self, snapshot: RebalanceSnapshot, ctx: DecisionContext) -> tuple[MigrationPlan, ...]:
        self.asked_s.append(snapshot.cluster.now_s)
        return ()


def test_rebalancing_rounds_resume_after_the_cluster_was_idle() -> None:
    recorder = _TickRecorder()
    policy = replace(make_llm_policy("jsq"), rebalancer=recorder)
    # A short request, then nothing for a minute, then a long one.
    rows = [Row(0.0, 100, 5), Row(60.0, 100, 2000)]
    Simulator(policy, SimulationConfig(workers=2)).run(rows)
    after_gap = [t for t in recorder.asked_s if t > 60.0]
    assert after_gap, recorder.asked_s
    assert after_gap[0] == pytest.approx(61.0)  # on the one-second grid from the start
    assert not any(10.0 < t < 60.0 for t in recorder.asked_s)  # none while idle


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("policy", "load_scale"),
    [
        # 1,000 requests over 17,000 s: at such instants the end of a decode step, read
        # back from its wake-up time, came out short by a rounding error and the
        # instance woke at the same instant forever.
        ("jsq", 1 / 64),
        # Migrating an instance's last running request away left it decoding an empty
        # batch, which the next arrival there could not be timed against.
        ("llumnix", 1.0),
    ],
)
def test_long_prompts_at_any_load_all_finish(policy: str, load_scale: float) -> None:
    rows = scale_load(resolve_trace("mooncake-sample"), load_scale).requests
    _, metrics = simulate(policy, rows, workers=8)
    assert metrics.completed + metrics.rejected == metrics.requests == 1000


def test_admission_refuses_what_cannot_start_in_time_and_counts_it_a_miss() -> None:
    perf = performance_model(A100)
    # A code completion's first token is due in 0.5 s; 8,000 prompt tokens take longer
    # to prefill on an idle A100, 1,000 do not.
    assert perf.prefill_s([8000]) > 0.5 > perf.prefill_s([1000])
    rows = [
        Row(0.0, 1000, 20, WorkloadType.CODE),
        Row(0.1, 8000, 20, WorkloadType.CODE),
        Row(0.2, 1000, 20, WorkloadType.CODE),
    ]
    _, taken = simulate("jsq", rows)
    assert (taken.completed, taken.refused) == (3, 0)
    _, refused = simulate("switchyard", rows)
    assert (refused.completed, refused.refused) == (2, 1)
    assert refused.slo_attainment == pytest.approx(2 / 3)  # the refused one is a miss
    assert refused.slo_violation_rate == pytest.approx(1 / 3)
