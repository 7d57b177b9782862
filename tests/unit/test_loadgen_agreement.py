"""The sim-to-live comparison: what it compares, in which unit, and what it leaves out."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from switchyard.contracts.messages import WorkloadType
from switchyard.traces.azure import TraceRequest

from loadgen.replay_records import OK, REJECTED, RequestRecord
from research.llm.agreement import (
    AgreementError,
    SimulatedLatency,
    compare,
    format_table,
    simulate,
)

A100 = "a100-80gb/llama-2-7b"
L40S = "l40s-48gb/llama-2-7b"


def _rows(count: int, gap_s: float = 0.5) -> list[TraceRequest]:
    return [
        TraceRequest(
            arrival_s=i * gap_s,
            prompt_tokens=200 + 37 * (i % 11),
            output_tokens=20 + 13 * (i % 7),
            workload=WorkloadType.CONVERSATION,
        )
        for i in range(count)
    ]


def _sim(latencies_s: list[float]) -> dict[int, SimulatedLatency]:
    return {
        i: SimulatedLatency(
            index=i, latency_s=v, wait_s=0.1, execution_s=v - 0.1, worker_id=f"w0{i % 2}"
        )
        for i, v in enumerate(latencies_s)
    }


def _record(
    index: int, latency_s: float | None, *, outcome: str = OK, worker: str = "w00"
) -> RequestRecord:
    return RequestRecord(
        index=index,
        request_id=f"run-{index}",
        kind="llm",
        app="llama-2-7b",
        workload="conversation",
        arrival_s=float(index),
        scheduled_s=float(index),
        sent_s=float(index),
        latency_s=latency_s,
        status_code=200 if outcome == OK else 429,
        outcome=outcome,
        worker_id=worker if outcome == OK else None,
        timeline={"arrival_s": 100.0, "started_s": 100.01, "finished_s": 100.01 + 0.8 * latency_s}
        if latency_s is not None
        else None,
    )


def _sim_first_tokens() -> dict[int, SimulatedLatency]:
    """Three requests: 0.1 s waiting, the first token 0.2 s after arrival, then 9 more
    tokens 0.05 s apart."""
    return {
        i: SimulatedLatency(
            index=i,
            latency_s=0.65,
            wait_s=0.1,
            execution_s=0.55,
            worker_id="w00",
            ttft_s=0.2,
            tpot_s=0.05,
        )
        for i in range(3)
    }


def test_the_simulation_returns_every_request_on_the_profiles_workers() -> None:
    simulated = simulate(_rows(60), policy="jsq", profiles=[A100, L40S, A100])
    assert sorted(simulated) == list(range(60))
    assert {s.worker_id for s in simulated.values()} == {"w00", "w01", "w02"}
    for s in simulated.values():
        assert s.latency_s == pytest.approx(s.wait_s + s.execution_s)
        assert s.execution_s > 0


def test_live_latencies_are_read_in_trace_seconds() -> None:
    simulated = _sim([1.0, 2.0, 3.0, 4.0, 5.0])
    # At speed-up 4 a live answer in 0.25 wall seconds took 1 trace second.
    records = [_record(i, v / 4) for i, v in enumerate([1.0, 2.0, 3.0, 4.0, 5.0])]
    agreement = compare(records, simulated, speedup=4.0, trace="t", policy="jsq", workers=[A100])
    assert agreement.live_p50_s == pytest.approx(3.0)
    assert agreement.sim_p50_s == pytest.approx(3.0)
    assert agreement.p50_gap == pytest.approx(0.0)
    assert agreement.p99_gap == pytest.approx(0.0)
    assert agreement.within()
    # The live execution is 0.8 of each latency (the timeline above), in trace seconds.
    assert agreement.live_execution_p50_s == pytest.approx(0.8 * 3.0)
    assert agreement.live_overhead_p50_s == pytest.approx(0.2 * 3.0)


def test_first_token_and_per_token_times_are_compared_in_trace_seconds() -> None:
    simulated = _sim_first_tokens()
    # Live at speed-up 2, in wall seconds: first token 0.11 s after the ingress's
    # arrival (0.22 trace s: 10 % later), the last 9 x 0.025 s after it (the same pace).
    records = []
    for i in range(3):
        record = _record(i, 0.34)
        timeline = {"arrival_s": 100.0, "started_s": 100.01, "first_token_s": 100.11}
        timeline["finished_s"] = 100.11 + 9 * 0.025
        records.append(replace(record, timeline=timeline, completion_tokens=10))
    agreement = compare(records, simulated, speedup=2.0, trace="t", policy="jsq", workers=[A100])
    assert agreement.sim_ttft_p50_s == pytest.approx(0.2)
    assert agreement.live_ttft_p99_s == pytest.approx(0.22)
    assert agreement.live_tpot_p50_s == pytest.approx(0.05)
    gaps = agreement.token_gaps()
    assert gaps["ttft_p50"] == pytest.approx(0.10)
    assert gaps["tpot_p99"] == pytest.approx(0.0)
    assert "TTFT P50 sim / live" in format_table([agreement])
    assert "| 200 ms / 220 ms | +10.0% |" in format_table([agreement])


def test_a_first_tokens_gap_is_split_into_the_live_paths_legs() -> None:
    simulated = _sim_first_tokens()
    # Live at speed-up 2, wall seconds: decided after 5 ms, started 55 ms after that,
    # first token 50 ms after the start; 0.22 trace seconds in all, 20 ms late.
    records = []
    for i in range(3):
        timeline = {
            "arrival_s": 100.0,
            "assigned_s": 100.005,
            "started_s": 100.06,
            "first_token_s": 100.11,
            "finished_s": 100.335,
        }
        records.append(replace(_record(i, 0.34), timeline=timeline, completion_tokens=10))
    agreement = compare(records, simulated, speedup=2.0, trace="t", policy="jsq", workers=[A100])
    assert agreement.paired_ttft_gap_p50_s == pytest.approx(0.02)
    assert agreement.sim_prefill_p50_s == pytest.approx(0.1)
    assert agreement.live_legs_p50_s == pytest.approx((0.01, 0.11, 0.1))
    assert "| +20 ms | 100 ms, 100 ms | 10 ms, 110 ms, 100 ms |" in format_table([agreement])


def test_a_live_run_slower_than_the_tolerance_disagrees() -> None:
    latencies = [float(v) for v in range(1, 101)]
    records = [_record(i, 1.2 * v) for i, v in enumerate(latencies)]
    agreement = compare(
        records, _sim(latencies), speedup=1.0, trace="t", policy="gaps", workers=[A100]
    )
    assert agreement.p50_gap == pytest.approx(0.2)
    assert agreement.paired_gap_p50_s == pytest.approx(0.2 * 50.5)
    assert not agreement.within(0.15)
    assert agreement.within(0.25)


def test_only_requests_both_sides_completed_are_compared() -> None:
    simulated = _sim([1.0, 1.0, 1.0, 9.0])
    del simulated[2]  # the simulator could not fit request 2
    records = [
        _record(0, 1.0),
        _record(1, None, outcome=REJECTED),  # refused live: out of both sides
        _record(2, 1.0),
        _record(3, 9.0, worker="w01"),
    ]
    agreement = compare(records, simulated, speedup=1.0, trace="t", policy="jsq", workers=[A100])
    assert agreement.planned == 4
    assert agreement.compared == 2
    assert agreement.live_not_ok == 1
    assert agreement.sim_not_completed == 1
    assert agreement.live_by_worker == {"w00": 1, "w01": 1}
    assert agreement.sim_by_worker == {"w00": 1, "w01": 1}


def test_nothing_in_common_or_a_bad_speedup_is_a_clear_error() -> None:
    with pytest.raises(AgreementError, match="no request was completed by both"):
        compare(
            [_record(0, None, outcome=REJECTED)],
            _sim([1.0]),
            speedup=1.0,
            trace="t",
            policy="jsq",
            workers=[A100],
        )
    with pytest.raises(AgreementError, match="speedup"):
        compare(
            [_record(0, 1.0)],
            _sim([1.0]),
            speedup=math.nan,
            trace="t",
            policy="jsq",
            workers=[A100],
        )


def test_the_table_names_trace_policy_and_gaps() -> None:
    latencies = [float(v) for v in range(1, 21)]
    records = [_record(i, 1.1 * v) for i, v in enumerate(latencies)]
    agreement = compare(
        records, _sim(latencies), speedup=1.0, trace="azure-conv", policy="gaps", workers=[A100]
    )
    table = format_table([agreement])
    assert "| azure-conv | gaps | 20/20 |" in table
    assert "+10.0%" in table
