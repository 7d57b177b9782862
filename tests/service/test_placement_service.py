"""The placement service over the in-memory bus and state store: the monitor writes the
workers from their heartbeats, the scheduler's counts say what is in demand, and the
service sends each worker whose placement changes a PlacementOrder on its own partition
of the worker inbox."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, Sum
from opentelemetry.sdk.trace import TracerProvider
from switchyard.bus import Bus, MemoryBroker, MemoryTransport
from switchyard.cluster.placement_view import GIB
from switchyard.config import Settings, load_settings
from switchyard.contracts.messages import (
    Heartbeat,
    PlacedModel,
    PlacedState,
    PlacementOrder,
    ResourceVector,
)
from switchyard.contracts.topics import WORKER_INBOX
from switchyard.errors import ConfigError
from switchyard.multimodel.model import ResourceVector as Vector
from switchyard.multimodel.policy_registry import (
    MultiModelPolicy,
    make_multimodel_policy,
    multimodel_policy_names,
)
from switchyard.multimodel.snapshot import PlacementPlan, PlacementSnapshot
from switchyard.policies.base import DecisionContext
from switchyard.runtime.service import EXIT_CONFIG, ServiceContext, run_service
from switchyard.serving.catalogue import DEFAULT_LLM_APPLICATIONS, ServingCatalogue
from switchyard.serving.pipelines import DEFAULT_PIPELINE_MODELS, DEFAULT_PIPELINES
from switchyard.state import MemoryStateStore, keys
from switchyard.telemetry import Telemetry

import services.placement
from services.monitor import MonitorService
from services.placement import PlacementService
from tests.support.services import eventually, store_worker

MODELS = DEFAULT_PIPELINE_MODELS
INBOX = {"w1": 1, "w2": 2, "w3": 3, "w-llm": 4, "w-draining": 5, "w-dead": 6}
"""The inbox partition each worker of these tests names in its heartbeats."""
BIG = (8.0, 1.0, 64.0)
"""A worker's cores, GPUs and GiB: room for every model of the catalogue at once."""
CATALOGUE = ServingCatalogue(
    llm={app.name: app for app in DEFAULT_LLM_APPLICATIONS},
    classification={},
    models=DEFAULT_PIPELINE_MODELS,
    pipelines=DEFAULT_PIPELINES,
)


def settings(policy: str = "adaptive-balanced", **overrides: object) -> Settings:
    values: dict[str, object] = {
        "instance_id": "test-placement",
        "placement_policy": policy,
        "placement_update_hz": 20.0,
        "heartbeat_interval_s": 0.5,
        "worker_timeout_s": 60.0,
        "commit_interval_s": 0.05,
        "health_port": 0,
    }
    values.update(overrides)
    return load_settings({}, **values)


def heartbeat(
    worker_id: str,
    placed: Mapping[str, PlacedState] | None = None,
    *,
    sequence: int = 1,
    capacity: tuple[float, float, float] = BIG,
    **overrides: object,
) -> Heartbeat:
    cpu, gpu, mem_gib = capacity
    values: dict[str, object] = {
        "worker_id": worker_id,
        "worker_type": "emulated-models",
        "backend": "emulated-models",
        "sequence": sequence,
        "interval_s": 0.5,
        "queue_length": 0,
        "queued_work_s": 0.0,
        "running": 0,
        "utilization": 0.0,
        "capacity": ResourceVector(cpu=cpu, gpu=gpu, mem_bytes=round(mem_gib * GIB)),
        "placed": [PlacedModel(model=m, state=s) for m, s in (placed or {}).items()],
        "inbox_partition": INBOX.get(worker_id, 0),
        "sent_at_s": time.time(),
    }
    values.update(overrides)
    return Heartbeat.model_validate(values)


class InboxReader:
    """Reads one worker's partition of the worker inbox, from when it was opened."""

    def __init__(self, bus: Bus, worker_id: str) -> None:
        self.partition = INBOX[worker_id]
        self.subscription = bus.subscribe(
            WORKER_INBOX, group=f"reader-{uuid.uuid4().hex[:6]}", partitions=[self.partition]
        )

    async def orders(self, count: int, *, timeout_s: float = 5.0) -> list[PlacementOrder]:
        found: list[PlacementOrder] = []
        deadline = time.monotonic() + timeout_s
        while len(found) < count and time.monotonic() < deadline:
            delivery = await self.subscription.next_within(deadline - time.monotonic())
            if delivery is None:
                continue
            assert delivery.envelope.partition == self.partition
            message = delivery.message
            assert isinstance(message, PlacementOrder), f"not a placement order: {message!r}"
            found.append(message)
        assert len(found) >= count, f"expected {count} orders, got {found}"
        return found

    async def nothing(self, quiet_s: float = 0.2) -> None:
        delivery = await self.subscription.next_within(quiet_s)
        assert delivery is None, f"unexpected {delivery.message!r}"


class Stack:
    """A broker, a state store, a monitor writing the workers, the scheduler's counts,
    and a clock the placement service reads (moved on by hand between rounds)."""

    def __init__(self, exits: AsyncExitStack) -> None:
        self.exits = exits
        self.broker = MemoryBroker()
        self.state = MemoryStateStore(f"t{uuid.uuid4().hex[:6]}:")
        self.monitor: MonitorService | None = None
        self.ahead_s = 0.0
        self.readers: list[InMemoryMetricReader] = []

    def clock(self) -> float:
        return time.time() + self.ahead_s

    def advance(self, seconds: float) -> None:
        self.ahead_s += seconds

    def context(self, name: str, values: Settings) -> ServiceContext:
        bus = Bus(MemoryTransport(self.broker), commit_interval_s=0.05, retry_initial_s=0.01)
        reader = InMemoryMetricReader()
        self.readers.append(reader)
        telemetry = Telemetry(TracerProvider(), MeterProvider(metric_readers=[reader]))
        ctx = ServiceContext(
            name=name,
            settings=values,
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
            ctx = self.context("monitor", settings())
            await ctx.bus.start()
            self.monitor = MonitorService(ctx)
        for beat in beats:
            assert await self.monitor.handle_heartbeat(beat)

    async def placement(
        self, policy_name: str = "adaptive-balanced", *, policy: MultiModelPolicy | None = None
    ) -> PlacementService:
        ctx = self.context("placement", settings(policy_name))
        await ctx.bus.start()
        if policy is None:
            made = await services.placement.create(ctx, CATALOGUE)
            assert isinstance(made, PlacementService)
            made.clock = self.clock
        else:
            made = PlacementService(
                ctx, models=MODELS, pipelines=DEFAULT_PIPELINES, policy=policy, clock=self.clock
            )

        async def stop() -> None:
            ctx.stopping.set()
            await made.drain()

        self.exits.push_async_callback(stop)
        return made

    async def demand(self, **counts: int) -> None:
        """The scheduler's running counts of stages per model."""
        await self.state.hset(keys.PLACEMENT_DEMAND, {m: str(n) for m, n in counts.items()})

    async def waiting(
        self, instance: str, counts: Mapping[str, int], *, age_s: float = 0.0
    ) -> None:
        """A scheduler replica's held stages, and its presence as of ``age_s`` ago."""
        await self.state.hset(
            keys.placement_waiting(instance), {m: str(n) for m, n in counts.items()}
        )
        await self.state.zadd(keys.SERVICES, {f"scheduler:{instance}": self.clock() - age_s})

    async def inbox(self, worker_id: str) -> InboxReader:
        bus = Bus(MemoryTransport(self.broker), commit_interval_s=0.05)
        await bus.start()
        self.exits.push_async_callback(bus.stop)
        reader = InboxReader(bus, worker_id)
        await reader.subscription.open()
        return reader

    def counted(self, name: str) -> int:
        """Counter ``name`` summed over every service of the stack."""
        total = 0
        for reader in self.readers:
            data = reader.get_metrics_data()
            for resource in data.resource_metrics if data is not None else ():
                for scope in resource.scope_metrics:
                    for metric in scope.metrics:
                        if metric.name == name and isinstance(metric.data, Sum):
                            total += sum(int(point.value) for point in metric.data.data_points)
        return total


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    async with AsyncExitStack() as exits:
        yield Stack(exits)


async def demand_arrives(stack: Stack, placement: PlacementService, **counts: int) -> None:
    """A first round reads the counts as they are (its baseline), then ``counts`` more
    stages arrive within a second: the next round sees them as a rate."""
    await stack.demand(**{m: 0 for m in counts})
    assert await placement.run_round() == []
    await stack.demand(**counts)
    stack.advance(1.0)


def used(placed: Sequence[str]) -> Vector:
    total = Vector(0.0, 0.0, 0.0)
    for model in placed:
        total = total + MODELS[model].resources
    return total


async def test_a_round_loads_the_model_in_demand_and_the_next_does_not_repeat_it(
    stack: Stack,
) -> None:
    await stack.report(heartbeat("w1"), heartbeat("w2"))
    inboxes = {w: await stack.inbox(w) for w in ("w1", "w2")}
    placement = await stack.placement()
    await demand_arrives(stack, placement, **{"sd15-base": 8})

    orders = await placement.run_round()

    assert sorted(o.worker_id for o in orders) == ["w1", "w2"]
    for order in orders:
        assert (order.load, order.unload) == (["sd15-base"], [])
        assert order.policy == "adaptive-balanced"
        assert order.decided_at_s == pytest.approx(stack.clock(), abs=5)
    assert len({o.plan_id for o in orders}) == 1  # one round, one plan
    for worker_id, inbox in inboxes.items():
        (received,) = await inbox.orders(1)
        assert received.worker_id == worker_id
        assert received.load == ["sd15-base"]
    assert placement.loads_ordered == 2
    assert stack.counted("switchyard.placement.loads") == 2

    # The heartbeats do not show the loads yet: the next round sees them done, as the
    # simulator would, and orders nothing again.
    await stack.demand(**{"sd15-base": 16})
    stack.advance(1.0)
    assert await placement.run_round() == []
    snapshot = placement.last_snapshot
    assert snapshot is not None
    for worker in snapshot.workers:
        assert [r.model for r in worker.resident] == ["sd15-base"]
        assert worker.free == Vector(*BIG) - MODELS["sd15-base"].resources
    assert placement.pending_orders == 2
    for inbox in inboxes.values():
        await inbox.nothing()

    # Once the heartbeats list the loads, the orders are forgotten; nothing is repeated.
    loading = {"sd15-base": PlacedState.LOADING}
    await stack.report(heartbeat("w1", loading, sequence=2), heartbeat("w2", loading, sequence=2))
    await stack.demand(**{"sd15-base": 24})
    stack.advance(1.0)
    assert await placement.run_round() == []
    assert placement.pending_orders == 0
    assert placement.rounds == 4


async def test_a_new_round_plan_has_a_new_id(stack: Stack) -> None:
    await stack.report(heartbeat("w1"))
    placement = await stack.placement("threshold")
    await demand_arrives(stack, placement, **{"sd15-base": 8})
    (first,) = await placement.run_round()
    await stack.demand(**{"sd15-base": 8, "upscaler": 8})
    stack.advance(1.0)
    (second,) = await placement.run_round()
    assert second.load == ["upscaler"]
    assert first.plan_id != second.plan_id
    assert first.plan_id.startswith("test-placement:")


async def test_only_the_lease_holder_places(stack: Stack) -> None:
    await stack.report(heartbeat("w1"), heartbeat("w2"))
    first = await stack.placement()
    second = await stack.placement()
    await demand_arrives(stack, first, **{"sd15-base": 8})
    assert await first.run_round()
    assert await second.run_round() == []
    assert second.rounds == 0
    assert second.loads_ordered == 0

    # The holder is gone (its lease ran out): the other takes over.
    await stack.state.delete(keys.PLACEMENT_LEASE)
    await second.run_round()
    assert second.rounds == 1
    assert await first.run_round() == []
    assert first.rounds == 2


async def test_a_plan_that_would_overflow_a_worker_is_refused_whole(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    class Greedy:
        """Loads the base model and the upscaler onto w1, the encoder onto w2."""

        name = "greedy"

        def place(self, snapshot: PlacementSnapshot, ctx: DecisionContext) -> PlacementPlan:
            return PlacementPlan(
                load=(("w1", "sd15-base"), ("w1", "upscaler"), ("w2", "prompt-encoder"))
            )

    reference = make_multimodel_policy("adaptive")
    policy = MultiModelPolicy(
        name="greedy", summary="too much", placement=Greedy(), router=reference.router
    )
    # w1 has room for the base model (16 GiB) but not for the upscaler beside it.
    await stack.report(heartbeat("w1", capacity=(8.0, 1.0, 20.0)), heartbeat("w2"))
    inboxes = [await stack.inbox(w) for w in ("w1", "w2")]
    placement = await stack.placement(policy=policy)

    with caplog.at_level(logging.WARNING, logger=placement.ctx.logger.name):
        assert await placement.run_round() == []

    assert placement.plans_refused == 1
    assert placement.loads_ordered == 0
    assert stack.counted("switchyard.placement.plans_refused") == 1
    problem = placement.last_problem or ""
    assert "overflows worker w1: loading sd15-base, upscaler" in problem
    assert "[cpu 8, gpu 1, mem 20 GiB]" in problem
    (line,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert line == f"plan of greedy refused: {problem}"
    for inbox in inboxes:  # not even w2's part, which would fit
        await inbox.nothing()


@pytest.mark.parametrize("name", multimodel_policy_names())
async def test_orders_never_place_more_than_a_worker_holds(stack: Stack, name: str) -> None:
    """Every policy, round after round, on workers that carry out each order at once
    (unloads, then loads) and whose heartbeats sometimes lag a round behind: the models
    placed on a worker never need more than it has."""
    small = (4.0, 1.0, 24.0)
    placed: dict[str, list[str]] = {"w1": [], "w2": [], "w3": []}
    await stack.report(*(heartbeat(w, capacity=small) for w in placed))
    placement = await stack.placement(name)
    counts = dict.fromkeys(MODELS, 0)
    ordered = 0
    for round_number in range(1, 13):
        await stack.demand(**counts)  # the first round reads its baseline
        for index, model in enumerate(MODELS):
            counts[model] += 3 * (index + round_number % 4)
        stack.advance(1.0)
        for order in await placement.run_round():
            ordered += len(order.load)
            holding = placed[order.worker_id]
            for model in order.unload:
                holding.remove(model)
            holding.extend(order.load)
            assert len(set(holding)) == len(holding), f"{name} loaded a model twice"
            assert used(holding).fits_in(Vector(*small)), (
                f"{name} overfilled {order.worker_id}: {holding}"
            )
        if round_number % 3 == 0:
            continue  # heartbeats lag behind the orders now and then
        await stack.report(
            *(
                heartbeat(
                    w,
                    dict.fromkeys(models, PlacedState.READY),
                    sequence=round_number + 1,
                    capacity=small,
                )
                for w, models in placed.items()
            )
        )
    assert ordered > 0, f"{name} placed nothing under demand"
    assert placement.plans_refused == 0


async def test_only_live_emulated_models_workers_that_read_an_inbox_are_placed_on(
    stack: Stack,
) -> None:
    await stack.report(
        heartbeat("w1"),
        heartbeat("w-llm", backend="emulated-llm"),
        heartbeat("w-draining", draining=True, running=1),
        heartbeat("w3", inbox_partition=None),
    )
    await store_worker(stack.state, heartbeat("w-dead"), status="down")
    placement = await stack.placement()
    await placement.run_round()
    snapshot = placement.last_snapshot
    assert snapshot is not None
    assert [w.spec.worker_id for w in snapshot.workers] == ["w1"]


async def test_waiting_stages_of_every_present_replica_are_summed(stack: Stack) -> None:
    await stack.report(heartbeat("w1"))
    await stack.waiting("scheduler-0", {"sd15-base": 2})
    await stack.waiting("scheduler-1", {"sd15-base": 3, "upscaler": 1, "not-in-catalogue": 4})
    await stack.waiting("scheduler-gone", {"sd15-base": 100}, age_s=3600.0)
    placement = await stack.placement()
    await placement.run_round()
    assert placement.last_snapshot is not None
    assert dict(placement.last_snapshot.waiting) == {"sd15-base": 5, "upscaler": 1}


async def test_an_unknown_policy_fails_clearly(stack: Stack) -> None:
    ctx = stack.context("placement", settings("nope"))
    with pytest.raises(ConfigError) as refused:
        await services.placement.create(ctx, CATALOGUE)
    message = str(refused.value)
    assert message.startswith("SWITCHYARD_PLACEMENT_POLICY: unknown multi-model policy 'nope'")
    assert all(name in message for name in multimodel_policy_names())


async def test_an_unknown_policy_stops_the_service_at_start_in_one_line(
    stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    async def build(name: str, values: Settings) -> ServiceContext:
        return stack.context(name, values)

    code = await run_service(
        services.placement.create, name="placement", settings=settings("nope"), build_context=build
    )
    assert code == EXIT_CONFIG
    err = capsys.readouterr().err
    assert err.startswith("switchyard placement: SWITCHYARD_PLACEMENT_POLICY: unknown")
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


async def test_the_routine_places_every_round_without_repeating_itself(stack: Stack) -> None:
    await stack.report(heartbeat("w1"), heartbeat("w2"))
    inboxes = [await stack.inbox(w) for w in ("w1", "w2")]
    placement = await stack.placement()
    await stack.demand(**{"sd15-base": 0})
    await placement.start()

    async def placing() -> bool:
        await stack.demand(**{"sd15-base": 10 * (placement.rounds + 1)})
        return placement.rounds >= 6

    await eventually(placing)
    assert placement.round_period_s == pytest.approx(0.05)
    received = [order for inbox in inboxes for order in await inbox.orders(1)]
    assert sorted(o.worker_id for o in received) == ["w1", "w2"]
    for inbox in inboxes:
        await inbox.nothing()
    assert placement.loads_ordered == 2
    assert stack.counted("switchyard.placement.rounds") >= 6
