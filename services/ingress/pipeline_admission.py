"""Deadline-aware admission control for pipeline calls: admit a call only when its
stages, each on the worker that can finish it soonest, can all be done before the call's
deadline.

Pure and synchronous, like :mod:`services.ingress.load_shedding` (whose verdicts,
slack, grace and ``Retry-After`` rule it shares): :class:`PipelineGate` holds the
monitor's last :class:`~switchyard.cluster.ClusterView` and the work still to come of
the calls this replica admitted, and :meth:`PipelineGate.decide` judges one call at
the time passed in, before any of its stages is recorded, so a refused call leaves
nothing behind.

**The estimate.** A live ``emulated-models`` worker lists in its heartbeat the models
placed on it (``placed``: loading, ready or draining) with the stages queued and running
on each; each placed model is one replica serving one stage at a time. For stage ``s``
on model ``m`` and worker ``w`` (``m`` placed there and not draining):

- *service time* ``e = exec_s * exec_scale / speed / time_scale`` (the catalogue's model
  seconds on that worker, in wall seconds);
- the replica is *free* after ``max(load left, backlog)``: the load time left
  (``ready_in_s``) and ``(queued + running) * e`` (a running stage counted whole: it
  errs long by less than one stage), both less the seconds since the monitor received
  the heartbeat, plus this replica's own work to come for ``m`` shared among the
  workers holding it: the stages of the calls it admitted that are not yet sent (an
  upscale waits for its generate: no heartbeat lists it yet), and those sent since the
  oldest live heartbeat (not listed yet either);
- the stage *starts* when the replica is free and its ``after`` stages are done, and
  *finishes* ``e`` later. Its finish is the earliest over the workers holding ``m``.
  A model placed on no live worker finishes after its load time and service on the
  fastest worker: the placement service loads models stages wait for (a later round,
  so the estimate errs short).

An *LLM stage* (one served by the LLM workers, :mod:`services.ingress.pipeline_llm`)
finishes on the live LLM worker of its application's model that finishes it soonest, by
the request gate's own estimate (:func:`services.ingress.load_shedding.estimate`:
continuous batches on the worker's performance profile, its held work and KV cache from
its heartbeat), starting no earlier than its ``after`` stages end; its prompt is
estimated as the call's input tokens plus the output tokens of the LLM stages it runs
after. Idle, it takes its service alone. This replica's own LLM work that no heartbeat
lists yet counts on the model's workers as the request gate counts its own admissions
(a slot, the idle service and the KV tokens each), shared evenly among the model's live
workers: the LLM stages it sent less than
:data:`~services.ingress.load_shedding.IN_TRANSIT_S` before the oldest live LLM
worker's latest heartbeat (or after it), and those of the calls it admitted still to
come (a verdict waits for its draft; a conditional one counts until dropped), which
will run in the batch a new call's stage joins. Without them, calls admitted together
were each judged on the batch as it was, and the batch they made together ran their
stages past the deadline (``bench/llm_pipeline_bench.py``). An LLM stage that no live
worker serves is not judged (the scheduler holds it until one does), and teaches the
calibration nothing.

The call's *expected* time is its critical path: the latest finish of its stages. A
conditional stage counts as run (the deadline holds for the branch that runs most).

**Calibration** (:mod:`services.ingress.calibration`). The estimate is a queue model's,
so the gate learns from the calls it admitted: when one is answered
(:meth:`PipelineGate.call_ended` with its answer time), it keeps how much later than
estimated it finished, and adds the calibration quantile of those errors (when positive)
to every expected time. A call admitted while one of its models was placed nowhere
teaches nothing: it also waits for the placement service's next round, which the
estimate leaves out, and a cold start's first calls would otherwise set a margin far
larger than any error after them.

It is **refused with 429** when the calibrated expected time exceeds ``slack`` times
the time left to the deadline, unless the call would miss it even on idle workers with
every model loaded and it waits behind no one (it delays nobody). **503** when the
pipeline has model stages and no live worker has served ``emulated-models`` stages for
longer than the grace period. Before
the first read of the cluster the gate admits everything.

The coordinator reports each admitted call's stages as it sends them
(:meth:`PipelineGate.stage_sent`), skips them (:meth:`PipelineGate.stage_dropped`) and
ends the call (:meth:`PipelineGate.call_ended`). Replicas do not share this account:
with several ingress replicas each sees the others' calls only as their stages reach
the workers. A retry of a call already accepted is not judged again (the coordinator
checks for its first stage's record before refusing).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from switchyard.cluster import ClusterView, WorkerRecord
from switchyard.contracts.messages import Heartbeat, PlacedState
from switchyard.multimodel.model import ModelSpec, PipelineSpec, Stage

from services.ingress.calibration import CALIBRATION_HORIZON, EstimateErrors
from services.ingress.load_shedding import (
    IN_TRANSIT_S,
    Decision,
    Demand,
    Verdict,
    estimate,
    without_worker,
)

__all__ = ["PipelineGate"]


@dataclass(frozen=True, slots=True)
class _Work:
    """One stage's service time on a model (wall seconds), and when it was sent; an LLM
    stage's model is the served LLM model, its service time alone, and its context
    tokens."""

    model: str
    service_s: float
    sent_at_s: float = 0.0
    llm: bool = False
    tokens: int = 0


@dataclass(frozen=True, slots=True)
class _Finish:
    """When one stage is estimated to finish, and its service time there; ``placed``:
    on a worker its model is placed on (not loaded first where none holds it)."""

    finish_s: float
    service_s: float
    placed: bool = True
    work: _Work | None = None
    """An LLM stage's work on its model (what it adds to a worker once sent)."""


def _takes_stages(heartbeat: Heartbeat) -> bool:
    return heartbeat.backend == "emulated-models"


def _service_s(spec: ModelSpec, exec_scale: float, heartbeat: Heartbeat) -> float:
    return spec.exec_s * exec_scale / heartbeat.speed / heartbeat.time_scale


class PipelineGate:
    """The cluster as last read, this replica's stage admissions since, and the decision.

    Args:
        models: the serving catalogue's multi-model models by name.
        llm_models: each LLM application's served model, by application name (what an
            LLM stage names, and what an LLM worker's heartbeat lists).
        slack: a call is refused when its expected time exceeds ``slack`` times the time
            left to its deadline (> 0).
        grace_s: how long there may be no live ``emulated-models`` worker before calls
            get 503.
        worker_timeout_s: a worker not heard from for this long is not live.
    """

    def __init__(
        self,
        models: Mapping[str, ModelSpec],
        *,
        llm_models: Mapping[str, str] | None = None,
        slack: float = 1.0,
        grace_s: float = 10.0,
        worker_timeout_s: float = 2.0,
    ) -> None:
        if not (math.isfinite(slack) and slack > 0):
            raise ValueError(f"slack must be a finite number > 0, got {slack}")
        self.models = models
        self.llm_models: Mapping[str, str] = llm_models or {}
        self.slack = slack
        self.grace_s = grace_s
        self.worker_timeout_s = worker_timeout_s
        self._view: ClusterView | None = None
        self._first_refresh_s: float | None = None
        self._served_at_s: float | None = None
        self._to_send: dict[str, dict[str, _Work]] = {}
        """The stages not yet sent of each call admitted here, by call id and stage."""
        self._sent: list[_Work] = []
        """Stages sent since the oldest live heartbeat (no heartbeat lists them yet)."""
        self._llm_sent: list[_Work] = []
        """LLM stages sent that no live LLM worker's heartbeat may list yet."""
        self._expected: dict[str, tuple[float, float]] = {}
        """Each call admitted here: when it is expected to be answered (uncalibrated),
        and how long its error will count."""
        self._errors = EstimateErrors()
        """How much later than expected the latest admitted calls were answered."""

    def observe(self, view: ClusterView) -> None:
        """Take a fresh read of the monitor's records (at ``view.now_s``): the stages
        sent before every live worker's latest heartbeat are left to the heartbeats."""
        if self._first_refresh_s is None:
            self._first_refresh_s = view.now_s
        heard_s = [
            record.heartbeat.sent_at_s
            for record in view.workers
            if self._live(record) and record.heartbeat is not None
        ]
        if heard_s:
            oldest_s = min(heard_s)
            self._sent = [work for work in self._sent if work.sent_at_s >= oldest_s]
        else:
            self._sent.clear()  # no worker to list them, and no estimate to make
        llm_heard_s = [
            record.heartbeat.sent_at_s
            for record in view.workers
            if record.takes_work(self.worker_timeout_s)
            and record.heartbeat is not None
            and not _takes_stages(record.heartbeat)
        ]
        if llm_heard_s:
            since_s = min(llm_heard_s) - IN_TRANSIT_S
            self._llm_sent = [work for work in self._llm_sent if work.sent_at_s > since_s]
        else:
            self._llm_sent.clear()
        if any(self._live(record) for record in view.workers):
            self._served_at_s = view.now_s
        self._view = view

    def _live(self, record: WorkerRecord) -> bool:
        return (
            record.takes_work(self.worker_timeout_s)
            and record.heartbeat is not None
            and _takes_stages(record.heartbeat)
        )

    def _llm_live(self, model: str) -> list[WorkerRecord]:
        """The live LLM workers serving ``model`` (none before a read)."""
        if self._view is None:
            return []
        return [
            record
            for record in self._view.workers
            if record.takes_work(self.worker_timeout_s)
            and record.heartbeat is not None
            and not _takes_stages(record.heartbeat)
            and model in record.heartbeat.servable_models
        ]

    def decide(
        self,
        pipeline: PipelineSpec,
        *,
        exec_scale: float,
        arrival_s: float,
        deadline_s: float,
        now_s: float,
        call_id: str,
        input_tokens: int = 1,
    ) -> Decision:
        """Admit or refuse the call ``call_id`` of ``pipeline`` at ``now_s``
        (``input_tokens``: its input's, the first LLM stages' prompt); an admitted call's
        model stages count as work to come on their models until sent and heard of."""
        time_left_s = deadline_s - now_s
        view = self._view
        if view is None:
            return Decision(
                verdict=Verdict.ADMIT,
                time_left_s=time_left_s,
                reason="no cluster view yet (fail open)",
            )
        live = [record for record in view.workers if self._live(record)]
        if not live and pipeline.models():
            return self._without_worker(now_s, time_left_s)
        call = (pipeline, exec_scale, input_tokens)
        loaded = self._path(*call, live, now_s, own_s=self._own_work_s(live))
        estimate_s = max(f.finish_s for f in loaded.values()) - now_s
        margin_s = self.margin_s(now_s)
        expected_s = estimate_s + margin_s
        idle = self._path(*call, live, now_s, own_s=None)
        idle_s = max(f.finish_s for f in idle.values()) - now_s
        budget_s = self.slack * time_left_s
        fits_idle = idle_s <= budget_s
        waits = estimate_s > idle_s + 1e-9
        if expected_s > budget_s and (fits_idle or waits):
            relative_s = self.slack * (deadline_s - arrival_s)
            return Decision(
                verdict=Verdict.OVERLOADED,
                wait_s=max(0.0, expected_s - idle_s),
                service_s=idle_s,
                time_left_s=time_left_s,
                retry_after_s=max(1, math.ceil(expected_s - relative_s)),
                reason=(
                    f"expected {expected_s:.3f} s for its stages (calibration "
                    f"{margin_s:+.3f} s; {idle_s:.3f} s on idle workers) > "
                    f"{self.slack:g} x {time_left_s:.3f} s left"
                ),
            )
        to_send: dict[str, _Work] = {}
        for stage in pipeline.stages:
            finish = loaded[stage.name]
            if stage.llm is None:
                to_send[stage.name] = _Work(stage.model, finish.service_s)
            elif finish.work is not None:  # None: no live worker serves it, not judged
                to_send[stage.name] = finish.work
        self._to_send[call_id] = to_send
        if all(finish.placed for finish in loaded.values()):
            # One that waits for a model placed nowhere waits for the placement service's
            # next round too: that error is the round's, not the queues', and is not learnt.
            horizon_s = CALIBRATION_HORIZON * max(0.0, deadline_s - arrival_s)
            self._expected[call_id] = (now_s + estimate_s, horizon_s)
        return Decision(
            verdict=Verdict.ADMIT,
            wait_s=max(0.0, expected_s - idle_s),
            service_s=idle_s,
            time_left_s=time_left_s,
            reason="fits its deadline"
            if fits_idle
            else "cannot fit even idle, waits behind no one (not overload)",
        )

    def _path(
        self,
        pipeline: PipelineSpec,
        exec_scale: float,
        input_tokens: int,
        live: list[WorkerRecord],
        now_s: float,
        *,
        own_s: Mapping[str, float] | None,
    ) -> dict[str, _Finish]:
        """Each stage's estimated finish, in pipeline order (``after`` stages first);
        ``own_s``: this replica's work to come per holder of each model; None: on idle
        workers with every model loaded."""
        finish: dict[str, _Finish] = {}
        for stage in pipeline.stages:
            ready_s = max((finish[name].finish_s for name in stage.after), default=now_s)
            if stage.llm is not None:
                prompt_tokens = pipeline.llm_prompt_tokens(stage, input_tokens)
                finish[stage.name] = self._on_llm(
                    stage, prompt_tokens, ready_s, now_s, idle=own_s is None
                )
                continue
            spec = self.models[stage.model]
            best: _Finish | None = None
            for record in live:
                found = self._on(
                    record,
                    spec,
                    exec_scale,
                    ready_s,
                    now_s,
                    None if own_s is None else own_s.get(spec.name, 0.0),
                )
                if found is not None and (best is None or found.finish_s < best.finish_s):
                    best = found
            if best is None:  # only when not idle: idle, every worker serves every model
                best = self._loaded_first(live, spec, exec_scale, ready_s, now_s)
            finish[stage.name] = best
        return finish

    def _on_llm(
        self, stage: Stage, prompt_tokens: int, ready_s: float, now_s: float, *, idle: bool
    ) -> _Finish:
        """When an LLM stage ready at ``ready_s`` finishes on the live LLM worker that
        finishes it soonest (``idle``: alone, behind no work); at ``ready_s``, not learnt
        from, when none serves its model."""
        assert stage.llm is not None
        model = self.llm_models.get(stage.model, stage.model)
        demand = Demand(
            kind="llm",
            model=model,
            arrival_s=now_s,
            deadline_s=now_s,
            prompt_tokens=prompt_tokens,
            output_tokens=stage.llm.output_tokens,
        )
        tokens = prompt_tokens + stage.llm.output_tokens
        live = self._llm_live(model)
        # This replica's LLM work on the model that no heartbeat lists: sent since, and
        # the stages of the calls it admitted still to come (a verdict waits for its
        # draft), which will run in the batch this stage joins.
        coming = (w for stages in self._to_send.values() for w in stages.values() if w.llm)
        own = [w for w in itertools.chain(self._llm_sent, coming) if w.model == model]
        share = 1.0 / max(1, len(live))
        count = math.ceil(len(own) * share)
        sent_s = sum(work.service_s for work in own) * share
        sent_tokens = int(sum(work.tokens for work in own) * share)
        best: _Finish | None = None
        for record in live:
            if idle:
                found = estimate(demand, record, now_s)
                finish = _Finish(ready_s + found.idle_service_s, found.idle_service_s)
            else:
                found = estimate(demand, record, now_s, count, sent_s, sent_tokens)
                start_s = max(ready_s, now_s + found.wait_s)
                work = _Work(model, found.idle_service_s, llm=True, tokens=tokens)
                finish = _Finish(start_s + found.service_s, found.service_s, work=work)
            if best is None or finish.finish_s < best.finish_s:
                best = finish
        return best if best is not None else _Finish(ready_s, 0.0, placed=False)

    def _on(
        self,
        record: WorkerRecord,
        spec: ModelSpec,
        exec_scale: float,
        ready_s: float,
        now_s: float,
        own_s: float | None,
    ) -> _Finish | None:
        """When a stage of ``spec`` ready at ``ready_s`` finishes on ``record``'s worker,
        behind ``own_s`` of this replica's work to come (None: the worker idle, the model
        loaded); None when the model is not placed there (or is draining)."""
        heartbeat = record.heartbeat
        assert heartbeat is not None
        service_s = _service_s(spec, exec_scale, heartbeat)
        if own_s is None:
            return _Finish(ready_s + service_s, service_s)
        placed = next((p for p in heartbeat.placed if p.model == spec.name), None)
        if placed is None or placed.state is PlacedState.DRAINING:
            return None
        since_s = max(0.0, now_s - record.last_seen_s)
        backlog_s = (placed.queued + placed.running) * service_s - since_s
        backlog_s = max(0.0, backlog_s) + own_s
        free_s = now_s + max(placed.ready_in_s - since_s, backlog_s, 0.0)
        return _Finish(max(ready_s, free_s) + service_s, service_s)

    def _own_work_s(self, live: list[WorkerRecord]) -> dict[str, float]:
        """This replica's work to come per model (its admitted calls' stages not sent,
        and those sent that no heartbeat lists yet), shared among the model's holders."""
        work_s: dict[str, float] = {}
        for work in itertools.chain(
            (w for stages in self._to_send.values() for w in stages.values()), self._sent
        ):
            if not work.llm:
                work_s[work.model] = work_s.get(work.model, 0.0) + work.service_s
        holders: dict[str, int] = {}
        for record in live:
            assert record.heartbeat is not None
            for placed in record.heartbeat.placed:
                if placed.state is not PlacedState.DRAINING:
                    holders[placed.model] = holders.get(placed.model, 0) + 1
        return {model: s / max(1, holders.get(model, 0)) for model, s in work_s.items()}

    # -- what the coordinator reports ----------------------------------------------------

    def stage_sent(self, call_id: str, stage: str, now_s: float) -> None:
        """A stage of an admitted call was accepted and published at ``now_s``: it counts
        until a heartbeat sent after it can list it."""
        work = self._to_send.get(call_id, {}).pop(stage, None)
        if work is not None:
            (self._llm_sent if work.llm else self._sent).append(replace(work, sent_at_s=now_s))

    def stage_dropped(self, call_id: str, stage: str) -> None:
        """A stage of an admitted call will not run (its branch was not taken)."""
        self._to_send.get(call_id, {}).pop(stage, None)

    def call_ended(self, call_id: str, answered_at_s: float | None = None) -> None:
        """An admitted call ended: its stages not sent will not be. ``answered_at_s``:
        when every stage had answered (None: it failed, timed out or its client left),
        which calibrates the estimates that follow."""
        self._to_send.pop(call_id, None)
        expected = self._expected.pop(call_id, None)
        if expected is None or answered_at_s is None:
            return
        expected_at_s, horizon_s = expected
        self._errors.add(answered_at_s - expected_at_s, answered_at_s + horizon_s)

    def margin_s(self, now_s: float) -> float:
        """What the gate adds to every expected time at ``now_s`` (see the module
        docstring): the calibration quantile of the errors that still count, or 0 with
        too few."""
        error_s = self._errors.quantile(now_s)
        return 0.0 if error_s is None else max(0.0, error_s)

    def _loaded_first(
        self,
        live: list[WorkerRecord],
        spec: ModelSpec,
        exec_scale: float,
        ready_s: float,
        now_s: float,
    ) -> _Finish:
        """A stage whose model no live worker holds: its service on the fastest live
        worker, after its load there when that ends later than ``ready_s``."""
        heartbeats = [r.heartbeat for r in live if r.heartbeat is not None]
        fastest = max(heartbeats, key=lambda h: h.speed * h.time_scale)
        service_s = _service_s(spec, exec_scale, fastest)
        loaded_s = now_s + spec.load_s / fastest.time_scale
        return _Finish(max(ready_s, loaded_s) + service_s, service_s, placed=False)

    def _without_worker(self, now_s: float, time_left_s: float) -> Decision:
        assert self._first_refresh_s is not None
        since_s = self._served_at_s if self._served_at_s is not None else self._first_refresh_s
        return without_worker(
            now_s - since_s, self.grace_s, time_left_s, "live emulated-models worker"
        )
