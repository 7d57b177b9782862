"""The discrete-event simulator: a trace, a cluster of simulated instances, one policy.

The loop only pops events and hands them to handlers; the policies never see the event
heap. Virtual time starts at the first arrival. Arrivals come straight from the sorted
trace (they never enter the heap); the heap holds instance wake-ups, migrations and KV
hand-offs in flight, and rebalancing ticks. Everything random draws from generators
seeded from ``config.seed``, so one seed gives one result.

The clock, randomness and predictions all live here, in the shell: a policy receives a
frozen :class:`ClusterSnapshot` and a :class:`DecisionContext` and returns a decision.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from switchyard.contracts.messages import WorkloadType
from switchyard.perf import PerformanceModel, performance_model
from switchyard.policies.base import DecisionContext, DecodeRouter, MigrationPlan
from switchyard.policies.registry import LlmPolicy, PredictionUse
from switchyard.policies.snapshot import (
    ClusterSnapshot,
    QueuedRequestView,
    RebalanceSnapshot,
    RequestPhase,
    RequestView,
    WorkerRole,
    WorkerView,
)
from switchyard.policies.splitwise import split_roles
from switchyard.prediction import (
    CalibrationConfig,
    CalibrationState,
    NoisyPredictor,
    ServiceTimeFeatures,
    ServiceTimePredictor,
    adaptive_deadline_s,
    calibrated_s,
    make_predictor,
)
from switchyard.slo import DEFAULT_TOKEN_SLOS, TokenSlo

from research.llm.instance import Phase, SimInstance
from research.llm.metrics import RunMetrics, RunTotals, summarise
from research.llm.request import SimRequest


class LlmTraceRequest(Protocol):
    """What the simulator reads of a trace row (``loadgen``'s ``TraceRequest`` has it)."""

    @property
    def arrival_s(self) -> float: ...
    @property
    def prompt_tokens(self) -> int: ...
    @property
    def output_tokens(self) -> int: ...
    @property
    def workload(self) -> WorkloadType: ...


class SimulationError(ValueError):
    """A simulation that cannot run as configured; the message says why."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SimulationConfig:
    """One simulated cluster and how requests are predicted and judged."""

    workers: int
    profiles: tuple[str, ...] = ("a100-80gb/llama-2-7b",)
    """Performance profiles, assigned to workers in turn (several: a mixed cluster)."""
    slo_scale: float = 5.0
    """A request meets its end-to-end objective when its latency is at most this times
    its service time on an idle worker of the first profile."""
    token_slos: Mapping[WorkloadType, TokenSlo] = field(default_factory=lambda: DEFAULT_TOKEN_SLOS)
    """TTFT and TPOT objectives per workload class (:mod:`switchyard.slo`)."""
    predictor: str = "linear"
    predictor_error: float = 0.0
    """Multiplicative error injected into every prediction (0.4 = 40 %)."""
    calibration: CalibrationConfig = field(default_factory=CalibrationConfig)
    train_requests: int = 2000
    """Requests of the trace (drawn at random) the predictor is trained on offline."""
    online_updates: bool = True
    """Update the predictor and the calibration from every completion."""
    violation_window: int = 100
    """Completions over which the rebalancer's recent SLO-violation rate is measured."""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise SimulationError(f"workers must be at least 1, got {self.workers}")
        if not self.profiles:
            raise SimulationError("at least one performance profile is needed")
        if self.slo_scale <= 0:
            raise SimulationError(f"slo-scale must be > 0, got {self.slo_scale}")
        if not 0.0 <= self.predictor_error <= 1.0:
            raise SimulationError(
                f"predictor-error must be within [0, 1], got {self.predictor_error}"
            )


_WAKE = 0
_ARRIVE = 1  # a migrated request or a KV hand-off reaches its new worker
_REBALANCE = 2

_Event = tuple[float, int, int, SimInstance | None, SimRequest | None, int]
"""(time, tie-breaker, kind, instance, request, wake version)."""


def _tail(waiting: deque[SimRequest], count: int | None) -> list[SimRequest]:
    """The last ``count`` waiting requests in queue order (all when ``count`` is None),
    read from the back so a long queue costs only what is listed."""
    if count is None or count >= len(waiting):
        return list(waiting)
    tail: list[SimRequest] = []
    for request in reversed(waiting):
        if len(tail) == count:
            break
        tail.append(request)
    tail.reverse()
    return tail


class Simulator:
    """Runs one policy over one trace on one simulated cluster."""

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
        if len({m.model for m in models}) > 1:
            raise SimulationError(
                "every profile of one cluster must serve the same model, got "
                + ", ".join(m.name for m in models)
            )
        self.model_name = models[0].model
        self.reference = models[0]
        roles: Sequence[WorkerRole] = (
            split_roles(config.workers, policy.prefill_fraction)
            if policy.prefill_fraction is not None
            else (WorkerRole.MIXED,) * config.workers
        )
        self.instances = [
            SimInstance(i, f"w{i:02d}", models[i % len(models)], roles[i])
            for i in range(config.workers)
        ]
        self.by_id = {inst.worker_id: inst for inst in self.instances}
        self.types: dict[str, PerformanceModel] = {m.name: m for m in models}
        self._rng = random.Random(config.seed)
        self._policy_rng = random.Random(config.seed * 7919 + 1)
        self._sequence = 0
        self._heap: list[_Event] = []
        self._tie = 0
        self._calibration = {name: CalibrationState() for name in self.types}
        self._recent: deque[bool] = deque(maxlen=config.violation_window)
        self._violations = 0
        # A spike may trigger a round early, but not more often than this.
        self._spike_gap_s = (policy.rebalancer.period_s / 4) if policy.rebalancer else math.inf
        self._last_rebalance_s = -math.inf
        self.migrations = 0
        self.migration_cost_s = 0.0
        self.decisions = 0
        self.predictor: ServiceTimePredictor | None = None
        self._constant_s: dict[str, float] = {}

    # -- set-up ----------------------------------------------------------------------

    def _features(self, row: LlmTraceRequest, gpu: str) -> ServiceTimeFeatures:
        return ServiceTimeFeatures(
            prompt_tokens=row.prompt_tokens, workload=row.workload, model=self.model_name, gpu=gpu
        )

    def _train(self, trace: Sequence[LlmTraceRequest]) -> None:
        """Offline training on a random sample of the trace, labelled by the profiles."""
        use = self.policy.prediction
        if use in (PredictionUse.NONE, PredictionUse.EXACT):
            return
        rng = random.Random(self.config.seed * 31 + 7)
        sample = (
            rng.sample(list(trace), self.config.train_requests)
            if len(trace) > self.config.train_requests
            else list(trace)
        )
        if use is PredictionUse.CONSTANT:
            for name, perf in self.types.items():
                times = [perf.idle_service_s(r.prompt_tokens, r.output_tokens) for r in sample]
                self._constant_s[name] = sum(times) / len(times)
            return
        predictor = make_predictor(self.config.predictor, seed=self.config.seed)
        features: list[ServiceTimeFeatures] = []
        labels: list[float] = []
        for row in sample:
            for name, perf in self.types.items():
                features.append(self._features(row, name))
                labels.append(perf.idle_service_s(row.prompt_tokens, row.output_tokens))
        predictor.fit(features, labels)
        if self.config.predictor_error > 0:
            predictor = NoisyPredictor(
                predictor, error=self.config.predictor_error, seed=self.config.seed
            )
        self.predictor = predictor

    def _view(self, index: int, row: LlmTraceRequest) -> tuple[RequestView, dict[str, float]]:
        use = self.policy.prediction
        raw: dict[str, float] = {}
        cal: dict[str, float] = {}
        true_s: dict[str, float] | None = None
        deadline_s: float | None = None
        if use is PredictionUse.CALIBRATED and self.predictor is not None:
            config = self.config.calibration
            for name in self.types:
                predicted = self.predictor.predict_s(self._features(row, name))
                raw[name] = predicted
                cal[name] = calibrated_s(predicted, self._calibration[name], config)
            first = self.reference.name
            deadline_s = row.arrival_s + adaptive_deadline_s(
                raw[first], self._calibration[first], config
            )
        elif use is PredictionUse.CONSTANT:
            raw = dict(self._constant_s)
            cal = raw
            deadline_s = (
                row.arrival_s + (1 + self.config.calibration.eps) * raw[self.reference.name]
            )
        elif use is PredictionUse.EXACT:
            true_s = {
                name: perf.idle_service_s(row.prompt_tokens, row.output_tokens)
                for name, perf in self.types.items()
            }
            raw = cal = true_s
            deadline_s = row.arrival_s + true_s[self.reference.name]
        view = RequestView(
            request_id=f"r{index}",
            arrival_s=row.arrival_s,
            prompt_tokens=row.prompt_tokens,
            workload=row.workload,
            model=self.model_name,
            predicted_s=raw,
            calibrated_s=cal,
            deadline_s=deadline_s,
            true_service_s=true_s,
        )
        return view, raw

    # -- snapshots ---------------------------------------------------------------------

    def _worker_view(self, inst: SimInstance, now_s: float) -> WorkerView:
        """The worker as of its last change, like a worker that reports on every change:
        a view is rebuilt only after its instance changed, so the predicted work left of
        its running requests is as of that moment."""
        view = inst.view
        if view is not None:
            return view
        perf = inst.perf
        kv = inst.kv_tokens()
        view = WorkerView(
            worker_id=inst.worker_id,
            worker_type=inst.worker_type,
            role=inst.role,
            waiting=len(inst.waiting),
            running=inst.running,
            max_slots=perf.max_batch_slots,
            kv_used_tokens=kv,
            kv_capacity_tokens=perf.kv_capacity_tokens,
            queued_work_s=inst.queued_work_s(),
            queued_tokens=inst.waiting_prompt_tokens + kv,
            utilization=inst.util_now,
            decode_step_s=inst.decode_step_s(),
            decode_step_per_seq_s=perf.decode_per_seq_s,
            decode_step_per_kv_token_s=perf.decode_per_kv_token_s,
            kv_bytes_per_token=perf.kv_bytes_per_token,
            interconnect_bytes_per_s=perf.interconnect_bytes_per_s,
        )
        inst.view = view
        return view

    def _cluster(self, now_s: float) -> ClusterSnapshot:
        return ClusterSnapshot(
            now_s=now_s, workers=tuple(self._worker_view(i, now_s) for i in self.instances)
        )

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
            self._push(max(wake_s, now_s), _WAKE, inst, version=inst.wake_version)

    def _place(self, request: SimRequest, inst: SimInstance, now_s: float) -> None:
        inst.enqueue(request, now_s)
        self._reschedule(inst, now_s)

    def _on_arrival(self, request: SimRequest, now_s: float) -> None:
        placement = self.policy.assignment.assign(
            request.view, self._cluster(now_s), self._context()
        )
        self.decisions += 1
        self._place(request, self.by_id[placement.worker_id], now_s)

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

    def _handoff(self, request: SimRequest, source: SimInstance, now_s: float) -> None:
        router = self.policy.assignment
        assert isinstance(router, DecodeRouter)
        kv_tokens = request.prompt_tokens + request.generated_at_join
        placement = router.route_decode(
            request.view, kv_tokens, self._cluster(now_s), self._context()
        )
        target = self.by_id[placement.worker_id]
        transfer_s = source.perf.kv_transfer_s(kv_tokens)
        self._push(now_s + transfer_s, _ARRIVE, target, request)

    def _complete(self, request: SimRequest) -> None:
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
        if not self.config.online_updates or self.predictor is None:
            return
        inst_type = request.served_by
        observed_s = request.finished_s - request.started_s
        predicted = request.predicted_s.get(inst_type)
        if predicted is not None:
            self._calibration[inst_type] = self._calibration[inst_type].observe(
                predicted, observed_s, self.config.calibration
            )
        features = ServiceTimeFeatures(
            prompt_tokens=request.prompt_tokens,
            workload=request.workload,
            model=self.model_name,
            gpu=inst_type,
        )
        self.predictor.update(features, observed_s)

    def _rebalance(self, now_s: float) -> None:
        rebalancer = self.policy.rebalancer
        if rebalancer is None:
            return
        self._last_rebalance_s = now_s
        for inst in self.instances:
            inst.account(now_s)
            inst.sync(now_s)
        cluster = self._cluster(now_s)
        scope = rebalancer.queue_scope
        queued: list[QueuedRequestView] = []
        for inst in self.instances:
            waiting = _tail(inst.waiting, scope.waiting_tail)
            # Work ahead of the first listed: the batch, then every waiting request
            # before it (the queue's whole predicted work less the listed ones').
            ahead_s = inst.prefill_work_s + inst.running_work_s() + inst.waiting_work_s
            ahead_s -= sum(request.work_s for request in waiting)
            for request in waiting:
                queued.append(
                    QueuedRequestView(
                        request=request.view,
                        worker_id=inst.worker_id,
                        phase=RequestPhase.WAITING,
                        queued_at_s=request.queued_at_s,
                        work_ahead_s=max(0.0, ahead_s),
                        remaining_s=request.work_s,
                        kv_tokens=request.prompt_tokens + request.generated_at_join
                        if request.has_kv
                        else 0,
                    )
                )
                ahead_s += request.work_s
            if scope.running and inst.phase is Phase.DECODE:
                for request in inst.running_requests():
                    generated = request.generated_at_join + inst.steps_done - request.join_step
                    queued.append(
                        QueuedRequestView(
                            request=request.view,
                            worker_id=inst.worker_id,
                            phase=RequestPhase.RUNNING,
                            queued_at_s=request.queued_at_s,
                            work_ahead_s=0.0,
                            remaining_s=inst.remaining_work_s(request),
                            kv_tokens=request.prompt_tokens + generated,
                            generated_tokens=generated,
                        )
                    )
        rate = self._violations / len(self._recent) if self._recent else 0.0
        snapshot = RebalanceSnapshot(
            cluster=cluster, queued=tuple(queued), recent_slo_violation_rate=rate
        )
        for plan in rebalancer.plan(snapshot, self._context()):
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
        if not trace:
            raise SimulationError("the trace has no requests")
        self._train(trace)
        reference = self.reference
        capacity = min(inst.perf.kv_capacity_tokens for inst in self.instances)
        self.completed: list[SimRequest] = []
        self._requests: list[SimRequest] = []
        rejected = 0
        rebalancer = self.policy.rebalancer
        period_s = rebalancer.period_s if rebalancer is not None else 0.0
        start_s = trace[0].arrival_s
        if period_s > 0:
            self._push(start_s + period_s, _REBALANCE)
        heap = self._heap
        pending = 0
        for index, row in enumerate(trace):
            now_s = row.arrival_s
            while heap and heap[0][0] <= now_s:
                pending = self._dispatch(heapq.heappop(heap), pending, period_s)
            view, raw = self._view(index, row)
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
            self._requests.append(request)
            if row.prompt_tokens + row.output_tokens > capacity:
                rejected += 1  # can never fit a worker's KV cache: reported, not simulated
                continue
            pending += 1
            self._on_arrival(request, now_s)
        while heap:
            pending = self._dispatch(heapq.heappop(heap), pending, period_s)
            if pending == 0 and all(e[2] == _REBALANCE for e in heap):
                break
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
            self._place(request, inst, now_s)
            return pending
        # A rebalancing tick; the next one only while work is outstanding.
        self._rebalance(now_s)
        if pending > 0:
            self._push(now_s + period_s, _REBALANCE)
        return pending
