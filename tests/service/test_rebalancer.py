"""The rebalancer over the in-memory bus and state store: the monitor writes the cluster
from heartbeats, the predictor's published model predicts the listed requests, and the
rebalancer plans over both and sends migrations to the source worker's inbox partition."""

from __future__ import annotations

import asyncio
import functools
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
from switchyard.contracts.messages import (
    Heartbeat,
    Migration,
    PredictorModel,
    QueuedEntry,
    WorkloadType,
)
from switchyard.contracts.topics import WORKER_INBOX
from switchyard.lifecycle import RECENT_WINDOW
from switchyard.perf.profiles import performance_model
from switchyard.policies.base import RebalancePolicy
from switchyard.policies.gaps import GapsRebalanceConfig, GapsRebalancer
from switchyard.policies.snapshot import QueueScope, RequestPhase
from switchyard.prediction.snapshot import FittedPredictor, Prediction
from switchyard.runtime.service import ServiceContext
from switchyard.state import MemoryStateStore, keys
from switchyard.telemetry import Telemetry

import services.rebalancer
from services.monitor import MonitorService
from services.predictor.model import LivePredictor
from services.rebalancer import RebalancerService, listed_entries

A100 = "a100-80gb/llama-2-7b"
H100 = "h100-80gb/llama-2-7b"
L40S = "l40s-48gb/llama-2-7b"
HEARTBEAT_INTERVAL_S = 0.05
WORKER_TIMEOUT_S = 2.0
INBOX = {"w-busy": 1, "w-idle": 2, "w-13b": 3, "w-torch": 4, "w-full": 5, "w-empty": 6}
"""The inbox partition each worker of these tests names in its heartbeats."""


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
        "inbox_partition": INBOX.get(worker_id, 0),
        "sent_at_s": time.time(),
    }
    values.update(overrides)
    return Heartbeat.model_validate(values)


def overloaded() -> Heartbeat:
    """One running request and six waiting, 1.5 s each: 10.5 s of work on one worker."""
    waiting = [entry(f"r{i}", epoch=2 if i == 6 else 0) for i in range(1, 7)]
    return heartbeat("w-busy", [entry("r0", running=True, remaining_s=1.5), *waiting])


@functools.cache
def predictor_model() -> PredictorModel:
    """What the predictor publishes before it learnt anything online (pre-trained)."""
    return LivePredictor.pretrained(1.0).snapshot(1, time.time())


def predicted(entry: QueuedEntry, predictor: FittedPredictor) -> Prediction:
    """The published model's prediction for a listed llama-2-7b request (as the scheduler
    predicts it when it places one)."""
    return predictor.predict(
        prompt_tokens=entry.prompt_tokens,
        workload=entry.workload,
        model="llama-2-7b",
        output_tokens_hint=entry.output_tokens_hint,
        arrival_s=entry.arrival_s if entry.arrival_s is not None else entry.queued_at_s,
    )


class InboxReader:
    """Reads one worker's partition of the worker inbox, from when it was opened."""

    def __init__(self, bus: Bus, worker_id: str) -> None:
        self.partition = INBOX[worker_id]
        self.subscription = bus.subscribe(
            WORKER_INBOX, group=f"reader-{uuid.uuid4().hex[:6]}", partitions=[self.partition]
        )

    async def migrations(self, count: int, *, timeout_s: float = 5.0) -> list[Migration]:
        """The next ``count`` migrations (fails if fewer arrive in time, or anything else)."""
        found: list[Migration] = []
        deadline = time.monotonic() + timeout_s
        while len(found) < count and time.monotonic() < deadline:
            delivery = await self.subscription.next_within(deadline - time.monotonic())
            if delivery is None:
                continue
            assert delivery.envelope.partition == self.partition
            message = delivery.message
            assert isinstance(message, Migration), f"not a migration: {message!r}"
            found.append(message)
        assert len(found) >= count, f"expected {count} migrations, got {found}"
        return found


class Stack:
    """A broker, a state store, a monitor (to write the cluster), the predictor's model
    and readers of workers' inboxes."""

    def __init__(self, exits: AsyncExitStack) -> None:
        self.exits = exits
        self.broker = MemoryBroker()
        self.state = MemoryStateStore(f"t{uuid.uuid4().hex[:6]}:")
        self.monitor: MonitorService | None = None
        self.monitor_ahead_s = 0.0
        """How far the monitor's clock runs ahead of the wall clock."""

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
            self.monitor = MonitorService(ctx, clock=lambda: time.time() + self.monitor_ahead_s)
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

    async def publish_model(self) -> FittedPredictor:
        """Store the predictor's model where it publishes it; returns it as applied."""
        model = predictor_model()
        await self.state.set(keys.PREDICTOR_MODEL, model.model_dump_json())
        return FittedPredictor.from_model(model)

    async def inbox(self, worker_id: str) -> InboxReader:
        """A reader of ``worker_id``'s inbox partition, open before anything is sent."""
        bus = Bus(MemoryTransport(self.broker), commit_interval_s=0.05)
        await bus.start()
        self.exits.push_async_callback(bus.stop)
        reader = InboxReader(bus, worker_id)
        await reader.subscription.open()
        return reader


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
    predictor = await stack.publish_model()
    busy_inbox = await stack.inbox("w-busy")
    rebalancer = await stack.rebalancer("gaps")

    published = await rebalancer.run_round()

    assert published, "an overloaded worker next to an idle one must shed work"
    assert rebalancer.migrations_published == len(published)
    for migration in published:
        assert (migration.from_worker_id, migration.to_worker_id) == ("w-busy", "w-idle")
        # Sent to the source (it hands the request on) naming where the target reads.
        assert migration.to_inbox_partition == INBOX["w-idle"]
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
    on_topic = await busy_inbox.migrations(len(published))
    assert {m.request_id for m in on_topic} == set(moved)

    # The next round sees the same heartbeats (the worker has not caught up yet):
    # nothing is moved twice.
    assert await rebalancer.run_round() == []
    assert rebalancer.migrations_published == len(published)
    # ... because that round saw the moves as done, like the simulator: the target holds
    # them at their predicted time there, the source lost what it reported for them.
    assert rebalancer.last_snapshot is not None
    views = {w.worker_id: w for w in rebalancer.last_snapshot.cluster.workers}
    there_s = predicted(entry("r1"), predictor).calibrated_by_worker_type_s[A100]
    assert there_s != pytest.approx(1.5)
    assert views["w-idle"].waiting == len(published)
    assert views["w-idle"].queued_work_s == pytest.approx(there_s * len(published))
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
    waiting = [entry(f"r{i}") for i in range(1, 7)]
    # r5 as the ingress described it: a long code prompt with a hint and a deadline.
    waiting[4] = entry(
        "r5",
        prompt_tokens=3000,
        workload=WorkloadType.CODE,
        output_tokens_hint=400,
        arrival_s=2.0,
        deadline_s=50.0,
    )
    busy = heartbeat("w-busy", [entry("r0", running=True), *waiting])
    await stack.report(busy, heartbeat("w-idle", []))
    rebalancer = await stack.rebalancer(
        policy=GapsRebalancer(GapsRebalanceConfig(max_migrations=0, queue_tail=3))
    )

    # Before the predictor published a model: the worker's own figures.
    assert await rebalancer.run_round() == []
    snapshot = rebalancer.last_snapshot
    assert snapshot is not None
    assert [w.worker_id for w in snapshot.cluster.workers] == ["w-busy", "w-idle"]
    listed = {q.request.request_id: q for q in snapshot.queued}
    assert set(listed) == {"r4", "r5", "r6"}  # the waiting tail of three, no running
    # Work ahead accumulates in queue order: r0 (running) + r1..r3 before r4.
    assert [listed[r].work_ahead_s for r in ("r4", "r5", "r6")] == [6.0, 7.5, 9.0]
    assert all(q.phase is RequestPhase.WAITING and q.remaining_s == 1.5 for q in listed.values())
    unpredicted = listed["r5"].request
    assert dict(unpredicted.calibrated_s) == {A100: 1.5}  # the worker's own remaining_s
    assert dict(unpredicted.predicted_s) == {A100: 1.5}
    assert unpredicted.deadline_s == 50.0  # its own deadline
    assert listed["r4"].request.deadline_s is None
    assert (unpredicted.model, unpredicted.prompt_tokens, unpredicted.arrival_s) == (
        "llama-2-7b",
        3000,
        2.0,
    )

    # Once it published one: every listed request predicted with it, on every worker
    # type of its model, as the scheduler predicts the requests it places.
    predictor = await stack.publish_model()
    assert await rebalancer.run_round() == []
    snapshot = rebalancer.last_snapshot
    assert snapshot is not None
    listed = {q.request.request_id: q for q in snapshot.queued}
    assert set(listed) == {"r4", "r5", "r6"}
    for request_id, item in listed.items():
        expected = predicted(waiting[int(request_id[1:]) - 1], predictor)
        view = item.request
        assert set(view.calibrated_s) == {A100, H100, L40S}
        assert dict(view.calibrated_s) == pytest.approx(expected.calibrated_by_worker_type_s)
        assert dict(view.predicted_s) == pytest.approx(expected.raw_by_worker_type_s)
        assert view.deadline_s == pytest.approx(expected.deadline_s)
        assert view.model == "llama-2-7b"
        assert item.remaining_s == 1.5  # what the worker says it still needs
    # What the heartbeat lists of a request (prompt, workload, hint) is what is predicted,
    # and the adaptive deadline counts from its arrival, replacing its own deadline.
    code, chat = listed["r5"].request, listed["r4"].request
    assert code.calibrated_s != chat.calibrated_s
    assert code.deadline_s is not None
    assert code.deadline_s != 50.0
    assert code.deadline_s > 2.0 + code.calibrated_s[L40S]


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
    assert first.to_inbox_partition == INBOX["w-empty"]
    assert first.kv_cache_bytes == 500 * performance_model(A100).kv_bytes_per_token
    # The prediction for the target's type travels with the move (no published model:
    # what the worker reports, 1.5 s, stands for it on this A100 as on the source).
    assert (first.predicted_s, first.predicted_raw_s) == (1.5, 1.5)


async def test_a_dead_worker_takes_no_part(stack: Stack) -> None:
    await stack.report(overloaded(), heartbeat("w-idle", []))
    assert stack.monitor is not None
    stack.monitor_ahead_s = WORKER_TIMEOUT_S + 1
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
    await stack.publish_model()
    busy_inbox = await stack.inbox("w-busy")
    policy = GapsRebalancer(GapsRebalanceConfig(period_s=0.05))
    rebalancer = await stack.rebalancer(policy=policy, run=True)
    assert rebalancer.round_period_s == pytest.approx(0.05)

    async def moved() -> bool:
        return rebalancer.migrations_published > 0 and rebalancer.rounds >= 3

    await eventually(moved)
    published = rebalancer.migrations_published
    on_topic = await busy_inbox.migrations(published)
    assert len({m.request_id for m in on_topic}) == published  # never the same one twice
    assert all(m.to_worker_id == "w-idle" for m in on_topic)
    assert all(m.to_inbox_partition == INBOX["w-idle"] for m in on_topic)


async def test_spike_only_policies_run_when_violations_spike(stack: Stack) -> None:
    await stack.report(overloaded(), heartbeat("w-idle", []))
    policy = GapsRebalancer(GapsRebalanceConfig(period_s=0.0, spike_violation_rate=0.2))
    rebalancer = await stack.rebalancer(policy=policy)
    assert not rebalancer.periodic
    assert await rebalancer.tick() == []  # no completions yet: no spike

    async def latest_outcomes(recent: str) -> None:
        """The outcomes of the latest completions as the request ledger keeps them."""
        await stack.state.hset(keys.CLUSTER_STATS, {"recent": recent})

    await latest_outcomes("1" * (RECENT_WINDOW // 2 - 1))  # all late, but too few yet
    assert await rebalancer.tick() == []
    await latest_outcomes("0000000001" * (RECENT_WINDOW // 10))  # 10 % late
    assert await rebalancer.tick() == []
    assert rebalancer.rounds == 0
    await latest_outcomes("01" * (RECENT_WINDOW // 2))  # 50 % late
    assert await rebalancer.tick()
    assert rebalancer.rounds == 1


async def test_only_one_of_two_replicas_rebalances(stack: Stack) -> None:
    await stack.report(overloaded(), heartbeat("w-idle", []))
    first = await stack.rebalancer("gaps")
    second = await stack.rebalancer("gaps")
    assert await first.run_round()
    assert await second.run_round() == []
    assert second.rounds == 0


async def test_no_work_moves_to_a_worker_whose_heartbeat_names_no_inbox(stack: Stack) -> None:
    """A worker that names no inbox partition (not reading one yet) is not sent work: the
    plans for it are dropped, until its heartbeat names one."""
    await stack.report(overloaded(), heartbeat("w-idle", [], inbox_partition=None))
    rebalancer = await stack.rebalancer("gaps")
    assert await rebalancer.run_round() == []
    assert rebalancer.plans_dropped > 0
    assert rebalancer.migrations_published == 0

    await stack.report(heartbeat("w-idle", [], sequence=2))
    published = await rebalancer.run_round()
    assert published
    assert {m.to_inbox_partition for m in published} == {INBOX["w-idle"]}
