"""The rebalancer over the in-memory bus and state store: the monitor writes the cluster
from heartbeats, the rebalancer plans over it and publishes migrations."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from switchyard.bus import Bus, MemoryBroker, MemoryTransport
from switchyard.config import Settings, load_settings
from switchyard.contracts.messages import Heartbeat, Migration, QueuedEntry, ServiceTimePrediction
from switchyard.contracts.topics import MIGRATIONS
from switchyard.perf.profiles import performance_model
from switchyard.policies.base import RebalancePolicy
from switchyard.policies.gaps import GapsRebalanceConfig, GapsRebalancer
from switchyard.policies.snapshot import QueueScope, RequestPhase
from switchyard.runtime.service import ServiceContext
from switchyard.state import MemoryStateStore
from switchyard.telemetry import Telemetry

import services.monitor
import services.rebalancer
from services.cluster_state import CLUSTER_STATS_KEY, prediction_key
from services.monitor import MonitorService
from services.rebalancer import RebalancerService, listed_entries

pytestmark = pytest.mark.unit

A100 = "a100-80gb/llama-2-7b"
H100 = "h100-80gb/llama-2-7b"
HEARTBEAT_INTERVAL_S = 0.05
WORKER_TIMEOUT_S = 2.0


def settings(policy: str = "gaps") -> Settings:
    return load_settings(
        {},
        instance_id="test-rebalancer",
        llm_policy=policy,
        heartbeat_interval_s=HEARTBEAT_INTERVAL_S,
        worker_timeout_s=WORKER_TIMEOUT_S,
        rebalance_interval_s=0.05,
        commit_interval_s=0.05,
    )


def entry(request_id: str, *, running: bool = False, **overrides: object) -> QueuedEntry:
    values: dict[str, object] = {
        "request_id": request_id,
        "app": "chat",
        "running": running,
        "queued_at_s": 1.0,
        "prompt_tokens": 100,
        "remaining_s": 1.5,
    }
    values.update(overrides)
    return QueuedEntry.model_validate(values)


def heartbeat(
    worker_id: str, outstanding: list[QueuedEntry], sequence: int = 1, **overrides: object
) -> Heartbeat:
    running = [e for e in outstanding if e.running]
    values: dict[str, object] = {
        "worker_id": worker_id,
        "worker_type": "emulated-llm",
        "profile": A100,
        "sequence": sequence,
        "interval_s": HEARTBEAT_INTERVAL_S,
        "queue_length": len(outstanding) - len(running),
        "queued_work_s": sum(e.remaining_s for e in outstanding),
        "running": len(running),
        "utilization": 1.0 if len(outstanding) > len(running) else 0.0,
        "outstanding": outstanding,
        "outstanding_total": len(outstanding),
        "sent_at_s": time.time(),
    }
    values.update(overrides)
    return Heartbeat.model_validate(values)


def overloaded() -> Heartbeat:
    """One running request and six waiting, 1.5 s each: 10.5 s of work on one worker."""
    waiting = [entry(f"r{i}", epoch=2 if i == 6 else 0) for i in range(1, 7)]
    return heartbeat("w-busy", [entry("r0", running=True, remaining_s=1.5), *waiting])


class Stack:
    """A broker, a state store, a monitor (to write the cluster) and a migrations reader."""

    def __init__(self, exits: AsyncExitStack) -> None:
        self.exits = exits
        self.broker = MemoryBroker()
        self.state = MemoryStateStore(f"t{uuid.uuid4().hex[:6]}:")
        self.monitor: MonitorService | None = None

    def _context(self, name: str, settings: Settings) -> ServiceContext:
        bus = Bus(MemoryTransport(self.broker), commit_interval_s=0.05, retry_initial_s=0.01)
        telemetry = Telemetry(TracerProvider(), MeterProvider())
        ctx = ServiceContext(
            name=name,
            settings=settings,
            bus=bus,
            state=self.state,
            telemetry=telemetry,
            logger=logging.getLogger(f"tests.{name}.{uuid.uuid4().hex[:6]}"),
            stopping=asyncio.Event(),
        )

        async def stop() -> None:
            await bus.stop()
            telemetry.shutdown()

        self.exits.push_async_callback(stop)
        return ctx

    async def report(self, *beats: Heartbeat) -> None:
        """Record heartbeats in the state store the way the monitor does."""
        if self.monitor is None:
            ctx = self._context("monitor", settings())
            await ctx.bus.start()
            made = await services.monitor.create(ctx)
            assert isinstance(made, MonitorService)
            self.monitor = made
        for beat in beats:
            assert await self.monitor.handle_heartbeat(beat)

    async def rebalancer(
        self, policy_name: str = "gaps", *, policy: RebalancePolicy | None = None, run: bool = False
    ) -> RebalancerService:
        ctx = self._context("rebalancer", settings(policy_name))
        await ctx.bus.start()
        if policy is None:
            made = await services.rebalancer.create(ctx)
            assert isinstance(made, RebalancerService)
        else:
            made = RebalancerService(ctx, policy=policy)

        async def stop() -> None:
            ctx.stopping.set()
            await made.drain()

        self.exits.push_async_callback(stop)
        if run:
            await made.start()
        return made

    async def migrations(self, count: int, *, timeout_s: float = 5.0) -> list[Migration]:
        """The first ``count`` migrations on the topic (fails if fewer arrive in time)."""
        found: list[Migration] = []
        bus = Bus(MemoryTransport(self.broker), commit_interval_s=0.05)
        await bus.start()
        try:
            async with bus.subscribe(MIGRATIONS, group=f"reader-{uuid.uuid4().hex[:6]}") as sub:
                deadline = time.monotonic() + timeout_s
                while len(found) < count and time.monotonic() < deadline:
                    delivery = await sub.next_within(deadline - time.monotonic())
                    if delivery is not None:
                        found.append(delivery.message)
        finally:
            await bus.stop()
        assert len(found) >= count, f"expected {count} migrations, got {found}"
        return found


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    async with AsyncExitStack() as exits:
        yield Stack(exits)


async def eventually(check: Callable[[], Awaitable[bool]], *, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout_s} s")
        await asyncio.sleep(0.01)


async def test_gaps_moves_waiting_requests_from_the_loaded_worker_to_the_idle_one(
    stack: Stack,
) -> None:
    await stack.report(overloaded(), heartbeat("w-idle", []))
    rebalancer = await stack.rebalancer("gaps")

    published = await rebalancer.run_round()

    assert published, "an overloaded worker next to an idle one must shed work"
    assert rebalancer.migrations_published == len(published)
    for migration in published:
        assert (migration.from_worker_id, migration.to_worker_id) == ("w-busy", "w-idle")
        assert migration.reason.startswith("gaps-rebalance: ")
        assert migration.expected_gain_s > migration.cost_s >= 0
        assert migration.kv_cache_bytes == 0  # waiting requests hold no KV cache
        assert migration.decided_at_s == pytest.approx(time.time(), abs=5)
    moved = {m.request_id: m for m in published}
    assert "r0" not in moved  # gaps moves waiting requests only
    assert set(moved) <= {f"r{i}" for i in range(1, 7)}
    assert "r6" in moved  # the tail of the queue waits longest
    assert moved["r6"].epoch == 3  # listed epoch 2, plus one
    assert all(m.epoch == 1 for rid, m in moved.items() if rid != "r6")
    on_topic = await stack.migrations(len(published))
    assert {m.request_id for m in on_topic} == set(moved)

    # The next round sees the same heartbeats (the worker has not caught up yet):
    # nothing is moved twice.
    assert await rebalancer.run_round() == []
    assert rebalancer.migrations_published == len(published)
    # ... because that round saw the moves as done, like the simulator.
    assert rebalancer.last_snapshot is not None
    views = {w.worker_id: w for w in rebalancer.last_snapshot.cluster.workers}
    assert views["w-idle"].waiting == len(published)
    assert views["w-idle"].queued_work_s == pytest.approx(1.5 * len(published))
    assert views["w-busy"].waiting == 6 - len(published)
    assert views["w-busy"].queued_work_s == pytest.approx(10.5 - 1.5 * len(published))


async def test_work_moves_only_to_workers_serving_its_model(stack: Stack) -> None:
    other_model = heartbeat(
        "w-13b", [], profile="h100-80gb/llama-2-13b", resident_models=["llama-2-13b"]
    )
    torch_worker = heartbeat(
        "w-torch", [], profile=None, worker_type="cpu", resident_models=["digits/mlp-small"]
    )
    await stack.report(overloaded(), other_model, torch_worker)
    rebalancer = await stack.rebalancer("gaps")
    assert await rebalancer.run_round() == []  # idle, but neither serves llama-2-7b
    await stack.report(heartbeat("w-idle", []))
    published = await rebalancer.run_round()
    assert published
    assert {m.to_worker_id for m in published} == {"w-idle"}


async def test_the_snapshot_mirrors_the_simulator(stack: Stack) -> None:
    await stack.report(overloaded(), heartbeat("w-idle", []))
    prediction = ServiceTimePrediction(
        request_id="r5",
        predicted_s=1.0,
        calibrated_s=2.0,
        deadline_s=50.0,
        by_worker_type_s={A100: 2.0, H100: 1.0},
        predictor="linear",
        predicted_at_s=1.0,
    )
    await stack.state.set(prediction_key("r5"), prediction.model_dump_json())
    rebalancer = await stack.rebalancer(
        policy=GapsRebalancer(GapsRebalanceConfig(max_migrations=0, queue_tail=3))
    )
    assert await rebalancer.run_round() == []
    snapshot = rebalancer.last_snapshot
    assert snapshot is not None
    assert [w.worker_id for w in snapshot.cluster.workers] == ["w-busy", "w-idle"]
    listed = {q.request.request_id: q for q in snapshot.queued}
    assert set(listed) == {"r4", "r5", "r6"}  # the waiting tail of three, no running
    # Work ahead accumulates in queue order: r0 (running) + r1..r3 before r4.
    assert [listed[r].work_ahead_s for r in ("r4", "r5", "r6")] == [6.0, 7.5, 9.0]
    assert all(q.phase is RequestPhase.WAITING and q.remaining_s == 1.5 for q in listed.values())
    with_prediction = listed["r5"].request
    assert dict(with_prediction.calibrated_s) == {A100: 2.0, H100: 1.0}
    assert dict(with_prediction.predicted_s) == {A100: 1.0, H100: 0.5}
    assert with_prediction.deadline_s == 50.0
    without = listed["r4"].request
    assert dict(without.calibrated_s) == {A100: 1.5}  # the worker's own remaining_s
    assert without.deadline_s is None
    assert without.model == "llama-2-7b"


def test_listed_entries_respects_the_queue_scope() -> None:
    beat = heartbeat(
        "w",
        [
            entry("run", running=True, remaining_s=4.0, kv_tokens=300, generated_tokens=20),
            entry("a", remaining_s=1.0),
            entry("b", remaining_s=2.0),
            entry("c", remaining_s=3.0),
        ],
    )
    everything = listed_entries(beat, QueueScope(waiting_tail=None, running=True))
    assert [(i.entry.request_id, i.work_ahead_s) for i in everything] == [
        ("a", 4.0),
        ("b", 5.0),
        ("c", 7.0),
        ("run", 0.0),
    ]
    assert [i.entry.request_id for i in listed_entries(beat, QueueScope(waiting_tail=0))] == ["run"]
    tail = listed_entries(beat, QueueScope(waiting_tail=1, running=False))
    assert [(i.entry.request_id, i.work_ahead_s, i.worker_type) for i in tail] == [("c", 7.0, A100)]


async def test_llumnix_moves_running_requests_with_their_kv_cache(stack: Stack) -> None:
    running = [
        entry(f"k{i}", running=True, kv_tokens=500 * (i + 1), generated_tokens=10) for i in range(4)
    ]
    await stack.report(
        heartbeat("w-full", running, kv_capacity_tokens=10_000, queued_tokens=9_000),
        heartbeat("w-empty", [], kv_capacity_tokens=10_000, queued_tokens=0),
    )
    rebalancer = await stack.rebalancer("llumnix")
    published = await rebalancer.run_round()
    assert published
    first = published[0]
    assert (first.request_id, first.from_worker_id, first.to_worker_id) == (
        "k0",
        "w-full",
        "w-empty",
    )  # shortest KV first
    assert first.epoch == 1
    assert first.kv_cache_bytes == 500 * performance_model(A100).kv_bytes_per_token


async def test_a_dead_worker_takes_no_part(stack: Stack) -> None:
    await stack.report(overloaded(), heartbeat("w-idle", []))
    assert stack.monitor is not None
    stack.monitor.clock = lambda: time.time() + WORKER_TIMEOUT_S + 1
    assert await stack.monitor.check_liveness() == ["w-busy", "w-idle"]
    await stack.report(overloaded().model_copy(update={"sequence": 2}))  # only w-busy is back
    rebalancer = await stack.rebalancer("gaps")
    assert await rebalancer.run_round() == []
    assert rebalancer.last_snapshot is not None
    alive = {w.worker_id: w.alive for w in rebalancer.last_snapshot.cluster.workers}
    assert alive == {"w-busy": True, "w-idle": False}


async def test_jsq_has_no_rebalancer_and_publishes_nothing(stack: Stack) -> None:
    await stack.report(overloaded(), heartbeat("w-idle", []))
    rebalancer = await stack.rebalancer("jsq", run=True)
    assert rebalancer.policy is None
    assert rebalancer.running_routines() == []
    assert rebalancer.alive
    assert await rebalancer.run_round() == []
    assert await rebalancer.tick() == []
    assert rebalancer.migrations_published == 0


async def test_the_routine_rebalances_every_period(stack: Stack) -> None:
    await stack.report(overloaded(), heartbeat("w-idle", []))
    policy = GapsRebalancer(GapsRebalanceConfig(period_s=0.05))
    rebalancer = await stack.rebalancer(policy=policy, run=True)
    assert rebalancer.round_period_s == pytest.approx(0.05)

    async def moved() -> bool:
        return rebalancer.migrations_published > 0 and rebalancer.rounds >= 3

    await eventually(moved)
    published = rebalancer.migrations_published
    on_topic = await stack.migrations(published)
    assert len({m.request_id for m in on_topic}) == published  # never the same one twice
    assert all(m.to_worker_id == "w-idle" for m in on_topic)


async def test_spike_only_policies_run_when_violations_spike(stack: Stack) -> None:
    await stack.report(overloaded(), heartbeat("w-idle", []))
    policy = GapsRebalancer(GapsRebalanceConfig(period_s=0.0, spike_violation_rate=0.2))
    rebalancer = await stack.rebalancer(policy=policy)
    assert not rebalancer.periodic
    assert await rebalancer.tick() == []  # no completions yet: no spike
    await stack.state.hset(
        CLUSTER_STATS_KEY, {"recent_violation_rate": "0.1", "recent_window": "100"}
    )
    assert await rebalancer.tick() == []
    assert rebalancer.rounds == 0
    await stack.state.hset(CLUSTER_STATS_KEY, {"recent_violation_rate": "0.5"})
    assert await rebalancer.tick()
    assert rebalancer.rounds == 1


async def test_only_one_of_two_replicas_rebalances(stack: Stack) -> None:
    await stack.report(overloaded(), heartbeat("w-idle", []))
    first = await stack.rebalancer("gaps")
    second = await stack.rebalancer("gaps")
    assert await first.run_round()
    assert await second.run_round() == []
    assert second.rounds == 0
