"""The scheduler service: every request decided, recorded and sent to its worker.

Routines:

- ``decide``: consumes ``switchyard.requests`` (LLM requests) in batches (group
  ``scheduler``; replicas share the partitions), predicts each in-process with the
  predictor's latest published model and decides it with the LLM policy
  (:mod:`switchyard.cluster.placer`): no round trip, no wait.
- ``windows``: consumes ``switchyard.classification-requests`` in batches (group
  ``scheduler-windows``) and, once their SneakPeek estimates came (at most
  ``SWITCHYARD_PREDICTION_WAIT_S``, when the window scheduler is data-aware), decides
  each batch as one window with the window scheduler (:mod:`services.scheduler.windows`).

  Either round is flushed through a :class:`~services.scheduler.outbox.DecisionOutbox`:
  recorded in the request ledger in one round trip, then sent to each worker's inbox
  partition. A batch is committed only after that, so a scheduler that dies mid-batch
  loses nothing: its successor decides the batch again, and a request the ledger shows
  decided gets that very assignment again.
- ``estimates``: consumes ``switchyard.estimates`` with a group of this replica's own, so
  whichever replica decides a request has its estimate.
- ``cluster``: reads the monitor's worker records every ``min(0.1 s, heartbeat interval
  / 2)``, and the predictor's published model every
  ``SWITCHYARD_PREDICTOR_PUBLISH_INTERVAL_S``.
- ``stages``: consumes ``switchyard.stage-requests`` (pipeline stages) in batches (group
  ``scheduler-stages``) and routes each with the placement policy's router, holding
  those whose model no worker holds yet (:mod:`services.scheduler.stages`).
- ``worker-events``: on a :class:`WorkerDown`, re-assigns the dead worker's unfinished
  requests (:mod:`services.scheduler.reassign`).

A request no live worker can serve yet (no worker of its model has reported) waits in
this replica for up to ``UNPLACED_TIMEOUT_S`` and is retried on every cluster refresh;
then it is answered with a failure that names the model.

Tracing: a batch's assignments are published each inside its request's CONSUMER span
(``Subscription.handling``). A request parked unplaced keeps its trace context (the
ingress's PRODUCER span, from the record's headers): its later assignment, or its
failure, is published in it. Re-assignments continue the request's trace from the
``traceparent`` its record keeps.

Metrics: the ``switchyard.scheduler.*`` instruments made in :class:`SchedulerService`,
listed for operators in docs/architecture.md, "Telemetry".
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.metrics import Observation
from switchyard import __version__
from switchyard.bus import Delivery, Subscription
from switchyard.cluster import ClusterReader
from switchyard.cluster.placer import LlmPlacer
from switchyard.cluster.published_model import PublishedModelReader
from switchyard.contracts.messages import (
    AccuracyEstimate,
    Assignment,
    Heartbeat,
    InferenceRequest,
    LLMPayload,
    StagePayload,
)
from switchyard.contracts.topics import (
    CLASSIFICATION_REQUESTS,
    ESTIMATES,
    REQUESTS,
    WORKER_EVENTS,
)
from switchyard.heap import collector_paused
from switchyard.lifecycle import RequestLedger
from switchyard.multimodel.policy_registry import MultiModelPolicy, make_multimodel_policy
from switchyard.policies.base import DecisionContext, NoWorkerError
from switchyard.policies.registry import LlmPolicy, make_llm_policy
from switchyard.runtime import Service, ServiceContext
from switchyard.selection.base import WindowScheduler
from switchyard.selection.registry import make_window_scheduler
from switchyard.selection.snapshot import AppView
from switchyard.selection.views import app_view
from switchyard.serving.catalogue import ServingCatalogue
from switchyard.state import keys
from switchyard.telemetry.buckets import SECONDS_BUCKETS
from switchyard.telemetry.observables import observe

from services.scheduler.hints import HintBook
from services.scheduler.outbox import DecisionOutbox, FlushReport, Origin, trace_of
from services.scheduler.reassign import Reassigner
from services.scheduler.stages import StagePlacer, StageRouting
from services.scheduler.windows import (
    decide_window,
    failed_answer,
    is_classification,
    serves_classification,
    window_snapshot,
)

log = logging.getLogger(__name__)

UNPLACED_TIMEOUT_S = 30.0
_BATCH = 512
_BATCH_WAIT_S = 0.2
_SCOPE = "switchyard.scheduler"


@dataclass(slots=True)
class _Unplaced:
    request: InferenceRequest
    since_s: float
    epoch: int = 0
    exclude: frozenset[str] = frozenset()
    trace: Context | None = None
    replaces_worker: str | None = None


class SchedulerService(Service):
    """Decides where every request runs; see the module docstring."""

    def __init__(
        self,
        ctx: ServiceContext,
        catalogue: ServingCatalogue,
        llm_policy: LlmPolicy,
        window_scheduler: WindowScheduler,
        placement: MultiModelPolicy | None = None,
    ) -> None:
        super().__init__(ctx)
        self.catalogue = catalogue
        self.llm_policy = llm_policy
        self.window_scheduler = window_scheduler
        seed = abs(hash(ctx.settings.instance_id)) % (2**31)
        self.placer = LlmPlacer(llm_policy, ctx_seed=seed)
        self.ledger = RequestLedger(ctx.state)
        self._cluster = ClusterReader(ctx.state)
        self._model = PublishedModelReader(
            ctx.state, interval_s=ctx.settings.predictor_publish_interval_s
        )
        self._window_rng = random.Random(seed + 1)
        self._window_sequence = 0
        self.estimates: HintBook[AccuracyEstimate] = HintBook()
        self.app_views: dict[str, AppView] = {
            name: app_view(app.spec) for name, app in catalogue.classification.items()
        }
        self._classification_workers: dict[str, Heartbeat] = {}
        self._busy_until_s: dict[str, float] = {}
        self._unplaced: list[_Unplaced] = []
        self.decided = 0
        self.failed_unplaced = 0
        self.cluster_ready = asyncio.Event()
        self.reassigner = Reassigner(self)
        # One policy object for the service's life: its router routes every stage.
        placement = placement or make_multimodel_policy(ctx.settings.placement_policy)
        self.stages = StageRouting(
            self,
            StagePlacer(placement.router, catalogue.models, catalogue.pipelines, seed + 2),
            placement.name,
        )
        tracer = trace.get_tracer(_SCOPE, __version__, ctx.telemetry.tracer_provider)
        self.tracer = tracer
        meter = ctx.telemetry.meter_provider.get_meter(_SCOPE, __version__)
        self._m_decisions = meter.create_counter(
            "switchyard.scheduler.decisions",
            unit="{decision}",
            description="Requests decided, by policy and kind (llm, window, resend, reassign).",
        )
        self._m_latency_s = meter.create_histogram(
            "switchyard.scheduler.decision.latency",
            unit="s",
            description="Seconds from a request's arrival to its assignment.",
            explicit_bucket_boundaries_advisory=SECONDS_BUCKETS,
        )
        self._m_hint_timeouts = meter.create_counter(
            "switchyard.scheduler.hint_timeouts",
            unit="{request}",
            description="Requests whose hint (an estimate) did not come in time.",
        )
        observe(
            ctx.telemetry.meter_provider,
            _SCOPE,
            "switchyard.scheduler.unplaced",
            self._observe_unplaced,
            unit="{request}",
            description="Requests waiting for a live worker that serves them.",
        )

    @property
    def reassigned(self) -> int:
        return self.reassigner.reassigned

    def _observe_unplaced(self) -> Iterable[Observation]:
        waiting = len(self._unplaced) + len(self.stages.held)
        return [Observation(waiting, {"replica": self.ctx.settings.instance_id})]

    def _kind(self, assignment: Assignment) -> str:
        if assignment.epoch > 0:
            return "reassign"
        if isinstance(assignment.request.payload, StagePayload):
            return "stage"
        return "window" if assignment.policy == self.window_scheduler.name else "llm"

    def count(self, report: FlushReport) -> None:
        """Count a flush's decisions and their latency."""
        for assignment in report.assigned:
            attributes = {"policy": assignment.policy, "kind": self._kind(assignment)}
            self._m_decisions.add(1, attributes)
            latency_s = assignment.assigned_at_s - assignment.request.arrival_s
            if latency_s >= 0:
                self._m_latency_s.record(latency_s, attributes)
        for assignment in report.resent:
            self._m_decisions.add(1, {"policy": assignment.policy, "kind": "resend"})
        if report.unaddressed:
            log.warning(
                "%d requests recorded on workers that name no inbox partition: they wait "
                "for those workers' drain or death",
                len(report.unaddressed),
            )

    def forget_worker(self, worker_id: str) -> None:
        """Choose ``worker_id`` no more (it died or drains) until its heartbeats return."""
        self.placer.mark_down(worker_id)
        self.stages.placer.mark_down(worker_id)
        self._classification_workers.pop(worker_id, None)

    async def flush(self, outbox: DecisionOutbox) -> FlushReport:
        """Record and publish a round's decisions (:mod:`services.scheduler.outbox`)."""
        report = await outbox.flush(self.ledger, self.ctx.bus, self.placer.inbox_partition)
        self.count(report)
        return report

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        await self._refresh_cluster()
        self.spawn_routine("cluster", self._cluster_routine)
        self.spawn_routine("estimates", self._estimates_routine)
        self.spawn_routine("worker-events", self._worker_events_routine)
        self.spawn_routine("decide", self._decide_routine)
        self.spawn_routine("windows", self._windows_routine)
        self.spawn_routine("stages", self.stages.routine)

    async def drain(self) -> None:
        await super().drain()
        # Held stages were consumed and committed: hand them to another replica.
        await self.stages.hand_back()

    # -- estimates -----------------------------------------------------------------------

    async def _estimates_routine(self) -> None:
        ctx = self.ctx
        group = f"scheduler-hints-{ctx.settings.instance_id}"
        async with ctx.bus.subscribe(ESTIMATES, group=group, stopping=ctx.stopping) as sub:
            while not ctx.stopping.is_set():
                for delivery in await sub.next_batch(_BATCH, timeout_s=_BATCH_WAIT_S):
                    self.estimates.put(delivery.message.request_id, delivery.message)

    async def _fill_from_state(self, requests: Sequence[InferenceRequest]) -> None:
        """Read the estimates this replica did not receive in time from the state store."""
        wanted = [r.request_id for r in requests if self.estimates.get(r.request_id) is None]
        if not wanted:
            return
        values = await self.ctx.state.get_many([keys.estimate(rid) for rid in wanted])
        for request_id, value in zip(wanted, values, strict=True):
            if value is not None:
                self.estimates.put(request_id, AccuracyEstimate.model_validate_json(value))

    # -- cluster and the predictor's model ---------------------------------------------------

    async def _cluster_routine(self) -> None:
        period_s = min(0.1, self.ctx.settings.heartbeat_interval_s / 2)
        while not self.ctx.stopping.is_set():
            await asyncio.sleep(period_s)
            await self._refresh_cluster()
            if self._unplaced:
                await self._retry_unplaced()
            await self.stages.on_cluster_read()

    async def _refresh_cluster(self) -> None:
        now_s = time.time()
        view = await self._cluster.read(now_s)
        timeout_s = self.ctx.settings.worker_timeout_s
        self.placer.observe_cluster(view, timeout_s)
        self.stages.placer.observe_cluster(view, timeout_s)
        classification: dict[str, Heartbeat] = {}
        for record in view.workers:
            heartbeat = record.heartbeat
            if (
                heartbeat is not None
                and heartbeat.inbox_partition is not None
                and record.takes_work(timeout_s)
                and any(
                    serves_classification(heartbeat, app) for app in self.catalogue.classification
                )
            ):
                classification[record.worker_id] = heartbeat
        self._classification_workers = classification
        if any(record.heartbeat is not None for record in view.workers):
            self.cluster_ready.set()
        self.placer.predictor = await self._model.refresh_due(now_s)

    # -- deciding ------------------------------------------------------------------------

    async def _decide_routine(self) -> None:
        ctx = self.ctx
        async with ctx.bus.subscribe(REQUESTS, group="scheduler", stopping=ctx.stopping) as sub:
            while not ctx.stopping.is_set():
                batch = await sub.next_batch(_BATCH, timeout_s=_BATCH_WAIT_S)
                if batch:
                    await sub.handle_batch(
                        batch, partial(self._decide_batch, sub), on_dead_letter=self.refuse
                    )

    async def _windows_routine(self) -> None:
        ctx = self.ctx
        async with ctx.bus.subscribe(
            CLASSIFICATION_REQUESTS, group="scheduler-windows", stopping=ctx.stopping
        ) as sub:
            while not ctx.stopping.is_set():
                batch = await sub.next_batch(_BATCH, timeout_s=_BATCH_WAIT_S)
                if batch:
                    await sub.handle_batch(
                        batch,
                        partial(self._decide_window_batch, sub),
                        on_dead_letter=self.refuse,
                    )

    async def _decide_batch(
        self, sub: Subscription[InferenceRequest], batch: Sequence[Delivery[InferenceRequest]]
    ) -> None:
        """Decide a batch of LLM requests, one by one."""
        outbox = DecisionOutbox(sub)
        now_s = time.time()
        for delivery in _unique(batch):
            self.place_llm(delivery.message, now_s, 0, frozenset(), outbox, delivery)
        await self.flush(outbox)

    async def _decide_window_batch(
        self, sub: Subscription[InferenceRequest], batch: Sequence[Delivery[InferenceRequest]]
    ) -> None:
        """Decide a batch of classification requests as one window."""
        outbox = DecisionOutbox(sub)
        windows = [d for d in _unique(batch) if is_classification(d.message)]
        if windows and self.window_scheduler.data_aware:
            wait_s = self.ctx.settings.prediction_wait_s
            await self.estimates.wait_for((d.message.request_id for d in windows), wait_s)
            missing = sum(1 for d in windows if self.estimates.get(d.message.request_id) is None)
            if missing:
                self._m_hint_timeouts.add(missing, {"kind": "estimate"})
                await self._fill_from_state([d.message for d in windows])
        if windows:
            self.decide_window(
                [d.message for d in windows], outbox, {d.message.request_id: d for d in windows}
            )
        await self.flush(outbox)

    async def refuse(self, delivery: Delivery[InferenceRequest], reason: str) -> None:
        """Answer a request that could not be decided (dead-lettered with ``reason``), so
        that its client hears why instead of waiting for its timeout."""
        request = delivery.message
        outbox = DecisionOutbox()
        error = f"the scheduler could not decide this request ({reason})"
        outbox.answer(failed_answer(request, time.time(), error), request, delivery)
        await self.flush(outbox)

    def place_llm(
        self,
        request: InferenceRequest,
        now_s: float,
        epoch: int,
        exclude: frozenset[str],
        outbox: DecisionOutbox,
        origin: Origin | None = None,
        replaces_worker: str | None = None,
    ) -> bool:
        """Decide an LLM request into ``outbox`` (epoch > 0: a re-assignment replacing
        ``epoch - 1`` on ``replaces_worker``); False when it was parked unplaced."""
        try:
            placed = self.placer.place(request, now_s, exclude)
        except NoWorkerError:
            self._unplaced.append(
                _Unplaced(request, now_s, epoch, exclude, trace_of(origin), replaces_worker)
            )
            return False
        assignment = placed.assignment(
            request, self.llm_policy.name, epoch=epoch, assigned_at_s=time.time()
        )
        self.assign(outbox, assignment, origin, replaces_worker)
        return True

    def assign(
        self,
        outbox: DecisionOutbox,
        assignment: Assignment,
        origin: Origin | None,
        replaces_worker: str | None,
    ) -> None:
        epoch = assignment.epoch
        outbox.assign(
            assignment,
            origin,
            replaces_epoch=None if epoch == 0 else epoch - 1,
            replaces_worker=replaces_worker,
        )
        self.decided += 1

    def decide_window(
        self,
        requests: list[InferenceRequest],
        outbox: DecisionOutbox,
        origins: Mapping[str, Origin],
        epoch: int = 0,
        replaces_worker: str | None = None,
    ) -> None:
        """Plan ``requests`` as one window."""
        if not self._classification_workers:
            now_s = time.time()
            self._unplaced.extend(
                _Unplaced(
                    request,
                    now_s,
                    epoch,
                    trace=trace_of(origins.get(request.request_id)),
                    replaces_worker=replaces_worker,
                )
                for request in requests
            )
            return
        estimates = {
            r.request_id: e
            for r in requests
            if (e := self.estimates.take(r.request_id)) is not None
        }
        now_s = time.time()
        snapshot = window_snapshot(
            requests,
            estimates,
            self.app_views,
            list(self._classification_workers.values()),
            self._busy_until_s,
            now_s,
            data_aware=self.window_scheduler.data_aware,
        )
        ctx = DecisionContext(self._window_rng, self._window_sequence)
        self._window_sequence += 1
        with collector_paused():  # a collection inside would set the decision's tail
            decision, busy_until_s = decide_window(
                self.window_scheduler, snapshot, requests, estimates, ctx
            )
        for worker_id, until_s in busy_until_s.items():
            self._busy_until_s[worker_id] = max(self._busy_until_s.get(worker_id, 0.0), until_s)
        assigned_at_s = time.time()
        for planned in decision.assignments:
            assignment = Assignment(
                request=planned.request,
                worker_id=planned.worker_id,
                variant=planned.variant,
                order=planned.order,
                policy=self.window_scheduler.name,
                epoch=epoch,
                predicted_s=planned.predicted_s,
                deadline_s=planned.request.deadline_s,
                assigned_at_s=assigned_at_s,
            )
            self.assign(
                outbox, assignment, origins.get(planned.request.request_id), replaces_worker
            )
        by_id = {request.request_id: request for request in requests}
        for answer in decision.answers:
            outbox.answer(
                answer, by_id[answer.request_id], origins.get(answer.request_id), epoch=epoch
            )
            self._m_decisions.add(
                1, {"policy": self.window_scheduler.name, "kind": "reassign" if epoch else "window"}
            )
            self.decided += 1

    async def _retry_unplaced(self) -> None:
        waiting, self._unplaced = self._unplaced, []
        now_s = time.time()
        outbox = DecisionOutbox()
        classification: list[_Unplaced] = []
        for item in waiting:
            request = item.request
            if isinstance(request.payload, LLMPayload):
                before = len(self._unplaced)
                if not self.place_llm(
                    request,
                    now_s,
                    item.epoch,
                    item.exclude,
                    outbox,
                    item.trace,
                    item.replaces_worker,
                ):
                    # place_llm parked a fresh entry; keep the original one's time.
                    del self._unplaced[before:]
                    self._park_or_fail(item, now_s, outbox)
            elif self._classification_workers:
                classification.append(item)
            else:
                self._park_or_fail(item, now_s, outbox)
        for epoch in sorted({item.epoch for item in classification}):
            same_epoch = [i for i in classification if i.epoch == epoch]
            for item in same_epoch:
                origins: dict[str, Origin] = {}
                if item.trace is not None:
                    origins[item.request.request_id] = item.trace
                self.decide_window([item.request], outbox, origins, epoch, item.replaces_worker)
        if outbox:
            await self.flush(outbox)

    def _park_or_fail(self, item: _Unplaced, now_s: float, outbox: DecisionOutbox) -> None:
        if now_s - item.since_s < UNPLACED_TIMEOUT_S:
            self._unplaced.append(item)
            return
        request = item.request
        what = (
            f"model {request.payload.model!r}"
            if isinstance(request.payload, LLMPayload)
            else f"application {request.app!r}"
        )
        error = f"no live worker serves {what} (waited {UNPLACED_TIMEOUT_S:.0f} s)"
        outbox.answer(
            failed_answer(request, now_s, error, epoch=item.epoch),
            request,
            item.trace,
            epoch=item.epoch,
        )
        self.failed_unplaced += 1

    # -- worker failures -----------------------------------------------------------------

    async def _worker_events_routine(self) -> None:
        ctx = self.ctx
        async with ctx.bus.subscribe(
            WORKER_EVENTS, group="scheduler-worker-events", stopping=ctx.stopping
        ) as sub:
            async for delivery in sub:
                await sub.handle(delivery, self.reassigner.on_worker_down)


def _unique(batch: Sequence[Delivery[InferenceRequest]]) -> list[Delivery[InferenceRequest]]:
    """The batch with each request once (a copy within a batch is decided once)."""
    fresh: dict[str, Delivery[InferenceRequest]] = {}
    for delivery in batch:
        fresh.setdefault(delivery.message.request_id, delivery)
    return list(fresh.values())


async def create(ctx: ServiceContext, catalogue: ServingCatalogue | None = None) -> Service:
    """The scheduler with ``SWITCHYARD_LLM_POLICY`` and ``SWITCHYARD_WINDOW_POLICY``."""
    if catalogue is None:
        from switchyard.serving.artifacts import load_catalogue

        catalogue = await asyncio.to_thread(
            load_catalogue, ctx.settings.registry, ctx.settings.cache_dir
        )
    return SchedulerService(
        ctx,
        catalogue,
        make_llm_policy(ctx.settings.llm_policy),
        make_window_scheduler(ctx.settings.window_policy),
    )


__all__ = ["SchedulerService", "create"]
