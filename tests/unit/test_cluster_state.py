"""services.cluster_state: the monitor's Redis layout read back as policy views."""

from __future__ import annotations

import math

import pytest
from switchyard.contracts.messages import Heartbeat, QueuedEntry
from switchyard.perf.profiles import performance_model
from switchyard.policies.snapshot import QueueScope, WorkerRole
from switchyard.state import MemoryStateStore

from services.cluster_state import (
    CLUSTER_STATS_KEY,
    WORKERS_KEY,
    ClusterView,
    WorkerRecord,
    WorkerStatus,
    assigned_key,
    cluster_snapshot,
    is_alive,
    parse_worker_record,
    profile_constants,
    read_assigned,
    read_cluster,
    worker_key,
    worker_profile,
    worker_view,
)
from services.rebalancer.snapshot import select_listed

pytestmark = pytest.mark.unit

A100 = "a100-80gb/llama-2-7b"


def heartbeat(worker_id: str = "w1", **overrides: object) -> Heartbeat:
    values: dict[str, object] = {
        "worker_id": worker_id,
        "worker_type": "emulated-llm",
        "profile": A100,
        "sequence": 3,
        "interval_s": 0.5,
        "queue_length": 2,
        "queued_work_s": 4.5,
        "running": 1,
        "utilization": 0.75,
        "max_slots": 0,
        "kv_used_tokens": 700,
        "kv_capacity_tokens": 0,
        "queued_tokens": 1200,
        "decode_step_s": 0.02,
        "outstanding": [
            QueuedEntry(request_id="r1", app="chat", running=True, queued_at_s=1.0, kv_tokens=700)
        ],
        "outstanding_total": 3,
        "sent_at_s": 100.0,
    }
    values.update(overrides)
    return Heartbeat.model_validate(values)


def test_worker_view_takes_load_from_the_heartbeat_and_constants_from_the_profile() -> None:
    perf = performance_model(A100)
    view = worker_view(heartbeat())
    assert view.worker_id == "w1"
    assert view.worker_type == A100
    assert view.role is WorkerRole.MIXED
    assert view.alive
    assert (view.waiting, view.running, view.outstanding) == (2, 1, 3)
    assert view.queued_work_s == 4.5
    assert view.queued_tokens == 1200
    assert view.kv_used_tokens == 700
    assert view.utilization == 0.75
    assert view.decode_step_s == 0.02
    # Not reported by the heartbeat (0): the profile's figures.
    assert view.max_slots == perf.max_batch_slots
    assert view.kv_capacity_tokens == perf.kv_capacity_tokens
    assert view.decode_step_per_seq_s == perf.decode_per_seq_s
    assert view.decode_step_per_kv_token_s == perf.decode_per_kv_token_s
    assert view.kv_bytes_per_token == perf.kv_bytes_per_token
    assert view.interconnect_bytes_per_s == perf.interconnect_bytes_per_s


def test_policies_see_the_held_work_as_predicted_when_the_worker_reports_it() -> None:
    assert worker_view(heartbeat(predicted_work_s=6.25)).queued_work_s == 6.25
    assert worker_view(heartbeat(predicted_work_s=None)).queued_work_s == 4.5


def test_reported_slots_and_kv_capacity_win_over_the_profile() -> None:
    view = worker_view(heartbeat(max_slots=8, kv_capacity_tokens=5000), alive=False)
    assert (view.max_slots, view.kv_capacity_tokens, view.alive) == (8, 5000, False)


def test_a_worker_without_profile_is_typed_by_worker_type_with_zero_costs() -> None:
    beat = heartbeat(profile=None, worker_type="cpu-classifier")
    assert worker_profile(beat) == "cpu-classifier"
    view = worker_view(beat)
    assert view.worker_type == "cpu-classifier"
    assert (view.decode_step_per_seq_s, view.kv_bytes_per_token, view.max_slots) == (0.0, 0, 0)
    # Infinite bandwidth: a policy's kv_bytes / bandwidth stays 0 instead of dividing by zero.
    assert view.kv_bytes_per_token / view.interconnect_bytes_per_s == 0.0
    assert not profile_constants("no-such-gpu/no-model").known
    assert profile_constants(A100) is profile_constants(A100)  # cached


def test_alive_needs_the_alive_status_and_a_recent_heartbeat() -> None:
    assert is_alive(WorkerStatus.ALIVE, 1.0, 2.0)
    assert is_alive(WorkerStatus.ALIVE, 2.0, 2.0)
    assert not is_alive(WorkerStatus.ALIVE, 2.5, 2.0)
    assert not is_alive(WorkerStatus.DOWN, 0.0, 2.0)
    assert not is_alive(WorkerStatus.DRAINED, 0.0, 2.0)


def test_a_draining_worker_takes_no_work_and_lends_none() -> None:
    def record(wid: str, **overrides: object) -> WorkerRecord:
        return WorkerRecord(
            worker_id=wid,
            status=WorkerStatus.ALIVE,
            last_seen_s=99.0,
            age_s=1.0,
            heartbeat=heartbeat(wid, **overrides),
        )

    staying, leaving = record("w1"), record("w2", draining=True)
    assert staying.takes_work(2.0)
    assert not leaving.takes_work(2.0)
    view = ClusterView(now_s=100.0, workers=(staying, leaving))
    # Policies see it as not alive, and the rebalancer lists none of its requests.
    snapshot = cluster_snapshot(view, 2.0)
    assert [(w.worker_id, w.alive) for w in snapshot.workers] == [("w1", True), ("w2", False)]
    listed = select_listed(view, worker_timeout_s=2.0, scope=QueueScope())
    assert {item.worker_id for item in listed} == {"w1"}


def test_parse_worker_record_tolerates_missing_and_broken_fields() -> None:
    record = parse_worker_record(
        "w9", {"heartbeat": "{not json", "status": "zombie", "completed": "x"}, now_s=5.0
    )
    assert record.heartbeat is None
    assert record.status is WorkerStatus.DOWN
    assert (record.completed, record.last_seen_s, record.age_s) == (0, 0.0, 5.0)


async def test_read_cluster_reads_what_the_monitor_wrote() -> None:
    state = MemoryStateStore("t:")
    for wid, seen_s, status in (("w2", 90.0, "down"), ("w1", 99.0, "alive")):
        beat = heartbeat(wid)
        await state.hset(
            worker_key(wid),
            {
                "heartbeat": beat.model_dump_json(),
                "last_seen_s": repr(seen_s),
                "status": status,
                "completed": "4",
                "violated": "1",
            },
        )
        await state.zadd(WORKERS_KEY, {wid: seen_s})
    await state.zadd(WORKERS_KEY, {"ghost": 1.0})  # hash gone: skipped
    await state.hset(
        CLUSTER_STATS_KEY,
        {"completed": "8", "violated": "2", "recent_violation_rate": "0.25", "recent_window": "8"},
    )
    await state.zadd(assigned_key("w1"), {"r2": 2.0, "r1": 1.0})

    view = await read_cluster(state, now_s=100.0)

    assert [r.worker_id for r in view.workers] == ["w1", "w2"]
    w1 = view.get("w1")
    assert w1 is not None
    assert w1.heartbeat is not None
    assert w1.status is WorkerStatus.ALIVE
    assert w1.age_s == pytest.approx(1.0)
    assert w1.heartbeat.outstanding[0].request_id == "r1"
    assert (w1.completed, w1.violated) == (4, 1)
    assert (view.completed, view.violated, view.recent_window) == (8, 2, 8)
    assert view.recent_violation_rate == 0.25
    assert view.get("nope") is None
    assert await read_assigned(state, "w1") == ["r1", "r2"]

    snapshot = cluster_snapshot(view, worker_timeout_s=2.0)
    assert [(w.worker_id, w.alive) for w in snapshot.workers] == [("w1", True), ("w2", False)]
    assert snapshot.now_s == 100.0
    assert not math.isnan(snapshot.utilization)
