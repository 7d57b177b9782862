"""The monitor: worker liveness and completion accounting, kept in the state store.

Three routines:

* ``heartbeat_routine`` consumes HEARTBEATS (group ``monitor``) and writes
  ``worker:{id}`` and ``workers`` (layout in :mod:`services.cluster_state`).
* ``completion_routine`` consumes COMPLETIONS (group ``monitor``): the answer into its
  request's record ``request:{id}`` (as the ingress replica it is addressed to does
  too: the record keeps it when that replica is gone), cluster and per-worker
  counters, SLO violations, the recent violation rate, and removal of the request from
  the ``worker:{id}:assigned`` sets.
* ``liveness_routine`` declares silent workers down and publishes
  :class:`~switchyard.contracts.messages.WorkerDown` on WORKER_EVENTS; it also sweeps
  down and drained workers' assigned sets for requests assigned after the death was
  handled (a scheduler replica that had not seen it yet) and orphans them again.

Detection time: a worker last heard from at ``t`` is declared down by the first check
after ``t + worker_timeout_s``; checks run every ``check_period_s =
min(heartbeat_interval_s, worker_timeout_s / 4)``, so the WorkerDown is published
between ``worker_timeout_s`` and ``worker_timeout_s + check_period_s`` after the last
heartbeat arrived (plus the time to publish).

Metrics: ``switchyard.monitor.heartbeats`` (by ``outcome``),
``switchyard.monitor.completions`` (by ``outcome``), ``switchyard.monitor.workers_down``
(by ``reason``), all counters; ``switchyard.monitor.workers`` (observable gauge): the
workers by the status this replica recorded last (``alive``, ``down``, ``drained``).

Replicas: several monitors may share one state store. Heartbeats and completions are
split between them by the consumer group; every replica runs the liveness check, and a
claim key ``claim:worker-down:{id}:{last_seen_s}`` (``set_if_absent``) makes exactly one
of them publish the WorkerDown of one death. Drains are published under
``claim:worker-down:{id}:drained:{sequence}``.

Drains: a stopping worker heartbeats ``draining`` while its running work finishes (it
stays ``alive`` here, and policies leave it out). Its first draining heartbeat that lists
waiting requests is announced as a WorkerDown ``draining`` (claim
``claim:worker-down:{id}:draining:{sequence}``) naming them, so they start elsewhere now
rather than after the longest running request; the heartbeat with ``running == 0`` is
its last, announced as ``drained`` with what it still held. Both carry
``held_request_ids``, the waiting list, so the scheduler never re-runs what ran there.

Heartbeat ordering: a heartbeat whose ``sequence`` is not above the stored one is stale
(a redelivery or reordering) and ignored, except when the worker is recorded down or
drained and the heartbeat was sent later than the stored one: a restarted worker whose
counter began again. (A worker restarted faster than the timeout is therefore first
declared down, which is right: its old process's requests were lost.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterable

from opentelemetry.metrics import Observation
from switchyard.bus import Delivery
from switchyard.contracts.messages import Completion, CompletionStatus, Heartbeat, WorkerDown
from switchyard.contracts.topics import COMPLETIONS, HEARTBEATS, WORKER_EVENTS
from switchyard.runtime.service import Service, ServiceContext
from switchyard.telemetry.observables import observe

from services.cluster_state import (
    CLUSTER_STATS_KEY,
    FINAL_STATUSES,
    RECENT_WINDOW,
    WORKERS_KEY,
    WorkerStatus,
    assigned_key,
    record_completion,
    request_key,
    worker_key,
    worker_profile,
)

GROUP = "monitor"
COMPLETION_CLAIM_TTL_S = 3600.0
"""How long a completion's claim key lives: redeliveries come within seconds."""
WORKER_DOWN_CLAIM_TTL_S = 3600.0
STRANDED_GRACE_S = 1.0
"""How old an entry of a down worker's assigned set must be to count as stranded: longer
than a scheduler replica takes to see the death (its cluster refresh, 0.1 s) and to
handle the WorkerDown that lists it, so the sweep does not race the first re-assignment."""


def completion_violated(completion: Completion) -> bool:
    """Whether ``completion`` missed its SLO: it has a deadline and either expired or
    finished after it. Completions without a deadline never count."""
    deadline_s = completion.deadline_s
    if deadline_s is None:
        return False
    if completion.status is CompletionStatus.EXPIRED:
        return True
    finished_s = completion.timeline.finished_s
    return finished_s is not None and finished_s > deadline_s


def completion_claim_key(request_id: str) -> str:
    """``claim:{request id}:monitor-completion``: the first monitor to count it claims it."""
    return f"claim:{request_id}:monitor-completion"


class MonitorService(Service):
    """Worker liveness and completion accounting (see the module docstring).

    Attributes (for tests and debugging; per replica):
        heartbeats_accepted / heartbeats_stale: heartbeats written / ignored.
        completions_counted / completions_duplicate: completions counted / seen again.
        workers_declared_down: WorkerDown messages this replica published (timeouts and drains).
        stranded_orphaned: requests found assigned to a down or drained worker after its
            WorkerDown and orphaned again (:meth:`_sweep_stranded`).
        check_period_s: how often the liveness check runs.
    """

    def __init__(self, ctx: ServiceContext, *, clock: Callable[[], float] = time.time) -> None:
        super().__init__(ctx)
        self.clock = clock
        settings = ctx.settings
        self.worker_timeout_s = settings.worker_timeout_s
        self.check_period_s = min(settings.heartbeat_interval_s, settings.worker_timeout_s / 4)
        # Unique per object: two replicas in one process share the settings' instance id.
        self.token = f"{settings.instance_id}:{uuid.uuid4().hex[:8]}"
        self.heartbeats_accepted = 0
        self.heartbeats_stale = 0
        self.completions_counted = 0
        self.completions_duplicate = 0
        self.workers_declared_down = 0
        self.stranded_orphaned = 0
        self.liveness_checks = 0
        self._recent: deque[bool] = deque(maxlen=RECENT_WINDOW)
        self._recent_violations = 0
        self._published_claims: set[str] = set()
        # The status of every worker this replica recorded last, for the workers gauge.
        self._statuses: dict[str, str] = {}
        meter = ctx.telemetry.meter_provider.get_meter("switchyard.monitor")
        self._m_heartbeats = meter.create_counter(
            "switchyard.monitor.heartbeats",
            unit="{heartbeat}",
            description="Heartbeats handled, by outcome.",
        )
        self._m_completions = meter.create_counter(
            "switchyard.monitor.completions",
            unit="{request}",
            description="Completions counted, by outcome (met, violated, duplicate).",
        )
        self._m_down = meter.create_counter(
            "switchyard.monitor.workers_down",
            unit="{worker}",
            description="WorkerDown messages published, by reason.",
        )
        observe(
            ctx.telemetry.meter_provider,
            "switchyard.monitor",
            "switchyard.monitor.workers",
            self._observe_workers,
            unit="{worker}",
            description="Workers by the status this monitor recorded last.",
        )

    def _observe_workers(self) -> Iterable[Observation]:
        counts = Counter(self._statuses.values())
        return [
            Observation(counts.get(status.value, 0), {"status": status.value})
            for status in WorkerStatus
        ]

    @property
    def log(self) -> logging.Logger:
        return self.ctx.logger

    async def start(self) -> None:
        self.spawn_routine("heartbeat_routine", self.heartbeat_routine)
        self.spawn_routine("completion_routine", self.completion_routine)
        self.spawn_routine("liveness_routine", self.liveness_routine)

    # -- heartbeats ------------------------------------------------------------------

    async def heartbeat_routine(self) -> None:
        await self.ctx.bus.consume(
            HEARTBEATS, group=GROUP, handler=self._on_heartbeat, stopping=self.ctx.stopping
        )

    async def _on_heartbeat(self, delivery: Delivery[Heartbeat]) -> None:
        await self.handle_heartbeat(delivery.message)

    async def handle_heartbeat(self, heartbeat: Heartbeat) -> bool:
        """Record ``heartbeat``; False when it was stale and ignored."""
        state = self.ctx.state
        wid = heartbeat.worker_id
        key = worker_key(wid)
        stored_seq, stored_status, stored_sent, stored_draining = await asyncio.gather(
            state.hget(key, "sequence"),
            state.hget(key, "status"),
            state.hget(key, "sent_at_s"),
            state.hget(key, "draining"),
        )
        previous = _status(stored_status)
        if stored_seq is not None and heartbeat.sequence <= int(stored_seq):
            restarted = previous is not WorkerStatus.ALIVE and heartbeat.sent_at_s > float(
                stored_sent or "-inf"
            )
            if not restarted:
                self.heartbeats_stale += 1
                self._m_heartbeats.add(1, {"outcome": "stale"})
                return False
        now_s = self.clock()
        # A draining heartbeat is the worker's last: it has stopped taking work and exits
        # once nothing runs. What it lists then only waits, and is re-assigned now.
        drained = heartbeat.draining and heartbeat.running == 0
        status = WorkerStatus.DRAINED if drained else WorkerStatus.ALIVE
        fields = {
            "heartbeat": heartbeat.model_dump_json(),
            "sequence": str(heartbeat.sequence),
            "sent_at_s": repr(heartbeat.sent_at_s),
            "last_seen_s": repr(now_s),
            "status": status.value,
            "worker_type": heartbeat.worker_type,
            "profile": heartbeat.profile or "",
            "draining": "1" if heartbeat.draining else "0",
        }
        if previous is not status:
            fields["status_changed_s"] = repr(now_s)
        if status is WorkerStatus.ALIVE and previous is not None and previous is not status:
            self.log.info(
                "worker %s is back (%s -> alive)",
                wid,
                previous.value,
                extra={"event": "worker-back", "worker_id": wid, "was": previous.value},
            )
        if drained and previous is not WorkerStatus.DRAINED:
            # Published before the heartbeat is stored: if publishing fails, the
            # redelivered heartbeat is not stale yet and the drain is announced then.
            claim = f"claim:worker-down:{wid}:drained:{heartbeat.sequence}"
            await self._declare_down(
                heartbeat, claim, reason="drained", last_seen_s=now_s, now_s=now_s
            )
        elif heartbeat.draining and stored_draining != "1" and status is WorkerStatus.ALIVE:
            await self._announce_draining(heartbeat, now_s)
        await state.hset(key, fields)
        self._statuses[wid] = status.value
        if status is WorkerStatus.ALIVE and previous is not None and previous is not status:
            await state.hdel(key, "down_reason")
        await state.zadd(WORKERS_KEY, {wid: now_s})
        self.heartbeats_accepted += 1
        self._m_heartbeats.add(1, {"outcome": "accepted"})
        return True

    # -- completions -----------------------------------------------------------------

    async def completion_routine(self) -> None:
        await self.ctx.bus.consume(
            COMPLETIONS, group=GROUP, handler=self._on_completion, stopping=self.ctx.stopping
        )

    async def _on_completion(self, delivery: Delivery[Completion]) -> None:
        await self.handle_completion(delivery.message)

    async def handle_completion(self, completion: Completion) -> bool:
        """Count ``completion`` once; False when it was a duplicate.

        The request leaves ``worker:{completing worker}:assigned`` and the set of the
        worker its latest assignment names (``request:{id}`` field ``worker_id``, read
        only) every time (idempotent); a request with ``epoch > 0`` was re-assigned or
        migrated, so its id may still sit in another worker's set: it leaves every known
        worker's set then.
        """
        state = self.ctx.state
        rid = completion.request_id
        await state.zrem(assigned_key(completion.worker_id), rid)
        # The worker of the request's latest assignment, as the scheduler recorded it.
        recorded = await state.hget(request_key(rid), "worker_id")
        if recorded and recorded != completion.worker_id:
            await state.zrem(assigned_key(recorded), rid)
        if completion.epoch > 0:
            members = await state.zrange_by_score(WORKERS_KEY, -math.inf, math.inf)
            others = [m for m, _ in members if m != completion.worker_id]
            await asyncio.gather(*(state.zrem(assigned_key(wid), rid) for wid in others))
        # Whichever ingress replica waited for it may be gone: the record gets the answer
        # here too (idempotent; a stale epoch is not written over a newer one). After the
        # sets above: they read the worker the scheduler recorded, which this replaces.
        await record_completion(state, completion)
        claimed = await state.set_if_absent(
            completion_claim_key(rid), self.token, ttl_s=COMPLETION_CLAIM_TTL_S
        )
        if not claimed:
            self.completions_duplicate += 1
            self._m_completions.add(1, {"outcome": "duplicate"})
            return False
        violated = completion_violated(completion)
        wkey = worker_key(completion.worker_id)
        await state.hincr_float(wkey, "completed", 1)
        await state.hincr_float(CLUSTER_STATS_KEY, "completed", 1)
        if violated:
            await state.hincr_float(wkey, "violated", 1)
            await state.hincr_float(CLUSTER_STATS_KEY, "violated", 1)
        recent = self._recent
        if len(recent) == recent.maxlen:
            self._recent_violations -= recent[0]
        recent.append(violated)
        self._recent_violations += violated
        await state.hset(
            CLUSTER_STATS_KEY,
            {
                "recent_violation_rate": repr(self.recent_violation_rate),
                "recent_window": str(len(recent)),
                "updated_s": repr(self.clock()),
            },
        )
        self.completions_counted += 1
        self._m_completions.add(1, {"outcome": "violated" if violated else "met"})
        return True

    @property
    def recent_violation_rate(self) -> float:
        """Share of this replica's last RECENT_WINDOW completions past their deadline."""
        return self._recent_violations / len(self._recent) if self._recent else 0.0

    # -- liveness --------------------------------------------------------------------

    async def liveness_routine(self) -> None:
        stopping = self.ctx.stopping
        while not stopping.is_set():
            await self.check_liveness()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), self.check_period_s)

    async def check_liveness(self) -> list[str]:
        """Declare down every alive worker silent for longer than ``worker_timeout_s``;
        returns the ids this call published a WorkerDown for."""
        state = self.ctx.state
        now_s = self.clock()
        self.liveness_checks += 1
        silent = await state.zrange_by_score(
            WORKERS_KEY, -math.inf, math.nextafter(now_s - self.worker_timeout_s, -math.inf)
        )
        declared: list[str] = []
        for wid, _ in silent:
            key = worker_key(wid)
            fields = await state.hgetall(key)
            status = _status(fields.get("status"))
            if status in (WorkerStatus.DOWN, WorkerStatus.DRAINED):
                await self._sweep_stranded(wid, status, now_s)
                continue
            if status is not WorkerStatus.ALIVE:
                continue
            seen = fields.get("last_seen_s")
            if seen is None or now_s - float(seen) <= self.worker_timeout_s:
                continue
            heartbeat: Heartbeat | None = None
            if raw := fields.get("heartbeat"):
                with contextlib.suppress(ValueError):
                    heartbeat = Heartbeat.model_validate_json(raw)
            claim = f"claim:worker-down:{wid}:{seen}"
            if await self._declare_down(
                heartbeat,
                claim,
                reason="heartbeat-timeout",
                last_seen_s=float(seen),
                now_s=now_s,
                worker_id=wid,
                expect_last_seen=seen,
            ):
                declared.append(wid)
        return declared

    async def _announce_draining(self, heartbeat: Heartbeat, now_s: float) -> None:
        """Publish a WorkerDown ``draining`` naming what only waits on a worker that began
        to drain (nothing when nothing waits), for the scheduler to start it elsewhere.

        Its status stays ``alive`` and its assigned set untouched: it still finishes what
        runs there, and its last heartbeat is announced as ``drained``. Like a drain, this
        is published before the heartbeat is stored, so a failed publish is retried with
        the redelivered heartbeat.
        """
        wid = heartbeat.worker_id
        waiting = [entry.request_id for entry in heartbeat.outstanding if not entry.running]
        if not waiting:
            return
        claim = f"claim:worker-down:{wid}:draining:{heartbeat.sequence}"
        if claim in self._published_claims:
            return
        claimed = await self.ctx.state.set_if_absent(
            claim, self.token, ttl_s=WORKER_DOWN_CLAIM_TTL_S
        )
        if not claimed and await self.ctx.state.get(claim) != self.token:
            return
        await self.ctx.bus.publish(
            WORKER_EVENTS,
            WorkerDown(
                worker_id=wid,
                reason="draining",
                last_heartbeat_s=now_s,
                detected_at_s=now_s,
                orphaned_request_ids=waiting,
                held_request_ids=_held_at_drain(heartbeat),
            ),
        )
        self._published_claims.add(claim)
        self._m_down.add(1, {"reason": "draining"})
        self.log.info(
            "worker %s is draining: %d waiting requests handed over, %d running finish there",
            wid,
            len(waiting),
            heartbeat.running,
            extra={
                "event": "worker-draining",
                "worker_id": wid,
                "orphans": len(waiting),
                "running": heartbeat.running,
            },
        )

    async def _sweep_stranded(self, wid: str, status: WorkerStatus, now_s: float) -> None:
        """Orphan again what was assigned to ``wid`` after its WorkerDown was handled.

        A scheduler replica that has not yet seen the death can still assign to the
        worker for up to its refresh period, after the replica that handled the
        WorkerDown re-read the worker's assigned set; such a request would wait forever.
        Every entry older than :data:`STRANDED_GRACE_S` in a down or drained worker's
        set is listed in one more WorkerDown (the scheduler re-assigns those still
        recorded on this worker and skips the rest) and taken out of the set.
        """
        state = self.ctx.state
        assigned = await state.zrange_by_score(
            assigned_key(wid), -math.inf, now_s - STRANDED_GRACE_S
        )
        if not assigned:
            return
        members = [member for member, _ in assigned]
        records = await asyncio.gather(*(state.hgetall(request_key(member)) for member in members))
        # Only a request still recorded on this worker and unfinished is stranded; the
        # others were re-assigned (or finished) and merely left their entry behind.
        stranded = [
            member
            for member, record in zip(members, records, strict=True)
            if record.get("worker_id") == wid and record.get("status") not in FINAL_STATUSES
        ]
        if not stranded:
            await state.zrem(assigned_key(wid), *members)
            return
        newest_s = max(score for _, score in assigned)
        claim = f"claim:worker-down:{wid}:stranded:{newest_s!r}:{len(stranded)}"
        if not await state.set_if_absent(claim, self.token, ttl_s=WORKER_DOWN_CLAIM_TTL_S):
            return
        drained = status is WorkerStatus.DRAINED
        held: list[str] | None = None
        if drained and (raw := await state.hget(worker_key(wid), "heartbeat")):
            with contextlib.suppress(ValueError):
                held = _held_at_drain(Heartbeat.model_validate_json(raw))
        await self.ctx.bus.publish(
            WORKER_EVENTS,
            WorkerDown(
                worker_id=wid,
                reason="drained" if drained else "heartbeat-timeout",
                detected_at_s=now_s,
                orphaned_request_ids=stranded,
                held_request_ids=held,
            ),
        )
        await state.zrem(assigned_key(wid), *members)
        self.stranded_orphaned += len(stranded)
        self.log.warning(
            "%d requests assigned to %s worker %s after its death was handled: orphaned again",
            len(stranded),
            status.value,
            wid,
            extra={"event": "worker-stranded", "worker_id": wid, "orphans": len(stranded)},
        )

    async def _declare_down(
        self,
        heartbeat: Heartbeat | None,
        claim: str,
        *,
        reason: str,
        last_seen_s: float,
        now_s: float,
        worker_id: str | None = None,
        expect_last_seen: str | None = None,
    ) -> bool:
        """Publish one WorkerDown for this death (the claim's winner only), then record
        the status and take the listed orphans out of the worker's assigned set."""
        state = self.ctx.state
        wid = worker_id if worker_id is not None else heartbeat.worker_id if heartbeat else ""
        if claim in self._published_claims:
            return False
        claimed = await state.set_if_absent(claim, self.token, ttl_s=WORKER_DOWN_CLAIM_TTL_S)
        # A claim of ours from an earlier attempt that failed before publishing: carry on.
        if not claimed and await state.get(claim) != self.token:
            return False
        key = worker_key(wid)
        if expect_last_seen is not None:
            # A heartbeat may have arrived since the check read the hash.
            fields = await state.hgetall(key)
            if (
                fields.get("last_seen_s") != expect_last_seen
                or _status(fields.get("status")) is not WorkerStatus.ALIVE
            ):
                return False
        assigned = await state.zrange_by_score(assigned_key(wid), -math.inf, math.inf)
        orphans = [member for member, _ in assigned]
        seen = set(orphans)
        if heartbeat is not None:
            for entry in heartbeat.outstanding:
                if entry.request_id not in seen:
                    seen.add(entry.request_id)
                    orphans.append(entry.request_id)
        drained = reason == "drained"
        message = WorkerDown(
            worker_id=wid,
            reason="drained" if drained else "heartbeat-timeout",
            last_heartbeat_s=last_seen_s,
            detected_at_s=now_s,
            orphaned_request_ids=orphans,
            held_request_ids=_held_at_drain(heartbeat) if drained and heartbeat else None,
        )
        await self.ctx.bus.publish(WORKER_EVENTS, message)
        self._published_claims.add(claim)
        status = WorkerStatus.DRAINED if reason == "drained" else WorkerStatus.DOWN
        await state.hset(
            key,
            {"status": status.value, "status_changed_s": repr(now_s), "down_reason": reason},
        )
        self._statuses[wid] = status.value
        if orphans:
            await state.zrem(assigned_key(wid), *orphans)
        self.workers_declared_down += 1
        self._m_down.add(1, {"reason": reason})
        # A worker that drained left on purpose; one that fell silent is news.
        level = logging.INFO if status is WorkerStatus.DRAINED else logging.WARNING
        self.log.log(
            level,
            "worker %s declared %s (%s), %d orphaned requests",
            wid,
            status.value,
            reason,
            len(orphans),
            extra={
                "event": "worker-down",
                "worker_id": wid,
                "reason": reason,
                "orphans": len(orphans),
                "silent_s": round(now_s - last_seen_s, 3),
                "profile": worker_profile(heartbeat) if heartbeat else None,
            },
        )
        return True


def _held_at_drain(heartbeat: Heartbeat) -> list[str] | None:
    """What a draining worker's heartbeat lists as waiting there, or None when the list
    was cut short (or the heartbeat is not a draining one)."""
    if not heartbeat.draining or heartbeat.outstanding_total > len(heartbeat.outstanding):
        return None
    return [entry.request_id for entry in heartbeat.outstanding if not entry.running]


def _status(text: str | None) -> WorkerStatus | None:
    if text is None:
        return None
    try:
        return WorkerStatus(text)
    except ValueError:
        return None
