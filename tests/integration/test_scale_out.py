"""Scale-out of the live stack, every service a separate OS process.

The stack runs over the real Kafka broker and Redis (``loadgen/harness/process_stack.py``):

- two ingress replicas, two scheduler replicas and four workers share the partitioned
  topics (each ingress replica's answers come back to it through ``reply_to`` and a
  consumer group of its own; the scheduler replicas split the requests' partitions);
- a worker started mid-replay takes load within about one heartbeat period of its first
  heartbeat (the schedulers refresh the cluster view every 0.1 s);
- a worker stopped with SIGTERM drains: it heartbeats ``draining`` (so it is never timed
  out), its running requests finish on it, the ones waiting there are re-assigned
  (epoch + 1) to the others at once, and the monitor records it ``drained``.
- an ingress replica killed while its call waits loses nothing: the monitor records the
  answer, and the other replica serves a retry with the same ``request_id`` from it.
"""

from __future__ import annotations

import asyncio
import re
import signal
import time
from collections import Counter
from typing import Any

import httpx
import pytest
from switchyard.contracts.messages import Assignment, Heartbeat, Migration, PlacementOrder
from switchyard.contracts.topics import HEARTBEATS, REQUESTS, WORKER_EVENTS, WORKER_INBOX
from switchyard.lifecycle import RequestLedger
from switchyard.traces import resolve_trace

from loadgen.harness.process_stack import (
    ProcessStack,
    Record,
    StackFactory,
    free_port,
    read_topic,
)
from loadgen.harness.recovery import analyse, third_of_the_way_s
from loadgen.mixes import PlannedRequest, build_plan
from loadgen.replay import replay
from loadgen.replay_records import ReplayResult

CLIENT_TIMEOUT_S = 40.0
STACK_ENV = {"SWITCHYARD_ADMISSION": "off"}
"""Every valid request is queued (admission control would refuse some while capacity is
reduced; that is tested elsewhere): every request must be answered 200, exactly once."""


def _plan(requests: int) -> list[PlannedRequest]:
    return build_plan(resolve_trace("azure-conv-sample"), "llm", requests, 0)


def _answers(result: ReplayResult) -> tuple[list[str], list[Any]]:
    """The ids answered 200 and the records that were not."""
    ok = [r.request_id for r in result.records if r.status_code == 200]
    bad = [
        (r.request_id, r.status_code, r.outcome, r.error_message)
        for r in result.records
        if r.status_code != 200
    ]
    return ok, bad


async def _decisions(port: int) -> float:
    """The scheduler's ``switchyard.scheduler.decisions`` counter, summed, from the
    Prometheus ``/metrics`` of its health endpoint."""
    async with httpx.AsyncClient(timeout=5.0) as client:
        text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
    total = 0.0
    for line in text.splitlines():
        match = re.match(r"switchyard_scheduler_decisions(?:_total)?(?:\{[^}]*\})? (\S+)$", line)
        if match:
            total += float(match.group(1))
    return total


async def _one_worker_stack(
    process_stack: StackFactory, *, ingresses: tuple[str, ...]
) -> ProcessStack:
    """Monitor, scheduler (JSQ), ``worker-a`` and the named ingress replicas, ready."""
    stack = process_stack(llm_policy="jsq", extra_env=STACK_ENV)
    stack.start_service("monitor")
    stack.start_service("scheduler")
    stack.start_worker("worker-a")
    for name in ingresses:
        stack.start_service("ingress", name=name)
    await stack.wait_ready(workers=1)
    return stack


async def test_replicas_of_every_service_share_the_load(process_stack: StackFactory) -> None:
    # The scheduler places every request here, so that its replicas' share is seen.
    stack = process_stack(
        llm_policy="jsq", extra_env={**STACK_ENV, "SWITCHYARD_LLM_DISPATCH": "scheduler"}
    )
    ingresses = ("ingress-a", "ingress-b")
    schedulers = {name: free_port() for name in ("scheduler-a", "scheduler-b")}
    workers = ("worker-a", "worker-b", "worker-c", "worker-d")
    stack.start_service("monitor")
    for name, port in schedulers.items():
        stack.start_service("scheduler", name=name, env={"SWITCHYARD_HEALTH_PORT": str(port)})
    for worker in workers:
        stack.start_worker(worker)
    for name in ingresses:
        stack.start_service("ingress", name=name)
    await stack.wait_ready(workers=len(workers))
    # Both scheduler replicas hold partitions of the requests and of the worker events.
    await stack.wait_group("scheduler", members=2)
    await stack.wait_group("scheduler-worker-events", members=2)

    plan = _plan(150)
    halves = [plan[0::2], plan[1::2]]
    results = await asyncio.gather(
        *(
            replay(
                half, stack.url_of(name), speedup=10.0, timeout_s=CLIENT_TIMEOUT_S, progress=False
            )
            for half, name in zip(halves, ingresses, strict=True)
        )
    )
    why = stack.logs()
    ok_ids: list[str] = []
    for result, half in zip(results, halves, strict=True):
        ok, bad = _answers(result)
        assert bad == [], (bad[:5], why)
        assert len(ok) == len(half), why
        ok_ids += ok
    # Every request answered exactly once, ids unique across the two replays.
    assert len(ok_ids) == len(set(ok_ids)) == len(plan), why

    # Each ingress replica published its own half with itself as reply_to, and (above)
    # answered every one of them: answers went back to the replica that took the call.
    requests = await read_topic(stack.kafka_bootstrap, stack.topic_prefix, REQUESTS)
    reply_to = {r.message.request_id: r.message.reply_to for r in requests}
    for result, name in zip(results, ingresses, strict=True):
        own = {reply_to.get(r.request_id) for r in result.records}
        assert own == {f"{stack.prefix}-{name}"}, (name, own)

    # Both scheduler replicas decided some of the requests.
    decided = {name: await _decisions(port) for name, port in schedulers.items()}
    assert all(count > 0 for count in decided.values()), decided
    assert sum(decided.values()) >= len(plan), decided
    inbox = await read_topic(stack.kafka_bootstrap, stack.topic_prefix, WORKER_INBOX)
    assignments = _assignments(inbox)
    assert {(a.message.request.request_id, a.message.epoch) for a in assignments} == {
        (i, 0) for i in ok_ids
    }
    # Each worker's assignments went to the partition it named, read by it alone.
    partitions = {a.message.worker_id: {a.partition} for a in assignments}
    heartbeats = await read_topic(stack.kafka_bootstrap, stack.topic_prefix, HEARTBEATS)
    named = {h.message.worker_id: {h.message.inbox_partition} for h in heartbeats}
    assert partitions == {w: named[w] for w in partitions}, (partitions, named)
    assert len({p for ps in partitions.values() for p in ps}) == len(partitions)

    # All four workers served requests.
    served = Counter(r.worker_id for result in results for r in result.records)
    assert set(served) == set(workers), served
    print(f"\nscale-out: answered by {dict(served)}, decisions {decided}")


async def test_a_worker_added_mid_replay_takes_load_within_a_heartbeat(
    process_stack: StackFactory,
) -> None:
    stack = await _one_worker_stack(process_stack, ingresses=("ingress",))
    plan = _plan(150)
    speedup = 5.0  # 150 requests over about 10 s: worker-a alone runs several at once
    task = asyncio.create_task(
        replay(plan, stack.url, speedup=speedup, timeout_s=CLIENT_TIMEOUT_S, progress=False)
    )
    try:
        await asyncio.sleep(third_of_the_way_s(plan, speedup))
        stack.start_worker("worker-b")
        result = await task
    except BaseException:
        task.cancel()
        raise
    why = stack.logs()
    ok, bad = _answers(result)
    assert bad == [], (bad[:5], why)
    assert len(ok) == len(set(ok)) == len(plan), why

    heartbeats, inbox = await asyncio.gather(
        read_topic(stack.kafka_bootstrap, stack.topic_prefix, HEARTBEATS),
        read_topic(stack.kafka_bootstrap, stack.topic_prefix, WORKER_INBOX),
    )
    assignments = _assignments(inbox)
    first_heartbeat_ms = min(
        h.timestamp_ms for h in heartbeats if h.message.worker_id == "worker-b"
    )
    to_b = [a for a in assignments if a.message.worker_id == "worker-b"]
    assert to_b, why
    first_assignment_ms = min(a.timestamp_ms for a in to_b)
    join_s = (first_assignment_ms - first_heartbeat_ms) / 1000.0
    interval_s = stack.heartbeat_interval_s
    # Within one heartbeat period (0.25 s), with slack for a busy 2-core machine.
    assert 0.0 < join_s <= 2 * interval_s, (join_s, why)

    # A fair share of what arrived after worker-b's first heartbeat went to it.
    joined_s = first_heartbeat_ms / 1000.0
    later = [
        r
        for r in result.records
        if r.timeline is not None and r.timeline.get("arrival_s", 0.0) > joined_s
    ]
    assert len(later) >= 30, (len(later), why)
    share_b = sum(1 for r in later if r.worker_id == "worker-b") / len(later)
    assert share_b >= 0.3, (share_b, why)
    print(
        f"\nworker join: first assignment {join_s * 1000:.0f} ms after its first heartbeat; "
        f"{share_b:.0%} of the {len(later)} later requests"
    )


VICTIM_SLOTS = 1
"""The drained worker runs at most this many requests at once (SWITCHYARD_WORKER_MAX_SLOTS),
so requests wait on it when it is stopped: there is something to hand over."""


async def _until_running_and_waiting(
    stack: ProcessStack, worker: str, *, waiting: int = 2, timeout_s: float = 20.0
) -> None:
    """Wait until ``worker``'s latest recorded heartbeat shows a request running and at
    least ``waiting`` waiting (the record lags by up to a heartbeat interval)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        raw = await stack.state.hget(f"worker:{worker}", "heartbeat")
        if raw is not None:
            beat = Heartbeat.model_validate_json(raw)
            if beat.running > 0 and beat.queue_length >= waiting:
                return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{worker} never had requests running and waiting in {timeout_s} s")


async def test_a_terminated_worker_drains(process_stack: StackFactory) -> None:
    # Round robin gives the small worker its half whatever its queue: requests wait there.
    stack = process_stack(llm_policy="round-robin", extra_env=STACK_ENV)
    victim, survivor = "worker-a", "worker-b"
    stack.start_service("monitor")
    stack.start_service("scheduler")
    stack.start_worker(victim, env={"SWITCHYARD_WORKER_MAX_SLOTS": str(VICTIM_SLOTS)})
    stack.start_worker(survivor)
    stack.start_service("ingress")
    await stack.wait_ready(workers=2)
    plan = _plan(150)
    speedup = 10.0
    task = asyncio.create_task(
        replay(plan, stack.url, speedup=speedup, timeout_s=CLIENT_TIMEOUT_S, progress=False)
    )
    try:
        await asyncio.sleep(third_of_the_way_s(plan, speedup))
        # Stop it while it runs some requests and others wait there.
        await _until_running_and_waiting(stack, victim)
        terminated_at_s = stack.terminate(victim)
        result = await task
    except BaseException:
        task.cancel()
        raise
    stack.processes[victim].popen.wait(timeout=15)
    report = await analyse(stack, result)
    why = f"{report.summary()}\nfailures: {report.failures[:5]}\n{stack.logs()}"
    assert stack.processes[victim].popen.returncode == 0, why

    # Exactly one 200 answer per request; nothing ran twice.
    assert report.failures == [], why
    assert report.answered_ok == len(plan), why
    assert report.lost == [], why
    assert report.answers_doubled == [], why
    assert report.runs_doubled == [], why
    assert report.assignment_conflicts == {}, why

    heartbeats, events = await asyncio.gather(
        read_topic(stack.kafka_bootstrap, stack.topic_prefix, HEARTBEATS),
        read_topic(stack.kafka_bootstrap, stack.topic_prefix, WORKER_EVENTS),
    )
    mine = [h.message for h in heartbeats if h.message.worker_id == victim]
    before = [h for h in mine if h.sent_at_s < terminated_at_s and not h.draining]
    draining = [h for h in mine if h.draining]
    # It heartbeat "draining" while its running requests finished, the last with
    # nothing running.
    assert draining, why
    assert draining[-1].running == 0, why
    # What ran on it when it was told to stop finished there.
    answered_by = {r.request_id: r.worker_id for r in result.records}
    running = [e.request_id for e in before[-1].outstanding if e.running]
    assert running, why
    assert all(answered_by[r] == victim for r in running), (running, why)
    # The monitor announced the drain (never a timeout) and recorded it drained. A
    # request placed on the worker just before its draining heartbeat was read (an
    # ingress placing requests itself reads the cluster every 0.1 s) is swept up later
    # with another "drained" event and re-assigned: answered once all the same (above).
    downs = [e.message for e in events if e.message.worker_id == victim]
    reasons = [d.reason for d in downs]
    assert reasons[0] in ("draining", "drained"), (downs, why)
    assert set(reasons) <= {"draining", "drained"}, (downs, why)
    assert "drained" in reasons, (downs, why)
    assert await stack.state.hget(f"worker:{victim}", "status") == "drained", why
    # What it held without running it moved to the survivor (epoch >= 1) and was
    # answered from there.
    handed_over = sorted({o for d in downs for o in d.held_request_ids or []})
    assert handed_over, why
    ledger = RequestLedger(stack.state)
    for orphan in handed_over:
        record = await ledger.read(orphan)
        assignment = None if record is None else record.assignment
        assert assignment is not None, (orphan, why)
        assert (assignment.worker_id, assignment.epoch >= 1) == (survivor, True), (orphan, why)
        assert answered_by[orphan] == survivor, (orphan, why)
    first_handover_s = next(
        (e.timestamp_ms / 1000.0 for e in events if e.message.worker_id == victim), None
    )
    assert first_handover_s is not None, why
    print(
        f"\ndrain: {len(running)} running finished on {victim}, {len(handed_over)} handed over "
        f"{(first_handover_s - terminated_at_s) * 1000:.0f} ms after SIGTERM ({downs[0].reason}); "
        f"{len(draining)} draining heartbeats; {report.summary()}"
    )


async def test_an_answer_outlives_the_ingress_replica_that_took_the_call(
    process_stack: StackFactory,
) -> None:
    stack = await _one_worker_stack(process_stack, ingresses=("ingress-a", "ingress-b"))
    request_id = "outlives-its-ingress"
    body = {
        "model": "llama-2-7b",
        "prompt": "a long answer",
        "max_tokens": 2000,  # about 2 s of emulated generation at this time scale
        "switchyard": {"request_id": request_id},
    }
    worker = stack.processes["worker-a"].popen
    async with httpx.AsyncClient(timeout=CLIENT_TIMEOUT_S) as client:
        # The worker is paused until the replica is gone: however slow this machine, the
        # answer cannot come before the kill (for well under the worker timeout).
        worker.send_signal(signal.SIGSTOP)
        try:
            call = asyncio.create_task(
                client.post(f"{stack.url_of('ingress-a')}/v1/completions", json=body)
            )
            status_url = f"{stack.url_of('ingress-b')}/v1/requests/{request_id}"
            deadline = time.monotonic() + 20.0
            while (status := (await client.get(status_url)).json().get("status")) != "assigned":
                assert time.monotonic() < deadline, (status, stack.logs())
                await asyncio.sleep(0.05)
            # The replica that took the call, and would have recorded its answer, is gone
            # for good before the answer comes.
            stack.kill("ingress-a")
            with pytest.raises(httpx.TransportError):
                await call
        finally:
            worker.send_signal(signal.SIGCONT)
        # The record still gets the answer (the worker records it), so both a status
        # poll and a retry with the same request_id on the other replica find it.
        while (record := (await client.get(status_url)).json())["status"] != "ok":
            assert time.monotonic() < deadline + 20.0, (record, stack.logs())
            await asyncio.sleep(0.1)
        retry = await client.post(f"{stack.url_of('ingress-b')}/v1/completions", json=body)
    assert record["worker_id"] == "worker-a", record
    assert retry.status_code == 200, retry.text
    assert retry.json()["usage"]["completion_tokens"] == 2000, retry.text
    # Run once: the retry found the answer rather than deciding or sending it again.
    inbox = await read_topic(stack.kafka_bootstrap, stack.topic_prefix, WORKER_INBOX)
    sent = [a.message.request.request_id for a in _assignments(inbox)]
    assert sent == [request_id]


def _assignments(
    inbox: list[Record[Assignment | Migration | PlacementOrder]],
) -> list[Record[Assignment]]:
    """The assignments among the worker inbox's records (migrations left out)."""
    return [
        Record(r.message, r.partition, r.offset, r.timestamp_ms)
        for r in inbox
        if isinstance(r.message, Assignment)
    ]
