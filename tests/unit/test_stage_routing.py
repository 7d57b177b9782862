"""The scheduler's stage routing, apart from the bus: which live workers a stage may go
to, the routing counted against a worker until its next heartbeat, exclusions, and the
placement counts' script on the in-memory store."""

from __future__ import annotations

import time

import pytest
from switchyard.cluster.records import ClusterView, WorkerRecord, WorkerStatus
from switchyard.contracts.messages import Heartbeat, PlacedModel, PlacedState, ResourceVector
from switchyard.multimodel.policy_registry import make_multimodel_policy
from switchyard.serving.pipelines import DEFAULT_PIPELINE_MODELS, DEFAULT_PIPELINES
from switchyard.state import keys
from switchyard.state.memory import MemoryStateStore

from services.scheduler.stages import STAGE_COUNTS, StagePlacer

GIB = 1024**3
READY = PlacedState.READY


def beat(
    worker_id: str,
    placed: dict[str, PlacedState],
    *,
    sent_at_s: float = 100.0,
    partition: int | None = 0,
    draining: bool = False,
    backend: str = "emulated-models",
    speed: float = 1.0,
) -> Heartbeat:
    return Heartbeat(
        worker_id=worker_id,
        worker_type="emulated-models",
        sequence=1,
        interval_s=0.5,
        queue_length=0,
        queued_work_s=0.0,
        running=0,
        utilization=0.0,
        backend=backend,
        capacity=ResourceVector(cpu=8, gpu=1, mem_bytes=64 * GIB),
        placed=[PlacedModel(model=m, state=s) for m, s in placed.items()],
        speed=speed,
        draining=draining,
        inbox_partition=partition,
        sent_at_s=sent_at_s,
    )


def view(*beats: Heartbeat, down: frozenset[str] = frozenset()) -> ClusterView:
    now_s = time.time()
    return ClusterView(
        now_s=now_s,
        workers=tuple(
            WorkerRecord(
                worker_id=b.worker_id,
                status=WorkerStatus.DOWN if b.worker_id in down else WorkerStatus.ALIVE,
                last_seen_s=now_s,
                age_s=0.0,
                heartbeat=b,
            )
            for b in sorted(beats, key=lambda b: b.worker_id)
        ),
    )


def placer(policy: str = "least-loaded") -> StagePlacer:
    router = make_multimodel_policy(policy).router
    return StagePlacer(router, DEFAULT_PIPELINE_MODELS, DEFAULT_PIPELINES, seed=1)


def test_only_live_emulated_models_workers_naming_a_partition_are_candidates() -> None:
    routing = placer()
    routing.observe_cluster(
        view(
            beat("ok", {"prompt-encoder": READY}),
            beat("mute", {"prompt-encoder": READY}, partition=None),
            beat("leaving", {"prompt-encoder": READY}, draining=True),
            beat("dead", {"prompt-encoder": READY}),
            beat("llm", {}, backend="emulated-llm"),
            down=frozenset({"dead"}),
        ),
        worker_timeout_s=5.0,
    )
    assert routing.workers == ["ok"]
    assert routing.route("prompt-encoder", 1000.0) == "ok"
    assert routing.route("sd15-base", 1000.0) is None


def test_routed_stages_count_against_their_worker_until_its_next_heartbeat() -> None:
    routing = placer()  # least-work: the holder with the least work ahead
    routing.observe_cluster(
        view(beat("a", {"sd15-base": READY}), beat("b", {"sd15-base": READY})),
        worker_timeout_s=5.0,
    )
    now_s = 1000.0
    first = [routing.route("sd15-base", now_s) for _ in range(4)]
    assert first == ["a", "b", "a", "b"]
    # A later snapshot (another batch) still sees them until the workers report them.
    assert routing.route("sd15-base", now_s + 1) == "a"
    snapshot = routing.snapshot(now_s + 1)
    queued = {w.spec.worker_id: w.resident[0].queued for w in snapshot.workers}
    assert queued == {"a": 3, "b": 2}
    # Fresh heartbeats (sent after the routing began) replace the local accounting.
    routing.observe_cluster(
        view(
            beat("a", {"sd15-base": READY}, sent_at_s=101.0),
            beat("b", {"sd15-base": READY}, sent_at_s=101.0),
        ),
        worker_timeout_s=5.0,
    )
    snapshot = routing.snapshot(now_s + 2)
    assert {w.spec.worker_id: w.resident[0].queued for w in snapshot.workers} == {"a": 0, "b": 0}


def test_an_excluded_or_downed_worker_gets_nothing() -> None:
    routing = placer()
    routing.observe_cluster(
        view(beat("a", {"upscaler": READY}), beat("b", {"upscaler": READY})),
        worker_timeout_s=5.0,
    )
    assert {routing.route("upscaler", 1.0, frozenset({"a"})) for _ in range(3)} == {"b"}
    routing.mark_down("b")
    assert routing.route("upscaler", 2.0, frozenset({"a"})) is None
    assert routing.route("upscaler", 2.0) == "a"


def test_least_work_queues_on_a_faster_worker_until_a_slow_one_is_as_soon() -> None:
    routing = placer()
    routing.observe_cluster(
        view(
            beat("slow", {"sd15-base": READY}),
            beat("fast", {"sd15-base": READY}, speed=4.0),
        ),
        worker_timeout_s=5.0,
    )
    got = [routing.route("sd15-base", 5.0) for _ in range(4)]
    # 2 s at speed 4 is 0.5 s: the fourth would finish at 2.0 s there, as soon as on the
    # idle slow worker, and the tie goes to the one with less work queued.
    assert got == ["fast", "fast", "fast", "slow"]


@pytest.mark.parametrize("rewrite", [True, False])
async def test_the_counts_script_adds_demand_and_rewrites_the_waiting_hash(rewrite: bool) -> None:
    store = MemoryStateStore("t:")
    waiting = keys.placement_waiting("s-0")
    await store.hset(keys.PLACEMENT_DEMAND, {"sd15-base": "3"})
    await store.hset(waiting, {"stale-model": "9"})
    args = ["10000", "2", "1" if rewrite else "", "sd15-base", "2", "upscaler", "1"]
    args += ["sd15-base", "4"]
    await store.run_script(STAGE_COUNTS, [keys.PLACEMENT_DEMAND, waiting], args)
    assert await store.hgetall(keys.PLACEMENT_DEMAND) == {"sd15-base": "5", "upscaler": "1"}
    if rewrite:
        assert await store.hgetall(waiting) == {"sd15-base": "4"}
        ttl_s = await store.ttl_s(waiting)
        assert ttl_s is not None
        assert 0 < ttl_s <= 10.0
    else:
        assert await store.hgetall(waiting) == {"stale-model": "9"}


async def test_the_counts_script_deletes_the_waiting_hash_when_nothing_waits() -> None:
    store = MemoryStateStore("t:")
    waiting = keys.placement_waiting("s-0")
    await store.hset(waiting, {"sd15-base": "1"})
    await store.run_script(STAGE_COUNTS, [keys.PLACEMENT_DEMAND, waiting], ["10000", "0", "1"])
    assert not await store.exists(waiting)
    assert not await store.exists(keys.PLACEMENT_DEMAND)
