"""The stack at a glance: what ``switchyard status`` shows and every ``/status`` serves.

:func:`read_status` takes a :class:`StatusSnapshot` from the records the services keep
(the monitor's worker records, the cluster counters, the replicas' presence), in a few
round trips; :func:`status_document` turns one into a JSON document, with rates when
given the snapshot before it. Nothing here writes.

Document::

    {"taken_s": ..., "interval_s": 2.0 | null,
     "totals": {"workers_alive", "workers", "completed", "violated", "slo_attainment",
                "recent_slo_attainment", "recent_window", "answers_per_s",
                "superseded", "dead_letters"},
     "workers": [{"worker_id", "state", "worker_type", "profile", "role", "models", "waiting",
                  "running", "max_slots", "utilization", "kv_used", "heartbeat_age_s",
                  "completed", "violated", "answers_per_s", "emulated"}],
     "services": [{"name", "instance", "state", "health_url", "up_s", "seen_age_s"}]}

A worker's ``state`` is ``alive``, ``draining``, ``silent`` (alive by the monitor's last
verdict but not heard from for longer than the worker timeout), ``down`` or ``drained``.
Rates and attainments are null where nothing defines them (no previous snapshot, no
answer yet).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from switchyard.cluster.records import ClusterView, WorkerRecord, WorkerStatus, read_cluster
from switchyard.runtime.presence import ServiceReplica, read_replicas
from switchyard.state.base import StateStore


@dataclass(frozen=True, slots=True)
class StatusSnapshot:
    """The records behind one status document, read at ``taken_s`` (wall seconds)."""

    taken_s: float
    cluster: ClusterView
    replicas: tuple[ServiceReplica, ...]


async def read_status(state: StateStore, now_s: float) -> StatusSnapshot:
    """The records now."""
    cluster = await read_cluster(state, now_s)
    replicas = await read_replicas(state, now_s)
    return StatusSnapshot(taken_s=now_s, cluster=cluster, replicas=tuple(replicas))


class StatusSource:
    """Status documents of one store, each with rates since the one before (what
    ``GET /status`` serves and ``switchyard status`` shows)."""

    def __init__(self, state: StateStore, *, worker_timeout_s: float) -> None:
        self.state = state
        self.worker_timeout_s = worker_timeout_s
        self._previous: StatusSnapshot | None = None

    async def document(self) -> dict[str, Any]:
        """The document now."""
        current = await read_status(self.state, time.time())
        document = status_document(current, self._previous, worker_timeout_s=self.worker_timeout_s)
        self._previous = current
        return document


def worker_state(record: WorkerRecord, worker_timeout_s: float) -> str:
    """The worker's state as an operator reads it (see the module docstring)."""
    if record.status is not WorkerStatus.ALIVE:
        return str(record.status)
    if record.age_s > worker_timeout_s:
        return "silent"
    if record.heartbeat is not None and record.heartbeat.draining:
        return "draining"
    return "alive"


def _rate(now: int, before: int | None, interval_s: float | None) -> float | None:
    if before is None or interval_s is None or interval_s <= 0:
        return None
    return max(0, now - before) / interval_s


def _attainment(met_of: int, violated: int) -> float | None:
    return None if met_of <= 0 else 1.0 - violated / met_of


def _worker_row(
    record: WorkerRecord,
    before: WorkerRecord | None,
    interval_s: float | None,
    worker_timeout_s: float,
) -> dict[str, Any]:
    heartbeat = record.heartbeat
    kv_used = None
    if heartbeat is not None and heartbeat.kv_capacity_tokens > 0:
        kv_used = heartbeat.kv_used_tokens / heartbeat.kv_capacity_tokens
    return {
        "worker_id": record.worker_id,
        "state": worker_state(record, worker_timeout_s),
        "worker_type": None if heartbeat is None else heartbeat.worker_type,
        "profile": None if heartbeat is None else heartbeat.profile,
        "role": None if heartbeat is None else heartbeat.role,
        "models": [] if heartbeat is None else list(heartbeat.resident_models),
        "waiting": None if heartbeat is None else heartbeat.queue_length,
        "running": None if heartbeat is None else heartbeat.running,
        "max_slots": None if heartbeat is None else heartbeat.max_slots,
        "utilization": None if heartbeat is None else heartbeat.utilization,
        "kv_used": kv_used,
        "heartbeat_age_s": record.age_s,
        "completed": record.completed,
        "violated": record.violated,
        "answers_per_s": _rate(
            record.completed, None if before is None else before.completed, interval_s
        ),
        "emulated": None if heartbeat is None else heartbeat.emulated,
    }


def status_document(
    current: StatusSnapshot,
    previous: StatusSnapshot | None = None,
    *,
    worker_timeout_s: float,
) -> dict[str, Any]:
    """The JSON document of ``current`` (rates over the time since ``previous``)."""
    interval_s = None if previous is None else current.taken_s - previous.taken_s
    cluster = current.cluster
    before = None if previous is None else previous.cluster
    workers = [
        _worker_row(
            record,
            None if before is None else before.get(record.worker_id),
            interval_s,
            worker_timeout_s,
        )
        for record in cluster.workers
    ]
    totals = {
        "workers_alive": sum(1 for w in workers if w["state"] in ("alive", "draining")),
        "workers": len(workers),
        "completed": cluster.completed,
        "violated": cluster.violated,
        "slo_attainment": _attainment(cluster.completed, cluster.violated),
        "recent_slo_attainment": (
            1.0 - cluster.recent_violation_rate if cluster.recent_window else None
        ),
        "recent_window": cluster.recent_window,
        "answers_per_s": _rate(
            cluster.completed, None if before is None else before.completed, interval_s
        ),
        "superseded": cluster.superseded,
        "dead_letters": cluster.dead_letters,
    }
    services = [
        {
            "name": replica.name,
            "instance": replica.instance,
            "state": replica.state,
            "health_url": replica.health_url,
            "up_s": max(0.0, current.taken_s - replica.started_s),
            "seen_age_s": max(0.0, current.taken_s - replica.last_seen_s),
        }
        for replica in current.replicas
    ]
    return {
        "taken_s": current.taken_s,
        "interval_s": interval_s,
        "totals": totals,
        "workers": workers,
        "services": services,
    }
