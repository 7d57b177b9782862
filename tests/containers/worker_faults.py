"""A fault on one ``worker-llm`` container during a replay through the published port,
and what became of the replay's requests (read back from the answers, the worker inbox
and the worker events topics)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import docker
from docker.models.containers import Container
from switchyard.contracts.messages import Assignment, Completion, CompletionStatus, WorkerDown
from switchyard.contracts.topics import ANSWERS, WORKER_EVENTS, WORKER_INBOX
from switchyard.traces import resolve_trace

from loadgen.harness.process_stack import read_topic
from loadgen.harness.recovery import third_of_the_way_s
from loadgen.mixes import build_plan
from loadgen.replay import replay
from loadgen.replay_records import ReplayResult
from services.ingress.tenants import public_request_id
from tests.containers.stack import (
    COMPOSE_DEMO_API_KEY,
    INGRESS,
    KAFKA,
    STATE_PREFIX,
    Workers,
    project_containers,
)

SPEEDUP = 2.5
REQUESTS = 120
HOLD_WAIT_S = 10.0


@dataclass(frozen=True)
class WorkerFault:
    """The replay and the container the fault hit."""

    result: ReplayResult
    victim: Container
    victim_id: str
    injected_at_s: float
    held: int
    """Requests in the victim's assigned set when the fault hit it."""


async def replay_with_worker_fault(
    client: docker.DockerClient, workers: Workers, inject: Callable[[Container], None]
) -> WorkerFault:
    """Replay :data:`REQUESTS` conversation rows through the published port; a third of
    the way in, ``inject`` the fault on the ``worker-llm`` container holding the most
    requests (it may block: it runs in a thread while the replay goes on)."""
    replicas = project_containers(client, "worker-llm")
    ids = {str(c.name): workers.id_of(c) for c in replicas}
    plan = build_plan(resolve_trace("azure-conv-sample"), "llm", REQUESTS, 0)
    task = asyncio.create_task(
        replay(
            plan,
            INGRESS,
            speedup=SPEEDUP,
            timeout_s=120,
            progress=False,
            api_key=COMPOSE_DEMO_API_KEY,
        )
    )
    try:
        await asyncio.sleep(third_of_the_way_s(plan, SPEEDUP))
        # The fault hits the worker holding the most requests, once one holds some.
        deadline = time.monotonic() + HOLD_WAIT_S
        while True:
            held = {
                name: int(workers.redis.zcard(f"{STATE_PREFIX}worker:{wid}:assigned"))
                for name, wid in ids.items()
            }
            if max(held.values()) > 0 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        victim = max(replicas, key=lambda c: held[str(c.name)])
        injected_at_s = time.time()
        await asyncio.to_thread(inject, victim)
        result = await task
    except BaseException:
        task.cancel()
        raise
    return WorkerFault(result, victim, ids[str(victim.name)], injected_at_s, held[str(victim.name)])


@dataclass(frozen=True)
class WorkerFaultOutcome:
    """What the topics say became of the replay's requests."""

    ran_twice: dict[str, set[tuple[str, int]]]
    """Request -> the ``(worker, epoch)`` pairs that answered it ``ok``, where several."""
    orphans: set[str]
    """The replay's requests the monitor's ``WorkerDown`` events of the victim listed,
    since the fault (a worker id outlives its container's restart, so an earlier fault's
    may be on the topic)."""
    reassigned: set[str]
    """Orphans assigned again (epoch 1 or more) to another worker."""
    finished_by_victim: set[str]
    """Requests the victim answered ``ok`` (before the fault, or before it was fenced)."""
    detected_at_s: float | None
    """The broker's time of the first ``WorkerDown``."""


async def ok_runs(request_ids: set[str]) -> dict[str, set[tuple[str, int]]]:
    """Request -> the ``(worker, epoch)`` pairs that answered it ``ok`` on the answers
    topic, by the ids the client knows (the topics carry them scoped to the compose
    file's demo tenant)."""
    runs: dict[str, set[tuple[str, int]]] = {}
    for record in await read_topic(KAFKA, "", ANSWERS):
        message = record.message
        if isinstance(message, Completion) and message.status is CompletionStatus.OK:
            rid = public_request_id(message.request_id)
            if rid in request_ids:
                runs.setdefault(rid, set()).add((message.worker_id, message.epoch))
    return runs


async def worker_fault_outcome(fault: WorkerFault) -> WorkerFaultOutcome:
    """What became of the replay's requests (by the ids the client knows)."""
    wanted = {r.request_id for r in fault.result.records}
    runs, inbox, events = await asyncio.gather(
        ok_runs(wanted),
        read_topic(KAFKA, "", WORKER_INBOX),
        read_topic(KAFKA, "", WORKER_EVENTS),
    )
    down_records = [
        e
        for e in events
        if isinstance(e.message, WorkerDown)
        and e.message.worker_id == fault.victim_id
        and e.timestamp_ms >= fault.injected_at_s * 1000
    ]
    orphans = {
        public_request_id(o)
        for e in down_records
        if isinstance(e.message, WorkerDown)  # narrowed above; for the type checker
        for o in e.message.orphaned_request_ids
    } & wanted
    reassigned = {
        rid
        for a in inbox
        if isinstance(a.message, Assignment)
        and (rid := public_request_id(a.message.request.request_id)) in orphans
        and a.message.epoch >= 1
        and a.message.worker_id != fault.victim_id
    }
    first_down_ms = min((e.timestamp_ms for e in down_records), default=None)
    return WorkerFaultOutcome(
        ran_twice={rid: seen for rid, seen in runs.items() if len(seen) > 1},
        orphans=orphans,
        reassigned=reassigned,
        finished_by_victim={
            rid for rid, seen in runs.items() if any(w == fault.victim_id for w, _ in seen)
        },
        detected_at_s=None if first_down_ms is None else first_down_ms / 1000,
    )
