"""Does the live stack agree with the multi-model simulator? One pipeline trace, both ways.

The workload is a slice of :func:`switchyard.multimodel.alibaba.lora_workload` (its first
``limit`` requests). The simulated side is :func:`simulate_slice`: the multi-model
simulator on identical workers, with the stage times of every call recorded. The live
side is a replay of the same calls against the embedded stack whose emulated-models
workers run ``time_scale`` (T) times faster than model time, replayed at speed-up T, so
one wall second is T model seconds for arrivals, loads and stages alike; every live time
here is read in *model seconds* (wall times T).

What is compared (:func:`compare`): call latency P50 and P99, live (the client's, from
sending the call to reading its answer) against simulated (arrival to the last stage's
end), on the calls both sides finished. What explains a gap is measured per stage, paired
by call and stage name (live answers give each stage's ``arrival_s`` at the ingress,
``assigned_s`` by the scheduler, ``started_s`` and ``finished_s`` on the worker):

- ``held`` (simulated): ready to routed (no ready replica yet); ``route`` (live): arrival
  at the ingress to assignment (the hop to the scheduler, and any time held there);
- ``queue`` (simulated): routed to started; ``dispatch`` (live): assigned to started
  (the hop to the worker, and the same queue);
- ``wait_sim``, ``wait_live``: ready to started; ``wait_gap``: live minus simulated for
  the same stage (its median: the per-stage cost of the live control plane);
- live only: ``hop``, the last earlier stage's finish to this stage's arrival (the answer
  to the ingress and the next stage's acceptance); ``exec_excess``, start to finish
  beyond the modelled service time; ``answer``, the client's latency less the ingress's.

A wall-clock delay of d seconds counts d * T model seconds: a gap that is control-plane
overhead grows with T, one that is a difference of model (the live worker drains an
unloaded model's queue where the simulator re-routes it; the live router sees heartbeats,
not the truth) does not.

The simulator is deterministic, but what the adaptive policies decide hangs on timing:
:func:`sim_band` runs it again with every arrival delayed by a small exponential jitter
(of the size of the live control plane's per-stage delay), one run per seed, and gives
the range of its P50 and P99: a live figure inside that range differs from the
simulator by no more than the simulator differs from itself.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from switchyard.multimodel.model import ModelSpec, PipelineSpec, WorkerSpec, Workload
from switchyard.multimodel.policy_registry import make_multimodel_policy
from switchyard.stats import quantile

from loadgen.replay_records import OK, RequestRecord
from research.multimodel.run import MultiModelResult, MultiModelSimConfig
from research.multimodel.sim_state import Replica, RequestRun, Task
from research.multimodel.simulator import MultiModelSimulator

__all__ = [
    "DEFAULT_TOLERANCE",
    "OfferedLoad",
    "PipelineAgreement",
    "PipelineAgreementError",
    "SimBand",
    "SimulatedCall",
    "StageTimes",
    "catalogue_problems",
    "compare",
    "jittered",
    "live_sim_config",
    "offered_load",
    "sim_band",
    "simulate_slice",
    "to_model_s",
    "workload_slice",
]

DEFAULT_TOLERANCE = 0.15
"""The relative P50 and P99 gap within which live and simulated runs agree."""

STAGE_PARTS = ("held", "queue", "route", "dispatch", "wait_sim", "wait_live", "wait_gap")
LIVE_ONLY_PARTS = ("hop", "exec_excess", "answer")


class PipelineAgreementError(ValueError):
    """A comparison that cannot be made; the message says why."""


# -- the workload and the configuration ------------------------------------------------------


def workload_slice(workload: Workload, limit: int) -> Workload:
    """The first ``limit`` requests of ``workload`` (in arrival order), same catalogue.

    Raises:
        PipelineAgreementError: ``limit`` below 1 or above the workload's requests.
    """
    total = len(workload.requests)
    if not 1 <= limit <= total:
        raise PipelineAgreementError(
            f"the slice must hold 1 to {total} requests (the workload's), got {limit}"
        )
    requests = sorted(workload.requests, key=lambda r: r.arrival_s)[:limit]
    return replace(workload, requests=tuple(requests))


def catalogue_problems(
    models: Mapping[str, ModelSpec],
    pipelines: Mapping[str, PipelineSpec],
    live_models: Mapping[str, ModelSpec],
    live_pipelines: Mapping[str, PipelineSpec],
) -> list[str]:
    """How the live catalogue differs from the workload's, one line each (none: same)."""
    problems: list[str] = []
    for what, mine, live in (
        ("model", models, live_models),
        ("pipeline", pipelines, live_pipelines),
    ):
        for name in sorted(mine.keys() - live.keys()):
            problems.append(f"{what} {name!r} is in the workload, not in the live catalogue")
        for name in sorted(live.keys() - mine.keys()):
            problems.append(f"{what} {name!r} is in the live catalogue, not in the workload")
        for name in sorted(mine.keys() & live.keys()):
            if mine[name] != live[name]:
                problems.append(
                    f"{what} {name!r} differs: workload {mine[name]}, live {live[name]}"
                )
    return problems


def to_model_s(wall_s: float, time_scale: float) -> float:
    """A live wall-clock duration in model seconds (the workers run ``time_scale`` faster)."""
    return wall_s * time_scale


def live_sim_config(
    *, update_hz: float, time_scale: float, demand_tau_model_s: float, seed: int = 0
) -> MultiModelSimConfig:
    """The simulator's settings closest to a live stack placing ``update_hz`` rounds a
    wall second with workers ``time_scale`` times faster than model time.

    - rounds: ``update_hz / time_scale`` a model second;
    - no routing pause (the live scheduler routes during a round) and no extra rounds on
      a demand change (the live service has none);
    - demand smoothing: the live service's time constant, ``demand_tau_model_s`` model
      seconds but never under one round (``services.placement.service``).
    """
    if not (math.isfinite(update_hz) and update_hz > 0):
        raise PipelineAgreementError(f"update_hz must be a number > 0, got {update_hz!r}")
    if not (math.isfinite(time_scale) and time_scale > 0):
        raise PipelineAgreementError(f"time_scale must be a number > 0, got {time_scale!r}")
    return MultiModelSimConfig(
        update_hz=update_hz / time_scale,
        decision_base_s=0.0,
        decision_per_change_s=0.0,
        large_change=None,
        demand_tau_s=max(demand_tau_model_s, time_scale / update_hz),
        seed=seed,
    )


@dataclass(frozen=True, slots=True)
class OfferedLoad:
    """What a workload asks of a cluster (model seconds): ``busy_replicas``, stage-seconds
    offered a second (replicas busy on average at speed 1) against ``replica_slots``, the
    replicas of the busiest model that fit the workers at once; ``share_load``, the
    dominant-resource share of the cluster kept busy; ``busiest_erlangs``, the busy
    replicas of ``busiest_model`` (above 1: one replica of it cannot keep up)."""

    span_s: float
    busy_replicas: float
    replica_slots: int
    share_load: float
    busiest_model: str
    busiest_erlangs: float
    by_model: dict[str, float]

    @property
    def slot_load(self) -> float:
        """``busy_replicas / replica_slots``."""
        return self.busy_replicas / self.replica_slots if self.replica_slots else math.inf


def offered_load(workload: Workload, workers: Sequence[WorkerSpec]) -> OfferedLoad:
    """The offered work of ``workload`` against ``workers`` (see :class:`OfferedLoad`).

    Raises:
        PipelineAgreementError: no workers, or fewer than two requests (no span).
    """
    requests = workload.requests
    if not workers:
        raise PipelineAgreementError("no workers to offer the load to")
    if len(requests) < 2 or requests[-1].arrival_s <= requests[0].arrival_s:
        raise PipelineAgreementError("the offered load needs two requests at different times")
    span_s = requests[-1].arrival_s - requests[0].arrival_s
    work: dict[str, float] = {}
    for request in requests:
        for stage in workload.pipelines[request.pipeline].stages:
            seconds = workload.models[stage.model].exec_s * request.exec_scale
            work[stage.model] = work.get(stage.model, 0.0) + seconds
    busiest = max(sorted(work), key=lambda m: work[m])
    share = 0.0
    for model, seconds in work.items():
        resources = workload.models[model].resources
        share += seconds * sum(resources.share_of(w.capacity) for w in workers) / len(workers)
    slots = sum(_fits(workload.models[busiest], w) for w in workers)
    return OfferedLoad(
        span_s=span_s,
        busy_replicas=sum(work.values()) / span_s,
        replica_slots=slots,
        share_load=share / span_s / len(workers),
        busiest_model=busiest,
        busiest_erlangs=work[busiest] / span_s,
        by_model={m: work[m] / span_s for m in sorted(work)},
    )


def _fits(model: ModelSpec, worker: WorkerSpec) -> int:
    need, have = model.resources, worker.capacity
    pairs = ((need.cpu, have.cpu), (need.gpu, have.gpu), (need.mem_gib, have.mem_gib))
    return min((math.floor(h / n + 1e-9) for n, h in pairs if n > 0), default=0)


# -- the simulated side -----------------------------------------------------------------------


@dataclass(slots=True)
class StageTimes:
    """One stage of one call (model seconds; NaN where it never happened)."""

    ready_s: float = math.nan
    routed_s: float = math.nan
    started_s: float = math.nan
    worker_id: str = ""


@dataclass(frozen=True, slots=True)
class SimulatedCall:
    """One simulated call: its latency and its stages by name."""

    index: int
    latency_s: float
    finished: bool
    stages: Mapping[str, StageTimes]


class _Recording(MultiModelSimulator):
    """The simulator, noting when each stage became ready, was routed and started (its
    last routing and start, for a stage re-routed after an eviction)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.times: dict[tuple[int, int], StageTimes] = {}

    def _note(self, run: RequestRun, stage: int) -> StageTimes:
        return self.times.setdefault((run.index, stage), StageTimes())

    def _stage_ready(self, run: RequestRun, stage: int) -> None:
        self._note(run, stage).ready_s = self._now
        super()._stage_ready(run, stage)

    def _enqueue(self, replica: Replica, task: Task) -> None:
        self._note(*task).routed_s = self._now
        super()._enqueue(replica, task)

    def _start(self, replica: Replica, run: RequestRun, stage: int, svc: float) -> None:
        times = self._note(run, stage)
        times.started_s = self._now
        times.worker_id = replica.worker.spec.worker_id
        super()._start(replica, run, stage, svc)


def simulate_slice(
    workload: Workload,
    workers: Sequence[WorkerSpec],
    *,
    policy: str,
    config: MultiModelSimConfig,
) -> tuple[MultiModelResult, list[SimulatedCall]]:
    """Simulate ``workload`` on ``workers`` under the multi-model ``policy``; returns the
    run's result and each call with its stages' times.

    Raises:
        UnknownMultiModelPolicyError: a policy name that is not registered.
        SimulationInputError, PlanError, RoutingError: as :func:`simulate_multimodel`.
    """
    chosen = make_multimodel_policy(policy)
    simulator = _Recording(workload, workers, chosen.placement, chosen.router, config)
    result = simulator.run()
    times = simulator.times
    calls = [
        SimulatedCall(
            index=index,
            latency_s=result.latencies_s[index],
            finished=result.finished[index],
            stages={
                stage.name: times.get((index, position), StageTimes())
                for position, stage in enumerate(workload.pipelines[request.pipeline].stages)
            },
        )
        for index, request in enumerate(workload.requests)
    ]
    return result, calls


def jittered(workload: Workload, mean_s: float, seed: int) -> Workload:
    """``workload`` with every arrival delayed by an exponential draw of mean ``mean_s``
    (seeded), re-sorted and moved so that the first is at 0 again.

    Raises:
        PipelineAgreementError: ``mean_s`` not a positive number.
    """
    if not (math.isfinite(mean_s) and mean_s > 0):
        raise PipelineAgreementError(f"the jitter must be a number of seconds > 0, got {mean_s!r}")
    rng = random.Random(seed)
    moved = sorted(
        (
            replace(r, arrival_s=r.arrival_s + rng.expovariate(1.0 / mean_s))
            for r in workload.requests
        ),
        key=lambda r: r.arrival_s,
    )
    first = moved[0].arrival_s if moved else 0.0
    return replace(
        workload, requests=tuple(replace(r, arrival_s=r.arrival_s - first) for r in moved)
    )


@dataclass(frozen=True, slots=True)
class SimBand:
    """The simulated P50 and P99 of one slice over ``seeds`` draws of arrival jitter of
    mean ``jitter_s`` (model seconds): how far the simulator itself moves with timing
    differences of the size the live control plane adds."""

    jitter_s: float
    seeds: int
    p50_min_s: float
    p50_median_s: float
    p50_max_s: float
    p99_min_s: float
    p99_median_s: float
    p99_max_s: float


def sim_band(
    workload: Workload,
    workers: Sequence[WorkerSpec],
    *,
    policy: str,
    config: MultiModelSimConfig,
    jitter_s: float,
    seeds: int,
) -> SimBand:
    """:class:`SimBand` of ``workload`` (seeds 0 .. seeds - 1; the request order, and so
    the pairing with live calls, is not needed here).

    Raises:
        PipelineAgreementError: fewer than one seed, or a bad jitter.
    """
    if seeds < 1:
        raise PipelineAgreementError(f"the band needs at least one seed, got {seeds}")
    p50: list[float] = []
    p99: list[float] = []
    for seed in range(seeds):
        _, calls = simulate_slice(
            jittered(workload, jitter_s, seed), workers, policy=policy, config=config
        )
        latencies = [call.latency_s for call in calls]
        p50.append(quantile(latencies, 0.5))
        p99.append(quantile(latencies, 0.99))
    return SimBand(
        jitter_s=jitter_s,
        seeds=seeds,
        p50_min_s=min(p50),
        p50_median_s=quantile(p50, 0.5),
        p50_max_s=max(p50),
        p99_min_s=min(p99),
        p99_median_s=quantile(p99, 0.5),
        p99_max_s=max(p99),
    )


# -- the comparison ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineAgreement:
    """Live against simulated latencies of one pipeline slice under one policy: every
    ``_s`` figure in model seconds, ``p50_ratio`` and ``p99_ratio`` live over simulated,
    ``parts`` each stage part's (module docstring) P50, P99 and count."""

    policy: str
    time_scale: float
    update_hz: float
    workers: int
    planned: int
    answered_ok: int
    """Calls answered 200 (each call is sent once, so at most one answer each)."""
    complete_answers: int
    """200 answers listing each stage of the call's pipeline exactly once, ``ok``, under
    the stage id ``{call id}.{stage}``."""
    not_ok: dict[str, int]
    """Calls without a 200, by outcome (``http_error``, ``timeout``, ...)."""
    sim_unfinished: int
    compared: int
    sim_p50_s: float
    sim_p99_s: float
    live_p50_s: float
    live_p99_s: float
    live_server_p50_s: float | None
    live_server_p99_s: float | None
    """The ingress's latency (its arrival to the last stage's finish): no HTTP."""
    p50_ratio: float
    p99_ratio: float
    paired_gap_p50_s: float
    max_send_lag_s: float
    parts: dict[str, dict[str, float]]
    sim_stages_by_worker: dict[str, int]
    live_stages_by_worker: dict[str, int]
    ledger: dict[str, int] = field(default_factory=dict)
    """Server-side counts of the stages' request records (filled in by the caller)."""
    band: SimBand | None = None
    """The simulator's own spread under arrival jitter (filled in by the caller)."""

    def within(self, tolerance: float = DEFAULT_TOLERANCE) -> bool:
        """Whether P50 and P99 both agree within ``tolerance`` (relative)."""
        return abs(self.p50_ratio - 1) <= tolerance and abs(self.p99_ratio - 1) <= tolerance

    def band_ratios(self) -> tuple[float, float] | None:
        """Live P50 and P99 over the medians of the jittered simulations."""
        if self.band is None:
            return None
        return self.live_p50_s / self.band.p50_median_s, self.live_p99_s / self.band.p99_median_s

    def inside_band(self) -> bool | None:
        """Whether live P50 and P99 both lie within the jittered simulations' range."""
        band = self.band
        if band is None:
            return None
        return (
            band.p50_min_s <= self.live_p50_s <= band.p50_max_s
            and band.p99_min_s <= self.live_p99_s <= band.p99_max_s
        )

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["within_tolerance"] = self.within()
        data["band_ratios"] = self.band_ratios()
        data["inside_band"] = self.inside_band()
        return data


def _answer_problem(record: RequestRecord, spec: PipelineSpec | None) -> str | None:
    """Why a 200 answer does not carry each stage of its call once, ``ok``; None when it does."""
    if spec is None:
        return f"call {record.request_id} names unknown pipeline {record.app!r}"
    stages = record.stages or ()
    names = [str(s.get("stage", "")) for s in stages]
    expected = [s.name for s in spec.stages]
    if sorted(names) != sorted(expected):
        return f"call {record.request_id}: stages {names}, expected {expected}"
    for stage in stages:
        if stage.get("status") != "ok":
            return f"call {record.request_id}: stage {stage.get('stage')} {stage.get('status')}"
        if stage.get("request_id") != f"{record.request_id}.{stage.get('stage')}":
            return f"call {record.request_id}: stage answered as {stage.get('request_id')}"
    return None


def _num(stage: Mapping[str, str | float], key: str) -> float:
    """A stage's number ``key``; NaN when it has none."""
    value = stage.get(key)
    return float(value) if isinstance(value, int | float) else math.nan


def _summary(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"count": 0}
    return {"p50": quantile(values, 0.5), "p99": quantile(values, 0.99), "count": len(values)}


def compare(
    records: Sequence[RequestRecord],
    simulated: Sequence[SimulatedCall],
    workload: Workload,
    *,
    policy: str,
    time_scale: float,
    update_hz: float,
    workers: int,
) -> PipelineAgreement:
    """Compare a replay's ``records`` (its plan: ``workload``'s requests in order, index
    for index) with the simulation of the same slice.

    Raises:
        PipelineAgreementError: ``time_scale`` not a positive number, records and
            simulation of different lengths, or no call finished by both sides.
    """
    if not (math.isfinite(time_scale) and time_scale > 0):
        raise PipelineAgreementError(f"time_scale must be a number > 0, got {time_scale!r}")
    if len(simulated) != len(workload.requests):
        raise PipelineAgreementError(
            f"{len(simulated)} simulated calls for {len(workload.requests)} requests"
        )
    scale = time_scale
    ok = {r.index: r for r in records if r.outcome == OK and r.latency_s is not None}
    not_ok = Counter(r.outcome for r in records if r.index not in ok)
    complete = {
        i for i, r in ok.items() if _answer_problem(r, workload.pipelines.get(r.app)) is None
    }
    both = sorted(i for i in complete if i < len(simulated) and simulated[i].finished)
    if not both:
        raise PipelineAgreementError(
            f"no call was finished by both the live stack ({len(complete)} complete answers) "
            f"and the simulator ({sum(c.finished for c in simulated)} finished)"
        )
    live = [to_model_s(ok[i].latency_s or 0.0, scale) for i in both]
    server = [to_model_s(s, scale) for i in both if (s := ok[i].server_latency_s) is not None]
    sim = [simulated[i].latency_s for i in both]
    parts: dict[str, list[float]] = {name: [] for name in STAGE_PARTS + LIVE_ONLY_PARTS}
    sim_by_worker: Counter[str] = Counter()
    live_by_worker: Counter[str] = Counter()
    for i in both:
        record = ok[i]
        _stage_parts(record, simulated[i], workload, scale, parts, sim_by_worker, live_by_worker)
        if record.server_latency_s is not None and record.latency_s is not None:
            parts["answer"].append(to_model_s(record.latency_s - record.server_latency_s, scale))
    sim_p50, sim_p99 = quantile(sim, 0.5), quantile(sim, 0.99)
    live_p50, live_p99 = quantile(live, 0.5), quantile(live, 0.99)
    lags = [r.send_lag_s for r in records if r.send_lag_s is not None]
    return PipelineAgreement(
        policy=policy,
        time_scale=time_scale,
        update_hz=update_hz,
        workers=workers,
        planned=len(records),
        answered_ok=len(ok),
        complete_answers=len(complete),
        not_ok=dict(sorted(not_ok.items())),
        sim_unfinished=sum(not c.finished for c in simulated),
        compared=len(both),
        sim_p50_s=sim_p50,
        sim_p99_s=sim_p99,
        live_p50_s=live_p50,
        live_p99_s=live_p99,
        live_server_p50_s=quantile(server, 0.5) if server else None,
        live_server_p99_s=quantile(server, 0.99) if server else None,
        p50_ratio=live_p50 / sim_p50 if sim_p50 > 0 else math.inf,
        p99_ratio=live_p99 / sim_p99 if sim_p99 > 0 else math.inf,
        paired_gap_p50_s=quantile([a - b for a, b in zip(live, sim, strict=True)], 0.5),
        max_send_lag_s=to_model_s(max(lags), scale) if lags else 0.0,
        parts={name: _summary(values) for name, values in parts.items()},
        sim_stages_by_worker=dict(sorted(sim_by_worker.items())),
        live_stages_by_worker=dict(sorted(live_by_worker.items())),
    )


def _stage_parts(
    record: RequestRecord,
    simulated: SimulatedCall,
    workload: Workload,
    scale: float,
    parts: dict[str, list[float]],
    sim_by_worker: Counter[str],
    live_by_worker: Counter[str],
) -> None:
    """Add one call's stage parts (model seconds) to ``parts``."""
    spec = workload.pipelines[record.app]
    request = workload.requests[record.index]
    by_name = {str(s.get("stage")): s for s in record.stages or ()}
    after = {stage.name: stage.after for stage in spec.stages}
    for stage in spec.stages:
        live = by_name[stage.name]
        sim = simulated.stages[stage.name]
        sim_by_worker[sim.worker_id or "?"] += 1
        live_by_worker[str(live.get("worker_id", "?"))] += 1
        arrival, assigned, started, finished = (
            _num(live, key) for key in ("arrival_s", "assigned_s", "started_s", "finished_s")
        )
        earlier = [_num(by_name[name], "finished_s") for name in after[stage.name]]
        last = max(earlier) if earlier and all(map(math.isfinite, earlier)) else math.nan
        sim_wait = sim.started_s - sim.ready_s
        live_wait = to_model_s(started - arrival, scale)
        modelled = workload.models[stage.model].exec_s * request.exec_scale
        values = {
            "held": sim.routed_s - sim.ready_s,
            "queue": sim.started_s - sim.routed_s,
            "route": to_model_s(assigned - arrival, scale),
            "dispatch": to_model_s(started - assigned, scale),
            "wait_sim": sim_wait,
            "wait_live": live_wait,
            "wait_gap": live_wait - sim_wait,
            "hop": to_model_s(arrival - last, scale),
            "exec_excess": to_model_s(finished - started, scale) - modelled,
        }
        for name, value in values.items():
            if math.isfinite(value):  # NaN: a time one side does not have
                parts[name].append(value)
