"""The multi-model simulator: pipelines of model stages on heterogeneous workers, in
virtual time, under a placement policy and a router (:mod:`switchyard.multimodel.snapshot`).

What it models
--------------
* A request runs its pipeline's DAG. A stage becomes *ready* when every stage in its
  ``after`` has finished; a stage whose output feeds two later stages runs once (the
  intermediate result is shared). A conditional stage runs only when the stage it names
  (a classifier, an LLM judge) answered its label, drawn from the label shares by a
  generator of the run's seed, or by the request's id (``config.labels_from_ids``)
  (:mod:`switchyard.multimodel.branching`); a skipped stage counts as done. A request's
  latency is the end of its last stage run minus its arrival.
* A ready stage is handed to the :class:`~switchyard.multimodel.snapshot.Router`, which
  picks a worker where the model is placed. While no replica of the model is ready (or
  the router answers ``None``), the stage waits in that model's *pending* queue; pending
  stages are routed again when a replica of the model becomes ready, when a stage of the
  model finishes, and after every placement update.
* A replica (one model resident on one worker) serves one stage at a time, FIFO. Service
  time = ``model.exec_s * request.exec_scale / worker.speed``. Replicas on one worker run
  side by side: each owns its resource vector.
* Every ``1 / update_hz`` seconds, and on a large demand change, the shell builds a
  :class:`~switchyard.multimodel.snapshot.PlacementSnapshot` and carries out the policy's
  :class:`~switchyard.multimodel.snapshot.PlacementPlan`: evictions first, then loads.
  A plan whose loads would not fit after its evictions (or that loads a model twice on a
  worker, evicts one that is not there, or names an unknown worker or model) is refused
  whole with a :class:`PlanError` naming the worker and the models.

What an update costs (the overhead of too-frequent updates)
-----------------------------------------------------------
Three costs are charged in virtual time, so a high ``update_hz`` shows its overhead:

1. **Decision pause.** Each update pauses routing cluster-wide for
   ``decision_base_s + decision_per_change_s * changes`` seconds (collecting the state,
   deciding, and telling the workers; ``changes`` = loads + evictions of the plan).
   Stages that become ready meanwhile wait in the pending queues; replicas keep serving
   what they already hold.
2. **Loading.** A loaded replica serves nothing until ``ready_at = now + model.load_s``.
   With ``load_blocks_worker`` (off by default) a load also blocks its whole worker: no
   replica on it *starts* a stage until every load there is done, as when a weights
   transfer saturates a worker's only memory bus; stages already in service finish.
   Off by default because the workers here hold several GPUs, and loading onto one
   leaves the others serving.
3. **Eviction.** An evicted replica finishes the stage it serves; its queued stages go
   back to the router (they lose their place in line). Its resources count as free at
   once.

Plan churn therefore costs pauses, blocked workers and re-queued work; a policy that
re-places on every noisy demand reading at 4 Hz pays all three.

Demand estimate
---------------
Every ``1 / update_hz`` seconds, and when a model's demand estimate moves by a large
change (:mod:`research.multimodel.demand`), a placement update runs.

LLM stages
----------
An LLM stage is not placed: it goes to its LLM application's workers, simulated with
continuous batching over the performance model and chosen by the registered LLM policy
``config.llm_policy`` (:mod:`research.multimodel.llm_stages`). A run with only LLM
stages needs no multi-model workers.

Routing snapshots
-----------------
The router gets a :class:`PlacementSnapshot` too. To keep routing cheap, a worker's
state is rebuilt only when something it shows changed (a stage queued, started or
finished, a model loaded or evicted) and, between updates, only for the workers that
hold the routed model; so the queues and residents of the candidates are exact, but
``queued_work_s`` counts a running stage's remaining time as of the worker's last change
(it overstates the work of a worker that has been serving one long stage undisturbed),
and ``utilization`` is the value of the last update.
``demand_rps`` and ``waiting`` in a routing snapshot are read-only views of live tables,
valid during the call.

Determinism: for one workload, workers, policy, router and config (seed included) a run
gives the same result every time; the only randomness is the ``DecisionContext`` rngs
seeded from ``seed``.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from collections import deque
from collections.abc import Mapping, Sequence
from types import MappingProxyType

from switchyard.multimodel.branching import label_at, stage_runs, unit_of
from switchyard.multimodel.model import (
    ModelSpec,
    WorkerSpec,
    Workload,
)
from switchyard.multimodel.snapshot import (
    PlacementPlan,
    PlacementPolicy,
    PlacementSnapshot,
    Router,
    WorkerState,
)
from switchyard.policies.base import DecisionContext

from research.llm.instance import SimInstance
from research.multimodel.demand import DemandEstimate
from research.multimodel.errors import PlanError, RoutingError, SimulationInputError
from research.multimodel.llm_stages import LlmStagePool, LlmWorkers
from research.multimodel.plan_check import check_plan
from research.multimodel.run import MultiModelResult, MultiModelSimConfig, UpdateRecord
from research.multimodel.sim_state import PipelineRun, Replica, RequestRun, Task, WorkerRun

__all__ = [
    "MultiModelResult",
    "MultiModelSimConfig",
    "MultiModelSimulator",
    "PlanError",
    "RoutingError",
    "SimulationInputError",
    "UpdateRecord",
    "simulate_multimodel",
]


_DONE = 0
_READY = 1
_UPDATE = 2
_EXTRA_UPDATE = 3
_RESUME = 4
_LLM_WAKE = 5


class MultiModelSimulator:
    """One run of a workload on workers under a placement policy and a router.

    Example::

        result = MultiModelSimulator(workload, workers, policy, router).run()
        metrics = summarize(result)  # research.multimodel.metrics
    """

    def __init__(
        self,
        workload: Workload,
        workers: Sequence[WorkerSpec],
        placement: PlacementPolicy,
        router: Router,
        config: MultiModelSimConfig | None = None,
        llm_workers: Sequence[LlmWorkers] = (),
    ) -> None:
        self.config = config or MultiModelSimConfig()
        self.workload = workload
        self.placement = placement
        self.router = router
        self.llm: LlmStagePool[Task] = LlmStagePool(
            llm_workers, self.config.llm_policy, self.config.seed
        )
        ids = [w.worker_id for w in workers]
        if len(set(ids)) != len(ids):
            raise SimulationInputError("worker ids must be unique")
        for w in workers:
            if not (math.isfinite(w.speed) and w.speed > 0):
                raise SimulationInputError(f"worker {w.worker_id}: speed must be > 0")
        self.models: Mapping[str, ModelSpec] = workload.models
        self.pipelines: dict[str, PipelineRun] = {
            name: PipelineRun(spec, workload.models, self.llm.applications)
            for name, spec in workload.pipelines.items()
        }
        # Without model stages there is nothing to place (LLM stages only).
        self._places = any(p.has_model_stages for p in self.pipelines.values())
        if self._places and not workers:
            raise SimulationInputError("no workers to simulate")
        for request in workload.requests:
            if request.pipeline not in self.pipelines:
                raise SimulationInputError(
                    f"request {request.request_id} names unknown pipeline {request.pipeline!r}"
                )
        self.workers = [WorkerRun(i, spec) for i, spec in enumerate(workers)]
        self.by_id = {w.spec.worker_id: w for w in self.workers}

    # ----------------------------------------------------------------- the run

    def run(self) -> MultiModelResult:
        cfg = self.config
        self._now = 0.0
        self._heap: list[tuple[float, int, int, object]] = []
        self._seq = 0
        self._paused_until = -1.0
        self._pending: dict[str, deque[Task]] = {m: deque() for m in self.models}
        self._waiting_counts: dict[str, int] = dict.fromkeys(self.models, 0)
        self._holders: dict[str, list[Replica]] = {m: [] for m in self.models}
        self._demand = DemandEstimate(self.models, cfg.demand_tau_s, cfg.large_change)
        self._last_update_s = -math.inf
        self._extra_pending = False
        self._updates: list[UpdateRecord] = []
        self._stages_run = 0
        self._route_rng = random.Random(f"route:{cfg.seed}")
        self._place_rng = random.Random(f"place:{cfg.seed}")
        # What a classifier stage answers (a conditional stage after it branches on it).
        self._label_rng = random.Random(f"label:{cfg.seed}")
        self._route_seq = 0
        self._place_seq = 0
        self._states: list[WorkerState] = [w.state(self._now) for w in self.workers]
        self._demand_view = MappingProxyType(self._demand.rps)
        self._waiting_view = MappingProxyType(self._waiting_counts)

        requests = self.workload.requests
        n = len(requests)
        latencies = [0.0] * n
        finished = [False] * n
        self._latencies = latencies
        self._finished = finished
        self._done = 0
        last_arrival = requests[-1].arrival_s if requests else 0.0
        cutoff = last_arrival + cfg.max_drain_s

        if self._places:
            self._push(0.0, _UPDATE, None)
        heap = self._heap
        next_i = 0
        end_s = 0.0
        while True:
            next_arrival = requests[next_i].arrival_s if next_i < n else math.inf
            if heap and heap[0][0] <= next_arrival:
                at, _, kind, payload = heapq.heappop(heap)
                if at > cutoff or (next_i >= n and self._done == n):
                    break
                self._now = at
                if kind == _DONE:
                    assert isinstance(payload, Replica)
                    self._on_done(payload)
                    end_s = at
                elif kind == _READY:
                    assert isinstance(payload, Replica)
                    self._on_ready(payload)
                elif kind == _UPDATE:
                    self._update(extra=False)
                    self._push(at + 1.0 / cfg.update_hz, _UPDATE, None)
                elif kind == _LLM_WAKE:
                    assert isinstance(payload, tuple)
                    woken: SimInstance = payload[0]
                    for run, stage in self.llm.wake(woken, payload[1], at):
                        self._stage_done(run, stage)
                    self._llm_reschedule(woken)
                    end_s = at
                elif kind == _EXTRA_UPDATE:
                    self._extra_pending = False
                    if at - self._last_update_s >= cfg.large_change_min_gap_s:
                        self._update(extra=True)
                else:  # _RESUME
                    if at >= self._paused_until:
                        self._retry_all_pending()
            elif next_i < n:
                req = requests[next_i]
                self._now = req.arrival_s
                pipeline = self.pipelines[req.pipeline]
                run = RequestRun(next_i, req.arrival_s, pipeline, req.exec_scale, req.input_tokens)
                next_i += 1
                for stage in pipeline.roots:
                    self._stage_ready(run, stage)
            else:
                break
        if self._done < n:
            end_s = max(end_s, min(cutoff, self._now))
        for w in self.workers:
            w.advance(end_s)
        for i, req in enumerate(requests):
            if not finished[i]:
                latencies[i] = max(0.0, end_s - req.arrival_s)
        return MultiModelResult(
            workload=self.workload.name,
            policy=self.placement.name,
            config=cfg,
            arrivals_s=tuple(r.arrival_s for r in requests),
            latencies_s=tuple(latencies),
            slo_s=tuple(self.pipelines[r.pipeline].slo_s for r in requests),
            finished=tuple(finished),
            end_s=end_s,
            worker_ids=tuple(w.spec.worker_id for w in self.workers),
            worker_busy_s=tuple(w.busy_s for w in self.workers),
            worker_share_s=tuple(w.share_s for w in self.workers),
            updates=tuple(self._updates),
            stages_run=self._stages_run,
            llm_worker_busy_s=self.llm.busy_s(end_s),
            step_at_s=self.workload.step_at_s,
        )

    def _push(self, at: float, kind: int, payload: object) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, kind, payload))

    # ----------------------------------------------------------------- stages

    def _stage_ready(self, run: RequestRun, stage: int) -> None:
        pipeline = run.pipeline
        llm = pipeline.llm[stage]
        if llm is not None:
            prompt_tokens = pipeline.spec.llm_prompt_tokens(
                pipeline.stages[stage], run.input_tokens
            )
            inst = self.llm.submit(
                pipeline.models[stage],
                (run, stage),
                prompt_tokens=prompt_tokens,
                output_tokens=llm.output_tokens,
                slo_s=pipeline.slo_s,
                now_s=self._now,
            )
            self._llm_reschedule(inst)
            return
        model = pipeline.models[stage]
        now = self._now
        if self._demand.invoke(model, now) and not self._extra_pending:
            at = max(now, self._last_update_s + self.config.large_change_min_gap_s)
            self._extra_pending = True
            self._push(at, _EXTRA_UPDATE, None)
        self._route(model, (run, stage))

    def _route(self, model: str, task: Task) -> None:
        if self._now < self._paused_until or not self._has_ready(model):
            self._wait(model, task)
            return
        worker_id = self.router.route(model, self._routing_snapshot(model), self._route_ctx())
        if worker_id is None:
            self._wait(model, task)
            return
        worker = self.by_id.get(worker_id)
        replica = worker.replicas.get(model) if worker is not None else None
        if replica is None:
            raise RoutingError(
                f"router sent a stage of model {model!r} to worker {worker_id!r}, "
                "which does not hold it"
            )
        self._enqueue(replica, task)

    def _has_ready(self, model: str) -> bool:
        now = self._now
        return any(r.ready_at <= now for r in self._holders[model])

    def _wait(self, model: str, task: Task) -> None:
        self._pending[model].append(task)
        self._waiting_counts[model] += 1

    def _retry_pending(self, model: str) -> None:
        pending = self._pending[model]
        if not pending or self._now < self._paused_until or not self._has_ready(model):
            return
        tasks = list(pending)
        pending.clear()
        self._waiting_counts[model] = 0
        for i, task in enumerate(tasks):
            before = len(pending)
            self._route(model, task)
            if len(pending) > before:
                # The router keeps this model's stages waiting: keep the rest, in order.
                pending.extend(tasks[i + 1 :])
                self._waiting_counts[model] = len(pending)
                return

    def _retry_all_pending(self) -> None:
        for model, pending in self._pending.items():
            if pending:
                self._retry_pending(model)

    def _enqueue(self, replica: Replica, task: Task) -> None:
        run, stage = task
        svc = replica.spec.exec_s * run.scale / replica.worker.spec.speed
        replica.worker.version += 1
        if replica.current is None and self._can_start(replica):
            self._start(replica, run, stage, svc)
        else:
            replica.queue.append((run, stage, svc))
            replica.queued_s += svc

    def _can_start(self, replica: Replica) -> bool:
        if replica.gone or replica.ready_at > self._now:
            return False
        return not (self.config.load_blocks_worker and replica.worker.loading)

    def _start(self, replica: Replica, run: RequestRun, stage: int, svc: float) -> None:
        now = self._now
        worker = replica.worker
        worker.advance(now)
        worker.busy += 1
        r = replica.resources
        worker.busy_cpu += r.cpu
        worker.busy_gpu += r.gpu
        worker.busy_mem += r.mem_gib
        replica.current = (run, stage)
        replica.current_svc = svc
        replica.current_end = now + svc
        self._push(now + svc, _DONE, replica)

    def _start_next(self, replica: Replica) -> None:
        if replica.queue and replica.current is None and self._can_start(replica):
            run, stage, svc = replica.queue.popleft()
            replica.queued_s -= svc
            replica.worker.version += 1
            self._start(replica, run, stage, svc)

    def _on_done(self, replica: Replica) -> None:
        now = self._now
        worker = replica.worker
        worker.version += 1
        worker.advance(now)
        worker.busy -= 1
        r = replica.resources
        worker.busy_cpu -= r.cpu
        worker.busy_gpu -= r.gpu
        worker.busy_mem -= r.mem_gib
        if worker.busy == 0:  # wipe float drift
            worker.busy_cpu = worker.busy_gpu = worker.busy_mem = 0.0
        assert replica.current is not None
        run, stage = replica.current
        replica.current = None
        self._start_next(replica)
        self._stage_done(run, stage)
        if self._pending[replica.model]:
            self._retry_pending(replica.model)

    def _stage_done(self, run: RequestRun, stage: int) -> None:
        """A stage (of a model or an LLM) answered: its label drawn, what waited on it
        made ready, the request finished when it was its last."""
        self._stages_run += 1
        run.left -= 1
        pipeline = run.pipeline
        if pipeline.branching:
            labels = pipeline.labels[stage]
            name = pipeline.stages[stage].name
            answered = None
            if labels:
                if self.config.labels_from_ids:
                    unit = unit_of(f"{self.workload.requests[run.index].request_id}.{name}")
                else:
                    unit = self._label_rng.random()
                answered = label_at(labels, unit)
            run.answered[name] = answered
        self._release(run, stage)
        if run.left == 0:
            self._latencies[run.index] = self._now - run.arrival_s
            self._finished[run.index] = True
            self._done += 1

    def _llm_reschedule(self, inst: SimInstance) -> None:
        wake = self.llm.reschedule(inst, self._now)
        if wake is not None:
            at, version = wake
            self._push(at, _LLM_WAKE, (inst, version))

    def _release(self, run: RequestRun, stage: int) -> None:
        """``stage`` is done (answered or skipped): make ready what waited on it, and skip
        what its branches rule out (and, in turn, what waited only on that)."""
        deps = run.deps
        pipeline = run.pipeline
        for j in pipeline.dependents[stage]:
            deps[j] -= 1
            if deps[j] != 0:
                continue
            spec = pipeline.stages[j]
            if pipeline.branching and not stage_runs(spec, run.answered, run.skipped):
                run.skipped.add(spec.name)
                run.left -= 1
                self._release(run, j)
            else:
                self._stage_ready(run, j)

    def _on_ready(self, replica: Replica) -> None:
        worker = replica.worker
        worker.loading -= 1
        if replica.gone:
            return
        if self.config.load_blocks_worker:
            if worker.loading == 0:
                for other in worker.replicas.values():
                    self._start_next(other)
        else:
            self._start_next(replica)
        self._retry_pending(replica.model)

    # ----------------------------------------------------------------- snapshots

    def _route_ctx(self) -> DecisionContext:
        self._route_seq += 1
        return DecisionContext(rng=self._route_rng, sequence=self._route_seq - 1)

    def _routing_snapshot(self, model: str) -> PlacementSnapshot:
        states = self._states
        for replica in self._holders[model]:
            holder = replica.worker
            if holder.version != holder.built:
                states[holder.index] = holder.state(self._now)
        return PlacementSnapshot(
            now_s=self._now,
            workers=tuple(states),
            models=self.models,
            pipelines=self.workload.pipelines,
            demand_rps=self._demand_view,
            waiting=self._waiting_view,
        )

    # ----------------------------------------------------------------- placement

    def _update(self, *, extra: bool) -> None:
        now = self._now
        cfg = self.config
        interval = now - self._last_update_s if math.isfinite(self._last_update_s) else 0.0
        self._demand.decay_to(now)
        for worker in self.workers:
            worker.advance(now)
            if interval > 0:
                worker.utilization = min(1.0, (worker.share_s - worker.share_at_update) / interval)
            worker.share_at_update = worker.share_s
            self._states[worker.index] = worker.state(self._now)
        snapshot = PlacementSnapshot(
            now_s=now,
            workers=tuple(self._states),
            models=self.models,
            pipelines=self.workload.pipelines,
            demand_rps=dict(self._demand.rps),
            waiting=dict(self._waiting_counts),
        )
        ctx = DecisionContext(rng=self._place_rng, sequence=self._place_seq)
        self._place_seq += 1
        started = time.perf_counter()
        plan = self.placement.place(snapshot, ctx)
        wall_s = time.perf_counter() - started
        self._apply(plan)
        changes = len(plan.load) + len(plan.evict)
        pause_s = cfg.decision_base_s + cfg.decision_per_change_s * changes
        self._last_update_s = now
        self._demand.mark_update()
        self._updates.append(
            UpdateRecord(
                at_s=now,
                extra=extra,
                loads=len(plan.load),
                evictions=len(plan.evict),
                decision_wall_s=wall_s,
                pause_s=pause_s,
            )
        )
        if pause_s > 0:
            self._paused_until = max(self._paused_until, now + pause_s)
            self._push(self._paused_until, _RESUME, None)
        else:
            self._retry_all_pending()

    def _apply(self, plan: PlacementPlan) -> None:
        if not plan.load and not plan.evict:
            return
        check_plan(plan, self.by_id, self.models)
        now = self._now
        for worker_id, model in plan.evict:
            worker = self.by_id[worker_id]
            replica = worker.replicas.pop(model)
            replica.gone = True
            self._holders[model].remove(replica)
            requeue = [(run, stage) for run, stage, _ in replica.queue]
            replica.queue.clear()
            replica.queued_s = 0.0
            worker.refresh_free()
            worker.version += 1
            self._states[worker.index] = worker.state(self._now)
            for task in requeue:
                self._wait(model, task)
        for worker_id, model in plan.load:
            worker = self.by_id[worker_id]
            spec = self.models[model]
            replica = Replica(worker, spec, now + spec.load_s)
            worker.replicas[model] = replica
            self._holders[model].append(replica)
            worker.loading += 1
            worker.refresh_free()
            worker.version += 1
            self._push(replica.ready_at, _READY, replica)
            self._states[worker.index] = worker.state(self._now)


def simulate_multimodel(
    workload: Workload,
    workers: Sequence[WorkerSpec],
    placement: PlacementPolicy,
    router: Router,
    config: MultiModelSimConfig | None = None,
    llm_workers: Sequence[LlmWorkers] = (),
) -> MultiModelResult:
    """Run ``workload`` on ``workers`` under ``placement`` and ``router``, its LLM stages
    on ``llm_workers``.

    Raises:
        SimulationInputError: a pipeline with a cycle or an unknown model, bad workers.
        PlanError: the policy produced a plan that overflows a worker (or is malformed).
        RoutingError: the router chose a worker that does not hold the model.
    """
    return MultiModelSimulator(workload, workers, placement, router, config, llm_workers).run()
