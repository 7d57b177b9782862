"""The placement service: runs the multi-model placement policy over the workers'
heartbeats and sends each worker whose placement changes a
:class:`~switchyard.contracts.messages.PlacementOrder`.

The policy is ``make_multimodel_policy(settings.placement_policy).placement``, one
object for the service's life (some keep state from round to round, as in the
simulator); an unknown name fails the start with the registry's message, naming the
known policies.

A round, every ``1 / settings.placement_update_hz`` wall seconds, as the simulator's
update (``research/multimodel/simulator.py``): snapshot, place, check, order.

* **Workers**: the monitor's records (:class:`switchyard.cluster.ClusterReader`), those
  alive and not draining whose heartbeat comes from the ``emulated-models`` backend and
  names an inbox partition (a worker that reads none cannot be told anything).
* **Demand**: ``placement:demand`` (stages the scheduler routed so far, per model) as a
  smoothed rate per wall second (:mod:`services.placement.demand`), with the
  simulator's time constant, 5 model seconds, in wall seconds (divided by the workers'
  time scale) but never under one round.
* **Waiting**: the ``placement:waiting:{instance}`` hashes of the replicas present in the
  ``services`` set, summed (:mod:`services.placement.inputs`).
* **Snapshot**: :func:`switchyard.cluster.placement_view.placement_snapshot`, with the
  orders this replica sent that heartbeats do not show yet as deltas
  (:mod:`services.placement.orders`, kept ``max(3 rounds, 3 heartbeat intervals)``), so
  consecutive rounds do not load one model twice. Demand and waiting of models the
  catalogue does not know are left out.
* **Check**: :func:`switchyard.multimodel.plan_check.plan_problem`, the simulator's. A
  plan that is wrong anywhere (it would overflow a worker, loads what is there, evicts
  what is not) is refused whole: counted and logged in one line naming the problem.
* **Orders**: one PlacementOrder per worker the plan changes (its unloads, then its
  loads, in the plan's order; ``plan_id`` ``{token}-{round}``, unique per round and
  replica; ``policy`` the policy's name), on the worker's own partition of
  ``switchyard.worker-inbox`` (its heartbeat's ``inbox_partition``).

Metrics: ``switchyard.placement.rounds``, ``.loads`` (models ordered loaded),
``.unloads`` (ordered unloaded) and ``.plans_refused``, all counters by ``policy``.

Replicas: only the holder of the lease ``lease:placement`` (a string with a time to live
of ``max(3 rounds, 1 s)``, renewed each round by ``compare_and_set``) runs rounds, so two
replicas never place at once; the others stand by and take over once it lapses.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
import zlib
from collections.abc import Callable, Mapping

from switchyard.cluster import ClusterReader
from switchyard.cluster.placement_view import placement_snapshot
from switchyard.contracts.messages import Heartbeat, PlacementOrder
from switchyard.contracts.topics import WORKER_INBOX
from switchyard.errors import ConfigError
from switchyard.multimodel.model import ModelSpec, PipelineSpec
from switchyard.multimodel.plan_check import plan_problem, snapshot_rooms
from switchyard.multimodel.policy_registry import (
    MultiModelPolicy,
    UnknownMultiModelPolicyError,
    make_multimodel_policy,
)
from switchyard.multimodel.snapshot import PlacementPlan, PlacementSnapshot
from switchyard.policies.base import DecisionContext
from switchyard.runtime.service import Service, ServiceContext
from switchyard.state import keys

from services.placement.demand import DemandRates
from services.placement.inputs import read_demand_counts, read_waiting
from services.placement.orders import OrderMemory

__all__ = ["EMULATED_MODELS", "PlacementService", "placement_policy"]

EMULATED_MODELS = "emulated-models"
"""The worker backend whose heartbeats list placed models."""

DEMAND_TAU_MODEL_S = 5.0
"""The demand's smoothing time constant in model seconds (the simulator's default)."""

LEASE_MIN_TTL_S = 1.0
"""The lease outlives a stalled round at least this long, however fast rounds are."""


def placement_policy(name: str) -> MultiModelPolicy:
    """A fresh instance of the multi-model policy ``name``.

    Raises:
        ConfigError: naming the setting, the name and every known policy.
    """
    try:
        return make_multimodel_policy(name)
    except UnknownMultiModelPolicyError as exc:
        raise ConfigError(f"SWITCHYARD_PLACEMENT_POLICY: {exc}") from None


class PlacementService(Service):
    """Periodic placement rounds on the lease holder (see the module docstring).

    Args:
        ctx: the service context.
        models: the catalogue's models by name (what workers load and their resources).
        pipelines: the catalogue's pipelines by name.
        policy: the policy, built already; None: the one ``settings.placement_policy``
            names.
        clock: wall clock (snapshots, demand, ``decided_at_s``, presence).
        monotonic: the clock orders are remembered by.

    Raises:
        ConfigError: ``settings.placement_policy`` names no policy.

    Attributes (per replica):
        rounds: rounds run (each one policy call, or none without workers).
        loads_ordered: models ordered loaded.
        unloads_ordered: models ordered unloaded.
        plans_refused: plans refused whole by the check.
        round_period_s: seconds between rounds.
        last_snapshot: the snapshot of the latest round (tests, diagnosis).
        last_problem: why the latest refused plan was refused.
    """

    def __init__(
        self,
        ctx: ServiceContext,
        *,
        models: Mapping[str, ModelSpec],
        pipelines: Mapping[str, PipelineSpec],
        policy: MultiModelPolicy | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(ctx)
        settings = ctx.settings
        self.policy = policy or placement_policy(settings.placement_policy)
        self.models = models
        self.pipelines = pipelines
        self.clock = clock
        self.monotonic = monotonic
        self.worker_timeout_s = settings.worker_timeout_s
        self.round_period_s = 1.0 / settings.placement_update_hz
        self.lease_ttl_s = max(3 * self.round_period_s, LEASE_MIN_TTL_S)
        self.token = f"{settings.instance_id}:{uuid.uuid4().hex[:8]}"
        self._cluster = ClusterReader(ctx.state)
        self._demand = DemandRates()
        self._orders = OrderMemory(max(3 * self.round_period_s, 3 * settings.heartbeat_interval_s))
        self._rng = random.Random(zlib.crc32(settings.instance_id.encode()))
        self._sequence = 0
        self._leading: bool | None = None
        self.rounds = 0
        self.loads_ordered = 0
        self.unloads_ordered = 0
        self.plans_refused = 0
        self.last_snapshot: PlacementSnapshot | None = None
        self.last_problem: str | None = None
        meter = ctx.telemetry.meter_provider.get_meter("switchyard.placement")
        self._m_rounds = meter.create_counter(
            "switchyard.placement.rounds",
            unit="{round}",
            description="Placement rounds run by the lease holder, by policy.",
        )
        self._m_loads = meter.create_counter(
            "switchyard.placement.loads",
            unit="{model}",
            description="Models ordered loaded onto a worker, by policy.",
        )
        self._m_unloads = meter.create_counter(
            "switchyard.placement.unloads",
            unit="{model}",
            description="Models ordered unloaded from a worker, by policy.",
        )
        self._m_refused = meter.create_counter(
            "switchyard.placement.plans_refused",
            unit="{plan}",
            description="Placement plans refused whole (overflow, unknown or repeated names).",
        )

    @property
    def pending_orders(self) -> int:
        """Models ordered loaded or unloaded that no heartbeat shows yet."""
        return len(self._orders)

    async def start(self) -> None:
        self.ctx.logger.info(
            "placing with %s every %.3g s over %d models",
            self.policy.name,
            self.round_period_s,
            len(self.models),
            extra={"event": "placing", "policy": self.policy.name},
        )
        self.spawn_routine("placement_routine", self.placement_routine)

    async def placement_routine(self) -> None:
        stopping = self.ctx.stopping
        while not stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), self.round_period_s)
            if stopping.is_set():
                return
            await self.run_round()

    async def _hold_lease(self) -> bool:
        state = self.ctx.state
        ttl_s = self.lease_ttl_s
        held = await state.compare_and_set(
            keys.PLACEMENT_LEASE, self.token, self.token, ttl_s=ttl_s
        ) or await state.set_if_absent(keys.PLACEMENT_LEASE, self.token, ttl_s=ttl_s)
        if held != self._leading:
            self._leading = held
            self.ctx.logger.info(
                "%s the placement lease",
                "holding" if held else "standing by: another replica holds",
                extra={"event": "leading" if held else "standing-by"},
            )
        return held

    def _workers(self, heartbeats: list[Heartbeat | None]) -> list[Heartbeat]:
        return [
            beat
            for beat in heartbeats
            if beat is not None
            and beat.backend == EMULATED_MODELS
            and beat.inbox_partition is not None
        ]

    async def run_round(self) -> list[PlacementOrder]:
        """Read, place, check and order once; returns the orders published (none on a
        replica that does not hold the lease)."""
        if not await self._hold_lease():
            return []
        state = self.ctx.state
        now_s = self.clock()
        view = await self._cluster.read(now_s)
        beats = self._workers(
            [r.heartbeat for r in view.workers if r.takes_work(self.worker_timeout_s)]
        )
        counts = await read_demand_counts(state)
        waiting = await read_waiting(state, now_s)
        scale = beats[0].time_scale if beats else 1.0
        tau_s = max(DEMAND_TAU_MODEL_S / scale, self.round_period_s)
        rates = self._demand.update(counts, now_s, tau_s)
        models = self.models
        snapshot = placement_snapshot(
            beats,
            models=models,
            pipelines=self.pipelines,
            now_wall_s=now_s,
            demand_rps={m: rate for m, rate in rates.items() if m in models},
            waiting={m: n for m, n in waiting.items() if m in models and n > 0},
            deltas=self._orders.deltas({b.worker_id: b for b in beats}, self.monotonic()),
        )
        self.last_snapshot = snapshot
        self.rounds += 1
        self._m_rounds.add(1, {"policy": self.policy.name})
        if not snapshot.workers:
            return []
        plan = self.policy.placement.place(snapshot, DecisionContext(self._rng, self._sequence))
        self._sequence += 1
        if not plan.load and not plan.evict:
            return []
        problem = plan_problem(plan, snapshot_rooms(snapshot), models)
        if problem is not None:
            self.plans_refused += 1
            self.last_problem = problem
            self._m_refused.add(1, {"policy": self.policy.name})
            self.ctx.logger.warning(
                "plan of %s refused: %s",
                self.policy.name,
                problem,
                extra={"event": "plan-refused", "policy": self.policy.name},
            )
            return []
        partitions = {b.worker_id: b.inbox_partition for b in beats}
        return await self._order(plan, partitions, now_s)

    async def _order(
        self, plan: PlacementPlan, partitions: Mapping[str, int | None], now_s: float
    ) -> list[PlacementOrder]:
        name = self.policy.name
        unloads: dict[str, list[str]] = {}
        loads: dict[str, list[str]] = {}
        for worker_id, model in plan.evict:
            unloads.setdefault(worker_id, []).append(model)
        for worker_id, model in plan.load:
            loads.setdefault(worker_id, []).append(model)
        plan_id = f"{self.token}-{self.rounds}"
        published: list[PlacementOrder] = []
        for worker_id in sorted(unloads.keys() | loads.keys()):
            partition = partitions[worker_id]
            assert partition is not None  # only such workers are in the snapshot
            order = PlacementOrder(
                worker_id=worker_id,
                load=loads.get(worker_id, []),
                unload=unloads.get(worker_id, []),
                policy=name,
                plan_id=plan_id,
                decided_at_s=now_s,
            )
            await self.ctx.bus.publish(WORKER_INBOX, order, partition=partition)
            self._orders.remember(
                worker_id, load=order.load, unload=order.unload, now_s=self.monotonic()
            )
            published.append(order)
            self.loads_ordered += len(order.load)
            self.unloads_ordered += len(order.unload)
            self._m_loads.add(len(order.load), {"policy": name})
            self._m_unloads.add(len(order.unload), {"policy": name})
        self.ctx.logger.info(
            "round %d: %d loads and %d unloads ordered on %d workers",
            self.rounds,
            len(plan.load),
            len(plan.evict),
            len(published),
            extra={
                "event": "placed",
                "policy": name,
                "plan_id": plan_id,
                "loads": len(plan.load),
                "unloads": len(plan.evict),
            },
        )
        return published
