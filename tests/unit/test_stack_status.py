"""The status document from the records, and the replicas' presence records."""

from __future__ import annotations

import pytest
from switchyard.cluster.records import ClusterView, WorkerRecord, WorkerStatus
from switchyard.runtime.presence import PRESENCE_TTL_S, Presence, read_replicas
from switchyard.runtime.status import StatusSnapshot, status_document
from switchyard.state import MemoryStateStore

from tests.unit.test_cluster_records import heartbeat


def _record(worker_id: str, *, completed: int, age_s: float = 0.1, **kw: object) -> WorkerRecord:
    status = kw.pop("status", WorkerStatus.ALIVE)
    assert isinstance(status, WorkerStatus)
    return WorkerRecord(
        worker_id=worker_id,
        status=status,
        last_seen_s=100.0,
        age_s=age_s,
        heartbeat=heartbeat(worker_id, **kw),
        completed=completed,
        violated=1,
    )


def _snapshot(taken_s: float, *workers: WorkerRecord, recent: float = 0.0) -> StatusSnapshot:
    completed = sum(w.completed for w in workers)
    cluster = ClusterView(
        now_s=taken_s,
        workers=workers,
        completed=completed,
        violated=len(workers),
        recent_violation_rate=recent,
        recent_window=10 if completed else 0,
        dead_letters=2,
    )
    return StatusSnapshot(taken_s=taken_s, cluster=cluster, replicas=())


def test_rates_come_from_the_answers_between_two_snapshots() -> None:
    before = _snapshot(10.0, _record("w1", completed=10), _record("w2", completed=0))
    now = _snapshot(12.0, _record("w1", completed=30), _record("w2", completed=4), recent=0.1)
    first = status_document(before, worker_timeout_s=2.0)
    assert first["totals"]["answers_per_s"] is None  # one snapshot defines no rate
    document = status_document(now, before, worker_timeout_s=2.0)
    assert document["totals"]["answers_per_s"] == pytest.approx(12.0)
    assert [w["answers_per_s"] for w in document["workers"]] == [10.0, 2.0]
    assert document["totals"]["slo_attainment"] == pytest.approx(1 - 2 / 34)
    assert document["totals"]["recent_slo_attainment"] == pytest.approx(0.9)
    assert document["totals"]["dead_letters"] == 2


def test_a_worker_reads_as_an_operator_would_name_its_state() -> None:
    workers = (
        _record("alive", completed=0),
        _record("quiet", completed=0, age_s=5.0),
        _record("stopping", completed=0, draining=True),
        _record("gone", completed=0, status=WorkerStatus.DOWN),
    )
    document = status_document(_snapshot(1.0, *workers), worker_timeout_s=2.0)
    states = {w["worker_id"]: w["state"] for w in document["workers"]}
    assert states == {"alive": "alive", "quiet": "silent", "stopping": "draining", "gone": "down"}
    assert document["totals"]["workers_alive"] == 2
    assert document["totals"]["slo_attainment"] is None  # nothing answered yet


async def test_a_replica_is_listed_while_it_runs_and_gone_once_withdrawn_or_silent() -> None:
    state = MemoryStateStore()
    now = [1000.0]
    ingress = Presence(state, "ingress", "i-1", lambda: "http://h:1", clock=lambda: now[0])
    worker = Presence(state, "worker", "w-1", lambda: "http://h:2", clock=lambda: now[0])
    await ingress.say("ready")
    await worker.say("ready")
    listed = await read_replicas(state, now[0])
    assert [(r.name, r.instance, r.state, r.health_url) for r in listed] == [
        ("ingress", "i-1", "ready", "http://h:1"),
        ("worker", "w-1", "ready", "http://h:2"),
    ]
    await worker.say("draining")
    await worker.withdraw()
    assert [r.instance for r in await read_replicas(state, now[0])] == ["i-1"]
    # A replica that died without a word drops out once its presence is older than the
    # time to live.
    assert [r.instance for r in await read_replicas(state, now[0] + PRESENCE_TTL_S + 1)] == []
