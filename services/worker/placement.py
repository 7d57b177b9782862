"""The models placed on an ``emulated-models`` worker, and how it carries out placement
orders.

A placed model is one replica: it holds its catalogue resource vector from the moment its
load starts (``loading``, for ``load_s / time_scale`` wall seconds), then serves one stage
at a time (``ready``), as the multi-model simulator and the routers assume. The sum of
the placed models' vectors never exceeds the worker's capacity: every load starts only
when it fits in what is free now.

A :class:`~switchyard.contracts.messages.PlacementOrder` is carried out unloads first:

- a model to unload turns ``draining``: the router no longer sends it stages (draining
  models are not resident in the placement snapshot), it finishes what it holds (its
  queued and running stages), then gives its resources back. One that holds nothing is
  freed at once. Unloading a model that is not placed is a no-op (a load still waiting
  for room is dropped).
- then each load: a model placed already is a no-op, a draining one has its drain
  cancelled; otherwise it starts at once when it fits in the free vector, and waits
  (*pending*) when it fits only once the draining models are gone. A load that would
  not fit even then (it exceeds the capacity, the models staying here leave too little
  room, or the catalogue does not know it) is refused with one log line naming the
  worker, the model and the vectors.

Pending loads keep the room they will take: a later load, a cancelled drain or a load on
demand (a stage routed here for a model not placed) must fit beside them, so a pending
load always starts once the drains it waits for are done.

Times are wall seconds on the worker's clock; the module does no I/O.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from switchyard.contracts.messages import PlacedModel, PlacedState, PlacementOrder
from switchyard.multimodel.model import ZERO, ModelSpec, ResourceVector

from services.worker.holdings import Holdings
from services.worker.queue import WorkItem

__all__ = [
    "ModelPlacement",
    "OrderOutcome",
    "Replica",
    "carry_out",
    "describe_vector",
    "placement_of",
    "queued_by_model",
]

log = logging.getLogger("switchyard.worker")


def describe_vector(vector: ResourceVector) -> str:
    """``[cpu 2, gpu 0.5, mem 16 GiB]``: a resource vector in a log line or an error."""
    return f"[cpu {vector.cpu:g}, gpu {vector.gpu:g}, mem {vector.mem_gib:g} GiB]"


def queued_by_model(items: Iterable[WorkItem]) -> Counter[str]:
    """How many of ``items`` (waiting stages) wait for each model."""
    return Counter(item.key.model for item in items)


@dataclass(eq=False, slots=True)
class Replica:
    """One model placed on the worker.

    Attributes:
        spec: the model's catalogue entry (its resources, load and service times).
        ready_at_s: when its load ends (wall seconds); it serves from then on.
        started_s: when its load started (wall seconds).
        draining: told to unload: it takes nothing new and leaves once it holds nothing.
        running: the stage it serves now, if any, and ``finish_at_s`` when it ends.
        idle_since_s: when its last stage ended (a queued stage starts from there).
        served_total: stages it finished since it was loaded.
    """

    spec: ModelSpec
    ready_at_s: float
    started_s: float = 0.0
    draining: bool = False
    running: WorkItem | None = None
    finish_at_s: float = 0.0
    idle_since_s: float = 0.0
    served_total: int = 0

    @property
    def model(self) -> str:
        return self.spec.name

    def loaded(self, now_s: float) -> bool:
        return now_s >= self.ready_at_s

    def state(self, now_s: float) -> PlacedState:
        if self.draining:
            return PlacedState.DRAINING
        return PlacedState.READY if self.loaded(now_s) else PlacedState.LOADING


@dataclass(slots=True)
class OrderOutcome:
    """What one order did, model by model."""

    started: list[str] = field(default_factory=list)
    """Loads that started at once."""
    pending: list[str] = field(default_factory=list)
    """Loads waiting for draining models to give their resources back."""
    draining: list[str] = field(default_factory=list)
    """Unloads that drain what they hold first."""
    freed: list[str] = field(default_factory=list)
    """Unloads that held nothing: their resources are free already."""
    kept: list[str] = field(default_factory=list)
    """Loads of draining models: the drain is cancelled."""
    refused: dict[str, str] = field(default_factory=dict)
    """Loads refused, with the reason (also logged)."""

    def summary(self) -> str:
        parts = [
            f"{name} {', '.join(models)}"
            for name, models in (
                ("unloading", self.draining),
                ("freed", self.freed),
                ("loading", self.started),
                ("waiting for room", self.pending),
                ("kept", self.kept),
                ("refused", list(self.refused)),
            )
            if models
        ]
        return "; ".join(parts) or "nothing to change"


class ModelPlacement:
    """The replicas placed on one worker within its resource vector.

    Args:
        worker_id: the worker's id (in log lines and errors).
        models: the catalogue's models by name.
        capacity: the worker's resource vector (cores, GPUs, GiB).
        time_scale: the emulation runs this many times faster than the model's seconds.
        clock: wall seconds.
    """

    def __init__(
        self,
        worker_id: str,
        models: Mapping[str, ModelSpec],
        capacity: ResourceVector,
        *,
        time_scale: float,
        clock: Callable[[], float],
    ) -> None:
        if not time_scale > 0:
            raise ValueError(f"time_scale must be positive, got {time_scale}")
        self.worker_id = worker_id
        self.models = models
        self.capacity = capacity
        self.time_scale = time_scale
        self.clock = clock
        self.replicas: dict[str, Replica] = {}
        self.pending: dict[str, ModelSpec] = {}
        """Ordered loads waiting for draining models to free room, oldest first."""
        self.loads_total = 0
        """Loads started so far (orders and on demand)."""

    # -- figures -----------------------------------------------------------------------

    def used(self) -> ResourceVector:
        """What every placed model holds, draining and loading ones included."""
        return _sum(replica.spec.resources for replica in self.replicas.values())

    def free(self) -> ResourceVector:
        """The capacity less what the placed models hold."""
        return self.capacity - self.used()

    def _kept(self) -> ResourceVector:
        """What the models staying here hold once the drains are done and the pending
        loads started."""
        staying = _sum(r.spec.resources for r in self.replicas.values() if not r.draining)
        return staying + _sum(spec.resources for spec in self.pending.values())

    def _room_after_drains(self) -> ResourceVector:
        """What is left once the draining models are gone and the pending loads started."""
        return self.capacity - self._kept()

    def placed(self, queued: Mapping[str, int]) -> list[PlacedModel]:
        """Every placed model as a heartbeat lists it; ``queued`` counts the waiting
        stages per model."""
        now_s = self.clock()
        return [
            PlacedModel(
                model=replica.model,
                state=replica.state(now_s),
                ready_in_s=max(0.0, replica.ready_at_s - now_s),
                age_s=max(0.0, now_s - replica.started_s),
                queued=queued.get(replica.model, 0),
                running=0 if replica.running is None else 1,
                served_total=replica.served_total,
            )
            for replica in self.replicas.values()
        ]

    def never_fits(self, model: str) -> str | None:
        """Why ``model`` can never be placed here (unknown, or larger than the whole
        capacity); None when it can."""
        spec = self.models.get(model)
        if spec is None:
            known = ", ".join(sorted(self.models)) or "none"
            return f"model {model!r} is not in the catalogue (its models: {known})"
        if not spec.resources.fits_in(self.capacity):
            return (
                f"model {model!r} needs {describe_vector(spec.resources)}, more than worker "
                f"{self.worker_id}'s whole capacity {describe_vector(self.capacity)}"
            )
        return None

    # -- orders ------------------------------------------------------------------------

    def apply(self, order: PlacementOrder, queued: Mapping[str, int]) -> OrderOutcome:
        """Carry out ``order`` (see the module docstring); ``queued`` counts the waiting
        stages per model. Refusals are logged, one line each."""
        outcome = OrderOutcome()
        for model in dict.fromkeys(order.unload):
            if self.pending.pop(model, None) is not None:
                outcome.freed.append(model)
                continue
            replica = self.replicas.get(model)
            if replica is None:
                continue
            replica.draining = True
            if self._holds_nothing(replica, queued):
                del self.replicas[model]
                outcome.freed.append(model)
            else:
                outcome.draining.append(model)
        for model in dict.fromkeys(order.load):
            replica = self.replicas.get(model)
            if replica is not None:
                if replica.draining:
                    if self._cancel_drain(replica, order):
                        outcome.kept.append(model)
                    else:
                        outcome.refused[model] = "its drain cannot be cancelled"
                continue
            if model in self.pending:
                continue
            reason = self._load_refusal(model)
            if reason is not None:
                outcome.refused[model] = reason
                log.warning(
                    "worker %s refused to load %s (plan %s of %s): %s",
                    self.worker_id,
                    model,
                    order.plan_id,
                    order.policy,
                    reason,
                    extra={"worker_id": self.worker_id, "model": model},
                )
                continue
            spec = self.models[model]
            if spec.resources.fits_in(self.free()):
                self._start_load(spec)
                outcome.started.append(model)
            else:
                self.pending[model] = spec
                outcome.pending.append(model)
        return outcome

    def _load_refusal(self, model: str) -> str | None:
        reason = self.never_fits(model)
        if reason is not None:
            return reason
        spec = self.models[model]
        room = self._room_after_drains()
        if spec.resources.fits_in(room):
            return None
        return (
            f"it needs {describe_vector(spec.resources)} and only {describe_vector(room)} of "
            f"worker {self.worker_id}'s capacity {describe_vector(self.capacity)} is left once "
            "its unloads and the loads waiting for room are done"
        )

    def _cancel_drain(self, replica: Replica, order: PlacementOrder) -> bool:
        """Keep a draining model (a load of it came); refused, and logged, when the loads
        waiting for room count on the resources it would give back."""
        replica.draining = False
        if self._kept().fits_in(self.capacity):
            return True
        replica.draining = True
        log.warning(
            "worker %s refused to load %s (plan %s of %s): it is draining, and the loads "
            "waiting for room (%s) need the %s it gives back, of capacity %s",
            self.worker_id,
            replica.model,
            order.plan_id,
            order.policy,
            ", ".join(self.pending),
            describe_vector(replica.spec.resources),
            describe_vector(self.capacity),
            extra={"worker_id": self.worker_id, "model": replica.model},
        )
        return False

    # -- as stages come and go ---------------------------------------------------------

    def load_on_demand(self, model: str) -> bool:
        """Start loading ``model`` for a stage routed here when it is neither placed nor
        waiting for room, if it fits now beside the pending loads; True when it started."""
        if model in self.replicas or model in self.pending or self.never_fits(model):
            return False
        spec = self.models[model]
        if not (
            spec.resources.fits_in(self.free())
            and spec.resources.fits_in(self._room_after_drains())
        ):
            return False
        self._start_load(spec)
        log.info(
            "worker %s loads %s on demand: a stage for it was routed here; free now %s",
            self.worker_id,
            model,
            describe_vector(self.free()),
            extra={"worker_id": self.worker_id, "model": model},
        )
        return True

    def settle(self, queued: Mapping[str, int]) -> bool:
        """Free the draining models that hold nothing any more, then start the pending
        loads that fit now; True when anything changed."""
        changed = False
        for model, replica in list(self.replicas.items()):
            if replica.draining and self._holds_nothing(replica, queued):
                del self.replicas[model]
                changed = True
                log.info(
                    "worker %s unloaded %s after %d stages; free now %s",
                    self.worker_id,
                    model,
                    replica.served_total,
                    describe_vector(self.free()),
                    extra={"worker_id": self.worker_id, "model": model},
                )
        for model, spec in list(self.pending.items()):
            if spec.resources.fits_in(self.free()):
                del self.pending[model]
                self._start_load(spec)
                changed = True
        return changed

    def _holds_nothing(self, replica: Replica, queued: Mapping[str, int]) -> bool:
        return replica.running is None and queued.get(replica.model, 0) == 0

    def _start_load(self, spec: ModelSpec) -> None:
        now_s = self.clock()
        if not spec.resources.fits_in(self.free()):  # the invariant every caller keeps
            raise AssertionError(f"{spec.name} does not fit in {describe_vector(self.free())}")
        ready_at_s = now_s + spec.load_s / self.time_scale
        self.replicas[spec.name] = Replica(
            spec=spec, ready_at_s=ready_at_s, started_s=now_s, idle_since_s=ready_at_s
        )
        self.loads_total += 1


def placement_of(backend: object) -> ModelPlacement | None:
    """The placement a backend keeps (``emulated-models``); None for other backends."""
    placement = getattr(backend, "placement", None)
    return placement if isinstance(placement, ModelPlacement) else None


def carry_out(
    order: PlacementOrder, placement: ModelPlacement | None, holdings: Holdings
) -> OrderOutcome | None:
    """Carry out ``order`` on a worker with ``holdings``; None when it is not for this
    worker or its backend places no models (logged). Wakes the engine: a drain may be
    done, a load may have started."""
    if order.worker_id != holdings.worker_id:
        return None
    if placement is None:
        log.warning(
            "worker %s places no models (not an emulated-models worker): placement order "
            "%s of %s ignored",
            holdings.worker_id,
            order.plan_id,
            order.policy,
            extra={"worker_id": holdings.worker_id},
        )
        return None
    outcome = placement.apply(order, queued_by_model(holdings.queue))
    holdings.wake.set()
    log.info(
        "worker %s placement order %s of %s: %s; free now %s",
        holdings.worker_id,
        order.plan_id,
        order.policy,
        outcome.summary(),
        describe_vector(placement.free()),
        extra={"worker_id": holdings.worker_id, "plan_id": order.plan_id},
    )
    return outcome


def _sum(vectors: Iterable[ResourceVector]) -> ResourceVector:
    total = ZERO
    for vector in vectors:
        total = total + vector
    return total
