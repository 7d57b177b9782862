"""switchyard.cluster: the workers as the monitor recorded them (with the counters the
request ledger keeps), read back in one step and turned into the policies' views."""

from __future__ import annotations

import inspect
import math
from collections import Counter
from collections.abc import Awaitable, Callable

import pytest
from switchyard.cluster import (
    ClusterReader,
    ClusterView,
    WorkerRecord,
    WorkerStatus,
    cluster_snapshot,
    is_alive,
    parse_worker_record,
    profile_constants,
    read_assigned,
    read_cluster,
    worker_profile,
    worker_view,
)
from switchyard.cluster import records as cluster_records
from switchyard.contracts.messages import (
    Assignment,
    Completion,
    CompletionStatus,
    Heartbeat,
    InferenceRequest,
    LLMPayload,
    LLMResult,
    QueuedEntry,
    RequestTimeline,
)
from switchyard.lifecycle import Assign, RequestLedger, completion_violated
from switchyard.perf.profiles import performance_model
from switchyard.policies.snapshot import QueueScope, WorkerRole
from switchyard.state import MemoryStateStore, StateStore, keys

from services.monitor.heartbeats import HeartbeatRecorder
from services.rebalancer.snapshot import select_listed

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


def completion(
    request_id: str,
    *,
    worker_id: str = "w1",
    finished_s: float = 10.0,
    deadline_s: float | None = 12.0,
    epoch: int = 0,
    status: CompletionStatus = CompletionStatus.OK,
) -> Completion:
    return Completion(
        request_id=request_id,
        app="chat",
        worker_id=worker_id,
        worker_type="emulated-llm",
        variant="llama-2-7b",
        epoch=epoch,
        status=status,
        result=LLMResult(output_tokens=5),
        timeline=RequestTimeline(arrival_s=1.0, started_s=2.0, finished_s=finished_s),
        deadline_s=deadline_s,
    )


class CountingStore(MemoryStateStore):
    """A memory store that lists every call of the store's interface made to it (each
    one a round trip to Redis)."""

    def __init__(self, prefix: str) -> None:
        super().__init__(prefix)
        self.calls: list[str] = []
        for name, member in vars(StateStore).items():
            if inspect.iscoroutinefunction(member):
                setattr(self, name, self._counted(name, getattr(self, name)))

    def _counted(
        self, name: str, call: Callable[..., Awaitable[object]]
    ) -> Callable[..., Awaitable[object]]:
        async def counted(*args: object, **kwargs: object) -> object:
            self.calls.append(name)
            return await call(*args, **kwargs)

        return counted


# -- views of one worker (pure) ----------------------------------------------------------


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


def test_a_worker_that_prefills_in_chunks_is_seen_to_and_its_first_tokens_come_later() -> None:
    perf = performance_model(A100)
    whole = worker_view(heartbeat(time_scale=10.0))
    chunked = worker_view(heartbeat(time_scale=10.0, chunked_prefill_tokens=512))
    assert (whole.chunk_budget_tokens, chunked.chunk_budget_tokens) == (None, 512)
    assert chunked.prefill_base_s == pytest.approx(perf.prefill_base_s / 10.0)
    # 8,000 tokens: one iteration whole; in chunks of what 512 leaves after the one
    # running request's token, 16 iterations, each at least the reported decode step.
    compute_s = whole.uncached_prefill_s(8000, 0)
    assert compute_s == chunked.prefill_compute_s(8000, 0)
    assert chunked.uncached_prefill_s(8000, 0) == pytest.approx(compute_s + 16 * 0.02)


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


# -- reading the cluster back --------------------------------------------------------------


async def test_read_cluster_reads_what_the_monitor_and_the_ledger_wrote() -> None:
    state = MemoryStateStore("t:")
    for wid, seen_s, status in (("w2", 90.0, "down"), ("w1", 99.0, "alive")):
        beat = heartbeat(wid)
        await state.hset(
            keys.worker(wid),
            {
                "heartbeat": beat.model_dump_json(),
                "sequence": str(beat.sequence),
                "last_seen_s": repr(seen_s),
                "status": status,
                "completed": "4",
                "violated": "1",
            },
        )
        await state.zadd(keys.WORKERS, {wid: seen_s})
    await state.zadd(keys.WORKERS, {"ghost": 1.0})  # hash gone: skipped
    # The ledger's counters: 8 answers, 2 of them late; of the latest 8 outcomes, 2 late.
    await state.hset(keys.CLUSTER_STATS, {"completed": "8", "violated": "2", "recent": "00100010"})
    await state.zadd(keys.assigned("w1"), {"r2": 2.0, "r1": 1.0})

    view = await read_cluster(state, now_s=100.0)

    assert [r.worker_id for r in view.workers] == ["w1", "w2"]
    w1 = view.get("w1")
    assert w1 is not None
    assert w1.heartbeat is not None
    assert w1.status is WorkerStatus.ALIVE
    assert w1.age_s == pytest.approx(1.0)
    assert w1.heartbeat.outstanding[0].request_id == "r1"
    assert (w1.completed, w1.violated) == (4, 1)
    w2 = view.get("w2")
    assert w2 is not None
    assert w2.status is WorkerStatus.DOWN
    assert (view.completed, view.violated, view.recent_window) == (8, 2, 8)
    assert view.recent_violation_rate == 0.25
    assert view.get("nope") is None
    assert await read_assigned(state, "w1") == ["r1", "r2"]

    snapshot = cluster_snapshot(view, worker_timeout_s=2.0)
    assert [(w.worker_id, w.alive) for w in snapshot.workers] == [("w1", True), ("w2", False)]
    assert snapshot.now_s == 100.0
    assert not math.isnan(snapshot.utilization)


async def test_an_empty_cluster_reads_as_no_workers_and_no_violations() -> None:
    view = await read_cluster(MemoryStateStore("t:"), now_s=5.0)
    assert view.workers == ()
    assert (view.completed, view.violated) == (0, 0)
    assert (view.recent_violation_rate, view.recent_window) == (0.0, 0)


async def test_the_reader_reads_everything_in_one_script_and_parses_only_new_heartbeats(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    state = CountingStore("t:")
    clock = [1000.0]
    recorder = HeartbeatRecorder(state, clock=lambda: clock[0])
    for wid, partition in (("w1", 3), ("w2", 7)):
        assert await recorder.record(
            heartbeat(wid, sequence=1, queue_length=1, inbox_partition=partition)
        )
    await state.hset(keys.CLUSTER_STATS, {"completed": "2", "violated": "1", "recent": "01"})
    parsed: Counter[str] = Counter()
    parse = cluster_records.parse_heartbeat

    def counting_parse(worker_id: str, raw: str | None) -> Heartbeat | None:
        parsed[worker_id] += 1
        return parse(worker_id, raw)

    monkeypatch.setattr(cluster_records, "parse_heartbeat", counting_parse)
    reader = ClusterReader(state)

    state.calls.clear()
    first = await reader.read(1000.5)
    # Both workers and the counters, in one round trip.
    assert state.calls == ["run_script"]
    assert [r.worker_id for r in first.workers] == ["w1", "w2"]
    assert (first.completed, first.violated, first.recent_violation_rate) == (2, 1, 0.5)
    assert parsed == {"w1": 1, "w2": 1}
    assert reader.inbox_partitions() == {"w1": 3, "w2": 7}

    # Nothing new: the heartbeats are not parsed again, and read the same.
    state.calls.clear()
    second = await reader.read(1001.0)
    assert state.calls == ["run_script"]
    assert parsed == {"w1": 1, "w2": 1}
    for before, after in zip(first.workers, second.workers, strict=True):
        assert after.heartbeat == before.heartbeat
        assert after.age_s == pytest.approx(before.age_s + 0.5)

    # w1 heartbeats again; w2 is declared down and an answer of w2 is counted. Only w1's
    # heartbeat is parsed again, and w2's other fields are read afresh all the same.
    clock[0] = 1001.0
    assert await recorder.record(
        heartbeat("w1", sequence=2, queue_length=5, inbox_partition=4, sent_at_s=101.0)
    )
    await state.hset(keys.worker("w2"), {"status": "down", "completed": "1"})
    third = await reader.read(1001.5)
    assert parsed == {"w1": 2, "w2": 1}
    w1, w2 = third.get("w1"), third.get("w2")
    assert w1 is not None
    assert w2 is not None
    assert w1.heartbeat is not None
    assert w1.heartbeat.queue_length == 5
    assert w1.age_s == pytest.approx(0.5)
    assert w2.status is WorkerStatus.DOWN
    assert w2.completed == 1
    assert w2.heartbeat == first.workers[1].heartbeat
    assert reader.inbox_partitions() == {"w1": 4, "w2": 7}

    # A reader of its own (another routine) parses everything on its first read.
    fresh = await ClusterReader(state).read(1001.5)
    assert parsed == {"w1": 3, "w2": 2}
    assert fresh.workers == third.workers


async def test_a_worker_gone_from_the_state_is_forgotten_by_the_reader() -> None:
    state = MemoryStateStore("t:")
    recorder = HeartbeatRecorder(state, clock=lambda: 1000.0)
    for wid in ("w1", "w2"):
        assert await recorder.record(heartbeat(wid, inbox_partition=1))
    reader = ClusterReader(state)
    assert [r.worker_id for r in (await reader.read(1000.0)).workers] == ["w1", "w2"]
    await state.delete(keys.worker("w2"))
    await state.zrem(keys.WORKERS, "w2")
    assert [r.worker_id for r in (await reader.read(1000.0)).workers] == ["w1"]
    assert reader.inbox_partitions() == {"w1": 1}


# -- the counters the request ledger keeps (moved from the monitor's tests) --------------


def _request(request_id: str) -> InferenceRequest:
    return InferenceRequest(
        request_id=request_id,
        app="chat",
        payload=LLMPayload(model="llama-2-7b", prompt_tokens=12, max_output_tokens=8),
        arrival_s=1.0,
        deadline_s=12.0,
        reply_to="ingress-a",
    )


async def test_the_cluster_counts_each_answer_once_with_its_violation() -> None:
    """What the ledger's finish counts is what the policies read: per worker and for the
    cluster, a redelivered answer once, an answer without a deadline never late."""
    state = MemoryStateStore("t:")
    ledger = RequestLedger(state)
    assert await HeartbeatRecorder(state, clock=lambda: 1000.0).record(heartbeat("w1"))
    for rid in ("r1", "r2", "r3"):
        await ledger.accept(_request(rid))
        assignment = Assignment(
            request=_request(rid),
            worker_id="w1",
            variant="llama-2-7b",
            order=1.0,
            policy="jsq",
            epoch=0,
            assigned_at_s=2.0,
        )
        assert (await ledger.assign(Assign(assignment))).result == "assigned"
    done = [
        completion("r1", finished_s=10.0, deadline_s=12.0),  # met
        completion("r2", finished_s=13.0, deadline_s=12.0),  # violated
        completion("r2", finished_s=13.0, deadline_s=12.0),  # redelivered
        completion("r3", finished_s=20.0, deadline_s=None),  # no SLO
    ]

    assert await ledger.finish_many(done) == ["finished", "finished", "duplicate", "finished"]

    view = await ClusterReader(state).read(1000.0)
    assert (view.completed, view.violated) == (3, 1)
    assert view.recent_window == 3
    assert view.recent_violation_rate == pytest.approx(1 / 3)
    w1 = view.get("w1")
    assert w1 is not None
    assert (w1.completed, w1.violated) == (3, 1)
    assert await read_assigned(state, "w1") == []
    # A later heartbeat keeps the worker's counts.
    assert await HeartbeatRecorder(state, clock=lambda: 1001.0).record(heartbeat("w1", sequence=4))
    again = (await read_cluster(state, 1001.0)).get("w1")
    assert again is not None
    assert (again.completed, again.violated) == (3, 1)


def test_violation_rule() -> None:
    assert not completion_violated(completion("a", finished_s=12.0, deadline_s=12.0))
    assert completion_violated(completion("a", finished_s=12.5, deadline_s=12.0))
    assert not completion_violated(completion("a", deadline_s=None))
    expired = completion("a", finished_s=1.0, deadline_s=12.0, status=CompletionStatus.EXPIRED)
    assert completion_violated(expired)


def test_policies_see_the_prefill_a_worker_reports_in_progress() -> None:
    assert worker_view(heartbeat(prefilling_tokens=3000, running=2)).prefilling_tokens == 3000
    assert worker_view(heartbeat()).prefilling_tokens == 0  # not reported: none
