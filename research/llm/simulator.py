"""The discrete-event simulator: a trace, a cluster of simulated instances, one policy.

The loop only pops events and hands them to handlers; the policies never see the event
heap. Virtual time starts at the first arrival. Arrivals come straight from the sorted
trace (they never enter the heap); the heap holds instance wake-ups, migrations and KV
hand-offs in flight, and rebalancing ticks. Everything random draws from generators
seeded from ``config.seed``, so one seed gives one result.

The clock, randomness and predictions (:mod:`research.llm.predictions`) all live in
this shell: a policy receives a frozen :class:`ClusterSnapshot` and a
:class:`DecisionContext` and returns a decision.
With prefill and decode pools, which pool's snapshot it gets is
:mod:`research.llm.disaggregation`'s.
"""

from __future__ import annotations

import gc
import heapq
import math
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import cast

from mypy_extensions import mypyc_attr
from switchyard.perf import PerformanceModel, performance_model
from switchyard.perf.prefix_cache import cached_tokens
from switchyard.policies.base import DecisionContext, MigrationPlan
from switchyard.policies.registry import LlmPolicy
from switchyard.policies.snapshot import (
    ClusterSnapshot,
    QueuedRequestView,
    RebalanceSnapshot,
    WorkerRole,
    WorkerView,
)
from switchyard.policies.view_builders import (
    new_cluster_snapshot,
)

from research.llm.chunked import ChunkedInstance
from research.llm.config import SimulationConfig, SimulationError
from research.llm.disaggregation import Pools, worker_roles
from research.llm.heard import HeardCluster
from research.llm.instance import Phase, SimInstance, worker_view
from research.llm.metrics import RunMetrics, RunTotals, summarise
from research.llm.predictions import RequestPredictions
from research.llm.request import LlmTraceRequest, SimRequest

_WAKE = 0
_ARRIVE = 1  # a migrated request or a KV hand-off reaches its new worker
_REBALANCE = 2
_HEARTBEAT = 3  # a worker reports its state (SimulationConfig.heartbeat_s)

_Event = tuple[float, int, int, SimInstance | None, SimRequest | None, int]
"""(time, tie-breaker, kind, instance, request, wake version)."""


@mypyc_attr(allow_interpreted_subclasses=True)
class Simulator:
    """Runs one policy over one trace on one simulated cluster.

    Compiled (:mod:`switchyard.native`) it may still be subclassed, as tests and probes do
    to watch hand-offs and migrations; its own classes' methods cannot be replaced.
    """

    def __init__(
        self,
        policy: LlmPolicy,
        config: SimulationConfig,
        *,
        on_progress: Callable[[int], None] | None = None,
    ) -> None:
        self.policy = policy
        self.config = config
        self._on_progress = on_progress
        try:
            models = [performance_model(name) for name in config.profiles]
        except ValueError as exc:
            raise SimulationError(str(exc)) from None
        if config.max_batch_slots is not None:
            models = [replace(m, max_batch_slots=config.max_batch_slots) for m in models]
        if len({m.model for m in models}) > 1:
            raise SimulationError(
                "every profile of one cluster must serve the same model, got "
                + ", ".join(m.name for m in models)
            )
        self.reference = models[0]
        roles = worker_roles(config.workers, config.prefill_workers, policy.prefill_fraction)
        # Instances list themselves here when their view goes stale; all start stale.
        self._changed: list[SimInstance] = []
        chunked = config.chunked_prefill_tokens
        self.instances: list[SimInstance]
        if chunked is None:
            self.instances = [
                SimInstance(
                    i, f"w{i:02d}", models[i % len(models)], roles[i], changed=self._changed
                )
                for i in range(config.workers)
            ]
        else:
            for model in models:
                problem = model.chunk_budget_problem(chunked)
                if problem is not None:
                    raise SimulationError(problem)
            self.instances = [
                ChunkedInstance(
                    i,
                    f"w{i:02d}",
                    models[i % len(models)],
                    roles[i],
                    budget=chunked,
                    changed=self._changed,
                )
                for i in range(config.workers)
            ]
        self._changed.extend(self.instances)
        self._pools = (
            Pools(policy.assignment, roles, [inst.worker_id for inst in self.instances])
            if WorkerRole.PREFILL in roles
            else None
        )
        """Set when the cluster is split into prefill and decode pools."""
        self._decode_early = self._pools is not None and config.decode_at_arrival
        """Decode workers chosen on arrival (``SimulationConfig.decode_at_arrival``)."""
        self._views: list[WorkerView | None] = [None] * config.workers
        self._heard: HeardCluster | None = None
        """With ``heartbeat_s``: the workers as their heartbeats showed them."""
        self._arrivals_left = False
        self._workers: tuple[WorkerView, ...] = ()
        """The views of the last snapshot, reused until an instance changes."""
        self.by_id = {inst.worker_id: inst for inst in self.instances}
        self.types: dict[str, PerformanceModel] = {m.name: m for m in models}
        self._rng = random.Random(config.seed)
        self._policy_rng = random.Random(config.seed * 7919 + 1)
        self._sequence = 0
        self._heap: list[_Event] = []
        self._tick_due = False  # a rebalancing tick is on the heap
        self._tie = 0
        self._recent: deque[bool] = deque(maxlen=config.violation_window)
        self._violations = 0
        # A spike may trigger a round early, but not more often than this.
        self._spike_gap_s = (policy.rebalancer.period_s / 4) if policy.rebalancer else math.inf
        self._last_rebalance_s = -math.inf
        self.migrations = 0
        self.migration_cost_s = 0.0
        self.decisions = 0
        self.predictions = RequestPredictions(policy.prediction, config, self.types, self.reference)
        self._reads_cache = policy.reads_cached_tokens

    # -- snapshots ---------------------------------------------------------------------

    def _cached_tokens(self, row: LlmTraceRequest) -> dict[str, int]:
        """Per instance, the prompt tokens of ``row`` its prefix cache holds (as vLLM's KV
        events tell llm-d's precise scorer and Dynamo's indexer)."""
        found: dict[str, int] = {}
        for inst in self.instances:
            matched = inst.prefix_cache.matched_blocks(row.prefix_blocks)
            if matched:
                found[inst.worker_id] = cached_tokens(matched, row.prompt_tokens)
        return found

    def _cluster(self, now_s: float) -> ClusterSnapshot:
        changed = self._changed
        if self._heard is not None:
            changed.clear()  # views are built at heartbeats (_fresh_view)
            return new_cluster_snapshot(now_s, self._heard.workers())
        if changed:
            # Only the instances that changed since the last snapshot get a new view.
            views = self._views
            for inst in changed:
                if inst.view is None:
                    inst.view = views[inst.index] = worker_view(
                        inst, self.config.chunked_prefill_tokens
                    )
            changed.clear()
            self._workers = tuple(views)  # type: ignore[arg-type]
        return new_cluster_snapshot(now_s, self._workers)

    def _fresh_view(self, inst: SimInstance) -> WorkerView:
        """``inst`` as of its last change (what its heartbeat reports)."""
        view = inst.view
        if view is None:
            view = inst.view = worker_view(inst, self.config.chunked_prefill_tokens)
        return view

    def _entry(self, now_s: float) -> ClusterSnapshot:
        """The workers a new request may go to: all, or the prefill pool."""
        cluster = self._cluster(now_s)
        return cluster if self._pools is None else self._pools.prefill(cluster)

    def _context(self) -> DecisionContext:
        ctx = DecisionContext(self._policy_rng, self._sequence)
        self._sequence += 1
        return ctx

    # -- events ------------------------------------------------------------------------

    def _push(
        self,
        time_s: float,
        kind: int,
        inst: SimInstance | None = None,
        request: SimRequest | None = None,
        version: int = 0,
    ) -> None:
        self._tie += 1
        heapq.heappush(self._heap, (time_s, self._tie, kind, inst, request, version))

    def _reschedule(self, inst: SimInstance, now_s: float) -> None:
        wake_s = inst.next_wake_s(now_s)
        if wake_s == inst.wake_s:
            return
        inst.wake_s = wake_s
        inst.wake_version += 1
        if wake_s is not None:
            # _push written out: this runs after every change of an instance.
            self._tie += 1
            heapq.heappush(
                self._heap,
                (
                    now_s if now_s > wake_s else wake_s,
                    self._tie,
                    _WAKE,
                    inst,
                    None,
                    inst.wake_version,
                ),
            )

    def _place(self, request: SimRequest, inst: SimInstance, now_s: float) -> None:
        inst.enqueue(request, now_s)
        self._reschedule(inst, now_s)

    def _on_arrival(self, request: SimRequest, now_s: float) -> None:
        placement = self.policy.assignment.assign(request.view, self._entry(now_s), self._context())
        self.decisions += 1
        inst = self.by_id[placement.worker_id]
        if self._heard is not None:
            self._heard.sent(inst.index, request.view.calibrated_s, request.prompt_tokens)
        if self._decode_early and inst.role is WorkerRole.PREFILL:
            self._choose_decode(request, now_s)
        inst.enqueue(request, now_s)
        if inst.phase is Phase.IDLE:
            # An idle worker admits it at once. _reschedule would push a wake-up at now_s
            # that is always the very next event (every earlier one has run, and the next
            # arrival waits for it), so running its work here gives the same outcome
            # without the round trip through the heap. Not so for a migrated request
            # (_place): other arrivals at the same instant may join its prefill batch.
            inst.wake(now_s)
        self._reschedule(inst, now_s)

    def _on_wake(self, inst: SimInstance, now_s: float) -> None:
        inst.wake_s = None
        finished, handoffs = inst.wake(now_s)
        for request in finished:
            self._complete(request)
        for request in handoffs:
            self._handoff(request, inst, now_s)
        self._reschedule(inst, now_s)
        rebalancer = self.policy.rebalancer
        if (
            finished
            and rebalancer is not None
            and now_s - self._last_rebalance_s >= self._spike_gap_s
            and len(self._recent) >= self._recent.maxlen // 2  # type: ignore[operator]
            and rebalancer.spike(self._violations / len(self._recent))
        ):
            self._rebalance(now_s)

    def _choose_decode(self, request: SimRequest, now_s: float) -> None:
        """Place ``request``'s decode phase on arrival (its KV cache will be its prompt
        and first token); the chosen worker counts it until it arrives there."""
        assert self._pools is not None
        placement = self._pools.place_decode(
            request.view, request.prompt_tokens + 1, self._cluster(now_s), self._context()
        )
        target = self.by_id[placement.worker_id]
        if self._heard is not None:
            self._heard.sent(target.index, request.view.calibrated_s, request.prompt_tokens)
        work_s = request.service_estimate_s(target.worker_type)
        target.expect(work_s, 1)
        request.decode_to = (target, work_s)

    def _handoff(self, request: SimRequest, source: SimInstance, now_s: float) -> None:
        """``request``'s prefill ended on a prefill-only worker: its decode phase is
        placed (:meth:`Pools.place_decode`; chosen on arrival with
        ``decode_at_arrival``) and its KV cache sent there."""
        assert self._pools is not None
        kv_tokens = request.prompt_tokens + request.generated_at_join
        chosen = request.decode_to
        if chosen is not None:
            target = chosen[0]
            assert isinstance(target, SimInstance)
        else:
            placement = self._pools.place_decode(
                request.view, kv_tokens, self._cluster(now_s), self._context()
            )
            target = self.by_id[placement.worker_id]
            if self._heard is not None:
                self._heard.sent(target.index, request.view.calibrated_s, request.prompt_tokens)
        transfer_s = source.perf.kv_transfer_s(kv_tokens)
        self._push(now_s + transfer_s, _ARRIVE, target, request)

    def _complete(self, request: SimRequest) -> None:
        if request.decode_to is not None:  # a one-token answer ended where it was prefilled
            target, work_s = request.decode_to
            cast(SimInstance, target).expect(work_s, -1)
            request.decode_to = None
        latency_s = request.finished_s - request.arrival_s
        self.completed.append(request)
        recent = self._recent
        if len(recent) == recent.maxlen:
            self._violations -= recent[0]
        violated = latency_s > request.slo_s
        recent.append(violated)
        self._violations += violated
        if self._on_progress is not None and len(self.completed) % 500 == 0:
            self._on_progress(len(self.completed))
        self.predictions.learn(request)

    def _rebalance(self, now_s: float) -> None:
        rebalancer = self.policy.rebalancer
        if rebalancer is None:
            return
        self._last_rebalance_s = now_s
        for inst in self.instances:
            inst.account(now_s)
            inst.sync(now_s)
        scope = rebalancer.queue_scope
        queued: list[QueuedRequestView] = []
        for inst in self.instances:
            inst.list_queued(queued, scope.waiting_tail, scope.running)
        if not queued:
            # Nothing listed, nothing to move. The views wait for the next decision (the
            # state is the same: a change marks them stale); the sequence moves on.
            self._context()
            return
        cluster = self._cluster(now_s)
        rate = self._violations / len(self._recent) if self._recent else 0.0
        snapshot = RebalanceSnapshot(
            cluster=cluster, queued=tuple(queued), recent_slo_violation_rate=rate
        )
        pools = self._pools
        for part in (snapshot,) if pools is None else pools.rebalance(snapshot):
            for plan in rebalancer.plan(part, self._context()):
                self._migrate(plan, now_s)

    def _migrate(self, plan: MigrationPlan, now_s: float) -> None:
        source = self.by_id[plan.from_worker_id]
        target = self.by_id[plan.to_worker_id]
        request = self._requests[int(plan.request_id[1:])]
        if request.instance is not source:
            return  # finished or moved since the snapshot
        if request in source.waiting:
            source.remove_waiting(request, now_s)
        else:
            source.remove_running(request, now_s)
        self._reschedule(source, now_s)
        request.migrations += 1
        self.migrations += 1
        self.migration_cost_s += plan.cost_s
        self._push(now_s + plan.cost_s, _ARRIVE, target, request)

    # -- the loop ------------------------------------------------------------------------

    def run(self, trace: Sequence[LlmTraceRequest]) -> RunMetrics:
        """Simulate every request of ``trace`` (sorted by arrival) to completion."""
        # A run makes a few short-lived objects per event, freed by reference counting,
        # and keeps every request alive to the end: the cyclic collector's passes over
        # that growing heap find next to nothing to free (a few dozen objects a run) and
        # cost about 5 % of the run, so it is paused while the run lasts.
        collecting = gc.isenabled()
        gc.disable()
        try:
            return self._run(trace)
        finally:
            if collecting:
                gc.enable()

    def _run(self, trace: Sequence[LlmTraceRequest]) -> RunMetrics:
        if not trace:
            raise SimulationError("the trace has no requests")
        self.predictions.train(trace)
        reference = self.reference
        capacity = min(inst.perf.kv_capacity_tokens for inst in self.instances)
        self.completed: list[SimRequest] = []
        self._requests: list[SimRequest] = []
        rejected = refused = 0
        admission = self.policy.admission
        rebalancer = self.policy.rebalancer
        period_s = rebalancer.period_s if rebalancer is not None else 0.0
        start_s = trace[0].arrival_s
        self._tick_due = period_s > 0
        if period_s > 0:
            self._push(start_s + period_s, _REBALANCE)
        heap = self._heap
        heartbeat_s = self.config.heartbeat_s
        if heartbeat_s is not None:
            self._heard = HeardCluster([self._fresh_view(inst) for inst in self.instances])
            spacing_s = heartbeat_s / len(self.instances)
            for inst in self.instances:
                self._push(start_s + (inst.index + 1) * spacing_s, _HEARTBEAT, inst)
        self._arrivals_left = True
        pending = 0
        for index, row in enumerate(trace):
            now_s = row.arrival_s
            while heap and heap[0][0] <= now_s:
                event = heapq.heappop(heap)
                if event[2] == _WAKE and event[5] != event[3].wake_version:  # type: ignore[union-attr]
                    continue  # a wake-up superseded by a later reschedule
                pending = self._dispatch(event, pending, period_s)
            view, raw, features = self.predictions.view(
                index,
                row,
                self._cached_tokens(row) if self._reads_cache and row.prefix_blocks else {},
            )
            slo_s = self.config.slo_scale * reference.idle_service_s(
                row.prompt_tokens, row.output_tokens
            )
            request = SimRequest(
                index=index,
                arrival_s=now_s,
                prompt_tokens=row.prompt_tokens,
                output_tokens=row.output_tokens,
                workload=row.workload,
                view=view,
                slo_s=slo_s,
            )
            request.predicted_s = raw
            request.features = features
            request.prefix_blocks = row.prefix_blocks
            self._requests.append(request)
            if row.prompt_tokens + row.output_tokens > capacity:
                rejected += 1  # can never fit a worker's KV cache: reported, not simulated
                continue
            if admission is not None and admission.admit(view, self._entry(now_s)) is not None:
                refused += 1  # answered at once, a miss: nothing of it is simulated
                continue
            pending += 1
            if period_s > 0 and not self._tick_due:
                # The ticks stopped while nothing was outstanding: they resume on the
                # same grid (start + k periods) with the first request after.
                self._tick_due = True
                periods = math.floor((now_s - start_s) / period_s) + 1
                self._push(start_s + periods * period_s, _REBALANCE)
            self._on_arrival(request, now_s)
        self._arrivals_left = False
        while heap:
            pending = self._dispatch(heapq.heappop(heap), pending, period_s)
            if pending == 0 and all(e[2] >= _REBALANCE for e in heap):
                break  # only ticks and heartbeats left
        end_s = max((r.finished_s for r in self.completed), default=start_s)
        for inst in self.instances:
            inst.account(end_s)
        totals = RunTotals(
            requests=self._requests,
            completed=self.completed,
            util_areas_s=[inst.util_area for inst in self.instances],
            migrations=self.migrations,
            migration_cost_s=self.migration_cost_s,
            decisions=self.decisions,
        )
        return summarise(
            totals,
            start_s=start_s,
            end_s=end_s,
            rejected=rejected,
            refused=refused,
            token_slos=self.config.token_slos,
            last_arrival_s=trace[-1].arrival_s,
        )

    def _dispatch(self, event: _Event, pending: int, period_s: float) -> int:
        now_s, _, kind, inst, request, version = event
        if kind == _WAKE:
            assert inst is not None
            if version != inst.wake_version:
                return pending
            before = len(self.completed)
            self._on_wake(inst, now_s)
            return pending - (len(self.completed) - before)
        if kind == _ARRIVE:
            assert inst is not None
            assert request is not None
            chosen = request.decode_to
            if chosen is not None and request.generated_at_join:
                # The decode phase chosen on arrival is here: no longer expected.
                request.decode_to = None
                cast(SimInstance, chosen[0]).expect(chosen[1], -1)
            self._place(request, inst, now_s)
            return pending
        if kind == _HEARTBEAT:
            assert inst is not None
            assert self._heard is not None
            self._heard.beat(inst.index, self._fresh_view(inst), now_s)
            if pending > 0 or self._arrivals_left:
                self._push(now_s + cast(float, self.config.heartbeat_s), _HEARTBEAT, inst)
            return pending
        # A rebalancing tick; the next one only while work is outstanding (the next
        # arrival starts them again).
        self._rebalance(now_s)
        self._tick_due = pending > 0
        if pending > 0:
            self._push(now_s + period_s, _REBALANCE)
        return pending
