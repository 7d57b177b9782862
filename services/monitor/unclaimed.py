"""Requests sent to a live worker that never reached it: found, taken back, re-assigned.

An assignment can be lost on its way to a worker that stays alive: a publish whose
outcome a broker outage left unknown, a message sent to a partition the worker no
longer reads. Nothing else notices: the worker keeps heartbeating, so it is never
declared down, and the request's client waits until it gives up.

The sweep compares each live worker's latest heartbeat with the worker's assigned set
(the request ledger keeps it). A heartbeat says how far the worker has read its inbox
(``inbox_read_through_s``: by then it had taken in every record its partition held). A
request assigned to the worker at least :data:`UNCLAIMED_GRACE_S` before that (and
before the heartbeat was sent), which the heartbeat does not list (running or waiting)
and which the worker never started, did not arrive. A worker behind on its inbox (a
backlog under load) reports an older time, so nothing still queued for it at the broker
is judged. The ledger's :meth:`~switchyard.lifecycle.RequestLedger.disown_many` takes it
back in one atomic step per request: a start that races it wins, and then nothing is
taken back; once taken back, the lost message can no longer start it should it turn up.
A WorkerDown ``unclaimed`` lists what was taken back, for the scheduler to re-assign; the
worker stays in service.

A heartbeat whose list was cut short (a worker holding more than ``Heartbeat.MAX_LISTED``
requests), or that does not say how far its worker has read, proves nothing: its worker
is skipped until a complete one arrives. Monitor replicas may each take a request back;
the scheduler re-assigns it once (it moves only a request the record still shows on that
worker).

Cost: one range read of each live worker's assigned set per sweep (every
:data:`SWEEP_PERIOD_S`); a script runs only for the entries a heartbeat does not list.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

from switchyard.bus import Bus
from switchyard.contracts.messages import Heartbeat, WorkerDown
from switchyard.contracts.topics import WORKER_EVENTS
from switchyard.lifecycle import RequestLedger
from switchyard.state import StateStore, keys

log = logging.getLogger("switchyard.monitor")

UNCLAIMED_GRACE_S = 2.0
"""How long before the worker had read its inbox through a request must have been
assigned for the heartbeat's silence about it to count: far more than a decision takes to
reach the broker, so a request still on its way is never taken back."""

SWEEP_PERIOD_S = 1.0
"""How often the assigned sets are compared with the heartbeats."""


class UnclaimedSweep:
    """Finds, takes back and announces what live workers never received (see the module
    docstring).

    Args:
        state, bus: the monitor's store and bus.
        fresh_s: a heartbeat heard longer ago than this is not judged by (its worker is
            silent: liveness declares it down and re-assigns all it held).
        grace_s: see :data:`UNCLAIMED_GRACE_S`.
        clock: wall seconds.
        on_taken_back: called with the number of requests each announcement lists.
    """

    def __init__(
        self,
        state: StateStore,
        bus: Bus,
        *,
        fresh_s: float,
        grace_s: float = UNCLAIMED_GRACE_S,
        clock: Callable[[], float] = time.time,
        on_taken_back: Callable[[int], None] | None = None,
    ) -> None:
        self.state = state
        self.bus = bus
        self.ledger = RequestLedger(state)
        self.fresh_s = fresh_s
        self.grace_s = grace_s
        self.clock = clock
        self._on_taken_back = on_taken_back
        self._latest: dict[str, tuple[Heartbeat, float]] = {}
        self.taken_back = 0

    def heard(self, heartbeat: Heartbeat) -> None:
        """Keep ``heartbeat`` as its worker's latest (a draining worker's requests are
        the drain's business: it is no longer judged)."""
        if heartbeat.draining:
            self._latest.pop(heartbeat.worker_id, None)
        else:
            self._latest[heartbeat.worker_id] = (heartbeat, self.clock())

    async def sweep(self) -> int:
        """Take back and announce every live worker's unclaimed requests; returns how
        many were taken back."""
        now_s = self.clock()
        found = 0
        for worker_id, (heartbeat, heard_s) in list(self._latest.items()):
            if now_s - heard_s > self.fresh_s:
                del self._latest[worker_id]
                continue
            if (
                heartbeat.outstanding_total > len(heartbeat.outstanding)
                or heartbeat.inbox_read_through_s is None
            ):
                continue
            found += await self._sweep_worker(heartbeat, now_s)
        return found

    async def _sweep_worker(self, heartbeat: Heartbeat, now_s: float) -> int:
        worker_id = heartbeat.worker_id
        read_through_s = heartbeat.inbox_read_through_s
        assert read_through_s is not None
        assigned_by_s = min(heartbeat.sent_at_s, read_through_s) - self.grace_s
        old = await self.state.zrange_by_score(keys.assigned(worker_id), -math.inf, assigned_by_s)
        if not old:
            return 0
        listed = {entry.request_id for entry in heartbeat.outstanding}
        unlisted = [request_id for request_id, _ in old if request_id not in listed]
        if not unlisted:
            return 0
        taken = await self.ledger.disown_many(worker_id, unlisted, assigned_by_s)
        if not taken:
            return 0
        await self.bus.publish(
            WORKER_EVENTS,
            WorkerDown(
                worker_id=worker_id,
                reason="unclaimed",
                last_heartbeat_s=heartbeat.sent_at_s,
                detected_at_s=now_s,
                orphaned_request_ids=taken,
            ),
        )
        self.taken_back += len(taken)
        if self._on_taken_back is not None:
            self._on_taken_back(len(taken))
        log.warning(
            "%d requests assigned to live worker %s never reached it: taken back for re-assignment",
            len(taken),
            worker_id,
            extra={"event": "worker-unclaimed", "worker_id": worker_id, "requests": taken[:20]},
        )
        return len(taken)
