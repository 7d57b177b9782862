"""Routing pipeline stages: each ready stage to a worker that holds its model.

The ingress publishes every ready stage of a pipeline call on
``switchyard.stage-requests`` (an :class:`InferenceRequest` with a
:class:`StagePayload`, accepted in the request ledger). The scheduler consumes them in
a consumer group of their own (``scheduler-stages``) and, for each, asks the router of
the placement policy (``SWITCHYARD_PLACEMENT_POLICY``, the one the placement service
runs) which worker serves it, over the placement snapshot of the live
``emulated-models`` workers (:func:`~switchyard.cluster.placement_view.placement_snapshot`).

- A worker: the stage is assigned as an LLM request is (the
  :class:`~services.scheduler.outbox.DecisionOutbox`: ledger assign, then an
  :class:`Assignment` to the worker's inbox partition; ``variant`` is the stage's model,
  ``policy`` the placement policy's name).
- None (no worker holds the model): the stage is *held* here and routed again on every
  cluster read. Past its deadline it still waits (the placement service may load the
  model later); only after :data:`HOLD_LIMIT_S` is it answered failed, naming the model.
- A model the serving catalogue does not have (or a request that is not a stage): it is
  answered failed at once, naming the model and the catalogue's models.

Between two heartbeats of a worker, the stages this replica routed there are added to
its state (:class:`~switchyard.cluster.placement_view.PlacedDelta` ``routed``), so a
burst is spread over the holders instead of all going to the one that looked idlest.

Counts for the placement service (:mod:`switchyard.state.keys`): every stage routed or
held on its first decision adds 1 to its model in ``placement:demand`` (one round trip
per decision batch), and ``placement:waiting:{instance}`` holds the stages held per
model, rewritten whole with a time to live when it changes and at least every
:data:`WAITING_REFRESH_S`, deleted when nothing is held. A count that cannot be written
(the store away) is kept and written with the next one: counts steer placement, and
are never worth holding up a decision.

A stage of a worker declared down is routed again through :meth:`StageRouting.place`
(:mod:`services.scheduler.reassign`), its epoch moved on and the dead worker excluded.
A replica that stops publishes its held first decisions again on
``switchyard.stage-requests``, for another replica (or its successor) to route.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from functools import partial
from typing import Protocol

from opentelemetry import context as otel_context
from opentelemetry.context import Context
from opentelemetry.trace import get_current_span
from switchyard.bus import Delivery, Subscription
from switchyard.cluster import ClusterView
from switchyard.cluster.placement_view import PlacedDelta, placement_snapshot, placement_worker
from switchyard.contracts.messages import Assignment, Heartbeat, InferenceRequest, StagePayload
from switchyard.contracts.topics import STAGE_REQUESTS
from switchyard.errors import StateError
from switchyard.multimodel.model import ModelSpec, PipelineSpec
from switchyard.multimodel.snapshot import PlacementSnapshot, Router
from switchyard.policies.base import DecisionContext
from switchyard.runtime import ServiceContext
from switchyard.state import keys
from switchyard.state.base import Script, ScriptView

from services.scheduler.outbox import DecisionOutbox, FlushReport, Origin, trace_of
from services.scheduler.windows import failed_answer

log = logging.getLogger(__name__)

__all__ = [
    "HOLD_LIMIT_S",
    "WAITING_REFRESH_S",
    "HeldStage",
    "Outcome",
    "StagePlacer",
    "StageRouting",
]

HOLD_LIMIT_S = 600.0
"""How long a stage waits for a worker to hold its model before it is answered failed:
long enough for the placement service to load any model, and well within the request
record's life (a record gone would be recreated by the assignment)."""

WAITING_REFRESH_S = keys.PLACEMENT_WAITING_TTL_S / 3
"""The waiting hash is rewritten at least this often while stages are held, so it
outlives its time to live only when this replica is gone."""

EMULATED_MODELS = "emulated-models"
_BATCH = 512
_BATCH_WAIT_S = 0.2


# -- the pure part: routing over the snapshot ----------------------------------------------


@dataclass(slots=True)
class _Routed:
    """Stages this replica routed to a worker since the heartbeat it last saw, by model."""

    since_sent_at_s: float
    models: Counter[str] = field(default_factory=Counter)


class StagePlacer:
    """Routes stages with a placement policy's router over the live emulated-models
    workers' heartbeats plus this replica's own routing since them (pure: no I/O).

    Args:
        router: the placement policy's router.
        models: the serving catalogue's multi-model models, by name.
        pipelines: its pipelines, by name.
        seed: seed of the decision context's randomness.
    """

    def __init__(
        self,
        router: Router,
        models: Mapping[str, ModelSpec],
        pipelines: Mapping[str, PipelineSpec],
        seed: int = 0,
    ) -> None:
        self.router = router
        self.models = models
        self.pipelines = pipelines
        self._rng = random.Random(seed)
        self._sequence = 0
        self._beats: dict[str, Heartbeat] = {}
        self._routed: dict[str, _Routed] = {}
        self._snapshot: PlacementSnapshot | None = None
        self._built_at_s = 0.0
        self._positions: dict[str, int] = {}

    @property
    def workers(self) -> list[str]:
        """The live emulated-models workers stages may go to, by id."""
        return list(self._beats)

    def heartbeat(self, worker_id: str) -> Heartbeat | None:
        return self._beats.get(worker_id)

    def observe_cluster(self, view: ClusterView, worker_timeout_s: float) -> None:
        """Take the latest heartbeats of the workers that take work (alive, not draining,
        naming an inbox partition) and serve pipeline stages; forget the routing a newer
        heartbeat covers."""
        live: dict[str, Heartbeat] = {}
        for record in view.workers:
            beat = record.heartbeat
            if (
                beat is None
                or beat.inbox_partition is None
                or not (beat.placed or beat.backend == EMULATED_MODELS)
                or not record.takes_work(worker_timeout_s)
            ):
                continue
            live[record.worker_id] = beat
            routed = self._routed.get(record.worker_id)
            if routed is not None and beat.sent_at_s > routed.since_sent_at_s:
                del self._routed[record.worker_id]
        for worker_id in [w for w in self._routed if w not in live]:
            del self._routed[worker_id]
        self._beats = live
        self._snapshot = None

    def mark_down(self, worker_id: str) -> None:
        """Route nothing to ``worker_id`` until a cluster read shows it taking work."""
        self._beats.pop(worker_id, None)
        self._routed.pop(worker_id, None)
        self._snapshot = None

    def snapshot(self, now_s: float, waiting: Mapping[str, int] | None = None) -> PlacementSnapshot:
        """The placement snapshot at wall time ``now_s``, this replica's routing added
        (built once per ``now_s`` and cluster read; a routed stage updates its worker)."""
        if self._snapshot is None or self._built_at_s != now_s:
            self._snapshot = placement_snapshot(
                self._beats.values(),
                models=self.models,
                pipelines=self.pipelines,
                now_wall_s=now_s,
                demand_rps={},
                waiting=waiting or {},
                deltas={w: _delta(r) for w, r in self._routed.items()},
            )
            self._built_at_s = now_s
            self._positions = {
                worker.spec.worker_id: index for index, worker in enumerate(self._snapshot.workers)
            }
        return self._snapshot

    def route(
        self,
        model: str,
        now_s: float,
        exclude: frozenset[str] = frozenset(),
        waiting: Mapping[str, int] | None = None,
    ) -> str | None:
        """The worker for a stage of ``model`` (None: no live worker holds it), counted
        against that worker until its next heartbeat."""
        snapshot = self.snapshot(now_s, waiting)
        if exclude:
            snapshot = replace(
                snapshot,
                workers=tuple(w for w in snapshot.workers if w.spec.worker_id not in exclude),
            )
        ctx = DecisionContext(self._rng, self._sequence)
        self._sequence += 1
        worker_id = self.router.route(model, snapshot, ctx)
        if worker_id is None:
            return None
        if worker_id not in self._beats or worker_id in exclude:
            log.warning("router chose %r for model %r, not a candidate: held", worker_id, model)
            return None
        self._account(worker_id, model)
        return worker_id

    def _account(self, worker_id: str, model: str) -> None:
        beat = self._beats[worker_id]
        routed = self._routed.get(worker_id)
        if routed is None:
            routed = self._routed[worker_id] = _Routed(since_sent_at_s=beat.sent_at_s)
        routed.models[model] += 1
        snapshot = self._snapshot
        position = self._positions.get(worker_id)
        if snapshot is None or position is None:
            return
        state = placement_worker(
            beat, self.models, now_wall_s=self._built_at_s, delta=_delta(routed)
        )
        workers = list(snapshot.workers)
        workers[position] = state
        self._snapshot = replace(snapshot, workers=tuple(workers))


def _delta(routed: _Routed) -> PlacedDelta:
    return PlacedDelta(routed=dict(routed.models))


# -- the counts the placement service reads --------------------------------------------------
# KEYS: placement:demand, placement:waiting:{instance}. ARGV: ttl_ms, the number of demand
# pairs, "1" to rewrite the waiting hash, then the demand model/count pairs, then the
# waiting model/count pairs (none: the hash is deleted). -> {"ok"}

_COUNTS_LUA = """
local pairs_n = tonumber(ARGV[2])
for i = 0, pairs_n - 1 do
  redis.call('HINCRBY', KEYS[1], ARGV[4 + 2 * i], ARGV[5 + 2 * i])
end
if ARGV[3] == '1' then
  redis.call('DEL', KEYS[2])
  local first = 4 + 2 * pairs_n
  if #ARGV >= first then
    redis.call('HSET', KEYS[2], unpack(ARGV, first))
    redis.call('PEXPIRE', KEYS[2], ARGV[1])
  end
end
return {'ok'}
"""


def _counts(view: ScriptView, keys_: Sequence[str], args: Sequence[str]) -> list[str]:
    pairs_n = int(args[1])
    demand = args[3 : 3 + 2 * pairs_n]
    for model, amount in zip(demand[0::2], demand[1::2], strict=True):
        view.hincrby(keys_[0], model, int(amount))
    if args[2] == "1":
        view.delete(keys_[1])
        waiting = args[3 + 2 * pairs_n :]
        if waiting:
            view.hset(keys_[1], dict(zip(waiting[0::2], waiting[1::2], strict=True)))
            view.expire(keys_[1], int(args[0]) / 1000.0)
    return ["ok"]


STAGE_COUNTS = Script("stage-counts", _COUNTS_LUA, _counts)
"""Add to the demand counters and rewrite the waiting hash, in one atomic step."""


# -- the shell ----------------------------------------------------------------------------


class Outcome(Enum):
    """What :meth:`StageRouting.place` did with a stage."""

    ASSIGNED = "assigned"
    HELD = "held"
    FAILED = "failed"


@dataclass(slots=True)
class HeldStage:
    """A stage no live worker holds the model of, waiting in this replica."""

    request: InferenceRequest
    model: str
    since_s: float
    epoch: int = 0
    exclude: frozenset[str] = frozenset()
    trace: Context | None = None
    replaces_worker: str | None = None


class StageHost(Protocol):
    """What stage routing needs of the scheduler replica it runs in
    (:class:`services.scheduler.service.SchedulerService`)."""

    ctx: ServiceContext

    def assign(
        self,
        outbox: DecisionOutbox,
        assignment: Assignment,
        origin: Origin | None,
        replaces_worker: str | None,
    ) -> None: ...

    async def flush(self, outbox: DecisionOutbox) -> FlushReport: ...

    async def refuse(self, delivery: Delivery[InferenceRequest], reason: str) -> None: ...


class StageRouting:
    """The scheduler's stage path (see the module docstring).

    Args:
        host: the scheduler replica (its context, its outbox flush and assignment).
        placer: routing over the snapshot.
        policy: the placement policy's name (each assignment's ``policy``).
    """

    def __init__(self, host: StageHost, placer: StagePlacer, policy: str) -> None:
        self.host = host
        self.placer = placer
        self.policy = policy
        self._held: dict[str, HeldStage] = {}
        self._waiting: Counter[str] = Counter()
        self._demand: Counter[str] = Counter()
        self._waiting_written: dict[str, int] | None = None
        self._waiting_written_s = 0.0
        self._counts_lock = asyncio.Lock()
        self._counts_failing = False
        self.failed = 0

    @property
    def held(self) -> list[HeldStage]:
        """The stages waiting here, oldest first."""
        return list(self._held.values())

    def waiting(self) -> dict[str, int]:
        """Held stages per model."""
        return {model: count for model, count in self._waiting.items() if count > 0}

    def _hold(self, item: HeldStage) -> None:
        if item.request.request_id not in self._held:
            self._held[item.request.request_id] = item
            self._waiting[item.model] += 1

    def _unhold(self, request_id: str) -> None:
        item = self._held.pop(request_id, None)
        if item is not None:
            self._waiting[item.model] -= 1

    # -- consuming ----------------------------------------------------------------------

    async def routine(self) -> None:
        """Consume ``switchyard.stage-requests`` in batches and route them."""
        ctx = self.host.ctx
        async with ctx.bus.subscribe(
            STAGE_REQUESTS, group="scheduler-stages", stopping=ctx.stopping
        ) as sub:
            while not ctx.stopping.is_set():
                batch = await sub.next_batch(_BATCH, timeout_s=_BATCH_WAIT_S)
                if batch:
                    await sub.handle_batch(
                        batch, partial(self._decide_batch, sub), on_dead_letter=self.host.refuse
                    )

    async def _decide_batch(
        self, sub: Subscription[InferenceRequest], batch: Sequence[Delivery[InferenceRequest]]
    ) -> None:
        """Route a batch of stages; counted as demand once recorded and sent."""
        outbox = DecisionOutbox(sub)
        now_s = time.time()
        demand: Counter[str] = Counter()
        for delivery in _unique(batch):
            request = delivery.message
            if self.place(request, now_s, outbox, delivery) is not Outcome.FAILED:
                assert isinstance(request.payload, StagePayload)
                demand[request.payload.model] += 1
        await self.host.flush(outbox)
        self._demand.update(demand)
        await self.write_counts(now_s)

    # -- deciding -----------------------------------------------------------------------

    def place(
        self,
        request: InferenceRequest,
        now_s: float,
        outbox: DecisionOutbox,
        origin: Origin | None = None,
        *,
        epoch: int = 0,
        exclude: frozenset[str] = frozenset(),
        replaces_worker: str | None = None,
        since_s: float | None = None,
    ) -> Outcome:
        """Route one stage into ``outbox`` (epoch > 0: a re-assignment replacing
        ``epoch - 1`` on ``replaces_worker``), hold it, or answer it failed."""
        payload = request.payload
        if not isinstance(payload, StagePayload):
            error = (
                f"request {request.request_id!r} is a {payload.kind} request on "
                f"{STAGE_REQUESTS.name}, which carries pipeline stages only"
            )
            self._fail(request, now_s, error, outbox, origin, epoch)
            return Outcome.FAILED
        spec = self.placer.models.get(payload.model)
        if spec is None:
            known = ", ".join(sorted(self.placer.models)) or "none"
            error = (
                f"stage {payload.stage!r} of pipeline {payload.pipeline!r} names model "
                f"{payload.model!r}, which the serving catalogue does not have "
                f"(its models: {known})"
            )
            self._fail(request, now_s, error, outbox, origin, epoch)
            return Outcome.FAILED
        worker_id = self.placer.route(payload.model, now_s, exclude, self._waiting)
        if worker_id is None:
            trace = trace_of(origin)
            if isinstance(origin, Delivery):  # consumed now: its span shows the hold
                with outbox.scope(origin):
                    get_current_span().add_event("held", {"model": payload.model})
                    trace = otel_context.get_current()
            since = now_s if since_s is None else since_s
            self._hold(
                HeldStage(request, payload.model, since, epoch, exclude, trace, replaces_worker)
            )
            return Outcome.HELD
        self._unhold(request.request_id)
        beat = self.placer.heartbeat(worker_id)
        assert beat is not None
        assignment = Assignment(
            request=request,
            worker_id=worker_id,
            variant=payload.model,
            order=request.arrival_s,
            policy=self.policy,
            epoch=epoch,
            # Wall seconds: the model's mean scaled to this request, at the worker's speed.
            predicted_s=spec.exec_s * payload.exec_scale / (beat.speed * beat.time_scale),
            deadline_s=request.deadline_s,
            assigned_at_s=time.time(),
        )
        self.host.assign(outbox, assignment, origin, replaces_worker)
        return Outcome.ASSIGNED

    def _fail(
        self,
        request: InferenceRequest,
        now_s: float,
        error: str,
        outbox: DecisionOutbox,
        origin: Origin | None,
        epoch: int,
    ) -> None:
        outbox.answer(
            failed_answer(request, now_s, error, epoch=epoch), request, origin, epoch=epoch
        )
        self.failed += 1

    async def retry_held(self, now_s: float) -> None:
        """Route the held stages again (after a cluster read), oldest first; answer those
        held for :data:`HOLD_LIMIT_S` failed."""
        if not self._held:
            return
        items = list(self._held.values())
        self._held = {}
        self._waiting.clear()
        outbox = DecisionOutbox()
        unroutable: set[tuple[str, frozenset[str]]] = set()
        for item in items:
            request = item.request
            if now_s - item.since_s >= HOLD_LIMIT_S:
                error = (
                    f"no worker held model {item.model!r} within {HOLD_LIMIT_S:.0f} s "
                    f"(stage {request.request_id!r})"
                )
                self._fail(request, now_s, error, outbox, item.trace, item.epoch)
                continue
            if (item.model, item.exclude) in unroutable:
                # No holder now: the rest of this model's stages need not ask again.
                self._hold(item)
                continue
            outcome = self.place(
                request,
                now_s,
                outbox,
                item.trace,
                epoch=item.epoch,
                exclude=item.exclude,
                replaces_worker=item.replaces_worker,
                since_s=item.since_s,
            )
            if outcome is Outcome.HELD:
                unroutable.add((item.model, item.exclude))
        if not outbox:
            return
        try:
            await self.host.flush(outbox)
        except BaseException:
            # Not recorded: hold them again, so that none is lost.
            for item in items:
                self._hold(item)
            raise

    # -- counts for the placement service ---------------------------------------------------

    async def write_counts(self, now_s: float) -> None:
        """Write the demand counted since the last write, and the waiting hash when it
        changed or is due (see the module docstring); nothing when neither."""
        async with self._counts_lock:
            demand = dict(self._demand)
            waiting = self.waiting()
            rewrite = waiting != self._waiting_written or (
                bool(waiting) and now_s - self._waiting_written_s >= WAITING_REFRESH_S
            )
            if not demand and not rewrite:
                return
            ttl_ms = str(max(1, round(keys.PLACEMENT_WAITING_TTL_S * 1000)))
            args = [ttl_ms, str(len(demand)), "1" if rewrite else ""]
            args += _flat(demand.items())
            if rewrite:
                args += _flat(waiting.items())
            instance = self.host.ctx.settings.instance_id
            try:
                await self.host.ctx.state.run_script(
                    STAGE_COUNTS, [keys.PLACEMENT_DEMAND, keys.placement_waiting(instance)], args
                )
            except StateError as exc:
                if not self._counts_failing:
                    log.warning("placement counts not written (kept for the next try): %s", exc)
                self._counts_failing = True
                return
            self._counts_failing = False
            self._demand -= Counter(demand)
            if rewrite:
                self._waiting_written = waiting
                self._waiting_written_s = now_s

    async def on_cluster_read(self) -> None:
        """After each cluster read: route the held stages again, then write the counts."""
        now_s = time.time()
        await self.retry_held(now_s)
        await self.write_counts(now_s)

    async def hand_back(self) -> None:
        """On stop: publish the held first decisions again on
        ``switchyard.stage-requests`` (their records are still queued) for another
        replica to route, and write the last counts (nothing held: the hash goes)."""
        bus = self.host.ctx.bus
        firsts = [item for item in self._held.values() if item.epoch == 0]
        acks = []
        scope = DecisionOutbox()
        try:
            for item in firsts:
                with scope.scope(item.trace):
                    acks.append(await bus.send(STAGE_REQUESTS, item.request))
            await asyncio.gather(*acks)
        except Exception as exc:
            # Their records stay queued; the ingress answers their calls on its timeout.
            log.warning("%d held stages not handed back: %s", len(firsts), exc)
            return
        for item in firsts:
            self._unhold(item.request.request_id)
        if firsts:
            log.info("handed %d held stages back to %s", len(firsts), STAGE_REQUESTS.name)
        await self.write_counts(time.time())


def _flat(pairs: Iterable[tuple[str, int]]) -> list[str]:
    return [text for model, count in pairs for text in (model, str(count))]


def _unique(batch: Sequence[Delivery[InferenceRequest]]) -> list[Delivery[InferenceRequest]]:
    """The batch with each request once (a copy within a batch is routed once)."""
    fresh: dict[str, Delivery[InferenceRequest]] = {}
    for delivery in batch:
        fresh.setdefault(delivery.message.request_id, delivery)
    return list(fresh.values())
