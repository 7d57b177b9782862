"""Building the rebalancer's :class:`RebalanceSnapshot` from the monitor's state (pure).

Mirrors the simulator's ``_rebalance``: for each live worker, its listed outstanding
requests (a heartbeat lists running ones first, then waiting ones in queue order) are
walked in queue order, accumulating ``work_ahead_s`` (every request before it, running
ones in full); the waiting ones in the policy's ``QueueScope.waiting_tail`` and, when the
scope asks, the running ones become :class:`QueuedRequestView`\\ s.

Where the live stack knows less than the simulator:

* ``remaining_s`` (and the work-ahead sums) are the worker's own
  ``QueuedEntry.remaining_s``;
* the request's view is built as the scheduler builds it
  (:mod:`switchyard.prediction.views`), predicted with the predictor's published model
  from what the heartbeat lists (prompt length, workload, hint, arrival, deadline); the
  worker's own type, when the prediction lacks it, is at ``remaining_s``;
* ``model`` is the model part of the worker's profile.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from switchyard.cluster import ClusterView, WorkerRecord, cluster_snapshot, worker_profile
from switchyard.contracts.messages import Heartbeat, QueuedEntry
from switchyard.policies.registry import PredictionUse
from switchyard.policies.snapshot import (
    QueuedRequestView,
    QueueScope,
    RebalanceSnapshot,
    RequestPhase,
    RequestView,
    WorkerView,
)
from switchyard.prediction.snapshot import FittedPredictor
from switchyard.prediction.views import LlmRequestFacts, predict
from switchyard.prediction.views import request_view as shared_request_view


@dataclass(frozen=True, slots=True)
class ListedEntry:
    """A request the snapshot lists: where it is and what the worker said about it."""

    worker_id: str
    worker_type: str
    entry: QueuedEntry
    work_ahead_s: float


SkipEntry = Callable[[str, QueuedEntry], bool]
"""``skip(worker_id, entry)``: True for a request the snapshot must leave out."""


def _never(worker_id: str, entry: QueuedEntry) -> bool:
    return False


def listed_entries(
    heartbeat: Heartbeat, scope: QueueScope, skip: SkipEntry = _never
) -> list[ListedEntry]:
    """The requests of one worker's heartbeat that ``scope`` asks for, in queue order
    (waiting tail first, then the running ones), each with the work ahead of it.

    Entries ``skip`` rejects (requests already moved away) are left out and do not
    count as work ahead, as if they had left the queue.
    """
    wid = heartbeat.worker_id
    worker_type = worker_profile(heartbeat)
    kept = [e for e in heartbeat.outstanding if not skip(wid, e)]
    running = [e for e in kept if e.running]
    waiting = [e for e in kept if not e.running]
    ahead_s = sum(e.remaining_s for e in running)
    tail_from = 0 if scope.waiting_tail is None else max(0, len(waiting) - scope.waiting_tail)
    listed: list[ListedEntry] = []
    for index, entry in enumerate(waiting):
        if index >= tail_from:
            listed.append(ListedEntry(wid, worker_type, entry, ahead_s))
        ahead_s += entry.remaining_s
    if scope.running:
        listed.extend(ListedEntry(wid, worker_type, e, 0.0) for e in running)
    return listed


def request_view(
    listed: ListedEntry,
    predictor: FittedPredictor | None,
    use: PredictionUse,
    model: str,
) -> RequestView:
    """The policy's view of a listed request, predicted with the published model as the
    scheduler predicts (:mod:`switchyard.prediction.views`); the worker's own type, when
    the prediction does not cover it, at the ``remaining_s`` the worker reports."""
    entry = listed.entry
    facts = LlmRequestFacts(
        request_id=entry.request_id,
        arrival_s=entry.arrival_s if entry.arrival_s is not None else entry.queued_at_s,
        prompt_tokens=entry.prompt_tokens,
        workload=entry.workload,
        model=model,
        output_tokens_hint=entry.output_tokens_hint,
        deadline_s=entry.deadline_s,
    )
    view = shared_request_view(facts, predict(facts, predictor, use))
    if listed.worker_type in view.calibrated_s:
        return view
    return replace(
        view,
        predicted_s={**view.predicted_s, listed.worker_type: entry.remaining_s},
        calibrated_s={**view.calibrated_s, listed.worker_type: entry.remaining_s},
    )


def model_of(heartbeat: Heartbeat) -> str:
    """The model a worker serves: its resident model, else the model part of its profile."""
    if heartbeat.resident_models:
        return heartbeat.resident_models[0]
    return worker_profile(heartbeat).rpartition("/")[2]


def model_groups(view: ClusterView) -> list[ClusterView]:
    """The cluster split by served model: one view per model, of the workers with a
    performance profile that serve it (in model order). Torch workers are left out."""
    groups: dict[str, list[WorkerRecord]] = {}
    for record in view.workers:
        heartbeat = record.heartbeat
        if heartbeat is None or heartbeat.profile is None:
            continue
        groups.setdefault(model_of(heartbeat), []).append(record)
    return [replace(view, workers=tuple(groups[model])) for model in sorted(groups)]


def select_listed(
    view: ClusterView,
    *,
    worker_timeout_s: float,
    scope: QueueScope,
    skip: SkipEntry = _never,
) -> list[ListedEntry]:
    """Every listed request of every live worker (ordered by worker id), leaving out
    what ``skip`` rejects (requests moved recently). A draining worker's are left out:
    its drain hands over what waits, and what runs finishes there."""
    listed: list[ListedEntry] = []
    for record in view.workers:
        heartbeat = record.heartbeat
        if heartbeat is None or not record.takes_work(worker_timeout_s):
            continue
        listed.extend(listed_entries(heartbeat, scope, skip))
    return listed


@dataclass(frozen=True, slots=True)
class LoadAdjustment:
    """What migrations decided but not yet visible in a worker's heartbeat change in its
    view (added to the reported figures; negative on a source, positive on a target)."""

    waiting: int = 0
    running: int = 0
    work_s: float = 0.0
    tokens: int = 0
    kv_used_tokens: int = 0

    def __add__(self, other: LoadAdjustment) -> LoadAdjustment:
        return LoadAdjustment(
            self.waiting + other.waiting,
            self.running + other.running,
            self.work_s + other.work_s,
            self.tokens + other.tokens,
            self.kv_used_tokens + other.kv_used_tokens,
        )


def adjusted(worker: WorkerView, change: LoadAdjustment | None) -> WorkerView:
    """``worker`` with ``change`` applied (figures floored at 0)."""
    if change is None:
        return worker
    waiting = max(0, worker.waiting + change.waiting)
    return replace(
        worker,
        waiting=waiting,
        running=max(0, worker.running + change.running),
        queued_work_s=max(0.0, worker.queued_work_s + change.work_s),
        queued_tokens=max(0, worker.queued_tokens + change.tokens),
        kv_used_tokens=max(0, worker.kv_used_tokens + change.kv_used_tokens),
        utilization=1.0 if waiting > 0 else worker.utilization,
    )


def build_rebalance_snapshot(
    view: ClusterView,
    listed: list[ListedEntry],
    predictor: FittedPredictor | None,
    *,
    use: PredictionUse = PredictionUse.CALIBRATED,
    worker_timeout_s: float,
    adjustments: Mapping[str, LoadAdjustment] | None = None,
) -> RebalanceSnapshot:
    """The snapshot a rebalancer plans over: every worker with a heartbeat (``alive``
    per :meth:`~switchyard.cluster.WorkerRecord.takes_work`: not draining, load changed by ``adjustments`` by
    worker id), the ``listed`` requests, and the recent violation rate from
    ``cluster:stats``."""
    models: dict[str, str] = {}
    for record in view.workers:
        if record.heartbeat is not None:
            models[record.worker_id] = model_of(record.heartbeat)
    queued = tuple(
        QueuedRequestView(
            request=request_view(item, predictor, use, models.get(item.worker_id, "")),
            worker_id=item.worker_id,
            phase=RequestPhase.RUNNING if item.entry.running else RequestPhase.WAITING,
            queued_at_s=item.entry.queued_at_s,
            work_ahead_s=item.work_ahead_s,
            remaining_s=item.entry.remaining_s,
            kv_tokens=item.entry.kv_tokens,
            generated_tokens=item.entry.generated_tokens,
        )
        for item in listed
    )
    cluster = cluster_snapshot(view, worker_timeout_s)
    if adjustments:
        cluster = replace(
            cluster,
            workers=tuple(adjusted(w, adjustments.get(w.worker_id)) for w in cluster.workers),
        )
    return RebalanceSnapshot(
        cluster=cluster,
        queued=queued,
        recent_slo_violation_rate=view.recent_violation_rate,
    )
