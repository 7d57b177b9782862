"""The workers as the monitor recorded them: reading ``worker:{id}`` back.

``worker:{id}`` (hash, written by the monitor from heartbeats; ``completed`` and
``violated`` by the request ledger's finish):

=====================  ==============================================================
field                  holds
=====================  ==============================================================
``heartbeat``          the last accepted :class:`Heartbeat`, ``model_dump_json()``
``sequence``           that heartbeat's ``sequence`` (decimal text)
``sent_at_s``          that heartbeat's ``sent_at_s`` (the worker's clock)
``last_seen_s``        wall time the monitor received it (the monitor's clock)
``status``             ``alive`` | ``down`` | ``drained`` (:class:`WorkerStatus`)
``draining``           ``1`` once its heartbeats say it drains
``status_changed_s``   wall time of the last status change
``down_reason``        ``heartbeat-timeout`` or ``drained`` once it went down (else absent)
``worker_type``        the heartbeat's ``worker_type``
``profile``            the heartbeat's ``profile`` (empty text when it has none)
``completed``          answers this worker recorded (decimal text)
``violated``           those that finished after their ``deadline_s``
=====================  ==============================================================

``workers`` (sorted set): worker id -> ``last_seen_s``. ``cluster:stats`` and
``monitor:hearing``: see :mod:`switchyard.state.keys`.

:class:`ClusterReader` reads all of it in one round trip and parses a worker's
heartbeat again only when its sequence changed: the scheduler and the ingress read the
cluster ten times a second.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from pydantic import ValidationError

from switchyard.contracts.messages import Heartbeat
from switchyard.state import keys
from switchyard.state.base import Script, ScriptView, StateStore

log = logging.getLogger(__name__)


class WorkerStatus(StrEnum):
    """The monitor's verdict on a worker (``status`` field of ``worker:{id}``)."""

    ALIVE = "alive"
    DOWN = "down"
    DRAINED = "drained"


def worker_profile(heartbeat: Heartbeat) -> str:
    """The worker type policies key predictions by: the heartbeat's ``profile`` when it
    names one, else its ``worker_type``."""
    return heartbeat.profile or heartbeat.worker_type


HEARING_FRESH_S = 3.0
"""A hearing record older than this is not trusted (the monitor is gone or stalled):
readers then measure silence on the wall clock."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Hearing:
    """How far the monitor has heard heartbeats, as its last liveness check wrote it
    (``monitor:hearing``; :mod:`services.monitor.silence` explains the clock).

    Readers measure a worker's silence the way the monitor does, so a broker outage or
    a monitor that has just started makes no live worker look gone to admission and
    placement either (while the broker is away, its heartbeats cannot arrive).
    """

    through_s: float
    since_s: float
    written_s: float

    def silence_s(self, last_seen_s: float, now_s: float) -> float:
        """How long a worker last heard from at ``last_seen_s`` has been silent while
        the monitor could hear it: 0 while it hears nothing; the wall age when this
        record is stale."""
        if now_s - self.written_s > HEARING_FRESH_S:
            return max(0.0, now_s - last_seen_s)
        if self.since_s == math.inf:
            return 0.0
        return max(0.0, self.through_s - max(last_seen_s, self.since_s))


def parse_hearing(fields: Mapping[str, str]) -> Hearing | None:
    """The hearing record from its hash fields; None when absent or unreadable."""
    try:
        return Hearing(
            through_s=float(fields["through_s"]),
            since_s=float(fields["since_s"]),
            written_s=float(fields["written_s"]),
        )
    except (KeyError, ValueError):
        return None


def is_alive(status: WorkerStatus, age_s: float, worker_timeout_s: float) -> bool:
    """Alive for scheduling: the monitor says alive and it was heard from within the timeout."""
    return status is WorkerStatus.ALIVE and age_s <= worker_timeout_s


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerRecord:
    """One worker as the monitor last recorded it.

    Attributes:
        worker_id: the worker.
        status: the monitor's verdict (a worker never seen alive reads as DOWN).
        last_seen_s: wall time its last accepted heartbeat arrived (0.0 unknown).
        age_s: how long it has been silent at the time of the read (never negative):
            ``now_s - last_seen_s``, or as the monitor hears (:class:`Hearing`) when the
            read carried the monitor's hearing record.
        heartbeat: its last heartbeat, or None when missing or unreadable.
        completed: answers it recorded.
        violated: those past their deadline.
    """

    worker_id: str
    status: WorkerStatus
    last_seen_s: float
    age_s: float
    heartbeat: Heartbeat | None
    completed: int = 0
    violated: int = 0

    def takes_work(self, worker_timeout_s: float) -> bool:
        """Whether policies may give it work or move work from it: alive
        (:func:`is_alive`), with a heartbeat, and not draining (a stopping worker only
        finishes what runs; what waits there is handed over by its drain)."""
        return (
            self.heartbeat is not None
            and not self.heartbeat.draining
            and is_alive(self.status, self.age_s, worker_timeout_s)
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterView:
    """Every worker the monitor knows, ordered by worker id, and the cluster counters.

    Attributes:
        now_s: the wall time the ages were computed against.
        workers: one record per member of ``workers``, ordered by worker id.
        completed: answers counted cluster-wide.
        violated: those past their deadline.
        recent_violation_rate: share of the latest completions that missed their
            deadline (0..1; 0.0 before any).
        recent_window: how many completions that rate is over (up to RECENT_WINDOW).
        superseded: answers refused because their request was given to another worker
            or epoch while they ran (each a run that should not have happened).
        dead_letters: messages no consumer could handle.
    """

    now_s: float
    workers: tuple[WorkerRecord, ...]
    completed: int = 0
    violated: int = 0
    recent_violation_rate: float = 0.0
    recent_window: int = 0
    superseded: int = 0
    dead_letters: int = 0

    def get(self, worker_id: str) -> WorkerRecord | None:
        """The record of ``worker_id``, or None."""
        for record in self.workers:
            if record.worker_id == worker_id:
                return record
        return None


def _float(text: str | None, default: float = 0.0) -> float:
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        return default
    return value if math.isfinite(value) else default


def _int(text: str | None) -> int:
    return int(_float(text))


def _status(text: str | None) -> WorkerStatus:
    try:
        return WorkerStatus(text or WorkerStatus.DOWN)
    except ValueError:
        return WorkerStatus.DOWN


def parse_heartbeat(worker_id: str, raw: str | None) -> Heartbeat | None:
    """A stored heartbeat; None (logged) when missing or unreadable."""
    if not raw:
        return None
    try:
        return Heartbeat.model_validate_json(raw)
    except ValidationError as exc:
        log.warning("worker %s: unreadable heartbeat in state: %s", worker_id, exc)
        return None


def parse_worker_record(
    worker_id: str,
    fields: Mapping[str, str],
    now_s: float,
    heartbeat: Heartbeat | None = None,
    hearing: Hearing | None = None,
) -> WorkerRecord:
    """A :class:`WorkerRecord` from the fields of ``worker:{id}`` (pure).

    ``heartbeat``, when given, is the already parsed heartbeat of these fields; else it
    is parsed from the ``heartbeat`` field. ``hearing``, when given, is the clock its
    silence is measured by (else the wall clock). A missing or unknown status reads as
    DOWN; numbers that do not parse read as 0.
    """
    if heartbeat is None:
        heartbeat = parse_heartbeat(worker_id, fields.get("heartbeat"))
    last_seen_s = _float(fields.get("last_seen_s"))
    return WorkerRecord(
        worker_id=worker_id,
        status=_status(fields.get("status")),
        last_seen_s=last_seen_s,
        age_s=max(0.0, now_s - last_seen_s)
        if hearing is None
        else hearing.silence_s(last_seen_s, now_s),
        heartbeat=heartbeat,
        completed=_int(fields.get("completed")),
        violated=_int(fields.get("violated")),
    )


def recent_violation_rate(recent: str) -> float:
    """The share of ``1``\\ s in the ``recent`` outcomes of ``cluster:stats``."""
    return recent.count("1") / len(recent) if recent else 0.0


# -- reading the whole cluster in one step ---------------------------------------------------
# KEYS: workers, cluster:stats, monitor:hearing. ARGV: the store's prefix (worker hashes
# are found through the set: their keys are built here, as keys.worker spells them), then
# worker id and known heartbeat version pairs (``sequence|sent_at_s``: a restarted worker
# counts its sequence from 1 again). -> the stats hash and then the hearing hash, each as
# a count and field/value pairs, then per worker: id, a count and its field/value pairs,
# the heartbeat left out when its version is the one the reader knows.

_READ_CLUSTER_LUA = """
local known = {}
for i = 2, #ARGV, 2 do known[ARGV[i]] = ARGV[i + 1] end
local out = {}
local stats = redis.call('HGETALL', KEYS[2])
table.insert(out, tostring(#stats))
for _, v in ipairs(stats) do table.insert(out, v) end
local hearing = redis.call('HGETALL', KEYS[3])
table.insert(out, tostring(#hearing))
for _, v in ipairs(hearing) do table.insert(out, v) end
for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local fields = redis.call('HGETALL', ARGV[1] .. 'worker:' .. id)
  local kept = {}
  local sequence, sent = nil, ''
  for i = 1, #fields, 2 do
    if fields[i] == 'sequence' then sequence = fields[i + 1] end
    if fields[i] == 'sent_at_s' then sent = fields[i + 1] end
  end
  local version = sequence and (sequence .. '|' .. sent)
  for i = 1, #fields, 2 do
    if not (fields[i] == 'heartbeat' and version ~= nil and known[id] == version) then
      table.insert(kept, fields[i]); table.insert(kept, fields[i + 1])
    end
  end
  table.insert(out, id)
  table.insert(out, tostring(#kept))
  for _, v in ipairs(kept) do table.insert(out, v) end
end
return out
"""


def _read_cluster(view: ScriptView, keys_: Sequence[str], args: Sequence[str]) -> list[str]:
    known = dict(zip(args[1::2], args[2::2], strict=True))
    stats = view.hgetall(keys_[1])
    out = [str(2 * len(stats)), *(item for pair in stats.items() for item in pair)]
    hearing = view.hgetall(keys_[2])
    out += [str(2 * len(hearing)), *(item for pair in hearing.items() for item in pair)]
    for worker_id in view.zrange(keys_[0]):
        fields = view.hgetall(keys.worker(worker_id))
        if _version(fields) is not None and known.get(worker_id) == _version(fields):
            fields.pop("heartbeat", None)
        out += [
            worker_id,
            str(2 * len(fields)),
            *(item for pair in fields.items() for item in pair),
        ]
    return out


def _version(fields: Mapping[str, str]) -> str | None:
    """What tells one stored heartbeat from another: its sequence and send time."""
    sequence = fields.get("sequence")
    return None if sequence is None else f"{sequence}|{fields.get('sent_at_s', '')}"


READ_CLUSTER = Script("read-cluster", _READ_CLUSTER_LUA, _read_cluster)


def _hash_at(reply: Sequence[str], position: int) -> tuple[dict[str, str], int]:
    """The hash written at ``position`` of a reply (a count, then field/value pairs),
    and the position after it."""
    count = int(reply[position])
    flat = reply[position + 1 : position + 1 + count]
    return dict(zip(flat[0::2], flat[1::2], strict=True)), position + 1 + count


class ClusterReader:
    """Reads the cluster (every worker record and the counters) in one round trip,
    parsing each worker's heartbeat only when its sequence changed since the last read.

    One per reading routine (it keeps the parsed heartbeats between reads).
    """

    def __init__(self, state: StateStore) -> None:
        self.state = state
        self._heartbeats: dict[str, tuple[str, Heartbeat | None]] = {}

    async def read(self, now_s: float) -> ClusterView:
        """The cluster now; ages are measured against ``now_s`` (wall seconds)."""
        args = [self.state.prefix]
        for worker_id, (version, _) in self._heartbeats.items():
            args += (worker_id, version)
        reply = await self.state.run_script(
            READ_CLUSTER, [keys.WORKERS, keys.CLUSTER_STATS, keys.MONITOR_HEARING], args
        )
        stats, position = _hash_at(reply, 0)
        hearing_fields, position = _hash_at(reply, position)
        hearing = parse_hearing(hearing_fields)
        records: list[WorkerRecord] = []
        seen: dict[str, tuple[str, Heartbeat | None]] = {}
        while position < len(reply):
            worker_id, count = reply[position], int(reply[position + 1])
            flat = reply[position + 2 : position + 2 + count]
            position += 2 + count
            fields = dict(zip(flat[0::2], flat[1::2], strict=True))
            if not fields:
                continue  # a member whose hash is gone (cleared state)
            version = _version(fields) or ""
            if "heartbeat" in fields or worker_id not in self._heartbeats:
                heartbeat = parse_heartbeat(worker_id, fields.get("heartbeat"))
            else:
                heartbeat = self._heartbeats[worker_id][1]
            seen[worker_id] = (version, heartbeat)
            records.append(parse_worker_record(worker_id, fields, now_s, heartbeat, hearing))
        self._heartbeats = seen
        recent = stats.get("recent", "")
        return ClusterView(
            now_s=now_s,
            workers=tuple(sorted(records, key=lambda r: r.worker_id)),
            completed=_int(stats.get("completed")),
            violated=_int(stats.get("violated")),
            recent_violation_rate=recent_violation_rate(recent),
            recent_window=len(recent),
            superseded=_int(stats.get("superseded")),
            dead_letters=_int(stats.get("dead_letters")),
        )

    def inbox_partitions(self) -> dict[str, int]:
        """Each worker's inbox partition, as its heartbeat of the last read named it."""
        return {
            worker_id: heartbeat.inbox_partition
            for worker_id, (_, heartbeat) in self._heartbeats.items()
            if heartbeat is not None and heartbeat.inbox_partition is not None
        }


async def read_cluster(state: StateStore, now_s: float) -> ClusterView:
    """The cluster now (a one-off read; a routine keeps a :class:`ClusterReader`)."""
    return await ClusterReader(state).read(now_s)


async def read_assigned(state: StateStore, worker_id: str) -> list[str]:
    """Members of ``worker:{id}:assigned`` (requests the worker holds or was sent),
    oldest assignment first."""
    members = await state.zrange_by_score(keys.assigned(worker_id), -math.inf, math.inf)
    return [member for member, _ in members]
