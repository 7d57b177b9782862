"""Recording workers' heartbeats into ``worker:{id}`` and ``workers``.

Layout: :mod:`switchyard.cluster.records`. One read and one write a heartbeat: the
record is read whole, the new state decided here, and written back with the ``workers``
entry in one atomic step.

Ordering: a heartbeat whose ``sequence`` is not above the stored one is stale (a
redelivery or reordering) and ignored, except when the worker is recorded down or
drained and the heartbeat was sent later than the stored one: a restarted worker whose
counter began again. (A worker restarted faster than the timeout is therefore first
declared down, which is right: its old process's requests were lost.)

Drains: the first heartbeat that says ``draining`` is announced (a WorkerDown
``draining`` naming what waits there) and the one with ``running == 0`` marks the worker
``drained`` (a WorkerDown ``drained``): :class:`~services.monitor.liveness.Liveness`
publishes both *before* the heartbeat is stored, so a publish that fails is retried with
the redelivered heartbeat.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from switchyard.cluster import WorkerStatus
from switchyard.contracts.messages import Heartbeat
from switchyard.state import StateStore, keys
from switchyard.state.base import Script, ScriptView

log = logging.getLogger("switchyard.monitor")

# KEYS: worker:{id}, workers. ARGV: worker id, last_seen_s, then field/value pairs, then
# "|" and the fields to delete.
_STORE_LUA = """
local split = #ARGV + 1
for i = 3, #ARGV do if ARGV[i] == '|' then split = i break end end
redis.call('HSET', KEYS[1], unpack(ARGV, 3, split - 1))
if split < #ARGV then redis.call('HDEL', KEYS[1], unpack(ARGV, split + 1)) end
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
return {'stored'}
"""


def _store(view: ScriptView, keys_: Sequence[str], args: Sequence[str]) -> list[str]:
    rest = list(args[2:])
    split = rest.index("|") if "|" in rest else len(rest)
    pairs, dropped = rest[:split], rest[split + 1 :]
    view.hset(keys_[0], dict(zip(pairs[0::2], pairs[1::2], strict=True)))
    if dropped:
        view.hdel(keys_[0], *dropped)
    view.zadd(keys_[1], {args[0]: float(args[1])})
    return ["stored"]


_STORE = Script("store-heartbeat", _STORE_LUA, _store)


def status_of(text: str | None) -> WorkerStatus | None:
    """A stored status, or None (missing or unknown)."""
    if text is None:
        return None
    try:
        return WorkerStatus(text)
    except ValueError:
        return None


class HeartbeatRecorder:
    """Writes heartbeats (see the module docstring).

    Args:
        state: the store.
        clock: wall seconds (when a heartbeat is received).
        on_draining: called before a first draining heartbeat is stored (announce it).
        on_drained: called before a draining heartbeat with nothing running is stored.
    """

    def __init__(
        self,
        state: StateStore,
        *,
        clock: Callable[[], float] = time.time,
        on_draining: Callable[[Heartbeat, float], Awaitable[object]] | None = None,
        on_drained: Callable[[Heartbeat, float], Awaitable[object]] | None = None,
    ) -> None:
        self.state = state
        self.clock = clock
        self.on_draining = on_draining
        self.on_drained = on_drained
        self.accepted = 0
        self.stale = 0
        self.statuses: dict[str, str] = {}
        """The status of every worker recorded last by this replica (for a gauge)."""

    async def record(self, heartbeat: Heartbeat) -> bool:
        """Record ``heartbeat``; False when it was stale and ignored."""
        wid = heartbeat.worker_id
        stored = await self.state.hgetall(keys.worker(wid))
        previous = status_of(stored.get("status"))
        stored_seq = stored.get("sequence")
        if (
            stored_seq is not None
            and stored_seq.isdigit()
            and heartbeat.sequence <= int(stored_seq)
        ):
            restarted = previous is not WorkerStatus.ALIVE and heartbeat.sent_at_s > float(
                stored.get("sent_at_s") or "-inf"
            )
            if not restarted:
                self.stale += 1
                return False
        now_s = self.clock()
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
        back = status is WorkerStatus.ALIVE and previous is not None and previous is not status
        if back:
            log.info(
                "worker %s is back (%s -> alive)",
                wid,
                previous.value if previous else None,
                extra={"event": "worker-back", "worker_id": wid},
            )
        # Announced before the heartbeat is stored: if publishing fails, the redelivered
        # heartbeat is not stale yet and the drain is announced then.
        if drained and previous is not WorkerStatus.DRAINED and self.on_drained is not None:
            await self.on_drained(heartbeat, now_s)
        elif (
            heartbeat.draining
            and stored.get("draining") != "1"
            and status is WorkerStatus.ALIVE
            and self.on_draining is not None
        ):
            await self.on_draining(heartbeat, now_s)
        args = [wid, repr(now_s)]
        for field, value in fields.items():
            args += (field, value)
        if back:
            args += ("|", "down_reason")
        await self.state.run_script(_STORE, [keys.worker(wid), keys.WORKERS], args)
        self.statuses[wid] = status.value
        self.accepted += 1
        return True
