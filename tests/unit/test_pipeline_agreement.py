"""The pure parts of the pipeline sim-live agreement: the workload slice, the catalogue
check, the simulator's settings for a live stack, time conversions, the offered load,
the recorded stage times, the jitter band and the comparison of a replay's answers with
a simulation."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from switchyard.multimodel.alibaba import lora_workload
from switchyard.multimodel.model import (
    ModelSpec,
    MultiModelRequest,
    PipelineSpec,
    ResourceVector,
    Stage,
    WorkerSpec,
    Workload,
)
from switchyard.serving.pipelines import ALIBABA_LORA_OPTIONS, pipeline_catalogue
from switchyard.traces.alibaba import LORA_SAMPLE

from loadgen.replay_records import HTTP_ERROR, OK, RequestRecord
from research.multimodel.agreement import (
    PipelineAgreementError,
    SimulatedCall,
    StageTimes,
    catalogue_problems,
    compare,
    jittered,
    live_sim_config,
    offered_load,
    sim_band,
    simulate_slice,
    to_model_s,
    workload_slice,
)

GEN = ModelSpec(name="gen", resources=ResourceVector(2.0, 0.5, 16.0), load_s=10.0, exec_s=20.0)
UP = ModelSpec(name="up", resources=ResourceVector(2.0, 0.5, 8.0), load_s=5.0, exec_s=4.0)
TWO_STAGES = PipelineSpec(
    name="two",
    stages=(
        Stage(name="generate", model="gen"),
        Stage(name="upscale", model="up", after=("generate",)),
    ),
    slo_s=100.0,
)
WORKER = WorkerSpec(worker_id="models-0", gpu_type="a100", capacity=ResourceVector(16, 2, 128))


def workload(*arrivals: float, scale: float = 1.0) -> Workload:
    return Workload(
        name="tiny",
        models={"gen": GEN, "up": UP},
        pipelines={"two": TWO_STAGES},
        requests=tuple(
            MultiModelRequest(f"r{i}", at, "two", exec_scale=scale) for i, at in enumerate(arrivals)
        ),
    )


# -- the slice and the catalogue -----------------------------------------------------------


def test_the_slice_keeps_the_first_calls_and_the_whole_catalogue() -> None:
    whole = workload(0.0, 5.0, 9.0, 30.0)
    part = workload_slice(whole, 2)
    assert [r.request_id for r in part.requests] == ["r0", "r1"]
    assert part.models == whole.models
    assert part.pipelines == whole.pipelines


@pytest.mark.parametrize("limit", [0, 5])
def test_a_slice_beyond_the_workload_is_refused_naming_its_size(limit: int) -> None:
    with pytest.raises(PipelineAgreementError, match="1 to 4 requests"):
        workload_slice(workload(0.0, 5.0, 9.0, 30.0), limit)


def test_the_live_catalogue_is_the_workloads_whatever_the_arrival_compression() -> None:
    models, pipelines = pipeline_catalogue("alibaba-lora")
    for compression in (250.0, 1000.0):
        options = {**ALIBABA_LORA_OPTIONS, "time_scale": compression}
        mine = lora_workload(LORA_SAMPLE, **options)
        assert catalogue_problems(mine.models, mine.pipelines, models, pipelines) == []


def test_a_catalogue_that_differs_is_named_model_by_model() -> None:
    slower = replace(GEN, exec_s=25.0)
    problems = catalogue_problems(
        {"gen": GEN, "up": UP}, {"two": TWO_STAGES}, {"gen": slower, "extra": UP}, {}
    )
    assert any("model 'gen' differs" in p for p in problems)
    assert any("model 'up' is in the workload, not in the live catalogue" in p for p in problems)
    assert any("model 'extra' is in the live catalogue" in p for p in problems)
    assert any("pipeline 'two' is in the workload" in p for p in problems)


# -- settings and time ---------------------------------------------------------------------


def test_live_seconds_count_time_scale_model_seconds() -> None:
    assert to_model_s(0.004, 50.0) == pytest.approx(0.2)


def test_the_simulator_runs_the_live_rounds_in_model_time_without_pauses() -> None:
    config = live_sim_config(update_hz=5.0, time_scale=50.0, demand_tau_model_s=5.0, seed=3)
    assert config.update_hz == pytest.approx(0.1)  # a round every 10 model seconds
    assert config.decision_base_s == 0.0
    assert config.decision_per_change_s == 0.0
    assert config.large_change is None
    # The live smoothing is never shorter than one round.
    assert config.demand_tau_s == pytest.approx(10.0)
    assert config.seed == 3
    fast = live_sim_config(update_hz=10.0, time_scale=10.0, demand_tau_model_s=5.0)
    assert fast.demand_tau_s == pytest.approx(5.0)


@pytest.mark.parametrize(("hz", "scale"), [(0.0, 50.0), (5.0, -1.0), (math.nan, 50.0)])
def test_bad_rates_and_scales_are_refused(hz: float, scale: float) -> None:
    with pytest.raises(PipelineAgreementError, match="must be a number > 0"):
        live_sim_config(update_hz=hz, time_scale=scale, demand_tau_model_s=5.0)


def test_the_offered_load_counts_every_stage_against_the_replica_slots() -> None:
    # Two calls over 10 s, each 20 s of gen and 4 s of up at scale 0.5: 24 s of work.
    load = offered_load(workload(0.0, 10.0, scale=0.5), [WORKER, replace(WORKER, worker_id="b")])
    assert load.span_s == 10.0
    assert load.busy_replicas == pytest.approx(2.4)
    assert load.replica_slots == 8  # 4 replicas of gen (0.5 GPU of 2) per worker
    assert load.slot_load == pytest.approx(0.3)
    assert load.busiest_model == "gen"
    assert load.busiest_erlangs == pytest.approx(2.0)
    assert load.share_load == pytest.approx(2.4 * 0.25 / 2)


def test_an_offered_load_needs_workers_and_a_span() -> None:
    with pytest.raises(PipelineAgreementError, match="no workers"):
        offered_load(workload(0.0, 10.0), [])
    with pytest.raises(PipelineAgreementError, match="two requests"):
        offered_load(workload(0.0), [WORKER])


# -- the simulated side ----------------------------------------------------------------------


def test_the_simulation_records_each_stage_from_ready_to_start() -> None:
    config = live_sim_config(update_hz=5.0, time_scale=50.0, demand_tau_model_s=5.0)
    result, calls = simulate_slice(workload(0.0), [WORKER], policy="least-loaded", config=config)
    (call,) = calls
    generate, upscale = call.stages["generate"], call.stages["upscale"]
    assert generate.ready_s == 0.0
    # Nothing is placed at first: the stage waits for a round and the load.
    assert generate.started_s >= GEN.load_s
    assert generate.worker_id == "models-0"
    # The upscale is ready when the generation ends, 20 model seconds after its start.
    assert upscale.ready_s == pytest.approx(generate.started_s + GEN.exec_s)
    assert call.latency_s == pytest.approx(upscale.started_s + UP.exec_s)
    assert call.finished
    assert result.latencies_s == (call.latency_s,)


def test_jitter_delays_arrivals_and_starts_the_first_at_zero() -> None:
    base = workload(0.0, 0.0, 50.0)
    moved = jittered(base, 1.0, seed=7)
    arrivals = [r.arrival_s for r in moved.requests]
    assert arrivals == sorted(arrivals)
    assert arrivals[0] == 0.0
    assert arrivals != [0.0, 0.0, 50.0]
    assert jittered(base, 1.0, seed=7) == moved
    with pytest.raises(PipelineAgreementError, match="jitter"):
        jittered(base, 0.0, seed=7)


def test_the_band_spans_the_jittered_simulations() -> None:
    config = live_sim_config(update_hz=5.0, time_scale=50.0, demand_tau_model_s=5.0)
    band = sim_band(
        workload(0.0, 3.0, 6.0, 40.0),
        [WORKER],
        policy="least-loaded",
        config=config,
        jitter_s=2.0,
        seeds=4,
    )
    assert band.seeds == 4
    assert band.p50_min_s <= band.p50_median_s <= band.p50_max_s
    assert band.p99_min_s <= band.p99_median_s <= band.p99_max_s


# -- the comparison ----------------------------------------------------------------------------


def record(
    index: int, *, latency_s: float, t0: float, outcome: str = OK, drop_upscale: bool = False
) -> RequestRecord:
    """A live answer (wall seconds) of call ``index``: generate from t0 + 0.01 to
    t0 + 0.41, upscale from t0 + 0.42 to t0 + 0.5."""
    request_id = f"run-{index}"
    stages: list[dict[str, str | float]] = [
        {
            "stage": "generate",
            "request_id": f"{request_id}.generate",
            "status": "ok",
            "worker_id": "models-0",
            "arrival_s": t0,
            "assigned_s": t0 + 0.002,
            "started_s": t0 + 0.01,
            "finished_s": t0 + 0.41,
        },
        {
            "stage": "upscale",
            "request_id": f"{request_id}.upscale",
            "status": "ok",
            "worker_id": "models-0",
            "arrival_s": t0 + 0.414,
            "assigned_s": t0 + 0.416,
            "started_s": t0 + 0.42,
            "finished_s": t0 + 0.5,
        },
    ]
    ok = outcome == OK
    return RequestRecord(
        index=index,
        request_id=request_id,
        kind="pipeline",
        app="two",
        workload="pipeline",
        arrival_s=0.0,
        scheduled_s=0.0,
        sent_s=0.0,
        send_lag_s=0.001,
        latency_s=latency_s if ok else None,
        status_code=200 if ok else 500,
        outcome=outcome,
        server_latency_s=0.5 if ok else None,
        stages=tuple(stages[:1] if drop_upscale else stages) if ok else None,
    )


def simulated(index: int, latency_s: float) -> SimulatedCall:
    return SimulatedCall(
        index=index,
        latency_s=latency_s,
        finished=True,
        stages={
            "generate": StageTimes(ready_s=0.0, routed_s=0.0, started_s=0.0, worker_id="models-0"),
            "upscale": StageTimes(
                ready_s=20.0, routed_s=20.0, started_s=20.0, worker_id="models-0"
            ),
        },
    )


def test_live_latencies_are_compared_in_model_seconds_on_complete_answers() -> None:
    slice_ = workload(0.0, 10.0, 20.0, 30.0)
    records = [
        record(0, latency_s=0.5, t0=100.0),  # 25 model s at T = 50
        record(1, latency_s=0.52, t0=200.0),  # 26 model s
        record(2, latency_s=0.5, t0=300.0, drop_upscale=True),  # a stage missing
        record(3, latency_s=0.5, t0=400.0, outcome=HTTP_ERROR),
    ]
    sims = [simulated(i, 24.0) for i in range(4)]
    agreement = compare(
        records, sims, slice_, policy="p", time_scale=50.0, update_hz=5.0, workers=1
    )
    assert agreement.answered_ok == 3
    assert agreement.complete_answers == 2
    assert agreement.not_ok == {HTTP_ERROR: 1}
    assert agreement.compared == 2
    assert agreement.live_p50_s == pytest.approx(25.5)
    assert agreement.sim_p50_s == pytest.approx(24.0)
    assert agreement.p50_ratio == pytest.approx(25.5 / 24.0)
    assert agreement.within(0.1)
    assert not agreement.within(0.05)
    assert agreement.live_server_p50_s == pytest.approx(25.0)
    parts = agreement.parts
    # Upscale arrived 4 ms after generate finished: 0.2 model s.
    assert parts["hop"]["p50"] == pytest.approx(0.2)
    assert parts["route"]["p50"] == pytest.approx(0.1)
    # Generate ran 0.4 s = 20 model s, as modelled at exec_scale 1.
    assert parts["exec_excess"]["count"] == 4
    # Waits of 0.5 (generate) and 0.3 (upscale) model s live, none simulated.
    assert parts["wait_gap"]["p50"] == pytest.approx(0.4)
    assert agreement.live_stages_by_worker == {"models-0": 4}


def test_nothing_finished_by_both_sides_cannot_be_compared() -> None:
    with pytest.raises(PipelineAgreementError, match="no call was finished by both"):
        compare(
            [record(0, latency_s=0.5, t0=0.0, outcome=HTTP_ERROR)],
            [simulated(0, 24.0)],
            workload(0.0),
            policy="p",
            time_scale=50.0,
            update_hz=5.0,
            workers=1,
        )
