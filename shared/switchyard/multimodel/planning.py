"""A scratch copy of the placement that a policy edits while it decides.

Every placement policy starts from the snapshot's placement, evicts and loads replicas on
a :class:`WorkingPlacement` (which refuses a load that does not fit the worker's free
resources at that moment) and finally turns the net changes into a
:class:`~switchyard.multimodel.snapshot.PlacementPlan`. Because every intermediate state
fits, the plan carried out as the shell does it -- all evictions first, then the loads --
fits too: after the evictions each worker holds a subset of its final residents.

Resource vectors are kept as plain ``(cpu, gpu, mem)`` float triples here: a policy
evaluates thousands of candidates per update and :class:`ResourceVector` validates on
construction.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from switchyard.multimodel.model import ModelSpec, ResourceVector
from switchyard.multimodel.snapshot import PlacementPlan, PlacementSnapshot, ResidentModel

__all__ = [
    "EPS",
    "Triple",
    "WorkingPlacement",
    "dominant_share",
    "effective_demand_rps",
    "model_backlog",
    "sorted_by_demand",
    "triple",
]

EPS = 1e-9
"""The slack of :meth:`ResourceVector.fits_in`, used for every capacity check here."""

Triple = tuple[float, float, float]


def triple(vector: ResourceVector) -> Triple:
    """``(cpu, gpu, mem_gib)`` of ``vector``."""
    return (vector.cpu, vector.gpu, vector.mem_gib)


def dominant_share(demand: Triple, capacity: Triple) -> float:
    """:meth:`ResourceVector.share_of` over triples: the largest share of ``capacity``
    taken in any dimension (``inf`` when a needed dimension is absent)."""
    share = 0.0
    for used, total in zip(demand, capacity, strict=True):
        if total > 0.0:
            share = max(share, used / total)
        elif used > 0.0:
            return math.inf
    return share


def model_backlog(snapshot: PlacementSnapshot) -> dict[str, int]:
    """Stages waiting per model: queued on its holders plus unroutable (``waiting``)."""
    backlog: dict[str, int] = {name: max(0, count) for name, count in snapshot.waiting.items()}
    for worker in snapshot.workers:
        for resident in worker.resident:
            backlog[resident.model] = backlog.get(resident.model, 0) + resident.queued
    return backlog


def effective_demand_rps(snapshot: PlacementSnapshot, horizon_s: float) -> dict[str, float]:
    """Per model, ``demand_rps + backlog / horizon_s``: the rate a placement has to serve
    so that the present backlog is also cleared within the horizon. Example: 2 rps and
    5 stages queued over a 10 s horizon -> 2.5 rps."""
    backlog = model_backlog(snapshot)
    names = set(snapshot.demand_rps) | set(backlog)
    rates: dict[str, float] = {}
    for name in names:
        rate = max(0.0, snapshot.demand_rps.get(name, 0.0)) + backlog.get(name, 0) / horizon_s
        if rate > 0.0 and math.isfinite(rate):
            rates[name] = rate
    return rates


@dataclass(slots=True)
class _Replica:
    resident: ResidentModel | None
    """What the snapshot shows; ``None`` for a replica this plan loads."""


class WorkingPlacement:
    """The snapshot's placement, edited by :meth:`load` and :meth:`evict`.

    Workers are addressed by their index in ``snapshot.workers``; ``holders`` lists, per
    model, the indexes of the workers holding it (ready, loading or planned), in snapshot
    order of first placement.
    """

    __slots__ = (
        "_evicted",
        "_loaded",
        "capacity",
        "free",
        "holders",
        "ids",
        "models",
        "replicas",
        "snapshot",
    )

    def __init__(self, snapshot: PlacementSnapshot) -> None:
        self.snapshot = snapshot
        self.models = snapshot.models
        self.ids: tuple[str, ...] = tuple(w.spec.worker_id for w in snapshot.workers)
        self.capacity: list[Triple] = [triple(w.spec.capacity) for w in snapshot.workers]
        self.free: list[list[float]] = [list(triple(w.free)) for w in snapshot.workers]
        self.replicas: list[dict[str, _Replica]] = []
        self.holders: dict[str, list[int]] = {}
        for index, worker in enumerate(snapshot.workers):
            placed: dict[str, _Replica] = {}
            for resident in worker.resident:
                placed[resident.model] = _Replica(resident)
                self.holders.setdefault(resident.model, []).append(index)
            self.replicas.append(placed)
        self._loaded: dict[tuple[int, str], None] = {}
        self._evicted: dict[tuple[int, str], None] = {}

    # -- queries --------------------------------------------------------------------

    def holds(self, index: int, model: str) -> bool:
        """Whether worker ``index`` holds ``model`` (ready, loading or planned)."""
        return model in self.replicas[index]

    def resident(self, index: int, model: str) -> ResidentModel | None:
        """The snapshot's view of the replica, ``None`` if it is planned or absent."""
        replica = self.replicas[index].get(model)
        return None if replica is None else replica.resident

    def models_on(self, index: int) -> tuple[str, ...]:
        """Models held by worker ``index``."""
        return tuple(self.replicas[index])

    def demand(self, model: str) -> Triple:
        """The model's resource vector (a model missing from the catalogue needs nothing
        the policy knows of, so it can be neither loaded nor priced)."""
        spec = self.models.get(model)
        return (0.0, 0.0, 0.0) if spec is None else triple(spec.resources)

    def fits(self, index: int, model: str, extra_free: Triple = (0.0, 0.0, 0.0)) -> bool:
        """Whether ``model`` fits worker ``index``'s free resources now (plus
        ``extra_free``, e.g. what evicting another replica would release)."""
        spec = self.models.get(model)
        if spec is None:
            return False
        need = spec.resources
        free = self.free[index]
        return (
            need.cpu <= free[0] + extra_free[0] + EPS
            and need.gpu <= free[1] + extra_free[1] + EPS
            and need.mem_gib <= free[2] + extra_free[2] + EPS
        )

    def is_ready(self, index: int, model: str) -> bool:
        """Whether the replica exists and has finished loading at the snapshot."""
        resident = self.resident(index, model)
        return resident is not None and resident.ready_at_s <= self.snapshot.now_s

    def is_idle(self, index: int, model: str) -> bool:
        """A ready replica with nothing queued or running."""
        resident = self.resident(index, model)
        return (
            resident is not None
            and resident.ready_at_s <= self.snapshot.now_s
            and resident.queued == 0
            and resident.running == 0
        )

    def age_s(self, index: int, model: str) -> float:
        """Seconds since the replica started loading (``-inf`` for a planned one; a
        model missing from the catalogue counts from its ``ready_at_s``)."""
        resident = self.resident(index, model)
        if resident is None:
            return -math.inf
        spec: ModelSpec | None = self.models.get(model)
        started = resident.ready_at_s - (spec.load_s if spec is not None else 0.0)
        return self.snapshot.now_s - started

    # -- edits ----------------------------------------------------------------------

    def load(self, index: int, model: str) -> None:
        """Place a replica of ``model`` on worker ``index``.

        Raises:
            ValueError: the worker already holds it, the model is unknown, or it does
                not fit the worker's free resources.
        """
        if self.holds(index, model):
            raise ValueError(f"worker {self.ids[index]!r} already holds model {model!r}")
        if not self.fits(index, model):
            raise ValueError(f"model {model!r} does not fit worker {self.ids[index]!r}")
        need = self.demand(model)
        free = self.free[index]
        for dim in range(3):
            free[dim] -= need[dim]
        key = (index, model)
        if key in self._evicted:  # evicted earlier in this plan: simply keep it
            del self._evicted[key]
            self.replicas[index][model] = _Replica(self._original(index, model))
        else:
            self._loaded[key] = None
            self.replicas[index][model] = _Replica(None)
        self.holders.setdefault(model, []).append(index)

    def evict(self, index: int, model: str) -> None:
        """Remove worker ``index``'s replica of ``model``.

        Raises:
            ValueError: the worker does not hold it.
        """
        if not self.holds(index, model):
            raise ValueError(f"worker {self.ids[index]!r} does not hold model {model!r}")
        need = self.demand(model)
        free = self.free[index]
        for dim in range(3):
            free[dim] += need[dim]
        key = (index, model)
        del self.replicas[index][model]
        self.holders[model].remove(index)
        if key in self._loaded:  # loaded earlier in this plan: cancel the load
            del self._loaded[key]
        else:
            self._evicted[key] = None

    def _original(self, index: int, model: str) -> ResidentModel | None:
        for resident in self.snapshot.workers[index].resident:
            if resident.model == model:
                return resident
        return None

    # -- result ---------------------------------------------------------------------

    def changed(self) -> bool:
        """Whether the plan so far changes anything."""
        return bool(self._loaded or self._evicted)

    def plan(self, cost_s: float = 0.0) -> PlacementPlan:
        """The net loads and evictions, each in the order first decided."""
        return PlacementPlan(
            load=tuple((self.ids[i], m) for i, m in self._loaded),
            evict=tuple((self.ids[i], m) for i, m in self._evicted),
            cost_s=cost_s,
        )


def sorted_by_demand(models: Iterable[str], rates: dict[str, float]) -> list[str]:
    """``models`` by descending rate, ties in the given (catalogue) order."""
    order = list(models)
    position = {name: i for i, name in enumerate(order)}
    return sorted(order, key=lambda name: (-rates.get(name, 0.0), position[name]))
