"""Declaring workers down, and announcing drains: the monitor's WorkerDown events.

Detection time: a worker last heard from at ``t`` is declared down by the first check
after ``t + worker_timeout_s`` of the monitor *hearing* (:mod:`services.monitor.silence`:
a broker outage, a monitor restart or a reader behind its backlog stops that clock); checks run every ``check_period_s = min(heartbeat
interval, worker_timeout_s / 4)``, so the WorkerDown is published between
``worker_timeout_s`` and ``worker_timeout_s + check_period_s`` after the last heartbeat
arrived (plus the time to publish). The WorkerDown lists what the worker held: its
assigned set (what the scheduler sent it and it did not finish; the request ledger keeps
the set) and its last heartbeat's outstanding requests.

Replicas: several monitors may share one state store. Every replica runs the check, and
a claim key ``claim:worker-down:{id}:{last_seen_s}`` (``set_if_absent``) makes exactly
one of them publish the WorkerDown of one death. Drains are claimed under
``...:draining:{sequence}`` and ``...:drained:{sequence}``.

Drains: a stopping worker heartbeats ``draining`` while its running work finishes (it
stays ``alive``, and policies leave it out). Its first draining heartbeat that lists
waiting requests is announced as a WorkerDown ``draining`` naming them, so they start
elsewhere now rather than after the longest running request; the heartbeat with
``running == 0`` is its last, announced as ``drained`` with what it still held. Both
carry ``held_request_ids``, the waiting list, so the scheduler never re-runs what ran
there.

Stranded requests: a scheduler replica that has not yet seen a death can still assign
to the worker within its refresh period, after the replica that handled the WorkerDown
re-read the worker's assigned set. Each check sweeps down and drained workers' assigned
sets and lists every entry older than :data:`STRANDED_GRACE_S` in one more WorkerDown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections.abc import Callable

from switchyard.bus import Bus
from switchyard.cluster import WorkerStatus, worker_profile
from switchyard.cluster.records import parse_heartbeat
from switchyard.contracts.messages import Heartbeat, WorkerDown
from switchyard.contracts.topics import WORKER_EVENTS
from switchyard.lifecycle import FINAL_STATUSES, RequestLedger
from switchyard.state import StateStore, keys

from services.monitor.heartbeats import status_of
from services.monitor.silence import HeardThrough

log = logging.getLogger("switchyard.monitor")

WORKER_DOWN_CLAIM_TTL_S = 3600.0
STRANDED_GRACE_S = 1.0
"""How old an entry of a down worker's assigned set must be to count as stranded: longer
than a scheduler replica takes to see the death (its cluster refresh, 0.1 s) and to
handle the WorkerDown that lists it, so the sweep does not race the first re-assignment."""


def held_at_drain(heartbeat: Heartbeat) -> list[str] | None:
    """What a draining worker's heartbeat lists as waiting there, or None when the list
    was cut short (or the heartbeat is not a draining one)."""
    if not heartbeat.draining or heartbeat.outstanding_total > len(heartbeat.outstanding):
        return None
    return [entry.request_id for entry in heartbeat.outstanding if not entry.running]


class Liveness:
    """Declares silent workers down and announces drains (see the module docstring).

    Args:
        state, bus: the monitor's store and bus.
        worker_timeout_s: silence after which a worker is declared down.
        clock: wall seconds.
        heard: the clock silence is judged by (:mod:`services.monitor.silence`); the
            wall clock when not given.
        on_status: called with (worker id, status) when this replica records one.
        on_down: called with the reason of each WorkerDown published.
    """

    def __init__(
        self,
        state: StateStore,
        bus: Bus,
        *,
        worker_timeout_s: float,
        clock: Callable[[], float] = time.time,
        heard: HeardThrough | None = None,
        on_status: Callable[[str, str], None] | None = None,
        on_down: Callable[[str], None] | None = None,
    ) -> None:
        self.state = state
        self.ledger = RequestLedger(state)
        self.bus = bus
        self.worker_timeout_s = worker_timeout_s
        self.clock = clock
        self.heard = heard if heard is not None else HeardThrough(gap_s=math.inf)
        self._on_status = on_status
        self._on_down = on_down
        # Unique per object: two replicas in one process share the settings' instance id.
        self.token = f"{uuid.uuid4().hex[:12]}"
        self.declared_down = 0
        self.stranded_orphaned = 0
        self.checks = 0
        self._published_claims: set[str] = set()

    async def _claim(self, claim: str) -> bool:
        """Whether this replica publishes the event behind ``claim`` (its first taker, or
        this replica after an earlier attempt of its own failed before publishing)."""
        if claim in self._published_claims:
            return False
        if await self.state.set_if_absent(claim, self.token, ttl_s=WORKER_DOWN_CLAIM_TTL_S):
            return True
        return await self.state.get(claim) == self.token

    def _published(self, claim: str, reason: str) -> None:
        self._published_claims.add(claim)
        self.declared_down += 1
        if self._on_down is not None:
            self._on_down(reason)

    # -- the periodic check ------------------------------------------------------------------

    async def check(self) -> list[str]:
        """Declare down every alive worker silent for longer than the timeout, and sweep
        the down ones' assigned sets; returns the ids this call published a death for."""
        now_s = self.clock()
        self.checks += 1
        judged_s = self.heard.judged_at(now_s)
        await self.state.hset(keys.MONITOR_HEARING, self.heard.record(now_s))
        if judged_s is None:
            return []
        silent = await self.state.zrange_by_score(
            keys.WORKERS, -math.inf, math.nextafter(judged_s - self.worker_timeout_s, -math.inf)
        )
        declared: list[str] = []
        for wid, _ in silent:
            fields = await self.state.hgetall(keys.worker(wid))
            status = status_of(fields.get("status"))
            if status in (WorkerStatus.DOWN, WorkerStatus.DRAINED):
                await self._sweep_stranded(wid, status, now_s)
                continue
            if status is not WorkerStatus.ALIVE:
                continue
            seen = fields.get("last_seen_s")
            if seen is None or self.heard.silence_s(judged_s, float(seen)) <= self.worker_timeout_s:
                continue
            heartbeat = parse_heartbeat(wid, fields.get("heartbeat"))
            if await self._declare_down(
                wid,
                heartbeat,
                keys.worker_down_claim(wid, seen),
                reason="heartbeat-timeout",
                last_seen_s=float(seen),
                now_s=now_s,
                expect_last_seen=seen,
            ):
                declared.append(wid)
        return declared

    # -- drains ----------------------------------------------------------------------------

    async def announce_draining(self, heartbeat: Heartbeat, now_s: float) -> None:
        """Publish a WorkerDown ``draining`` naming what only waits on a worker that began
        to drain (nothing when nothing waits), for the scheduler to start it elsewhere.

        Its status stays ``alive`` and its assigned set untouched: it still finishes what
        runs there, and its last heartbeat is announced as ``drained``.
        """
        wid = heartbeat.worker_id
        waiting = [entry.request_id for entry in heartbeat.outstanding if not entry.running]
        if not waiting:
            return
        claim = keys.worker_down_claim(wid, f"draining:{heartbeat.sequence}")
        if not await self._claim(claim):
            return
        await self.bus.publish(
            WORKER_EVENTS,
            WorkerDown(
                worker_id=wid,
                reason="draining",
                last_heartbeat_s=now_s,
                detected_at_s=now_s,
                orphaned_request_ids=waiting,
                held_request_ids=held_at_drain(heartbeat),
            ),
        )
        self._published(claim, "draining")
        log.info(
            "worker %s is draining: %d waiting requests handed over, %d running finish there",
            wid,
            len(waiting),
            heartbeat.running,
            extra={"event": "worker-draining", "worker_id": wid, "orphans": len(waiting)},
        )

    async def announce_drained(self, heartbeat: Heartbeat, now_s: float) -> None:
        """Publish the WorkerDown ``drained`` of a worker whose last heartbeat came."""
        claim = keys.worker_down_claim(heartbeat.worker_id, f"drained:{heartbeat.sequence}")
        await self._declare_down(
            heartbeat.worker_id, heartbeat, claim, reason="drained", last_seen_s=now_s, now_s=now_s
        )

    # -- deaths ----------------------------------------------------------------------------

    async def _declare_down(
        self,
        wid: str,
        heartbeat: Heartbeat | None,
        claim: str,
        *,
        reason: str,
        last_seen_s: float,
        now_s: float,
        expect_last_seen: str | None = None,
    ) -> bool:
        """Publish one WorkerDown for this death (the claim's winner only), then record
        the status and take the listed orphans out of the worker's assigned set."""
        if not await self._claim(claim):
            return False
        key = keys.worker(wid)
        if expect_last_seen is not None:
            # A heartbeat may have arrived since the check read the hash.
            fields = await self.state.hgetall(key)
            if (
                fields.get("last_seen_s") != expect_last_seen
                or status_of(fields.get("status")) is not WorkerStatus.ALIVE
            ):
                return False
        assigned = await self.state.zrange_by_score(keys.assigned(wid), -math.inf, math.inf)
        orphans = [member for member, _ in assigned]
        seen = set(orphans)
        if heartbeat is not None:
            for entry in heartbeat.outstanding:
                if entry.request_id not in seen:
                    seen.add(entry.request_id)
                    orphans.append(entry.request_id)
        drained = reason == "drained"
        await self.bus.publish(
            WORKER_EVENTS,
            WorkerDown(
                worker_id=wid,
                reason="drained" if drained else "heartbeat-timeout",
                last_heartbeat_s=last_seen_s,
                detected_at_s=now_s,
                orphaned_request_ids=orphans,
                held_request_ids=held_at_drain(heartbeat) if drained and heartbeat else None,
            ),
        )
        self._published(claim, reason)
        status = WorkerStatus.DRAINED if drained else WorkerStatus.DOWN
        await self.state.hset(
            key, {"status": status.value, "status_changed_s": repr(now_s), "down_reason": reason}
        )
        if self._on_status is not None:
            self._on_status(wid, status.value)
        await self.ledger.hand_over(wid, orphans)
        # A worker that drained left on purpose; one that fell silent is news.
        log.log(
            logging.INFO if drained else logging.WARNING,
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

    async def _sweep_stranded(self, wid: str, status: WorkerStatus, now_s: float) -> None:
        """Orphan again what was assigned to ``wid`` after its WorkerDown was handled
        (see the module docstring)."""
        assigned = await self.state.zrange_by_score(
            keys.assigned(wid), -math.inf, now_s - STRANDED_GRACE_S
        )
        if not assigned:
            return
        members = [member for member, _ in assigned]
        records = await asyncio.gather(
            *(self.state.hgetall(keys.request(member)) for member in members)
        )
        # Only a request still recorded on this worker and unfinished is stranded; the
        # others were re-assigned (or finished) and merely left their entry behind.
        stranded = [
            member
            for member, record in zip(members, records, strict=True)
            if record.get("worker_id") == wid and record.get("status") not in FINAL_STATUSES
        ]
        if not stranded:
            await self.ledger.hand_over(wid, members)
            return
        newest_s = max(score for _, score in assigned)
        claim = keys.worker_down_claim(wid, f"stranded:{newest_s!r}:{len(stranded)}")
        if not await self.state.set_if_absent(claim, self.token, ttl_s=WORKER_DOWN_CLAIM_TTL_S):
            return
        drained = status is WorkerStatus.DRAINED
        held: list[str] | None = None
        if drained and (raw := await self.state.hget(keys.worker(wid), "heartbeat")):
            with contextlib.suppress(ValueError):
                held = held_at_drain(Heartbeat.model_validate_json(raw))
        await self.bus.publish(
            WORKER_EVENTS,
            WorkerDown(
                worker_id=wid,
                reason="drained" if drained else "heartbeat-timeout",
                detected_at_s=now_s,
                orphaned_request_ids=stranded,
                held_request_ids=held,
            ),
        )
        await self.ledger.hand_over(wid, members)
        self.stranded_orphaned += len(stranded)
        log.warning(
            "%d requests assigned to %s worker %s after its death was handled: orphaned again",
            len(stranded),
            status.value,
            wid,
            extra={"event": "worker-stranded", "worker_id": wid, "orphans": len(stranded)},
        )
