"""Window-based discrete-event simulation of classification requests (SneakPeek).

The shell around a :class:`~switchyard.selection.base.WindowScheduler`, in virtual time:

1. Workload (from the seed alone, so every scheduler sees the same requests): each
   window of ``window_s`` receives ``requests_per_window`` requests, split evenly over
   the ``apps`` applications taking part (12 over 3: 4 each; a remainder goes to the
   first applications). An application's requests are real held-out rows of its test
   split whose labels follow its stream class mix
   (:func:`~switchyard.apps.datasets.sample_stream`); they arrive uniformly over the
   window; each has a relative deadline drawn from ``Normal(deadline_s,
   deadline_std_s)``, clipped to at least 1 ms (0.001 s).
2. SneakPeek: one :class:`~switchyard.estimation.NeighbourIndex` per dataset over its
   training split (built once per simulator), a Dirichlet prior (``prior``, or each
   application's own) and the variants' profiled recalls give every request ``theta``
   and each variant's expected accuracy. A *data-aware* scheduler receives them.
3. At each window's end (``now_s``) the scheduler gets every request that arrived in
   the window, the applications' views (:func:`~switchyard.selection.views.app_view`:
   profiles x the emulated-device scale) and the workers (when each is free, which
   variant is loaded, carried over from earlier windows). ``schedule`` is timed with
   ``time.perf_counter``, the only wall clock this module reads, with the collector
   paused as the scheduler service pauses it (:func:`~switchyard.heap.collector_paused`).
4. The plan must cover each request exactly once (:class:`PlanError`, naming the
   scheduler, otherwise). The shell then executes it with *real inference*: each batch
   runs its variant's ``predict_proba`` on the requests' real features; a request is
   right when the argmax is its true label. Timing is virtual: on each worker the
   batches run in planned order, each from ``max(planned start, worker free, now)``,
   plus the variant's load time when another (application, variant) was resident (a
   worker starts with none), plus the profiled batch latency x scale. With a scheduler
   whose arithmetic matches the profiles this is exactly the planned ``end_s``; any gap
   is reported as ``plan_drift_s``. Short-circuited requests are answered at ``now_s``
   with SneakPeek's label; rejected requests earn nothing.

Emulated edge device: the profiled CPU latencies (0.01 to 0.25 ms a batch) are
multiplied by ``latency_scale`` (default 100) and load times by ``load_scale``
(default 10); see :mod:`switchyard.selection.views`. Reports label these figures as
emulation.

Same registry, configuration, scheduler and seed: the same outcomes and metrics, except
the two overhead figures.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NoReturn

import numpy as np
from numpy.typing import NDArray
from switchyard.apps.datasets import Dataset, load_dataset, sample_stream
from switchyard.apps.registry import Application, Registry
from switchyard.apps.variants import Variant, load_variant
from switchyard.estimation import (
    NeighbourIndex,
    SneakPeekEstimator,
)
from switchyard.estimation.application import estimator_for_application
from switchyard.heap import collector_paused
from switchyard.policies.base import DecisionContext
from switchyard.selection.base import WindowPlan, WindowScheduler, batch_latency_s
from switchyard.selection.snapshot import (
    AppView,
    VariantView,
    WindowRequest,
    WindowSnapshot,
    WorkerSlot,
)
from switchyard.selection.views import app_view

from research.window.config import DEFAULT_PENALTIES, WindowSimConfig
from research.window.metrics import Outcome, RequestOutcome, WindowSimResult, summarise

__all__ = [
    "PlanError",
    "WindowSimulator",
    "simulate_windows",
]


class PlanError(ValueError):
    """A scheduler returned a plan the shell cannot execute; the message names it."""


@dataclass(frozen=True, slots=True)
class _App:
    """One application taking part: its registry entry, data, models and estimator."""

    name: str
    application: Application
    dataset: Dataset
    view: AppView
    models: Mapping[str, Variant]
    estimator: SneakPeekEstimator


@dataclass(frozen=True, slots=True)
class _Request:
    """One generated request with everything the shell knows about it."""

    request_id: str
    app: str
    window: int
    arrival_s: float
    deadline_s: float
    features: NDArray[np.float32]
    label: int
    theta: tuple[float, ...]
    expected_accuracy: Mapping[str, float]
    predicted_label: int
    problem: str | None = None
    """Why the shell refuses the request before scheduling (malformed features)."""


UNKNOWN_APP = "no-such-app"
"""The application a corrupted request names (fault injection)."""


def feature_problem(features: NDArray[np.float32], expected_dim: int) -> str | None:
    """What is wrong with a request's features, in one line naming the field, or None.

    Example: 13 values where the application expects 30 -> ``"features: 13 values,
    expected 30"``; a NaN at position 4 -> ``"features[4]: nan is not a finite number"``.
    """
    if features.ndim != 1 or features.shape[0] != expected_dim:
        return f"features: {features.size} values, expected {expected_dim}"
    bad = np.flatnonzero(~np.isfinite(features))
    if bad.size:
        i = int(bad[0])
        return f"features[{i}]: {features[i]} is not a finite number"
    return None


class WindowSimulator:
    """Holds the loaded models and SneakPeek indexes; runs schedulers on seeded workloads.

    Args:
        registry: the applications (their first ``config.apps``, cycled when more).
        registry_dir: the registry file's folder (model files are relative to it).
        config: the settings; ``config.seed`` is the default seed of :meth:`run`.

    Raises:
        ValueError: a variant without a profile for ``config.worker_type``, or a bad
            SneakPeek setting (``k`` above the training rows); model files that cannot
            be loaded raise :class:`~switchyard.apps.variants.VariantFileError`.
    """

    def __init__(self, registry: Registry, registry_dir: Path, config: WindowSimConfig) -> None:
        self._config = config
        count = len(registry.applications) if config.apps is None else config.apps
        penalty = None if config.penalty is None else DEFAULT_PENALTIES[config.penalty]
        indexes: dict[str, NeighbourIndex] = {}
        models: dict[tuple[str, str], Variant] = {}
        apps: list[_App] = []
        for position in range(count):
            application = registry.applications[position % len(registry.applications)]
            copy = position // len(registry.applications)
            name = application.name if copy == 0 else f"{application.name}#{copy + 1}"
            for variant_name, profile in application.variants.items():
                if config.worker_type not in profile.latency_s:
                    raise ValueError(
                        f"worker_type: application {application.name!r} variant "
                        f"{variant_name!r} has no profile for {config.worker_type!r}"
                    )
                key = (application.name, variant_name)
                if key not in models:
                    models[key] = load_variant(profile.model_path(registry_dir))
            dataset = load_dataset(application.dataset)
            apps.append(
                _App(
                    name=name,
                    application=application,
                    dataset=dataset,
                    view=app_view(
                        application,
                        latency_scale=config.latency_scale,
                        load_scale=config.load_scale,
                        penalty=penalty,
                        name=name,
                    ),
                    models={v: models[(application.name, v)] for v in application.variants},
                    estimator=estimator_for_application(
                        application,
                        index_kind=config.index,
                        k=config.k,
                        prior_kind=config.prior,
                        indexes=indexes,
                        dataset=dataset,
                    ),
                )
            )
        self._apps = tuple(apps)
        self._views: Mapping[str, AppView] = {app.name: app.view for app in apps}
        self._workloads: dict[int, tuple[tuple[_Request, ...], ...]] = {}

    @property
    def config(self) -> WindowSimConfig:
        return self._config

    @property
    def app_names(self) -> tuple[str, ...]:
        """The applications taking part, in order."""
        return tuple(app.name for app in self._apps)

    @property
    def views(self) -> Mapping[str, AppView]:
        """Each application's view, as schedulers get it."""
        return self._views

    def workload(self, seed: int) -> tuple[tuple[_Request, ...], ...]:
        """The requests of each window for ``seed`` (generated once, then cached)."""
        if seed not in self._workloads:
            self._workloads[seed] = self._generate(seed)
        return self._workloads[seed]

    def _generate(self, seed: int) -> tuple[tuple[_Request, ...], ...]:
        config = self._config
        napps = len(self._apps)
        per_window = [
            config.requests_per_window // napps
            + (1 if i < config.requests_per_window % napps else 0)
            for i in range(napps)
        ]
        windows: list[list[_Request]] = [[] for _ in range(config.windows)]
        for position, (app, count) in enumerate(zip(self._apps, per_window, strict=True)):
            if count == 0:
                continue
            rng = np.random.default_rng([seed, position])
            total = count * config.windows
            features, labels = sample_stream(
                app.dataset, app.application.stream_class_mix, total, rng
            )
            offsets = rng.uniform(0.0, config.window_s, size=total)
            if config.deadline_std_s > 0:
                relative = rng.normal(config.deadline_s, config.deadline_std_s, size=total)
            else:
                relative = np.full(total, config.deadline_s)
            relative = np.maximum(relative, 0.001)
            # Drawn after everything else, so a fraction of 0 leaves the workload as is.
            corrupt = (
                rng.random(total) < config.malformed_fraction
                if config.malformed_fraction > 0
                else np.zeros(total, dtype=bool)
            )
            estimates = app.estimator.estimate(features)
            for n in range(total):
                window = n // count
                arrival = window * config.window_s + float(offsets[n])
                request = _Request(
                    request_id=f"w{window}/{app.name}/{n % count}",
                    app=app.name,
                    window=window,
                    arrival_s=arrival,
                    deadline_s=arrival + float(relative[n]),
                    features=features[n],
                    label=int(labels[n]),
                    theta=tuple(float(t) for t in estimates.theta[n]),
                    expected_accuracy={
                        v: float(a[n]) for v, a in estimates.expected_accuracy.items()
                    },
                    predicted_label=int(estimates.predicted_label[n]),
                )
                if corrupt[n]:
                    request = _corrupted(request, n, app.dataset.x_train.shape[1])
                windows[window].append(request)
        return tuple(
            tuple(sorted(requests, key=lambda r: (r.arrival_s, r.request_id)))
            for requests in windows
        )

    def run(self, scheduler: WindowScheduler, seed: int | None = None) -> WindowSimResult:
        """Run ``scheduler`` over the workload of ``seed`` (default ``config.seed``).

        Raises:
            PlanError: the plan misses or repeats a request, names an unknown request,
                worker, application or variant, or batches another application's request.
        """
        config = self._config
        seed = config.seed if seed is None else seed
        name = scheduler.name
        data_aware = scheduler.data_aware
        free_at = [0.0] * config.workers
        loaded: list[tuple[str, str] | None] = [None] * config.workers
        worker_ids = tuple(f"w{i}" for i in range(config.workers))
        outcomes: list[RequestOutcome] = []
        overhead_s: list[float] = []
        swaps = 0
        drift = 0.0
        for window, all_requests in enumerate(self.workload(seed)):
            now = (window + 1) * config.window_s
            # Malformed requests never reach the scheduler: refused here, the rest goes on.
            requests = []
            for r in all_requests:
                if r.problem is None:
                    requests.append(r)
                else:
                    outcomes.append(_rejected(r, r.problem))
            snapshot = WindowSnapshot(
                now_s=now,
                requests=tuple(_view(r, data_aware) for r in requests),
                apps=self._views,
                workers=tuple(
                    WorkerSlot(
                        worker_id=worker_ids[i],
                        worker_type=config.worker_type,
                        free_at_s=free_at[i],
                        loaded=loaded[i],
                    )
                    for i in range(config.workers)
                ),
            )
            ctx = DecisionContext(rng=random.Random(seed * 1_000_003 + window), sequence=window)
            with collector_paused():  # as the scheduler service decides a window
                started = time.perf_counter()
                plan = scheduler.schedule(snapshot, ctx)
                overhead_s.append(time.perf_counter() - started)
            by_id = {r.request_id: r for r in requests}
            _check_plan(name, plan, by_id, self._views, worker_ids)
            for request_id in plan.short_circuited:
                r = by_id[request_id]
                outcomes.append(self._outcome(r, "short-circuit", now, r.predicted_label))
            for request_id, reason in plan.rejected:
                outcomes.append(_rejected(by_id[request_id], reason))
            order = sorted(
                range(len(plan.batches)),
                key=lambda i: (plan.batches[i].start_s, plan.batches[i].end_s, i),
            )
            for i in order:
                batch = plan.batches[i]
                w = worker_ids.index(batch.worker_id)
                variant = _variant(self._views[batch.app], batch.variant)
                swap = 0.0 if loaded[w] == (batch.app, batch.variant) else variant.load_s
                start = max(batch.start_s, free_at[w], now)
                end = (
                    start
                    + swap
                    + batch_latency_s(variant, config.worker_type, len(batch.request_ids))
                )
                drift = max(drift, abs(end - batch.end_s))
                swaps += 1 if swap > 0 else 0
                free_at[w] = end
                loaded[w] = (batch.app, batch.variant)
                batch_requests = [by_id[rid] for rid in batch.request_ids]
                model = self._app(batch.app).models[batch.variant]
                proba = model.predict_proba(np.stack([r.features for r in batch_requests]))
                predicted = np.argmax(proba, axis=1)
                for r, p in zip(batch_requests, predicted, strict=True):
                    outcomes.append(self._outcome(r, "batch", end, int(p), batch.variant))
        outcomes.sort(key=lambda o: (o.window, o.arrival_s, o.request_id))
        return summarise(name, seed, outcomes, overhead_s, swaps=swaps, plan_drift_s=drift)

    def _app(self, name: str) -> _App:
        for app in self._apps:
            if app.name == name:
                return app
        raise KeyError(name)  # pragma: no cover - plans are checked first

    def _outcome(
        self,
        r: _Request,
        how: Outcome,
        finish_s: float,
        answer: int,
        variant: str | None = None,
    ) -> RequestOutcome:
        correct = answer == r.label
        factor = self._views[r.app].penalty.factor(finish_s - r.deadline_s)
        return _record(
            r,
            how=how,
            finish_s=finish_s,
            correct=correct,
            utility=factor if correct else 0.0,
            variant=variant,
        )


def _rejected(r: _Request, reason: str) -> RequestOutcome:
    return _record(r, how="rejected", finish_s=None, correct=False, utility=0.0, reason=reason)


def _record(
    r: _Request,
    *,
    how: Outcome,
    finish_s: float | None,
    correct: bool,
    utility: float,
    variant: str | None = None,
    reason: str | None = None,
) -> RequestOutcome:
    return RequestOutcome(
        request_id=r.request_id,
        app=r.app,
        window=r.window,
        label=r.label,
        arrival_s=r.arrival_s,
        deadline_s=r.deadline_s,
        how=how,
        finish_s=finish_s,
        correct=correct,
        utility=utility,
        variant=variant,
        reason=reason,
    )


def _corrupted(request: _Request, n: int, dim: int) -> _Request:
    """``request`` spoilt one of three ways, in turn by ``n``: a NaN feature, a feature
    vector one short, or an application nobody registered."""
    kind = n % 3
    if kind == 0:
        features = request.features.copy()
        features[n % dim] = np.nan
        return replace(request, features=features, problem=feature_problem(features, dim))
    if kind == 1:
        features = request.features[:-1].copy()
        return replace(request, features=features, problem=feature_problem(features, dim))
    return replace(request, app=UNKNOWN_APP)


def _view(r: _Request, data_aware: bool) -> WindowRequest:
    if not data_aware:
        return WindowRequest(
            request_id=r.request_id, app=r.app, arrival_s=r.arrival_s, deadline_s=r.deadline_s
        )
    return WindowRequest(
        request_id=r.request_id,
        app=r.app,
        arrival_s=r.arrival_s,
        deadline_s=r.deadline_s,
        theta=r.theta,
        expected_accuracy=r.expected_accuracy,
    )


def _variant(app: AppView, name: str) -> VariantView:
    for variant in app.variants:
        if variant.name == name:
            return variant
    raise KeyError(name)


def _check_plan(
    scheduler: str,
    plan: WindowPlan,
    requests: Mapping[str, _Request],
    apps: Mapping[str, AppView],
    worker_ids: Sequence[str],
) -> None:
    """Raise :class:`PlanError` unless ``plan`` covers each request exactly once, validly."""

    def fail(message: str) -> NoReturn:
        raise PlanError(f"scheduler {scheduler!r} returned an invalid plan: {message}")

    seen: dict[str, str] = {}

    def take(request_id: str, where: str) -> None:
        if request_id not in requests:
            fail(f"{where} names unknown request {request_id!r}")
        if request_id in seen:
            fail(f"request {request_id!r} appears twice ({seen[request_id]} and {where})")
        seen[request_id] = where

    for i, batch in enumerate(plan.batches):
        where = f"batch {i}"
        if batch.worker_id not in worker_ids:
            fail(f"{where} names unknown worker {batch.worker_id!r}")
        if batch.app not in apps:
            fail(f"{where} names unknown application {batch.app!r}")
        if all(v.name != batch.variant for v in apps[batch.app].variants):
            fail(f"{where} names unknown variant {batch.variant!r} of {batch.app!r}")
        if not batch.request_ids:
            fail(f"{where} holds no request")
        if not (math.isfinite(batch.start_s) and math.isfinite(batch.end_s)):
            fail(f"{where} has a non-finite start or end")
        for request_id in batch.request_ids:
            take(request_id, where)
            if requests[request_id].app != batch.app:
                fail(
                    f"{where} runs {batch.app!r} on request {request_id!r} "
                    f"of {requests[request_id].app!r}"
                )
    for request_id in plan.short_circuited:
        take(request_id, "short_circuited")
    for request_id, _reason in plan.rejected:
        take(request_id, "rejected")
    missing = [r for r in requests if r not in seen]
    if missing:
        shown = ", ".join(repr(r) for r in missing[:3])
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        fail(f"request {shown}{more} neither batched, short-circuited nor rejected")


def simulate_windows(
    registry: Registry,
    registry_dir: Path,
    scheduler: WindowScheduler,
    config: WindowSimConfig,
) -> WindowSimResult:
    """One run: ``WindowSimulator(registry, registry_dir, config).run(scheduler)``."""
    return WindowSimulator(registry, registry_dir, config).run(scheduler)
