"""The placement baselines: static round-robin, a threshold heuristic, least-loaded.

Each is a small class with a ``place`` method (the
:class:`~switchyard.multimodel.snapshot.PlacementPolicy` Protocol). Decisions depend on
the snapshot only (and, for ``static-rr``, on the plan it fixed at its first update);
ties go to the worker or model listed first.

"Demand" below is a model's effective rate ``demand_rps + backlog / horizon_s`` (see
:func:`~switchyard.multimodel.planning.effective_demand_rps`): a queue that builds for a
model with no measured rate yet still asks for a replica. Its offered load is
``demand * exec_s`` busy seconds per second on a speed-1 worker.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from switchyard.multimodel.planning import (
    WorkingPlacement,
    effective_demand_rps,
    model_backlog,
    sorted_by_demand,
)
from switchyard.multimodel.snapshot import PlacementPlan, PlacementSnapshot, ResidentModel
from switchyard.policies.base import DecisionContext

__all__ = [
    "LeastLoadedConfig",
    "LeastLoadedPlacement",
    "StaticRoundRobinPlacement",
    "ThresholdConfig",
    "ThresholdPlacement",
]

DEFAULT_HORIZON_S = 10.0
"""Seconds over which a present backlog counts as extra demand."""


def _rotate_fit(
    work: WorkingPlacement, model: str, start: int
) -> int | None:  # the next worker from ``start`` (cyclic) without the model that fits it
    n = len(work.ids)
    for step in range(n):
        index = (start + step) % n
        if not work.holds(index, model) and work.fits(index, model):
            return index
    return None


class StaticRoundRobinPlacement:
    """``static-rr``: at its first update, models in descending demand (catalogue order
    on ties, so a cold start with no demand yet uses the catalogue) are dealt round-robin
    over the workers -- one replica each per pass, each to the next worker in turn that
    fits it -- pass after pass until no replica fits anywhere. It never evicts and never
    changes that plan; later updates only load what of it is missing (a load the shell
    refused, a worker that came back empty).

    Its one piece of memory is that initial plan, kept on the instance and re-derived
    when the set of workers or models changes or when nothing is placed anywhere (a new
    run): make one instance per run (the registry does).
    """

    __slots__ = ("_key", "_plan")

    name = "static-rr"

    def __init__(self) -> None:
        self._key: tuple[tuple[str, ...], tuple[str, ...]] | None = None
        self._plan: tuple[tuple[str, str], ...] = ()

    @property
    def initial_plan(self) -> tuple[tuple[str, str], ...]:
        """The ``(worker_id, model)`` pairs fixed at the first update (empty before)."""
        return self._plan

    def place(self, snapshot: PlacementSnapshot, ctx: DecisionContext) -> PlacementPlan:
        key = (tuple(w.spec.worker_id for w in snapshot.workers), tuple(snapshot.models))
        if self._key != key or not any(w.resident for w in snapshot.workers):
            self._key = key
            self._plan = self._deal(snapshot)
        work = WorkingPlacement(snapshot)
        index_of = {worker_id: i for i, worker_id in enumerate(work.ids)}
        for worker_id, model in self._plan:
            index = index_of[worker_id]
            if not work.holds(index, model) and work.fits(index, model):
                work.load(index, model)
        return work.plan()

    @staticmethod
    def _deal(snapshot: PlacementSnapshot) -> tuple[tuple[str, str], ...]:
        work = WorkingPlacement(snapshot)
        rates = {name: max(0.0, rate) for name, rate in snapshot.demand_rps.items()}
        order = sorted_by_demand(snapshot.models, rates)
        pointer = 0
        placed: list[tuple[str, str]] = []
        if not work.ids:
            return ()
        while True:
            progress = False
            for model in order:
                index = _rotate_fit(work, model, pointer)
                if index is None:
                    continue
                work.load(index, model)
                placed.append((work.ids[index], model))
                pointer = (index + 1) % len(work.ids)
                progress = True
            if not progress:
                return tuple(placed)


@dataclass(frozen=True, slots=True, kw_only=True)
class ThresholdConfig:
    """Tunables of the threshold heuristic (defaults are the documented ones)."""

    queue_high: float = 2.0
    """Add a replica when stages waiting per ready replica exceed this."""
    util_high: float = 0.8
    """... or when the model's predicted utilisation per replica exceeds this."""
    util_low: float = 0.2
    """Evict an idle replica when utilisation with one replica fewer stays below this."""
    horizon_s: float = DEFAULT_HORIZON_S

    def __post_init__(self) -> None:
        if not 0.0 <= self.util_low < self.util_high:
            raise ValueError(
                f"need 0 <= util_low < util_high, got {self.util_low} and {self.util_high}"
            )
        if self.queue_high < 0 or self.horizon_s <= 0:
            raise ValueError("queue_high must be >= 0 and horizon_s > 0")


class ThresholdPlacement:
    """``threshold``: the classic autoscaling heuristic, one step per model per update.

    For each model (descending demand) with ``rho = demand * exec_s / sum(speed of its
    replicas)``: if it has no replica and any demand, or if stages waiting per ready
    replica exceed ``queue_high`` or ``rho`` exceeds ``util_high`` (and no replica of it
    is still loading), add one replica on the least-utilised worker that fits (snapshot
    ``utilization``, plus what this update already added there). If instead an idle
    replica exists and ``rho`` with one replica fewer stays below ``util_low``, evict the
    idle replica on the most-utilised worker (the last replica only once the model has
    no demand at all). Evictions are decided before additions, so the room they free is
    usable at once. Example: 3 rps of a 0.5 s model on one speed-1 replica is
    ``rho = 1.5 > 0.8``: add one; at 0.2 rps on two replicas, ``rho`` on one is
    ``0.1 < 0.2``: evict one.
    """

    __slots__ = ("config",)

    name = "threshold"

    def __init__(self, config: ThresholdConfig | None = None) -> None:
        self.config = config or ThresholdConfig()

    def place(self, snapshot: PlacementSnapshot, ctx: DecisionContext) -> PlacementPlan:
        cfg = self.config
        work = WorkingPlacement(snapshot)
        rates = effective_demand_rps(snapshot, cfg.horizon_s)
        backlog = model_backlog(snapshot)
        speeds = [w.spec.speed for w in snapshot.workers]
        added_util = [w.utilization for w in snapshot.workers]
        order = sorted_by_demand(snapshot.models, rates)

        def rho(model: str, replicas: list[int]) -> float:
            speed = sum(speeds[i] for i in replicas)
            load = rates.get(model, 0.0) * snapshot.models[model].exec_s
            return math.inf if speed <= 0 else load / speed

        additions: list[str] = []
        for model in order:
            replicas = list(work.holders.get(model, ()))
            rate = rates.get(model, 0.0)
            if not replicas:
                if rate > 0:
                    additions.append(model)
                continue
            ready = [i for i in replicas if work.is_ready(i, model)]
            loading = len(ready) < len(replicas)
            waiting = backlog.get(model, 0)
            if not loading and (
                waiting / max(1, len(ready)) > cfg.queue_high
                or rho(model, replicas) > cfg.util_high
            ):
                additions.append(model)
                continue
            idle = [i for i in ready if work.is_idle(i, model)]
            if not idle:
                continue
            victim = max(idle, key=lambda i: (added_util[i], -i))
            rest = [i for i in replicas if i != victim]
            if (rest and rho(model, rest) < cfg.util_low) or (not rest and rate <= 0.0):
                work.evict(victim, model)
        for model in additions:
            candidates = [
                i for i in range(len(work.ids)) if not work.holds(i, model) and work.fits(i, model)
            ]
            if not candidates:
                continue
            target = min(candidates, key=lambda i: (added_util[i], -speeds[i], i))
            work.load(target, model)
            share = (
                rates.get(model, 0.0) * snapshot.models[model].exec_s / max(speeds[target], 1e-9)
            )
            added_util[target] += min(1.0, share / (len(work.holders[model])))
        return work.plan()


@dataclass(frozen=True, slots=True, kw_only=True)
class LeastLoadedConfig:
    """Tunables of least-loaded placement."""

    target_util: float = 0.7
    """Replicas per model: ``ceil(offered load / (target_util * mean worker speed))``."""
    horizon_s: float = DEFAULT_HORIZON_S

    def __post_init__(self) -> None:
        if not 0.0 < self.target_util <= 1.0:
            raise ValueError(f"target_util must be within (0, 1], got {self.target_util}")
        if self.horizon_s <= 0:
            raise ValueError("horizon_s must be > 0")


class LeastLoadedPlacement:
    """``least-loaded`` (and the placement half of ``gaps``): replicas proportional to
    demand, each on the least-loaded worker.

    A model with offered load ``a = demand * exec_s`` gets ``ceil(a / (target_util *
    mean speed))`` replicas (at least one while it has demand, none without). Excess
    replicas go first -- idle ones before busy ones, the most loaded worker's first, never
    one still loading; then, models in descending offered load, each missing replica goes
    to the least-loaded worker that fits, a worker's load being the predicted busy share
    ``sum over its models of (a / replicas) / speed``. Example: 4 rps of a 0.35 s model
    on speed-1 workers is ``a = 1.4`` -> ``ceil(1.4 / 0.7) = 2`` replicas.
    """

    __slots__ = ("config", "name")

    def __init__(self, config: LeastLoadedConfig | None = None, *, name: str = "least-loaded"):
        self.config = config or LeastLoadedConfig()
        self.name = name

    def place(self, snapshot: PlacementSnapshot, ctx: DecisionContext) -> PlacementPlan:
        cfg = self.config
        work = WorkingPlacement(snapshot)
        rates = effective_demand_rps(snapshot, cfg.horizon_s)
        n = len(work.ids)
        if n == 0:
            return work.plan()
        speeds = [max(w.spec.speed, 1e-9) for w in snapshot.workers]
        mean_speed = sum(speeds) / n
        offered = {m: rates.get(m, 0.0) * spec.exec_s for m, spec in snapshot.models.items()}
        target: dict[str, int] = {}
        for model, load in offered.items():
            wanted = (
                0
                if rates.get(model, 0.0) <= 0
                else math.ceil(load / (cfg.target_util * mean_speed) - 1e-9)
            )
            target[model] = min(n, max(1 if rates.get(model, 0.0) > 0 else 0, wanted))

        def worker_load() -> list[float]:
            loads = [0.0] * n
            for model, held in work.holders.items():
                if held and model in offered:
                    per_replica = offered[model] / len(held)
                    for i in held:
                        loads[i] += per_replica / speeds[i]
            return loads

        loads = worker_load()
        for model in snapshot.models:
            held = list(work.holders.get(model, ()))
            excess = len(held) - target[model]
            if excess <= 0:
                continue
            removable = [i for i in held if work.is_ready(i, model)]
            resident = {i: work.resident(i, model) for i in removable}
            removable.sort(
                key=lambda i: (
                    not work.is_idle(i, model),
                    _outstanding(resident[i]),
                    -loads[i],
                    i,
                )
            )
            for i in removable[:excess]:
                work.evict(i, model)
        loads = worker_load()
        order = sorted(snapshot.models, key=lambda m: -offered[m])
        for model in order:
            missing = target[model] - len(work.holders.get(model, ()))
            for _ in range(missing):
                candidates = [
                    i for i in range(n) if not work.holds(i, model) and work.fits(i, model)
                ]
                if not candidates:
                    break
                best = min(candidates, key=lambda i: (loads[i], -speeds[i], i))
                work.load(best, model)
                loads[best] += offered[model] / max(1, target[model]) / speeds[best]
        return work.plan()


def _outstanding(resident: ResidentModel | None) -> int:
    return 0 if resident is None else max(0, resident.queued) + max(0, resident.running)
