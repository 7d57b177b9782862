"""Reading the cluster in one script, against the memory store and a real Redis."""

from __future__ import annotations

import pytest
from switchyard.cluster import ClusterReader, WorkerStatus
from switchyard.contracts.messages import Heartbeat
from switchyard.state import StateStore, keys


def heartbeat(worker_id: str, sequence: int, sent_at_s: float, partition: int) -> Heartbeat:
    return Heartbeat(
        worker_id=worker_id,
        worker_type="a100-80gb",
        sequence=sequence,
        interval_s=0.5,
        queue_length=0,
        queued_work_s=0.0,
        running=0,
        utilization=0.0,
        inbox_partition=partition,
        sent_at_s=sent_at_s,
    )


async def record(store: StateStore, beat: Heartbeat, last_seen_s: float) -> None:
    """What the monitor writes for a heartbeat."""
    await store.hset(
        keys.worker(beat.worker_id),
        {
            "heartbeat": beat.model_dump_json(),
            "sequence": str(beat.sequence),
            "sent_at_s": repr(beat.sent_at_s),
            "last_seen_s": repr(last_seen_s),
            "status": "alive",
        },
    )
    await store.zadd(keys.WORKERS, {beat.worker_id: last_seen_s})


async def test_one_read_gives_every_worker_and_the_counters(store: StateStore) -> None:
    await record(store, heartbeat("w2", 1, 10.0, 2), 10.5)
    await record(store, heartbeat("w1", 4, 10.0, 1), 10.2)
    await store.hset(keys.CLUSTER_STATS, {"completed": "7", "violated": "2", "recent": "0110"})

    view = await ClusterReader(store).read(now_s=11.0)

    assert [w.worker_id for w in view.workers] == ["w1", "w2"]
    assert [w.status for w in view.workers] == [WorkerStatus.ALIVE] * 2
    assert view.workers[0].age_s == pytest.approx(0.8)
    assert [w.heartbeat.inbox_partition for w in view.workers if w.heartbeat] == [1, 2]
    assert (view.completed, view.violated) == (7, 2)
    assert (view.recent_violation_rate, view.recent_window) == (0.5, 4)


async def test_a_restarted_worker_s_new_heartbeat_is_read_though_its_sequence_repeats(
    store: StateStore,
) -> None:
    reader = ClusterReader(store)
    await record(store, heartbeat("w1", 5, 10.0, 3), 10.0)
    first = await reader.read(now_s=10.1)
    again = await reader.read(now_s=10.2)  # the heartbeat is not sent again, but kept

    # The worker restarts; its counter happens to be at 5 again, sent later.
    await record(store, heartbeat("w1", 5, 20.0, 9), 20.0)
    after = await reader.read(now_s=20.1)

    assert first.workers[0].heartbeat is not None
    assert first.workers[0].heartbeat.inbox_partition == 3
    assert again.workers[0].heartbeat == first.workers[0].heartbeat
    assert after.workers[0].heartbeat is not None
    assert after.workers[0].heartbeat.inbox_partition == 9
    assert reader.inbox_partitions() == {"w1": 9}


async def hear(store: StateStore, *, through_s: float, since_s: float, written_s: float) -> None:
    """What the monitor's liveness check writes of its hearing."""
    await store.hset(
        keys.MONITOR_HEARING,
        {"through_s": repr(through_s), "since_s": repr(since_s), "written_s": repr(written_s)},
    )


async def test_workers_silent_only_because_the_monitor_hears_nothing_stay_live(
    store: StateStore,
) -> None:
    # Heard from 30 s ago; the broker has been away since, so the monitor hears nothing.
    await record(store, heartbeat("w1", 4, 70.0, 1), 70.0)
    await hear(store, through_s=70.2, since_s=float("inf"), written_s=99.9)

    outage = await ClusterReader(store).read(now_s=100.0)
    assert outage.workers[0].age_s == 0.0
    assert outage.workers[0].takes_work(worker_timeout_s=2.0)

    # The broker is back: the stretch of hearing starts at 100 s, so the worker gets a
    # whole timeout to be heard again, and is gone only after it.
    await hear(store, through_s=101.0, since_s=100.0, written_s=101.1)
    back = await ClusterReader(store).read(now_s=101.2)
    assert back.workers[0].age_s == pytest.approx(1.0)
    assert back.workers[0].takes_work(worker_timeout_s=2.0)
    await hear(store, through_s=102.5, since_s=100.0, written_s=102.6)
    silent = await ClusterReader(store).read(now_s=102.7)
    assert not silent.workers[0].takes_work(worker_timeout_s=2.0)


async def test_a_stale_hearing_record_leaves_the_wall_clock_to_judge(store: StateStore) -> None:
    # The monitor itself stopped writing 10 s ago: its word no longer counts.
    await record(store, heartbeat("w1", 4, 70.0, 1), 70.0)
    await hear(store, through_s=90.0, since_s=float("inf"), written_s=90.0)

    view = await ClusterReader(store).read(now_s=100.0)

    assert view.workers[0].age_s == pytest.approx(30.0)
    assert not view.workers[0].takes_work(worker_timeout_s=2.0)
