"""Scheduling classification requests in windows: the live shell around a window scheduler.

The scheduler service gathers the classification requests that arrived together into
one window and hands it to the same :class:`~switchyard.selection.base.WindowScheduler`
the window simulator runs: which model variant answers each request, batched how, on
which worker, in what order. This module is pure: it builds the
:class:`~switchyard.selection.snapshot.WindowSnapshot` from heartbeats and estimates,
and turns the plan into assignments and direct answers.

Times inside a window are epoch seconds. Workers are the torch workers (those whose
heartbeat lists classification applications among its servable models); their
``free_at_s`` is when their queued work ends by their own estimate, plus what this
scheduler planned on them since.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from switchyard.contracts.messages import (
    AccuracyEstimate,
    ClassificationPayload,
    ClassificationResult,
    Completion,
    CompletionStatus,
    Heartbeat,
    InferenceRequest,
    RequestTimeline,
)
from switchyard.policies.base import DecisionContext
from switchyard.selection.base import WindowPlan, WindowScheduler
from switchyard.selection.snapshot import AppView, WindowRequest, WindowSnapshot, WorkerSlot

SHORT_CIRCUIT_WORKER = "estimator"
"""The ``worker_id``, worker type and variant of an answer the plan short-circuited:
given by the estimator's own label, no worker ran it."""


def serves_classification(heartbeat: Heartbeat, app: str) -> bool:
    """Whether the worker can serve application ``app``'s variants."""
    return any(m == app or m.startswith(f"{app}/") for m in heartbeat.servable_models)


def loaded_pair(heartbeat: Heartbeat) -> tuple[str, str] | None:
    """The (application, variant) most recently resident on the worker, if any."""
    for model in reversed(heartbeat.resident_models):
        app, sep, variant = model.partition("/")
        if sep:
            return app, variant
    return None


@dataclass(frozen=True, slots=True)
class PlannedAssignment:
    """One request's place in a window plan."""

    request: InferenceRequest
    worker_id: str
    variant: str
    order: float
    predicted_s: float


@dataclass(frozen=True, slots=True)
class WindowDecision:
    """What a window plan means for the bus: assignments and answers given directly."""

    assignments: tuple[PlannedAssignment, ...]
    answers: tuple[Completion, ...]
    expected_utility: float


def window_snapshot(
    requests: Sequence[InferenceRequest],
    estimates: Mapping[str, AccuracyEstimate],
    apps: Mapping[str, AppView],
    workers: Sequence[Heartbeat],
    busy_until_s: Mapping[str, float],
    now_s: float,
    *,
    data_aware: bool,
) -> WindowSnapshot:
    """The window of ``requests`` (classification only) over the classification workers."""
    views = []
    for request in requests:
        estimate = estimates.get(request.request_id) if data_aware else None
        deadline_s = request.deadline_s if request.deadline_s is not None else request.arrival_s
        views.append(
            WindowRequest(
                request_id=request.request_id,
                app=request.app,
                arrival_s=request.arrival_s,
                deadline_s=deadline_s,
                theta=tuple(estimate.theta) if estimate is not None else None,
                expected_accuracy=dict(estimate.expected_accuracy)
                if estimate is not None
                else None,
            )
        )
    # Variants are profiled on some worker types (``cpu`` on this machine); a worker of
    # an unprofiled type is planned with the first profiled type's figures.
    profiled = {t for app in apps.values() for v in app.variants for t in v.latency_s}
    fallback = min(profiled) if profiled else "cpu"
    slots = []
    for heartbeat in workers:
        reported_s = now_s + heartbeat.queued_work_s
        slots.append(
            WorkerSlot(
                worker_id=heartbeat.worker_id,
                worker_type=heartbeat.worker_type
                if heartbeat.worker_type in profiled
                else fallback,
                free_at_s=max(reported_s, busy_until_s.get(heartbeat.worker_id, now_s)),
                loaded=loaded_pair(heartbeat),
            )
        )
    used = {request.app for request in requests}
    return WindowSnapshot(
        now_s=now_s,
        requests=tuple(views),
        apps={name: view for name, view in apps.items() if name in used},
        workers=tuple(slots),
    )


def decide_window(
    scheduler: WindowScheduler,
    snapshot: WindowSnapshot,
    requests: Sequence[InferenceRequest],
    estimates: Mapping[str, AccuracyEstimate],
    ctx: DecisionContext,
) -> tuple[WindowDecision, dict[str, float]]:
    """Run ``scheduler`` on ``snapshot``; the assignments, direct answers, and when each
    worker's planned work ends (epoch seconds)."""
    plan: WindowPlan = scheduler.schedule(snapshot, ctx)
    by_id = {request.request_id: request for request in requests}
    assignments: list[PlannedAssignment] = []
    busy_until_s: dict[str, float] = {}
    for batch in plan.batches:
        # Batches run in plan order on each worker: the start time orders the queue.
        duration_s = max(0.0, batch.end_s - batch.start_s)
        for position, request_id in enumerate(batch.request_ids):
            assignments.append(
                PlannedAssignment(
                    request=by_id[request_id],
                    worker_id=batch.worker_id,
                    variant=batch.variant,
                    order=batch.start_s + position * 1e-9,
                    predicted_s=duration_s,
                )
            )
        busy_until_s[batch.worker_id] = max(busy_until_s.get(batch.worker_id, 0.0), batch.end_s)
    now_s = snapshot.now_s
    answers: list[Completion] = []
    for request_id in plan.short_circuited:
        request = by_id[request_id]
        estimate = estimates.get(request_id)
        label = estimate.predicted_label if estimate is not None else None
        if estimate is None or label is None:
            answers.append(
                failed_answer(
                    request, now_s, "short-circuited without an estimate", assigned_s=now_s
                )
            )
            continue
        answers.append(
            Completion(
                request_id=request_id,
                app=request.app,
                worker_id=SHORT_CIRCUIT_WORKER,
                worker_type=SHORT_CIRCUIT_WORKER,
                variant=SHORT_CIRCUIT_WORKER,
                status=CompletionStatus.OK,
                result=ClassificationResult(label=label, probabilities=list(estimate.theta)),
                timeline=RequestTimeline(
                    arrival_s=request.arrival_s,
                    assigned_s=now_s,
                    started_s=now_s,
                    finished_s=now_s,
                ),
                deadline_s=request.deadline_s,
                reply_to=request.reply_to,
            )
        )
    for request_id, reason in plan.rejected:
        answers.append(
            failed_answer(
                by_id[request_id], now_s, f"rejected by the scheduler: {reason}", assigned_s=now_s
            )
        )
    return (
        WindowDecision(tuple(assignments), tuple(answers), plan.expected_utility),
        busy_until_s,
    )


def failed_answer(
    request: InferenceRequest,
    now_s: float,
    reason: str,
    *,
    epoch: int = 0,
    assigned_s: float | None = None,
) -> Completion:
    """The FAILED answer the scheduler gives ``request`` itself (no worker ran it)."""
    return Completion(
        request_id=request.request_id,
        app=request.app,
        worker_id=SHORT_CIRCUIT_WORKER,
        worker_type=SHORT_CIRCUIT_WORKER,
        variant=SHORT_CIRCUIT_WORKER,
        epoch=epoch,
        status=CompletionStatus.FAILED,
        error=reason[:2000],
        timeline=RequestTimeline(
            arrival_s=request.arrival_s, assigned_s=assigned_s, finished_s=now_s
        ),
        deadline_s=request.deadline_s,
        reply_to=request.reply_to,
    )


def is_classification(request: InferenceRequest) -> bool:
    return isinstance(request.payload, ClassificationPayload)
