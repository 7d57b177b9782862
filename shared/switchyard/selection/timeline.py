"""The execution model every window scheduler plans with and every plan is scored by.

A worker runs its batches one after another. It starts on the first one at
``max(now_s, free_at_s)``; a batch whose (application, variant) differs from the one
resident on the worker first pays the variant's ``load_s`` (the swap), after which that
variant is resident; the inference itself takes :func:`batch_latency_s` for the
worker's type and the batch's size. A request earns ``penalty.utility(accuracy,
end_s - deadline_s)`` with the accuracy the scheduler believes in (profiled, or
SneakPeek's per-request estimate). A short-circuited request is answered at ``now_s``
with SneakPeek's own label and earns ``penalty.utility(sneakpeek_accuracy, now_s -
deadline_s)``.

With several workers, placement is list scheduling: each next batch goes to the worker
that would finish it earliest (ties: the first listed), unless the caller names the
worker. A variant only runs on workers whose type it has a latency profile for.

Worked example: one worker of type ``"cpu"`` idle at ``now_s = 0`` with ``("a", "small")``
resident; batches ``[a/small x2, a/large x1]`` with ``small`` taking 3 ms for 2 and
``large`` 10 ms for 1 and 4 ms to load: ``a/small`` runs 0 -> 0.003 s (no swap),
``a/large`` starts at 0.003, swaps until 0.007 and ends at 0.017.

:func:`validate_requests` is the bad-input gate every scheduler runs first: a request the
window cannot serve is rejected with a one-line reason and the rest goes on.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from switchyard.selection.base import (
    PlannedBatch,
    WindowPlan,
    batch_latency_s,
    expected_accuracy,
)
from switchyard.selection.snapshot import AppView, VariantView, WindowRequest, WindowSnapshot

__all__ = [
    "AccuracyFn",
    "BatchSpec",
    "Option",
    "ScoredPlan",
    "Timeline",
    "estimated_accuracy",
    "profiled_accuracy",
    "runs_on",
    "score_plan",
    "short_circuit_utility",
    "validate_requests",
    "without_estimates",
]

AccuracyFn = Callable[[WindowRequest, VariantView], float]
"""A scheduler's belief that a variant answers a request right."""


def profiled_accuracy(request: WindowRequest, variant: VariantView) -> float:
    """The data-oblivious belief: the variant's profiled accuracy, whatever estimate the
    request carries."""
    del request
    return variant.accuracy


estimated_accuracy: AccuracyFn = expected_accuracy
"""The data-aware belief: SneakPeek's estimate for the request when it carries one for
the variant, else the profiled accuracy (:func:`~switchyard.selection.base.expected_accuracy`)."""


def short_circuit_utility(request: WindowRequest, app: AppView, now_s: float) -> float | None:
    """What answering ``request`` at ``now_s`` with SneakPeek's label is worth, or
    ``None`` when the request carries no estimate."""
    accuracy = request.sneakpeek_accuracy
    if accuracy is None:
        return None
    return app.penalty.utility(accuracy, now_s - request.deadline_s)


def without_estimates(requests: Sequence[WindowRequest]) -> list[WindowRequest]:
    """The requests as a data-oblivious scheduler sees them: any SneakPeek estimate
    dropped, so that :func:`~switchyard.selection.base.priority` and
    :func:`~switchyard.selection.base.expected_accuracy` fall back to profiled accuracy."""
    return [
        r
        if r.theta is None and r.expected_accuracy is None
        else WindowRequest(
            request_id=r.request_id, app=r.app, arrival_s=r.arrival_s, deadline_s=r.deadline_s
        )
        for r in requests
    ]


def runs_on(variant: VariantView, worker_type: str) -> bool:
    """Whether ``variant`` has a latency profile for ``worker_type``."""
    return bool(variant.latency_s.get(worker_type))


def _unit_interval(value: float) -> bool:
    return math.isfinite(value) and 0.0 <= value <= 1.0


def _all_in_unit_interval(values: Sequence[float]) -> bool:
    # Three calls in C instead of a test per value (this runs on every request of every
    # window): a NaN or an infinity makes the sum NaN or infinite; min and max then
    # see finite numbers only.
    return not values or (math.isfinite(sum(values)) and min(values) >= 0.0 and max(values) <= 1.0)


def validate_requests(
    snapshot: WindowSnapshot, *, use_estimates: bool
) -> tuple[list[WindowRequest], list[tuple[str, str]]]:
    """Split the window into requests a scheduler can plan and rejected ones.

    A request is rejected, with a one-line reason naming the field, when its request id
    repeats an earlier one, its deadline is not a finite number, it names an unknown
    application, or no variant of its application is profiled for a worker type present
    in the window. With ``use_estimates`` (data-aware schedulers) a malformed estimate
    also rejects it: ``theta`` of the wrong length or outside ``[0, 1]``, or an expected
    accuracy outside ``[0, 1]``. Order is kept.
    """
    worker_types = {w.worker_type for w in snapshot.workers}
    servable: dict[str, bool] = {}
    seen: set[str] = set()
    valid: list[WindowRequest] = []
    rejected: list[tuple[str, str]] = []
    for request in snapshot.requests:
        reason = None
        app = snapshot.apps.get(request.app)
        if request.request_id in seen:
            reason = f"request_id: {request.request_id!r} appears twice in the window"
        elif not math.isfinite(request.deadline_s):
            reason = f"deadline_s: must be a finite number, got {request.deadline_s!r}"
        elif app is None:
            reason = f"app: unknown application {request.app!r}"
        else:
            ok = servable.get(app.name)
            if ok is None:
                ok = any(runs_on(v, t) for v in app.variants for t in worker_types)
                servable[app.name] = ok
            if not ok:
                types = ", ".join(sorted(worker_types)) or "none"
                reason = (
                    f"app: no variant of {app.name!r} is profiled for the window's "
                    f"worker types ({types})"
                )
            elif use_estimates:
                reason = _estimate_problem(request, app)
        seen.add(request.request_id)
        if reason is None:
            valid.append(request)
        else:
            rejected.append((request.request_id, reason))
    return valid, rejected


def _estimate_problem(request: WindowRequest, app: AppView) -> str | None:
    if request.theta is not None:
        if len(request.theta) != app.num_classes:
            return (
                f"theta: {len(request.theta)} class frequencies for {app.name!r}, "
                f"which has {app.num_classes} classes"
            )
        if not _all_in_unit_interval(request.theta):
            return "theta: class frequencies must lie in [0, 1]"
    expected = request.expected_accuracy
    if expected is not None and not _all_in_unit_interval(tuple(expected.values())):
        for variant, value in expected.items():
            if not _unit_interval(value):
                return f"expected_accuracy: {variant!r} must lie in [0, 1], got {value!r}"
    return None


@dataclass(frozen=True, slots=True)
class BatchSpec:
    """One batch of a plan before timing: what runs, for whom, and optionally where."""

    app: str
    variant: str
    request_ids: tuple[str, ...]
    worker_id: str | None = None
    """``None``: list scheduling picks the worker."""


@dataclass(frozen=True, slots=True)
class Option:
    """Where and when a batch would run if committed now."""

    lane: int
    """Index of the worker in the snapshot's ``workers``."""
    start_s: float
    swap_s: float
    end_s: float
    merge: bool
    """Joins the worker's last batch instead of opening a new one."""


@dataclass(frozen=True, slots=True)
class ScoredPlan:
    """A timed plan with what each request is expected to earn."""

    batches: tuple[PlannedBatch, ...]
    utility_by_request: Mapping[str, float]
    short_circuited: tuple[str, ...]
    total_utility: float

    def to_plan(self, rejected: Sequence[tuple[str, str]] = ()) -> WindowPlan:
        """The :class:`WindowPlan` the shell executes."""
        return WindowPlan(
            batches=self.batches,
            short_circuited=self.short_circuited,
            rejected=tuple(rejected),
            expected_utility=self.total_utility,
        )


class _Lane:
    """One worker's mutable state while a plan is built."""

    __slots__ = ("free_s", "last", "loaded", "worker_id", "worker_type")

    def __init__(
        self, worker_id: str, worker_type: str, free_s: float, loaded: tuple[str, str] | None
    ) -> None:
        self.worker_id = worker_id
        self.worker_type = worker_type
        self.free_s = free_s
        self.loaded = loaded
        self.last = -1  # index of this lane's last batch in the timeline, -1: none yet


class _Batch:
    __slots__ = ("app", "end_s", "lane", "requests", "start_s", "swap_s", "variant")

    def __init__(
        self,
        lane: int,
        app: AppView,
        variant: VariantView,
        requests: list[WindowRequest],
        start_s: float,
        swap_s: float,
        end_s: float,
    ) -> None:
        self.lane = lane
        self.app = app
        self.variant = variant
        self.requests = requests
        self.start_s = start_s
        self.swap_s = swap_s
        self.end_s = end_s


class Timeline:
    """A plan under construction on the window's workers (mutable, one window only).

    Schedulers that decide request by request (the EDF family) ask for :meth:`option`
    and :meth:`commit` the one they choose; :func:`score_plan` times a finished list of
    batches. :meth:`result` scores what was committed.
    """

    def __init__(self, snapshot: WindowSnapshot, accuracy: AccuracyFn) -> None:
        self._now_s = snapshot.now_s
        self._apps = snapshot.apps
        self._accuracy = accuracy
        self._lanes = [
            _Lane(w.worker_id, w.worker_type, max(snapshot.now_s, w.free_at_s), w.loaded)
            for w in snapshot.workers
        ]
        self._lane_of = {w.worker_id: i for i, w in enumerate(snapshot.workers)}
        self._batches: list[_Batch] = []
        self._short: list[WindowRequest] = []

    def lane_index(self, worker_id: str) -> int:
        """The position of ``worker_id`` among the snapshot's workers."""
        try:
            return self._lane_of[worker_id]
        except KeyError:
            raise ValueError(f"worker_id: no worker {worker_id!r} in the window") from None

    def option(
        self,
        app: AppView,
        variant: VariantView,
        size: int,
        *,
        lane: int | None = None,
        merge: bool = False,
    ) -> Option | None:
        """Where a batch of ``size`` requests for ``variant`` would finish earliest.

        With ``merge``, on a worker whose last batch in this window runs the same
        (application, variant), the requests would join that batch (its start and swap
        stay, its size grows) instead of opening a new one after it. ``lane`` fixes the
        worker. ``None`` when no (allowed) worker has a profile for the variant.
        """
        best: Option | None = None
        key = (app.name, variant.name)
        lanes = range(len(self._lanes)) if lane is None else (lane,)
        for i in lanes:
            state = self._lanes[i]
            if not runs_on(variant, state.worker_type):
                continue
            last = self._batches[state.last] if state.last >= 0 else None
            if (
                merge
                and last is not None
                and last.app.name == app.name
                and last.variant.name == variant.name
            ):
                run_s = batch_latency_s(variant, state.worker_type, len(last.requests) + size)
                candidate = Option(
                    i, last.start_s, last.swap_s, last.start_s + last.swap_s + run_s, True
                )
            else:
                swap_s = 0.0 if state.loaded == key else variant.load_s
                run_s = batch_latency_s(variant, state.worker_type, size)
                start = state.free_s
                candidate = Option(i, start, swap_s, start + swap_s + run_s, False)
            if best is None or candidate.end_s < best.end_s:
                best = candidate
        return best

    def commit(
        self,
        option: Option,
        app: AppView,
        variant: VariantView,
        requests: Sequence[WindowRequest],
    ) -> None:
        """Run ``requests`` with ``variant`` as ``option`` (from :meth:`option`) says."""
        state = self._lanes[option.lane]
        if option.merge:
            batch = self._batches[state.last]
            batch.requests.extend(requests)
            batch.end_s = option.end_s
        else:
            state.last = len(self._batches)
            self._batches.append(
                _Batch(
                    option.lane,
                    app,
                    variant,
                    list(requests),
                    option.start_s,
                    option.swap_s,
                    option.end_s,
                )
            )
            state.loaded = (app.name, variant.name)
        state.free_s = option.end_s

    def short_circuit(self, request: WindowRequest) -> None:
        """Answer ``request`` at ``now_s`` with SneakPeek's label.

        Raises:
            ValueError: when the request carries no SneakPeek estimate.
        """
        if request.theta is None:
            raise ValueError(
                f"short_circuited: request {request.request_id!r} has no SneakPeek estimate"
            )
        self._short.append(request)

    def utility(self, request: WindowRequest, variant: VariantView, end_s: float) -> float:
        """What ``request`` earns if ``variant`` answers it at ``end_s``."""
        app = self._apps[request.app]
        return app.penalty.utility(self._accuracy(request, variant), end_s - request.deadline_s)

    def result(self) -> ScoredPlan:
        """The committed batches, timed and scored."""
        by_request: dict[str, float] = {}
        total = 0.0
        planned: list[PlannedBatch] = []
        for batch in self._batches:
            for request in batch.requests:
                value = self.utility(request, batch.variant, batch.end_s)
                by_request[request.request_id] = value
                total += value
            planned.append(
                PlannedBatch(
                    worker_id=self._lanes[batch.lane].worker_id,
                    app=batch.app.name,
                    variant=batch.variant.name,
                    request_ids=tuple(r.request_id for r in batch.requests),
                    start_s=batch.start_s,
                    swap_s=batch.swap_s,
                    end_s=batch.end_s,
                )
            )
        for request in self._short:
            answer = short_circuit_utility(request, self._apps[request.app], self._now_s)
            assert answer is not None  # checked in short_circuit()
            by_request[request.request_id] = answer
            total += answer
        return ScoredPlan(
            batches=tuple(planned),
            utility_by_request=by_request,
            short_circuited=tuple(r.request_id for r in self._short),
            total_utility=total,
        )


def score_plan(
    snapshot: WindowSnapshot,
    batches: Sequence[BatchSpec],
    *,
    accuracy: AccuracyFn = estimated_accuracy,
    short_circuited: Sequence[str] = (),
) -> ScoredPlan:
    """Time and score ``batches`` in order on the snapshot's workers.

    Each batch runs on its named worker, or (``worker_id=None``) on the one that would
    finish it earliest. Raises ``ValueError`` naming the field for an unknown request,
    application, variant or worker, or a variant with no profile for the named worker.

    Example: see the module docstring (``a/small`` ends at 0.003 s, ``a/large`` at 0.017 s).
    """
    timeline = Timeline(snapshot, accuracy)
    by_id = {r.request_id: r for r in snapshot.requests}

    def request(request_id: str) -> WindowRequest:
        try:
            return by_id[request_id]
        except KeyError:
            raise ValueError(f"request_ids: no request {request_id!r} in the window") from None

    for spec in batches:
        app = snapshot.apps.get(spec.app)
        if app is None:
            raise ValueError(f"app: unknown application {spec.app!r}")
        variant = next((v for v in app.variants if v.name == spec.variant), None)
        if variant is None:
            raise ValueError(f"variant: {spec.app!r} has no variant {spec.variant!r}")
        lane = None if spec.worker_id is None else timeline.lane_index(spec.worker_id)
        option = timeline.option(app, variant, len(spec.request_ids), lane=lane)
        if option is None:
            raise ValueError(
                f"variant: {spec.app}/{spec.variant} has no profile for the chosen worker"
            )
        timeline.commit(option, app, variant, [request(i) for i in spec.request_ids])
    for request_id in short_circuited:
        timeline.short_circuit(request(request_id))
    return timeline.result()
