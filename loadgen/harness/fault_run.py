"""One row of the fault matrix: a replay, one fault during it, and what became of
every request.

:func:`run_fault` starts the stack (:func:`start_fault_stack`), replays open-loop
Poisson arrivals of LLM completions with client-chosen request ids, injects the fault a
third of the way in (:mod:`loadgen.harness.faults`), and when the replay is over (a
pipeline call's stages, ``{call id}.{stage}`` in the ledger, are looked at as requests of
their own):

1. reads the ledger for every call that was *refused* (429, or 503 other than
   ``outcome_unknown``: "nothing was started"): a record there means the refusal was
   false (``refused_then_run``);
2. retries, with the same id and body, every call that did not get a 200 (refused,
   ``outcome_unknown``, a connection that failed, a timeout) until it gets a final
   answer, as a client following the README would; one that never does is *lost*;
3. retries ``retry_answered`` calls that were answered: each must get the same answer
   again (``answers_differ``) and must not run again;
4. reads the bus and the ledger (:func:`loadgen.harness.recovery.analyse`): a request
   answered ``ok`` from two ``(worker, epoch)`` pairs (*answered by two runs*: never
   allowed), or whose record counts a superseded run (a run whose answer was refused),
   *ran twice*. Of those, *ran twice, held* were held by a worker when it was declared
   down: a frozen or cut-off worker may run on what it held (the fence refuses its
   answer, it cannot stop the run), so the fault itself allows them, and nothing else.

Times: ``stall_s`` is the longest stretch, from the fault on, in which the client got
no 200 at all; ``longest_wait_s`` the longest a call sent from the fault on waited for
its 200 (a fault that holds back only some calls, such as a scheduler replica's
partitions waiting for its group to notice, shows here and not in the stall);
``recovery_s`` is from the end of the fault (its heal, or the kill when nothing is
restarted) to the first 200 for a call sent after it.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from switchyard.errors import StateError
from switchyard.lifecycle import RequestLedger
from switchyard.serving.pipelines import DEFAULT_PIPELINES
from switchyard.traces import resolve_trace

from loadgen.harness.faults import (
    CUT_WORKER,
    MODEL_WORKERS,
    TORCH_WORKER,
    WORKERS,
    Fault,
    FaultContext,
)
from loadgen.harness.infra import PrivateInfra
from loadgen.harness.network_cut import NetworkCut
from loadgen.harness.process_stack import ProcessStack, gather_bounded
from loadgen.harness.recovery import analyse, third_of_the_way_s
from loadgen.mixes import PlannedRequest, build_plan
from loadgen.replay import new_run_id, replay
from loadgen.replay_records import OK, RequestRecord

FINAL_RETRY_STATUSES = frozenset({200, 409})
"""Answers a retry stops at: the answer, or 409 (the request was cancelled, or its id
was used for another body): both are the one final word on that id."""
RETRY_FOR_S = 90.0


@dataclass
class FaultRunConfig:
    """How one fault is run (defaults: the ``make faults`` row)."""

    requests: int = 10_000
    rate_rps: float = 80.0
    time_scale: float = 50.0
    client_timeout_s: float = 60.0
    retry_answered: int = 20
    seed: int = 0
    policy: str = "gaps"


@dataclass
class FaultReport:
    """What one fault did to one replay (see the module docstring)."""

    fault: str
    summary: str
    requests: int
    classification_calls: int
    pipeline_calls: int
    answered_first_call: int
    refused: int
    unknown_outcome: int
    retried: int
    answered_after_retry: int
    cancelled: int
    lost: list[str]
    refused_then_run: list[str]
    answers_differ: list[str]
    ran_twice: list[str]
    ran_twice_held: list[str]
    answered_by_two_runs: list[str]
    answered_retries: int
    injected_at_s: float
    healed_at_s: float
    stall_s: float | None
    longest_wait_s: float | None
    recovery_s: float | None
    duration_s: float
    events: list[tuple[float, str]] = field(default_factory=list)
    failures_by_kind: dict[str, int] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        """Nothing lost, answered twice or falsely refused, and nothing run twice but what
        a worker held when it was declared down (see the module docstring)."""
        return not (
            self.lost
            or self.refused_then_run
            or self.answers_differ
            or self.answered_by_two_runs
            or set(self.ran_twice) - set(self.ran_twice_held)
        )

    def summary_row(self) -> dict[str, Any]:
        return {
            "fault": self.fault,
            "requests": self.requests,
            "classification calls": self.classification_calls,
            "pipeline calls": self.pipeline_calls,
            "answered first call": self.answered_first_call,
            "refused": self.refused,
            "unknown": self.unknown_outcome,
            "lost": len(self.lost),
            "refused then run": len(self.refused_then_run),
            "answers differ": len(self.answers_differ),
            "ran twice": len(self.ran_twice),
            "of them held when declared down": len(self.ran_twice_held),
            "stall s": None if self.stall_s is None else round(self.stall_s, 2),
            "longest wait s": None
            if self.longest_wait_s is None
            else round(self.longest_wait_s, 2),
            "recovery s": None if self.recovery_s is None else round(self.recovery_s, 2),
        }

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "clean": self.clean}


def _refused(record: RequestRecord) -> bool:
    """A refusal that says nothing was started (admission, quota, draining, no worker)."""
    return record.status_code in (429, 503) and record.error_code != "outcome_unknown"


async def start_fault_stack(
    infra: PrivateInfra, fault: Fault, config: FaultRunConfig, prefix: str, log_dir: Path
) -> tuple[ProcessStack, NetworkCut | None]:
    """The matrix's stack for ``fault`` (see :mod:`loadgen.harness.faults`), ready."""
    stack = ProcessStack(
        infra.kafka_bootstrap,
        infra.redis_url,
        prefix,
        log_dir,
        time_scale=config.time_scale,
        llm_policy=config.policy,
        extra_env=dict(fault.env),
    )
    cut = None
    if fault.name == "worker-cut":
        cut = NetworkCut(uid=61_000 + abs(hash(prefix)) % 2_000, tag=f"switchyard-{prefix}")
    stack.start_service("monitor")
    stack.start_service("predictor")
    stack.start_service("rebalancer")
    stack.start_service("scheduler")
    for replica in range(1, fault.schedulers):
        stack.start_service("scheduler", name=f"scheduler-{replica + 1}")
    for worker in WORKERS:
        prefix_argv = cut.argv_prefix if cut is not None and worker == CUT_WORKER else ()
        stack.start_worker(worker, argv_prefix=prefix_argv)
    workers = len(WORKERS)
    if fault.classification_share > 0:
        stack.start_service("estimator")
        stack.start_torch_worker(TORCH_WORKER)
        workers += 1
    if fault.pipeline_share > 0:
        stack.start_service("placement")
        for worker in MODEL_WORKERS:
            stack.start_models_worker(worker)
        workers += len(MODEL_WORKERS)
    stack.start_service("ingress")
    await stack.wait_ready(workers=workers, timeout_s=120.0)
    if fault.schedulers > 1:
        await stack.wait_group("scheduler", fault.schedulers)
    return stack, cut


PIPELINES = tuple(sorted(DEFAULT_PIPELINES))
"""The pipelines a plan's pipeline calls go to (the default ``txt2img`` catalogue's)."""


def fault_plan(
    config: FaultRunConfig, classification_share: float = 0.0, pipeline_share: float = 0.0
) -> list[PlannedRequest]:
    """Poisson arrivals at ``rate_rps`` with conversation-like lengths; with
    ``classification_share`` above 0, that fraction of them classification calls; with
    ``pipeline_share`` above 0, that fraction of them (drawn by ``seed``) calls to the
    :data:`PIPELINES` in turn, at the same arrival times."""
    spec = f"poisson:rate_rps={config.rate_rps:g},requests={config.requests},seed={config.seed}"
    trace = resolve_trace(spec)
    if classification_share <= 0:
        plan = build_plan(trace, "llm", config.requests, config.seed)
    else:
        plan = build_plan(
            trace, "mixed", config.requests, config.seed, classification_share=classification_share
        )
    if pipeline_share <= 0:
        return plan
    rng = random.Random(f"fault-plan:{config.seed}")
    chosen = sorted(rng.sample(range(len(plan)), round(len(plan) * pipeline_share)))
    for turn, index in enumerate(chosen):
        call = plan[index]
        plan[index] = PlannedRequest(
            index=call.index,
            arrival_s=call.arrival_s,
            kind="pipeline",
            app=PIPELINES[turn % len(PIPELINES)],
            workload="pipeline",
            exec_scale=1.0,
        )
    return plan


def stage_ids(request: PlannedRequest, request_id: str) -> list[str]:
    """The ledger ids of a pipeline call's stages (``{call id}.{stage}``; the stack has
    no tenants, so the call's id is the client's); none for any other call."""
    if request.kind != "pipeline":
        return []
    return [f"{request_id}.{stage.name}" for stage in DEFAULT_PIPELINES[request.app].stages]


async def _retry_until_final(
    client: httpx.AsyncClient, request: PlannedRequest, run_id: str
) -> tuple[int | None, dict[str, Any] | None]:
    """POST ``request`` again (same id, same body) until a final answer; its status and
    JSON body, or the last status seen when none came within :data:`RETRY_FOR_S`."""
    body = request.body(run_id)
    deadline = time.monotonic() + RETRY_FOR_S
    status: int | None = None
    while time.monotonic() < deadline:
        try:
            answer = await client.post(request.path, json=body)
        except httpx.HTTPError:
            await asyncio.sleep(1.0)
            continue
        status = answer.status_code
        if status in FINAL_RETRY_STATUSES:
            return status, answer.json()
        if 400 <= status < 500 and status != 429:
            return status, answer.json()  # refused for good: the plan's body is bad
        await asyncio.sleep(float(answer.headers.get("retry-after", "1") or 1))
    return status, None


def _served(document: dict[str, Any] | None) -> tuple[Any, Any]:
    """Who served an answer and what it said (an LLM answer's length, a classification
    answer's label, a pipeline answer's stages with their workers and labels): a second
    run elsewhere differs."""
    if not document:
        return None, None
    if document.get("object") == "pipeline.result":
        return "pipeline", _stage_runs(document.get("stages") or [])
    if "label" in document:  # a classification answer: its fields at the top
        return document.get("worker_id"), document.get("label")
    usage = document.get("usage") or {}
    return (document.get("switchyard") or {}).get("worker_id"), usage.get("completion_tokens")


def _stage_runs(stages: Any) -> tuple[tuple[Any, ...], ...]:
    """Each stage of a pipeline answer as ``(stage, worker, status, label)``."""
    return tuple(
        (s.get("stage"), s.get("worker_id"), s.get("status"), s.get("label")) for s in stages
    )


def _recorded(record: RequestRecord) -> tuple[Any, Any]:
    """:func:`_served` of the answer the replay read."""
    if record.kind == "pipeline":
        return "pipeline", _stage_runs(record.stages or ())
    if record.kind == "classification":
        return record.worker_id, record.label
    return record.worker_id, record.completion_tokens


def _fault_times(
    records: list[RequestRecord], start_wall_s: float, injected_at_s: float, healed_at_s: float
) -> tuple[float | None, float | None, float | None]:
    """``stall_s``, ``longest_wait_s`` and ``recovery_s`` (see the module docstring)."""
    # (sent, answered) in wall seconds, of every call answered 200.
    answered = sorted(
        (start_wall_s + r.sent_s, start_wall_s + r.sent_s + r.latency_s)
        for r in records
        if r.outcome == OK and r.sent_s is not None and r.latency_s is not None
    )
    points = [injected_at_s, *sorted(at for _, at in answered if at >= injected_at_s)]
    stall = max((b - a for a, b in itertools.pairwise(points)), default=None)
    longest_wait = max((at - sent for sent, at in answered if sent >= injected_at_s), default=None)
    after_heal = [at for sent, at in answered if sent >= healed_at_s]
    recovery = min(after_heal) - healed_at_s if after_heal else None
    return stall, longest_wait, recovery


async def _reconnected(stack: ProcessStack, within_s: float = 30.0) -> None:
    """Wait until the harness's own store connection works again (after a Redis restart
    its pooled connections fail once each)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            # Several at once, so that every pooled connection is tried (and replaced).
            await asyncio.gather(*(stack.state.zcard("workers") for _ in range(16)))
            return
        except StateError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def run_fault(
    infra: PrivateInfra, fault: Fault, config: FaultRunConfig, prefix: str, log_dir: Path
) -> FaultReport:
    """Run ``fault`` during one replay on a fresh stack; the stack is closed after."""
    stack, cut = await start_fault_stack(infra, fault, config, prefix, log_dir)
    ctx = FaultContext(stack, infra, cut)
    try:
        return await _run(ctx, fault, config)
    finally:
        if cut is not None:
            cut.restore()
        await stack.close()


async def _run(ctx: FaultContext, fault: Fault, config: FaultRunConfig) -> FaultReport:
    stack = ctx.stack
    plan = fault_plan(config, fault.classification_share, fault.pipeline_share)
    run_id = new_run_id()
    start_wall_s = time.time()
    began = time.monotonic()
    task = asyncio.create_task(
        replay(plan, stack.url, timeout_s=config.client_timeout_s, progress=False, run_id=run_id)
    )
    try:
        await asyncio.sleep(third_of_the_way_s(plan, speedup=1.0))
        injected_at_s, healed_at_s = await fault.run(ctx)
    except BaseException:
        task.cancel()
        raise
    result = await task
    records = list(result.records)
    by_id = {r.request_id: r for r in records}
    planned = {p.request_id(run_id): p for p in plan}

    stages = {rid: stage_ids(call, rid) for rid, call in planned.items() if call.kind == "pipeline"}

    # 1. A refusal must be true: nothing of it (nor of a pipeline call's stages) may be in
    # the ledger.
    await _reconnected(stack)
    ledger = RequestLedger(stack.state)
    refused = [r.request_id for r in records if _refused(r)]
    looked_up = [(rid, one) for rid in refused for one in [rid, *stages.get(rid, [])]]
    found = await gather_bounded([ledger.read(one) for _, one in looked_up])
    refused_then_run = sorted({rid for (rid, _), rec in zip(looked_up, found, strict=True) if rec})

    # 2. Every call without an answer is retried until it has one.
    unanswered = [r.request_id for r in records if r.outcome != OK]
    failures = Counter(
        f"{r.outcome} {r.status_code or ''} {r.error_code or ''}".strip()
        for r in records
        if r.outcome != OK
    )
    lost: list[str] = []
    cancelled = 0
    answered_after = 0
    async with httpx.AsyncClient(base_url=stack.url, timeout=config.client_timeout_s) as client:
        retried = await gather_bounded(
            [_retry_until_final(client, planned[rid], run_id) for rid in unanswered]
        )
        for rid, (status, _) in zip(unanswered, retried, strict=True):
            if status == 200:
                answered_after += 1
            elif status == 409:
                cancelled += 1
            else:
                lost.append(rid)
        # 3. Answered calls, retried, give the same answer and do not run again.
        answered = [r.request_id for r in records if r.outcome == OK]
        step = max(1, len(answered) // max(1, config.retry_answered))
        again = answered[::step][: config.retry_answered]
        second = await gather_bounded(
            [_retry_until_final(client, planned[rid], run_id) for rid in again]
        )
    differ = sorted(
        rid
        for rid, (status, document) in zip(again, second, strict=True)
        if status != 200 or _served(document) != _recorded(by_id[rid])
    )

    # 4. Nothing ran twice (the bus and the ledger, read back).
    report = await analyse(
        stack,
        result,
        worker_killed=False,
        stage_ids=[one for ids in stages.values() for one in ids],
    )
    stall, longest_wait, recovery = _fault_times(records, start_wall_s, injected_at_s, healed_at_s)
    return FaultReport(
        fault=fault.name,
        summary=fault.summary,
        requests=len(records),
        classification_calls=sum(1 for r in records if r.kind == "classification"),
        pipeline_calls=sum(1 for r in records if r.kind == "pipeline"),
        answered_first_call=sum(1 for r in records if r.outcome == OK),
        refused=len(refused),
        unknown_outcome=len(unanswered) - len(refused),
        retried=len(unanswered),
        answered_after_retry=answered_after,
        cancelled=cancelled,
        lost=sorted(lost),
        refused_then_run=refused_then_run,
        answers_differ=differ,
        ran_twice=report.runs_doubled,
        ran_twice_held=sorted(set(report.runs_doubled) & set(report.held_when_declared_down)),
        answered_by_two_runs=report.answered_by_two_runs,
        answered_retries=len(again),
        injected_at_s=injected_at_s,
        healed_at_s=healed_at_s,
        stall_s=stall,
        longest_wait_s=longest_wait,
        recovery_s=recovery,
        duration_s=time.monotonic() - began,
        events=ctx.events,
        failures_by_kind=dict(failures),
    )
