"""The shared reader of the monitor's Redis layout: what the cluster looks like now.

The monitor writes the keys below from heartbeats and completions; the scheduler and the
rebalancer read them through this module, so the layout is spelled out once. Keys are
relative to the state store's prefix (the store adds it).

``worker:{id}`` (hash, written by the monitor):

=====================  ==============================================================
field                  holds
=====================  ==============================================================
``heartbeat``          the last accepted :class:`Heartbeat`, ``model_dump_json()``
``sequence``           that heartbeat's ``sequence`` (decimal text)
``sent_at_s``          that heartbeat's ``sent_at_s`` (the worker's clock)
``last_seen_s``        wall time the monitor received it (the monitor's clock)
``status``             ``alive`` | ``down`` | ``drained`` (:class:`WorkerStatus`)
``status_changed_s``   wall time of the last status change
``down_reason``        ``heartbeat-timeout`` or ``drained`` once it went down (else absent)
``worker_type``        the heartbeat's ``worker_type``
``profile``            the heartbeat's ``profile`` (empty text when it has none)
``completed``          completions reported by this worker (decimal text)
``violated``           those that finished after their ``deadline_s``
=====================  ==============================================================

``workers`` (sorted set): worker id -> ``last_seen_s``.

``worker:{id}:assigned`` (sorted set): request id -> assigned-at seconds. The scheduler
adds a member when it assigns (or re-assigns) a request to the worker; the monitor
removes it when the request's completion arrives, and removes the members it listed as
orphans once it declared the worker down.

``cluster:stats`` (hash, monitor): ``completed``, ``violated`` (totals),
``recent_violation_rate`` (share of the monitor's last ``recent_window`` completions
that missed their deadline), ``recent_window`` (how many completions that rate is over),
``updated_s``.

``request:{id}`` (hash, :data:`REQUEST_TTL_S`): the request's status, shared with the
ingress (which writes it on acceptance, see ``services/ingress/records.py``). The
scheduler sets ``status`` = ``assigned``, ``worker_id``, ``epoch`` and the decision's
``traceparent`` (:func:`record_assignment`); the answer adds ``status`` (the
completion's), ``worker_id`` and ``completion`` JSON (:func:`record_completion`),
written by the monitor and by the ingress replica the answer is addressed to.

``prediction:{request id}`` (string with a TTL, predictor): a
:class:`~switchyard.contracts.messages.ServiceTimePrediction` as JSON.

Everything below is pure except :func:`read_cluster` and :func:`read_assigned`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import ValidationError
from switchyard.contracts.messages import Assignment, Completion, CompletionStatus, Heartbeat
from switchyard.perf.profiles import UnknownProfileError, performance_model
from switchyard.policies.snapshot import ClusterSnapshot, WorkerRole, WorkerView
from switchyard.state.base import StateStore

__all__ = [
    "CLUSTER_STATS_KEY",
    "DECISION_TTL_S",
    "FINAL_STATUSES",
    "RECENT_WINDOW",
    "REQUEST_TTL_S",
    "WORKERS_KEY",
    "ClusterView",
    "ProfileConstants",
    "WorkerRecord",
    "WorkerStatus",
    "assigned_key",
    "assignment_key",
    "cluster_snapshot",
    "is_alive",
    "parse_worker_record",
    "prediction_key",
    "profile_constants",
    "read_assigned",
    "read_cluster",
    "record_assignment",
    "record_completion",
    "request_key",
    "worker_key",
    "worker_profile",
    "worker_view",
]

log = logging.getLogger(__name__)

WORKERS_KEY = "workers"
"""Sorted set: worker id -> last_seen_s."""
CLUSTER_STATS_KEY = "cluster:stats"
"""Hash: completed, violated, recent_violation_rate, recent_window, updated_s."""
RECENT_WINDOW = 100
"""How many of the latest completions the monitor's ``recent_violation_rate`` is over
(the simulator's default ``violation_window``)."""


def worker_key(worker_id: str) -> str:
    """``worker:{id}``: the hash the monitor keeps per worker."""
    return f"worker:{worker_id}"


def assigned_key(worker_id: str) -> str:
    """``worker:{id}:assigned``: request id -> assigned-at seconds (scheduler adds, monitor removes)."""
    return f"worker:{worker_id}:assigned"


def assignment_key(request_id: str) -> str:
    """``assignment:{id}``: the request's latest assignment (JSON)."""
    return f"assignment:{request_id}"


def request_key(request_id: str) -> str:
    """``request:{id}``: the request's status hash (shared with the ingress)."""
    return f"request:{request_id}"


DECISION_TTL_S = 3600.0
"""How long a recorded assignment lives: redeliveries and failures come within minutes."""
FINAL_STATUSES = frozenset(status.value for status in CompletionStatus)
"""``request:{id}`` statuses of a request that has its answer: nothing re-assigns it."""


async def record_assignment(
    state: StateStore,
    assignment: Assignment,
    *,
    moved_from: str | None = None,
    trace: Mapping[str, str] | None = None,
) -> None:
    """Record ``assignment`` as the request's latest, before it is published: its status
    hash (``assigned``, worker, epoch), ``assignment:{id}``, and the worker's assigned
    set. A migration (``moved_from``: the worker it leaves) also leaves that worker's
    set, so a death of either worker afterwards finds the request where it is.

    ``trace`` (``traceparent``/``tracestate``, :func:`switchyard.telemetry.trace_carrier`)
    is the request's trace where it was decided, kept in the status hash so that a
    re-assignment after a death continues the request's trace."""
    request_id = assignment.request.request_id
    writes: list[Coroutine[Any, Any, object]] = [
        state.hset(
            request_key(request_id),
            {
                "status": "assigned",
                "worker_id": assignment.worker_id,
                "epoch": str(assignment.epoch),
                **(trace or {}),
            },
        ),
        state.set(assignment_key(request_id), assignment.model_dump_json(), ttl_s=DECISION_TTL_S),
        state.zadd(assigned_key(assignment.worker_id), {request_id: assignment.assigned_at_s}),
    ]
    if moved_from is not None and moved_from != assignment.worker_id:
        writes.append(state.zrem(assigned_key(moved_from), request_id))
    await asyncio.gather(*writes)


REQUEST_TTL_S = 3600.0
"""How long a request's record (and its answer, for idempotent retries) is kept."""


async def record_completion(state: StateStore, completion: Completion) -> bool:
    """Add ``completion`` to its request's record (``request:{id}``); False when the
    record already holds a completion of a later epoch (this one is stale) or this very
    one (a redelivery, or another writer was first)."""
    key = request_key(completion.request_id)
    stored = await state.hget(key, "completion")
    if stored:
        with contextlib.suppress(ValidationError):
            previous = Completion.model_validate_json(stored)
            if previous.epoch > completion.epoch or previous.message_id == completion.message_id:
                return False
    await state.hset(
        key,
        {
            "app": completion.app,
            "status": str(completion.status),
            "worker_id": completion.worker_id,
            "completion": completion.model_dump_json(),
        },
    )
    await state.expire(key, REQUEST_TTL_S)
    return True


def prediction_key(request_id: str) -> str:
    """``prediction:{request id}``: the predictor's ServiceTimePrediction JSON."""
    return f"prediction:{request_id}"


class WorkerStatus(StrEnum):
    """The monitor's verdict on a worker (``status`` field of ``worker:{id}``)."""

    ALIVE = "alive"
    DOWN = "down"
    DRAINED = "drained"


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerRecord:
    """One worker as the monitor last recorded it.

    Attributes:
        worker_id: the worker.
        status: the monitor's verdict (a worker never seen alive reads as DOWN).
        last_seen_s: wall time its last accepted heartbeat arrived (0.0 unknown).
        age_s: ``now_s - last_seen_s`` at the time of the read (never negative).
        heartbeat: its last heartbeat, or None when missing or unreadable.
        completed: completions it reported.
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
        completed: completions counted cluster-wide.
        violated: those past their deadline.
        recent_violation_rate: share of the recent completions that missed their
            deadline (0..1; 0.0 before any).
        recent_window: how many completions that rate is over (up to RECENT_WINDOW).
    """

    now_s: float
    workers: tuple[WorkerRecord, ...]
    completed: int = 0
    violated: int = 0
    recent_violation_rate: float = 0.0
    recent_window: int = 0

    def get(self, worker_id: str) -> WorkerRecord | None:
        """The record of ``worker_id``, or None."""
        for record in self.workers:
            if record.worker_id == worker_id:
                return record
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileConstants:
    """The constants of a performance profile a :class:`WorkerView` carries.

    For an unknown profile every cost is 0 and ``interconnect_bytes_per_s`` is infinite
    (moving zero bytes costs nothing), so a policy that divides by it stays finite.
    """

    known: bool
    max_batch_slots: int
    kv_capacity_tokens: int
    decode_step_per_seq_s: float
    decode_step_per_kv_token_s: float
    kv_bytes_per_token: int
    interconnect_bytes_per_s: float


_UNKNOWN_PROFILE = ProfileConstants(
    known=False,
    max_batch_slots=0,
    kv_capacity_tokens=0,
    decode_step_per_seq_s=0.0,
    decode_step_per_kv_token_s=0.0,
    kv_bytes_per_token=0,
    interconnect_bytes_per_s=math.inf,
)


@functools.cache
def profile_constants(profile: str) -> ProfileConstants:
    """The constants of performance profile ``profile`` (``"GPU/MODEL"``), cached.

    An unknown name gives the all-zero constants (see :class:`ProfileConstants`).
    """
    try:
        perf = performance_model(profile)
    except UnknownProfileError:
        return _UNKNOWN_PROFILE
    return ProfileConstants(
        known=True,
        max_batch_slots=perf.max_batch_slots,
        kv_capacity_tokens=perf.kv_capacity_tokens,
        decode_step_per_seq_s=perf.decode_per_seq_s,
        decode_step_per_kv_token_s=perf.decode_per_kv_token_s,
        kv_bytes_per_token=perf.kv_bytes_per_token,
        interconnect_bytes_per_s=perf.interconnect_bytes_per_s,
    )


def worker_profile(heartbeat: Heartbeat) -> str:
    """The worker type policies key predictions by: the heartbeat's ``profile`` when it
    names one, else its ``worker_type``."""
    return heartbeat.profile or heartbeat.worker_type


def is_alive(status: WorkerStatus, age_s: float, worker_timeout_s: float) -> bool:
    """Alive for scheduling: the monitor says alive and it was heard from within the timeout."""
    return status is WorkerStatus.ALIVE and age_s <= worker_timeout_s


def worker_view(heartbeat: Heartbeat, *, alive: bool = True) -> WorkerView:
    """The policies' :class:`WorkerView` of a worker from its heartbeat.

    Load figures (queue length, running batch, KV use, queued work and tokens,
    utilisation, decode step) come from the heartbeat; the per-sequence and per-token
    decode costs, KV bytes per token and interconnect bandwidth from the profile
    (:func:`profile_constants`). ``max_slots`` and ``kv_capacity_tokens`` are the
    heartbeat's when it reports them (non-zero), else the profile's. Role is MIXED.
    Time constants are divided by the heartbeat's ``time_scale`` (an emulated worker's
    figures are wall seconds).
    """
    profile = worker_profile(heartbeat)
    constants = profile_constants(profile)
    # The profile's constants are modelled seconds; an emulated worker running
    # time_scale times faster reports wall seconds, and so must its view.
    scale = heartbeat.time_scale
    return WorkerView(
        worker_id=heartbeat.worker_id,
        worker_type=profile,
        role=WorkerRole.MIXED,
        alive=alive,
        waiting=heartbeat.queue_length,
        running=heartbeat.running,
        max_slots=heartbeat.max_slots or constants.max_batch_slots,
        kv_used_tokens=heartbeat.kv_used_tokens,
        kv_capacity_tokens=heartbeat.kv_capacity_tokens or constants.kv_capacity_tokens,
        # Policies compare queued work with their predictions, so they see it predicted.
        queued_work_s=heartbeat.predicted_work_s
        if heartbeat.predicted_work_s is not None
        else heartbeat.queued_work_s,
        queued_tokens=heartbeat.queued_tokens,
        utilization=heartbeat.utilization,
        decode_step_s=heartbeat.decode_step_s,
        decode_step_per_seq_s=constants.decode_step_per_seq_s / scale,
        decode_step_per_kv_token_s=constants.decode_step_per_kv_token_s / scale,
        kv_bytes_per_token=constants.kv_bytes_per_token,
        interconnect_bytes_per_s=constants.interconnect_bytes_per_s * scale,
    )


def cluster_snapshot(view: ClusterView, worker_timeout_s: float) -> ClusterSnapshot:
    """A policy :class:`ClusterSnapshot` of every worker with a heartbeat, ordered by id;
    ``alive`` per :meth:`WorkerRecord.takes_work`. Workers without a readable heartbeat
    are left out."""
    return ClusterSnapshot(
        now_s=view.now_s,
        workers=tuple(
            worker_view(record.heartbeat, alive=record.takes_work(worker_timeout_s))
            for record in view.workers
            if record.heartbeat is not None
        ),
    )


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


def parse_worker_record(worker_id: str, fields: Mapping[str, str], now_s: float) -> WorkerRecord:
    """A :class:`WorkerRecord` from the fields of ``worker:{id}`` (pure).

    A missing or unreadable heartbeat gives ``heartbeat=None`` (logged); a missing or
    unknown status reads as DOWN; numbers that do not parse read as 0.
    """
    heartbeat: Heartbeat | None = None
    raw = fields.get("heartbeat")
    if raw:
        try:
            heartbeat = Heartbeat.model_validate_json(raw)
        except ValidationError as exc:
            log.warning("worker %s: unreadable heartbeat in state: %s", worker_id, exc)
    try:
        status = WorkerStatus(fields.get("status", WorkerStatus.DOWN))
    except ValueError:
        status = WorkerStatus.DOWN
    last_seen_s = _float(fields.get("last_seen_s"))
    return WorkerRecord(
        worker_id=worker_id,
        status=status,
        last_seen_s=last_seen_s,
        age_s=max(0.0, now_s - last_seen_s),
        heartbeat=heartbeat,
        completed=_int(fields.get("completed")),
        violated=_int(fields.get("violated")),
    )


async def read_cluster(state: StateStore, now_s: float) -> ClusterView:
    """Read every worker in ``workers`` and the ``cluster:stats`` counters.

    One ``zrange`` plus one ``hgetall`` per worker (issued concurrently) plus one for the
    stats. Ages are measured against ``now_s`` (wall seconds, the monitor's clock).
    """
    members = await state.zrange_by_score(WORKERS_KEY, -math.inf, math.inf)
    ids = sorted(member for member, _ in members)
    hashes, stats = await asyncio.gather(
        asyncio.gather(*(state.hgetall(worker_key(wid)) for wid in ids)),
        state.hgetall(CLUSTER_STATS_KEY),
    )
    records = tuple(
        parse_worker_record(wid, fields, now_s)
        for wid, fields in zip(ids, hashes, strict=True)
        if fields  # a member whose hash is gone (cleared state) is skipped
    )
    rate = min(1.0, max(0.0, _float(stats.get("recent_violation_rate"))))
    return ClusterView(
        now_s=now_s,
        workers=records,
        completed=_int(stats.get("completed")),
        violated=_int(stats.get("violated")),
        recent_violation_rate=rate,
        recent_window=_int(stats.get("recent_window")),
    )


async def read_assigned(state: StateStore, worker_id: str) -> list[str]:
    """Members of ``worker:{id}:assigned`` (requests the worker holds or was sent),
    oldest assignment first."""
    members = await state.zrange_by_score(assigned_key(worker_id), -math.inf, math.inf)
    return [member for member, _ in members]
