"""The rebalancer: runs the LLM policy's rebalancer over the monitor's state and
publishes its :class:`~switchyard.contracts.messages.Migration`\\ s.

The policy is ``make_llm_policy(settings.llm_policy).rebalancer``. Without one (``jsq``,
``round-robin``, ...) the service starts, logs that once, stays healthy and does nothing.

When it runs:

* ``policy.period_s > 0``: a round every ``max(policy.period_s, rebalance_interval_s)``;
* ``policy.period_s == 0`` (spike-only): every ``rebalance_interval_s`` it reads the
  cluster and runs a round when ``policy.spike(recent_violation_rate)`` says so (the
  share of the latest completions that missed their deadline, kept by the request
  ledger), once at least half of ``RECENT_WINDOW`` completions are in that rate (as
  the simulator requires).

A round reads the cluster (:class:`switchyard.cluster.ClusterReader`) and the
predictor's latest published model (``predictor:model``, predicting the listed requests
in-process as the scheduler does), builds the snapshot as the simulator does
(:mod:`services.rebalancer.snapshot`), calls ``policy.plan`` and publishes one Migration
per plan whose source and target are live and whose request is still listed on the
source, to the source's partition of ``switchyard.worker-inbox`` (naming the target's):
``epoch`` is the listed epoch + 1, ``kv_cache_bytes`` the plan's KV tokens times the
source profile's ``kv_bytes_per_token``.

Moves not yet visible in the heartbeats: a request moved within ``move_memory_s =
max(round period, 3 heartbeat intervals)`` is neither listed nor moved again, and a
listing with an epoch below the one sent (an old copy the source still reports) is
ignored while the move is remembered (four times that). Until the heartbeats show a move,
the snapshot shows it done, as the simulator does: the source's view loses the request's
work and tokens, the target's gains them (its predicted work there), so consecutive
rounds do not pile requests onto a worker that still reports itself idle.

Metrics: ``switchyard.rebalancer.migrations`` (by ``policy``),
``switchyard.rebalancer.rounds`` (by ``trigger``) and
``switchyard.rebalancer.plans_dropped`` (by ``policy``), all counters.

Replicas: only the holder of the lease ``lease:rebalancer`` (a string with a TTL of
three round periods, renewed each round by ``compare_and_set``) runs rounds, so two
replicas never move the same request twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
import uuid
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from switchyard.cluster import ClusterReader
from switchyard.cluster.published_model import PublishedModelReader
from switchyard.contracts.messages import Migration, QueuedEntry
from switchyard.contracts.topics import WORKER_INBOX
from switchyard.lifecycle import RECENT_WINDOW
from switchyard.policies.base import DecisionContext, MigrationPlan, RebalancePolicy
from switchyard.policies.disaggregation import rebalance_pools
from switchyard.policies.registry import make_llm_policy
from switchyard.policies.snapshot import RebalanceSnapshot
from switchyard.runtime.service import Service, ServiceContext
from switchyard.state import keys

from services.rebalancer.snapshot import (
    ListedEntry,
    LoadAdjustment,
    build_rebalance_snapshot,
    model_groups,
    select_listed,
)

MIN_SPIKE_SAMPLES = RECENT_WINDOW // 2


@dataclass(frozen=True, slots=True, kw_only=True)
class _Move:
    """A migration this replica published, remembered to keep the next rounds honest."""

    decided_monotonic_s: float
    epoch: int
    from_worker_id: str
    to_worker_id: str
    running: bool
    work_s: float
    """Its remaining work where it was."""
    target_work_s: float
    """Its predicted work where it goes."""
    tokens: int
    """What it adds to ``queued_tokens``: its KV tokens when running, else its prompt."""
    kv_tokens: int


class RebalancerService(Service):
    """Periodic and spike-triggered rebalancing (see the module docstring).

    Args:
        ctx: the service context.
        policy: overrides the policy named by ``settings.llm_policy`` (tests).
        clock: wall clock for ``now_s`` and ``decided_at_s``.

    Attributes (per replica):
        migrations_published: Migration messages published.
        rounds: rounds run (each one plan call).
        plans_dropped: plans not carried out (source or target not live, request not
            listed any more, or moved recently).
        round_period_s: seconds between rounds (or spike checks); None without a policy.
    """

    def __init__(
        self,
        ctx: ServiceContext,
        *,
        policy: RebalancePolicy | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(ctx)
        settings = ctx.settings
        bundle = make_llm_policy(settings.llm_policy)
        self.policy = policy if policy is not None else bundle.rebalancer
        self.prediction_use = bundle.prediction
        self._cluster = ClusterReader(ctx.state)
        self._model = PublishedModelReader(ctx.state)
        self.clock = clock
        self.worker_timeout_s = settings.worker_timeout_s
        self.round_period_s: float | None = None
        self.periodic = False
        if self.policy is not None:
            self.periodic = self.policy.period_s > 0
            self.round_period_s = (
                max(self.policy.period_s, settings.rebalance_interval_s)
                if self.periodic
                else settings.rebalance_interval_s
            )
        self.move_memory_s = max(self.round_period_s or 0.0, 3 * settings.heartbeat_interval_s)
        self.token = f"{settings.instance_id}:{uuid.uuid4().hex[:8]}"
        self._rng = random.Random(zlib.crc32(settings.instance_id.encode()))
        self._sequence = 0
        self._moves: dict[str, _Move] = {}
        self.migrations_published = 0
        self.rounds = 0
        self.plans_dropped = 0
        self.last_snapshot: RebalanceSnapshot | None = None
        meter = ctx.telemetry.meter_provider.get_meter("switchyard.rebalancer")
        self._m_migrations = meter.create_counter(
            "switchyard.rebalancer.migrations",
            unit="{migration}",
            description="Migrations published, by policy.",
        )
        self._m_rounds = meter.create_counter(
            "switchyard.rebalancer.rounds",
            unit="{round}",
            description="Rebalancing rounds, by trigger (period, spike, manual).",
        )
        self._m_dropped = meter.create_counter(
            "switchyard.rebalancer.plans_dropped",
            unit="{plan}",
            description="Planned migrations not carried out (source or target gone, moved).",
        )

    async def start(self) -> None:
        if self.policy is None:
            self.ctx.logger.info(
                "policy %s has no rebalancer: nothing to do",
                self.ctx.settings.llm_policy,
                extra={"event": "idle", "policy": self.ctx.settings.llm_policy},
            )
            return
        self.ctx.logger.info(
            "rebalancing with %s every %.3g s (%s)",
            self.policy.name,
            self.round_period_s,
            "periodic" if self.periodic else "on violation spikes",
            extra={"event": "rebalancing", "policy": self.policy.name},
        )
        self.spawn_routine("rebalance_routine", self.rebalance_routine)

    async def rebalance_routine(self) -> None:
        stopping = self.ctx.stopping
        assert self.round_period_s is not None
        while not stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), self.round_period_s)
            if stopping.is_set():
                return
            await self.tick()

    async def tick(self) -> list[Migration]:
        """One scheduled step: a round when periodic, else a round if the rate spiked."""
        policy = self.policy
        if policy is None:
            return []
        if self.periodic:
            return await self.run_round(trigger="period")
        view = await self._cluster.read(self.clock())
        if view.recent_window >= MIN_SPIKE_SAMPLES and policy.spike(view.recent_violation_rate):
            return await self.run_round(trigger="spike")
        return []

    async def _hold_lease(self) -> bool:
        state = self.ctx.state
        ttl_s = 3 * (self.round_period_s or 1.0)
        if await state.compare_and_set(keys.REBALANCER_LEASE, self.token, self.token, ttl_s=ttl_s):
            return True
        return await state.set_if_absent(keys.REBALANCER_LEASE, self.token, ttl_s=ttl_s)

    async def run_round(self, *, trigger: str = "manual") -> list[Migration]:
        """Read, plan and publish once; returns the migrations published."""
        policy = self.policy
        if policy is None or not await self._hold_lease():
            return []
        now_s = self.clock()
        now_mono_s = time.monotonic()
        self._forget(now_mono_s)
        view = await self._cluster.read(now_s)
        await self._model.refresh()
        listings = {
            record.worker_id: {e.request_id: e for e in record.heartbeat.outstanding}
            for record in view.workers
            if record.heartbeat is not None
        }

        def skip(worker_id: str, entry: QueuedEntry) -> bool:
            move = self._moves.get(entry.request_id)
            if move is None:
                return False
            # Moved this period, or an old copy the source has not given up yet.
            recent = now_mono_s - move.decided_monotonic_s < self.move_memory_s
            return recent or entry.epoch < move.epoch

        published: list[Migration] = []
        plans_total = 0
        # A request may only move to a worker serving its model: each model's workers
        # are planned as a cluster of their own. Workers without a performance profile
        # (torch workers: static batches, classification windows) are not rebalanced.
        for group in model_groups(view):
            listed = select_listed(
                group, worker_timeout_s=self.worker_timeout_s, scope=policy.queue_scope, skip=skip
            )
            snapshot = build_rebalance_snapshot(
                group,
                listed,
                self._model.current,
                use=self.prediction_use,
                worker_timeout_s=self.worker_timeout_s,
                adjustments=self._pending(listings, now_mono_s),
            )
            self.last_snapshot = snapshot
            # With prefill/decode pools, each pool is planned on its own: a request
            # never moves between them.
            for pool in rebalance_pools(snapshot):
                plans = policy.plan(pool, DecisionContext(self._rng, self._sequence))
                self._sequence += 1
                plans_total += len(plans)
                published += await self._publish(plans, listed, pool, now_s, now_mono_s)
        self.rounds += 1
        self._m_rounds.add(1, {"trigger": trigger})
        if published:
            self.ctx.logger.info(
                "round (%s): %d of %d planned migrations published",
                trigger,
                len(published),
                plans_total,
                extra={"event": "rebalanced", "trigger": trigger, "migrations": len(published)},
            )
        return published

    def _forget(self, now_mono_s: float) -> None:
        horizon_s = 4 * self.move_memory_s
        for rid in [
            r for r, m in self._moves.items() if now_mono_s - m.decided_monotonic_s > horizon_s
        ]:
            del self._moves[rid]

    def _pending(
        self, listings: Mapping[str, Mapping[str, QueuedEntry]], now_mono_s: float
    ) -> dict[str, LoadAdjustment]:
        """Moves decided but not yet in the heartbeats, as load changes per worker: the
        simulator moves a request at once, so the snapshot should not show it twice."""
        changes: dict[str, LoadAdjustment] = {}
        for rid, move in self._moves.items():
            at_source = listings.get(move.from_worker_id, {}).get(rid)
            if at_source is not None and at_source.epoch < move.epoch:
                change = LoadAdjustment(
                    waiting=0 if move.running else -1,
                    running=-1 if move.running else 0,
                    work_s=-move.work_s,
                    tokens=-move.tokens,
                    kv_used_tokens=-move.kv_tokens if move.running else 0,
                )
                changes[move.from_worker_id] = (
                    changes.get(move.from_worker_id, LoadAdjustment()) + change
                )
            arrived = rid in listings.get(move.to_worker_id, {})
            if not arrived and now_mono_s - move.decided_monotonic_s < self.move_memory_s:
                change = LoadAdjustment(
                    waiting=1,
                    work_s=move.target_work_s,
                    tokens=move.tokens,
                    kv_used_tokens=move.kv_tokens,
                )
                changes[move.to_worker_id] = (
                    changes.get(move.to_worker_id, LoadAdjustment()) + change
                )
        return changes

    async def _publish(
        self,
        plans: tuple[MigrationPlan, ...],
        listed: list[ListedEntry],
        snapshot: RebalanceSnapshot,
        now_s: float,
        now_mono_s: float,
    ) -> list[Migration]:
        assert self.policy is not None
        alive = {w.worker_id: w for w in snapshot.cluster.workers if w.alive}
        partitions = self._cluster.inbox_partitions()
        where = {(item.worker_id, item.entry.request_id): item for item in listed}
        views = {q.request.request_id: q.request for q in snapshot.queued}
        moved: set[str] = set()
        published: list[Migration] = []
        for plan in plans:
            request = views.get(plan.request_id)
            target = alive.get(plan.to_worker_id)
            item = where.get((plan.from_worker_id, plan.request_id))
            source = alive.get(plan.from_worker_id)
            if (
                item is None
                or source is None
                or target is None
                or partitions.get(plan.from_worker_id) is None
                or partitions.get(plan.to_worker_id) is None
                or plan.to_worker_id == plan.from_worker_id
                or plan.request_id in moved
                or not math.isfinite(plan.cost_s)
                or not math.isfinite(plan.expected_gain_s)
            ):
                self.plans_dropped += 1
                self._m_dropped.add(1, {"policy": self.policy.name})
                continue
            target_type = target.worker_type
            migration = Migration(
                request_id=plan.request_id,
                from_worker_id=plan.from_worker_id,
                to_worker_id=plan.to_worker_id,
                to_inbox_partition=partitions[plan.to_worker_id],
                epoch=item.entry.epoch + 1,
                reason=f"{self.policy.name}: {plan.reason}"[:500],
                expected_gain_s=plan.expected_gain_s,
                cost_s=max(0.0, plan.cost_s),
                kv_cache_bytes=max(0, plan.kv_tokens) * source.kv_bytes_per_token,
                predicted_s=None if request is None else request.calibrated_s.get(target_type),
                predicted_raw_s=None if request is None else request.predicted_s.get(target_type),
                decided_at_s=now_s,
            )
            await self.ctx.bus.publish(
                WORKER_INBOX, migration, partition=partitions[plan.from_worker_id]
            )
            moved.add(plan.request_id)
            entry = item.entry
            target_work_s = (
                entry.remaining_s if migration.predicted_s is None else migration.predicted_s
            )
            self._moves[plan.request_id] = _Move(
                decided_monotonic_s=now_mono_s,
                epoch=migration.epoch,
                from_worker_id=plan.from_worker_id,
                to_worker_id=plan.to_worker_id,
                running=entry.running,
                work_s=entry.remaining_s,
                target_work_s=target_work_s,
                tokens=entry.kv_tokens if entry.running else entry.prompt_tokens,
                kv_tokens=entry.kv_tokens,
            )
            published.append(migration)
            self.migrations_published += 1
            self._m_migrations.add(1, {"policy": self.policy.name})
        return published
