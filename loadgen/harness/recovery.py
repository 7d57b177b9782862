"""What became of every request of a replay during which a process was killed.

:func:`analyse` reads the replay's client records, the bus (completions, assignments,
worker events, each read back from the beginning) and the recorded assignments in the
state store, and returns a :class:`RecoveryReport`: the figures the recovery tests
assert and ``bench/recovery_bench.py`` records.

Definitions (wall seconds, one machine's clock):

- *lost*: a planned request without a 200 answer at the client;
- *answers doubled*: a request id the client got more than one answer for (the replay
  sends each once, so this counts ids that appear twice among the answers);
- *runs doubled*: a request with ``ok`` answers from more than one ``(worker, epoch)``
  on the answers topic (*answered by two runs*), or whose record counts a superseded run
  (a *stale run*: a worker ran it to the end after it had been given to another, and
  its answer was refused): it ran twice (the client still gets one answer);
- *held when declared down*: the requests a ``WorkerDown`` of the replay listed (a
  frozen or cut-off worker still holds them, and may run them on);
- *detection*: from the kill to the broker's timestamp of the ``WorkerDown``;
- *re-assignment*: from the kill to the ``assigned_at_s`` of the last orphan's
  re-assignment (its record's assignment with ``epoch >= 1``);
- *assignment conflicts*: a ``(request, epoch)`` with more than one distinct decision on
  the worker inbox topic (re-sends of one recorded decision share its ``message_id``;
  a migration's moved assignment is a new decision of a new epoch).
"""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from switchyard.contracts.messages import Assignment, Completion, CompletionStatus, WorkerDown
from switchyard.contracts.topics import ANSWERS, WORKER_EVENTS, WORKER_INBOX
from switchyard.lifecycle import RequestLedger

from loadgen.harness.process_stack import ProcessStack, Record, gather_bounded, read_topic
from loadgen.mixes import PlannedRequest
from loadgen.replay import replay
from loadgen.replay_records import ReplayResult

DECLARED_DEAD = frozenset({"heartbeat-timeout", "failed"})
"""The ``WorkerDown`` reasons that declare a worker dead (held when declared down)."""


@dataclass
class RecoveryReport:
    """The outcome of one replay with a kill (see the module docstring)."""

    requests: int
    answered_ok: int
    lost: list[str]
    failures: list[tuple[str, int | None, str, str | None]]
    answers_doubled: list[str]
    runs_doubled: list[str]
    answered_by_two_runs: list[str]
    stale_runs: list[str]
    held_when_declared_down: list[str]
    completions: int
    completion_redeliveries: int
    killed: str | None
    killed_at_s: float | None
    detection_s: float | None = None
    detected_at_s: float | None = None
    orphans: list[str] = field(default_factory=list)
    reassigned: dict[str, tuple[str, int, float]] = field(default_factory=dict)
    """Orphan id -> (worker, epoch, assigned_at_s) of its latest recorded assignment."""
    reassignment_s: float | None = None
    orphans_not_reassigned: list[str] = field(default_factory=list)
    orphans_answered_by: dict[str, str | None] = field(default_factory=dict)
    assigned_to_killed_after_kill: list[str] = field(default_factory=list)
    assignment_conflicts: dict[str, list[str]] = field(default_factory=dict)
    """``"{request}@{epoch}"`` -> the distinct message ids decided for it (when > 1)."""
    worker_downs: int = 0
    late_orphans: list[str] = field(default_factory=list)
    """Requests listed by a WorkerDown after the first (the monitor's sweep of what was
    assigned to the worker after its death was handled)."""
    assignment_resends: int = 0
    """Assignment records repeating a decision already on the topic (same message id): a
    scheduler re-sending the recorded assignment of a redelivered request."""
    max_decision_delay_s: float | None = None
    """The longest time from a request's arrival to its (first answered) assignment."""
    in_flight_at_kill: int = 0
    """Requests that had arrived at the ingress but were not finished at the kill (from
    the answers' timelines)."""

    def summary(self) -> dict[str, Any]:
        """The headline figures, for tables and failure messages."""
        return {
            "requests": self.requests,
            "answered_ok": self.answered_ok,
            "lost": len(self.lost),
            "answers_doubled": len(self.answers_doubled),
            "runs_doubled": len(self.runs_doubled),
            "killed": self.killed,
            "detection_s": _round(self.detection_s),
            "reassignment_s": _round(self.reassignment_s),
            "orphans": len(self.orphans),
            "reassigned": len(self.reassigned),
            "orphans_not_reassigned": len(self.orphans_not_reassigned),
            "assigned_to_killed_after_kill": len(self.assigned_to_killed_after_kill),
            "assignment_conflicts": len(self.assignment_conflicts),
            "in_flight_at_kill": self.in_flight_at_kill,
            "assignment_resends": self.assignment_resends,
            "max_decision_delay_s": _round(self.max_decision_delay_s),
            "completions": self.completions,
            "completion_redeliveries": self.completion_redeliveries,
        }

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def third_of_the_way_s(plan: Sequence[PlannedRequest], speedup: float) -> float:
    """When a replay of ``plan`` sends the first request of its second third."""
    ordered = sorted(r.arrival_s for r in plan)
    return (ordered[len(ordered) // 3] - ordered[0]) / speedup


async def start_stack(stack: ProcessStack, workers: Sequence[str]) -> None:
    """Monitor, one scheduler, ``workers`` and one ingress, each its own process; returns
    once the ingress answers and every worker has reported."""
    stack.start_service("monitor")
    stack.start_service("scheduler")
    for worker in workers:
        stack.start_worker(worker)
    stack.start_service("ingress")
    await stack.wait_ready(workers=len(workers))


async def replay_with_kill(
    stack: ProcessStack,
    plan: Sequence[PlannedRequest],
    pick_victim: Callable[[], Awaitable[str]],
    *,
    speedup: float,
    timeout_s: float,
    after_kill: Callable[[str], Awaitable[None]] | None = None,
) -> tuple[ReplayResult, str, float]:
    """Replay ``plan`` through the stack's ingress; a third of the way in (by requests
    sent) SIGKILL the process ``await pick_victim()`` names, then ``await
    after_kill(victim)`` while the replay goes on. Returns the replay's result, the victim
    and the wall time of the kill."""
    task = asyncio.create_task(
        replay(plan, stack.url, speedup=speedup, timeout_s=timeout_s, progress=False)
    )
    try:
        await asyncio.sleep(third_of_the_way_s(plan, speedup))
        victim = await pick_victim()
        killed_at_s = stack.kill(victim)
        if after_kill is not None:
            await after_kill(victim)
    except BaseException:
        task.cancel()
        raise
    return await task, victim, killed_at_s


async def busiest_worker(stack: ProcessStack, workers: Sequence[str]) -> str:
    """The worker holding the most requests now (``worker:{id}:assigned``)."""
    held = {w: await stack.state.zcard(f"worker:{w}:assigned") for w in workers}
    return max(workers, key=lambda w: held[w])


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


async def analyse(
    stack: ProcessStack,
    result: ReplayResult,
    *,
    killed: str | None = None,
    killed_at_s: float | None = None,
    worker_killed: bool = True,
    stage_ids: Sequence[str] = (),
) -> RecoveryReport:
    """Everything :class:`RecoveryReport` holds, for ``result`` on ``stack``; ``killed``
    is the process killed at ``killed_at_s`` (a worker when ``worker_killed``).
    ``stage_ids`` are the requests of the replay's pipeline calls' stages: what ran
    twice or was held by a worker declared down is looked for among them too (a call's
    own id has no run of its own)."""
    records = result.records
    ids = [r.request_id for r in records]
    runs = [*ids, *stage_ids]
    ok_ids = [r.request_id for r in records if r.status_code == 200]
    answers_doubled = sorted(i for i, n in Counter(ok_ids).items() if n > 1)
    failures = [
        (r.request_id, r.status_code, r.outcome, r.error_message)
        for r in records
        if r.status_code != 200
    ]
    lost = sorted(set(ids) - set(ok_ids))

    answers, inbox, events = await asyncio.gather(
        read_topic(stack.kafka_bootstrap, stack.topic_prefix, ANSWERS),
        read_topic(stack.kafka_bootstrap, stack.topic_prefix, WORKER_INBOX),
        read_topic(stack.kafka_bootstrap, stack.topic_prefix, WORKER_EVENTS),
    )
    completions = [
        Record(r.message, r.partition, r.offset, r.timestamp_ms)
        for r in answers
        if isinstance(r.message, Completion)
    ]
    assignments = [
        Record(r.message, r.partition, r.offset, r.timestamp_ms)
        for r in inbox
        if isinstance(r.message, Assignment)
    ]
    wanted = set(runs)
    ledger = RequestLedger(stack.state)
    request_records = dict(
        zip(runs, await gather_bounded([ledger.read(rid) for rid in runs]), strict=True)
    )
    two_runs, redeliveries = _doubled_runs(completions, wanted)
    superseded = {rid for rid, rec in request_records.items() if rec and rec.superseded_runs}
    runs_doubled = sorted(set(two_runs) | superseded)
    # Only a worker declared dead may have run on what it held; what the monitor took
    # back from a live worker ("unclaimed") never reached it, so a second run of that is
    # no more allowed than any other.
    held_when_down = {
        rid
        for e in events
        if isinstance(e.message, WorkerDown) and e.message.reason in DECLARED_DEAD
        for rid in e.message.orphaned_request_ids
        if rid in wanted
    }
    conflicts = _assignment_conflicts(assignments, wanted)
    records_per_decision = Counter(
        a.message.message_id for a in assignments if a.message.request.request_id in wanted
    )
    delays = [
        r.timeline["assigned_s"] - r.timeline["arrival_s"]
        for r in records
        if r.timeline is not None and "assigned_s" in r.timeline and "arrival_s" in r.timeline
    ]

    report = RecoveryReport(
        requests=len(records),
        answered_ok=len(set(ok_ids)),
        lost=lost,
        failures=failures,
        answers_doubled=answers_doubled,
        runs_doubled=runs_doubled,
        answered_by_two_runs=sorted(two_runs),
        stale_runs=sorted(superseded),
        held_when_declared_down=sorted(held_when_down),
        completions=sum(1 for c in completions if c.message.request_id in wanted),
        completion_redeliveries=redeliveries,
        killed=killed,
        killed_at_s=killed_at_s,
        assignment_conflicts=conflicts,
        assignment_resends=sum(n - 1 for n in records_per_decision.values()),
        max_decision_delay_s=max(delays, default=None),
    )
    if killed_at_s is not None:
        report.in_flight_at_kill = sum(
            1
            for r in records
            if r.timeline is not None
            and r.timeline.get("arrival_s", float("inf")) <= killed_at_s
            and r.timeline.get("finished_s", float("-inf")) > killed_at_s
        )
    if killed is None or killed_at_s is None or not worker_killed:
        return report

    downs = [e for e in events if e.message.worker_id == killed]
    report.worker_downs = len(downs)
    orphans: list[str] = []
    if downs:
        first: Record[WorkerDown] = min(downs, key=lambda e: e.timestamp_ms)
        report.detection_s = first.timestamp_ms / 1000.0 - killed_at_s
        report.detected_at_s = first.message.detected_at_s
        for event in sorted(downs, key=lambda e: e.timestamp_ms):
            if event is not first:
                report.late_orphans += event.message.orphaned_request_ids
            orphans += [o for o in event.message.orphaned_request_ids if o not in orphans]
    report.orphans = orphans
    report.assigned_to_killed_after_kill = sorted(
        {
            a.message.request.request_id
            for a in assignments
            if a.message.worker_id == killed
            and a.message.assigned_at_s > killed_at_s
            and a.message.request.request_id in wanted
        }
    )
    by_worker = {r.request_id: r.worker_id for r in records if r.status_code == 200}
    recorded = await gather_bounded([ledger.read(o) for o in orphans])
    latest: list[float] = []
    for orphan, record in zip(orphans, recorded, strict=True):
        report.orphans_answered_by[orphan] = by_worker.get(orphan)
        assignment = None if record is None else record.assignment
        if assignment is None:
            report.orphans_not_reassigned.append(orphan)
            continue
        if assignment.epoch >= 1 and assignment.worker_id != killed:
            report.reassigned[orphan] = (
                assignment.worker_id,
                assignment.epoch,
                assignment.assigned_at_s,
            )
            latest.append(assignment.assigned_at_s)
        elif not _completed_by(completions, orphan, killed):
            report.orphans_not_reassigned.append(orphan)
    if latest:
        report.reassignment_s = max(latest) - killed_at_s
    return report


def _completed_by(completions: Sequence[Record[Completion]], request_id: str, worker: str) -> bool:
    """Whether ``worker`` published an ok completion of ``request_id`` (it finished it
    before it died, and the orphan was left alone for that reason)."""
    return any(
        c.message.request_id == request_id
        and c.message.worker_id == worker
        and c.message.status is CompletionStatus.OK
        for c in completions
    )


def _doubled_runs(
    completions: Sequence[Record[Completion]], wanted: set[str]
) -> tuple[list[str], int]:
    """Requests with ok completions from more than one (worker, epoch), and how many
    completion records repeat one already seen (same message id: a re-publish)."""
    runs: dict[str, set[tuple[str, int]]] = defaultdict(set)
    message_ids: set[str] = set()
    redeliveries = 0
    for record in completions:
        completion = record.message
        if completion.request_id not in wanted:
            continue
        if completion.message_id in message_ids:
            redeliveries += 1
            continue
        message_ids.add(completion.message_id)
        if completion.status is CompletionStatus.OK:
            runs[completion.request_id].add((completion.worker_id, completion.epoch))
    return sorted(r for r, seen in runs.items() if len(seen) > 1), redeliveries


def _assignment_conflicts(
    assignments: Sequence[Record[Assignment]], wanted: set[str]
) -> dict[str, list[str]]:
    decided: dict[str, set[str]] = defaultdict(set)
    for record in assignments:
        assignment = record.message
        request_id = assignment.request.request_id
        if request_id in wanted:
            decided[f"{request_id}@{assignment.epoch}"].add(assignment.message_id)
    return {key: sorted(ids) for key, ids in decided.items() if len(ids) > 1}
