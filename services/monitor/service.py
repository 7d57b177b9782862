"""The monitor: workers' liveness, kept in the state store.

Two routines:

* ``heartbeat_routine`` reads every partition of HEARTBEATS (offsets committed under
  ``monitor``, no group rebalance) and records each
  (:mod:`services.monitor.heartbeats`), announcing drains on the way;
* ``liveness_routine`` declares silent workers down and sweeps down workers' assigned
  sets (:mod:`services.monitor.liveness`), takes back what live workers were sent and
  never received (:mod:`services.monitor.unclaimed`), publishing
  :class:`~switchyard.contracts.messages.WorkerDown` on WORKER_EVENTS, and notices when
  the state store lost its data and restores its answers from the answers topic
  (:mod:`services.monitor.state_loss`, :mod:`services.monitor.restore`).

Answers are not the monitor's business: a worker records each in the request ledger
itself (with the per-worker and cluster counters, the recent violations), so no
completion passes through here.

Replicas: every replica reads every heartbeat (a heartbeat recorded already is stale
and ignored) and runs the liveness check, and claim keys make one of them publish each
event. Silence is judged only while a replica hears (:mod:`services.monitor.silence`).

Metrics: ``switchyard.monitor.heartbeats`` (by ``outcome``: accepted, stale),
``switchyard.monitor.workers_down`` (by ``reason``), ``switchyard.monitor.unclaimed``
(requests taken back from live workers), ``switchyard.monitor.state_losses``, counters;
``switchyard.monitor.workers`` (observable gauge): the workers by the status this
replica recorded last (``alive``, ``down``, ``drained``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable

from opentelemetry.metrics import Observation
from switchyard.bus import Delivery, Subscription
from switchyard.cluster import WorkerStatus
from switchyard.contracts.messages import Heartbeat
from switchyard.contracts.topics import HEARTBEATS
from switchyard.lifecycle import RequestLedger
from switchyard.runtime.service import Service, ServiceContext
from switchyard.telemetry.observables import observe

from services.monitor.heartbeats import HeartbeatRecorder
from services.monitor.liveness import STRANDED_GRACE_S, Liveness
from services.monitor.restore import restore_from_broker
from services.monitor.silence import HeardThrough
from services.monitor.state_loss import StateWatch
from services.monitor.unclaimed import SWEEP_PERIOD_S, UnclaimedSweep

GROUP = "monitor"

__all__ = ["GROUP", "STRANDED_GRACE_S", "MonitorService"]


class MonitorService(Service):
    """Worker liveness (see the module docstring).

    Attributes (per replica, for tests and debugging):
        heartbeats_accepted / heartbeats_stale: heartbeats written / ignored.
        workers_declared_down: WorkerDown messages this replica published.
        stranded_orphaned: requests found assigned to a down worker after its death was
            handled, and orphaned again.
        check_period_s: how often the liveness check runs.
    """

    def __init__(self, ctx: ServiceContext, *, clock: Callable[[], float] = time.time) -> None:
        super().__init__(ctx)
        self.clock = clock
        settings = ctx.settings
        self.worker_timeout_s = settings.worker_timeout_s
        self.check_period_s = min(settings.heartbeat_interval_s, settings.worker_timeout_s / 4)
        meter = ctx.telemetry.meter_provider.get_meter("switchyard.monitor")
        self._m_heartbeats = meter.create_counter(
            "switchyard.monitor.heartbeats",
            unit="{heartbeat}",
            description="Heartbeats handled, by outcome.",
        )
        self._m_down = meter.create_counter(
            "switchyard.monitor.workers_down",
            unit="{worker}",
            description="WorkerDown messages published, by reason.",
        )
        # Broken after two fetch waits (and at least one check period) without news: a
        # reader that hears answers at least every fetch wait (0.5 s by default).
        self.heard = HeardThrough(
            gap_s=max(1.0, 2 * settings.kafka_fetch_max_wait_ms / 1000, 2 * self.check_period_s)
        )
        self.liveness = Liveness(
            ctx.state,
            ctx.bus,
            worker_timeout_s=self.worker_timeout_s,
            clock=clock,
            heard=self.heard,
            on_status=self._record_status,
            on_down=lambda reason: self._m_down.add(1, {"reason": reason}),
        )
        unclaimed = meter.create_counter(
            "switchyard.monitor.unclaimed",
            unit="{request}",
            description="Requests assigned to a live worker that never reached it, taken "
            "back for re-assignment.",
        )
        self.unclaimed = UnclaimedSweep(
            ctx.state,
            ctx.bus,
            fresh_s=self.worker_timeout_s,
            clock=clock,
            on_taken_back=lambda count: unclaimed.add(count),
        )
        losses = meter.create_counter(
            "switchyard.monitor.state_losses",
            unit="{loss}",
            description="Times the state store was found to have lost its data.",
        )
        self._heartbeats: Subscription[Heartbeat] | None = None
        self.state_watch = StateWatch(
            ctx.state,
            ctx.logger,
            lambda: losses.add(1),
            restore=lambda: restore_from_broker(
                ctx.bus, RequestLedger(ctx.state), stopping=ctx.stopping
            ),
        )
        self.recorder = HeartbeatRecorder(
            ctx.state,
            clock=clock,
            on_draining=self.liveness.announce_draining,
            on_drained=self.liveness.announce_drained,
        )
        observe(
            ctx.telemetry.meter_provider,
            "switchyard.monitor",
            "switchyard.monitor.workers",
            self._observe_workers,
            unit="{worker}",
            description="Workers by the status this monitor recorded last.",
        )

    def _record_status(self, worker_id: str, status: str) -> None:
        self.recorder.statuses[worker_id] = status

    def _observe_workers(self) -> Iterable[Observation]:
        counts = Counter(self.recorder.statuses.values())
        return [
            Observation(counts.get(status.value, 0), {"status": status.value})
            for status in WorkerStatus
        ]

    @property
    def log(self) -> logging.Logger:
        return self.ctx.logger

    @property
    def heartbeats_accepted(self) -> int:
        return self.recorder.accepted

    @property
    def heartbeats_stale(self) -> int:
        return self.recorder.stale

    @property
    def workers_declared_down(self) -> int:
        return self.liveness.declared_down

    @property
    def stranded_orphaned(self) -> int:
        return self.liveness.stranded_orphaned

    @property
    def liveness_checks(self) -> int:
        return self.liveness.checks

    async def start(self) -> None:
        self.heard.expect_reader()
        self._heartbeats = await self._read_heartbeats()
        self.spawn_routine("heartbeat_routine", self.heartbeat_routine)
        self.spawn_routine("liveness_routine", self.liveness_routine)

    async def drain(self) -> None:
        await self.state_watch.close()
        await super().drain()

    async def _read_heartbeats(self) -> Subscription[Heartbeat]:
        # Every partition, without a group rebalance: a restarted replica reads at once
        # (from the offsets committed under ``monitor``), rather than after the dead
        # member's session times out. Replicas all read everything; a heartbeat recorded
        # twice is stale the second time.
        bus = self.ctx.bus
        partitions = list(range(await bus.partitions_of(HEARTBEATS)))
        subscription = bus.subscribe(
            HEARTBEATS, group=GROUP, stopping=self.ctx.stopping, partitions=partitions
        )
        await subscription.open()
        self.heard.attach(subscription.handled_through_s)
        return subscription

    async def heartbeat_routine(self) -> None:
        # The reader opened at start, or a new one when the routine restarts.
        subscription, self._heartbeats = self._heartbeats, None
        await self.ctx.bus.consume(
            HEARTBEATS,
            group=GROUP,
            handler=self._on_heartbeat,
            stopping=self.ctx.stopping,
            subscription=subscription or await self._read_heartbeats(),
        )

    async def _on_heartbeat(self, delivery: Delivery[Heartbeat]) -> None:
        await self.handle_heartbeat(delivery.message)

    async def handle_heartbeat(self, heartbeat: Heartbeat) -> bool:
        """Record ``heartbeat``; False when it was stale and ignored."""
        accepted = await self.recorder.record(heartbeat)
        if accepted:
            self.unclaimed.heard(heartbeat)
        self._m_heartbeats.add(1, {"outcome": "accepted" if accepted else "stale"})
        return accepted

    async def liveness_routine(self) -> None:
        stopping = self.ctx.stopping
        swept_s = -math.inf
        while not stopping.is_set():
            await self.state_watch.check()
            await self.check_liveness()
            if time.monotonic() - swept_s >= SWEEP_PERIOD_S:
                swept_s = time.monotonic()
                await self.sweep_unclaimed()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), self.check_period_s)

    async def sweep_unclaimed(self) -> int:
        """Take back what live workers never received (:mod:`services.monitor.unclaimed`);
        returns how many. Nothing while the store has no generation (it lost its data
        and is being restored, here or by another replica): the requests read back come
        back assigned, before the answers that settle most of them, and no heartbeat
        lists a request its worker finished long ago, so the sweep would take back and
        run again what was answered."""
        if self.state_watch.known is None:
            return 0
        return await self.unclaimed.sweep()

    async def check_liveness(self) -> list[str]:
        """Declare down every alive worker silent for longer than the timeout; returns the
        ids this call published a WorkerDown for."""
        return await self.liveness.check()
