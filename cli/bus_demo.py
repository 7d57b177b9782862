"""The foundation demo: a trace replayed through the bus and state store, with a crash.

What it shows, on the embedded default or on Kafka and Redis:

1. An "ingress" publishes the bundled Azure trace sample as :class:`InferenceRequest`
   messages, at the trace's arrival times compressed by ``speedup``.
2. Two replicas of one consumer group share the request partitions. Each claims a
   request in the state store (``set_if_absent``) before publishing its completion, so a
   request delivered twice is answered once.
3. Halfway through, replica ``a`` is killed without committing; replica ``b`` takes its
   partitions over and receives its unfinished messages again.
4. A corrupt record on the request topic goes to the dead-letter topic; nothing else
   waits for it.
5. A reporter consumes the completions and prints counts, hop latencies, dead letters,
   and how many requests formed one trace across every hop.

The replicas do no model work; this is the plumbing every service stands on.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from switchyard.bus import Bus, Delivery, MemoryBroker, bus_from_settings
from switchyard.config import Settings
from switchyard.contracts.messages import (
    Completion,
    CompletionStatus,
    InferenceRequest,
    LLMPayload,
    LLMResult,
    OutputChunk,
    RequestTimeline,
)
from switchyard.contracts.topics import ALL_TOPICS, ANSWERS, DEAD_LETTERS, REQUESTS
from switchyard.state import StateStore, state_from_settings
from switchyard.telemetry import TracingMiddleware
from switchyard.traces.azure import bundled_mix

_CLAIM_TTL_S = 3600.0
_REPORT_PARTITION = 0
"""The partition of the answers topic the demo's reporter reads (its answers address it)."""


@dataclass
class _Tally:
    completed: set[str] = field(default_factory=set)
    answers: Counter[str] = field(default_factory=Counter)
    handled_by: Counter[str] = field(default_factory=Counter)
    duplicates_suppressed: int = 0
    hops_ms: list[float] = field(default_factory=list)
    dead_letters: list[str] = field(default_factory=list)


class _Replica:
    """One member of the demo's consumer group: claim, then complete."""

    def __init__(self, name: str, bus: Bus, state: StateStore, tally: _Tally) -> None:
        self.name = name
        self.bus = bus
        self.state = state
        self.tally = tally
        self.stopping = asyncio.Event()
        self.subscription = bus.subscribe(REQUESTS, group="demo-replicas", stopping=self.stopping)

    async def handle(self, delivery: Delivery[InferenceRequest]) -> None:
        request = delivery.message
        claimed = await self.state.set_if_absent(
            f"claim:{request.request_id}:complete", self.name, ttl_s=_CLAIM_TTL_S
        )
        if not claimed:
            self.tally.duplicates_suppressed += 1
            return
        self.tally.handled_by[self.name] += 1
        payload = request.payload
        output_tokens = payload.output_tokens_hint if isinstance(payload, LLMPayload) else None
        now_s = time.time()
        await self.bus.publish(
            ANSWERS,
            Completion(
                request_id=request.request_id,
                app=request.app,
                worker_id=self.name,
                worker_type="demo",
                variant="none",
                status=CompletionStatus.OK,
                result=LLMResult(output_tokens=output_tokens or 1),
                timeline=RequestTimeline(
                    arrival_s=request.arrival_s,
                    assigned_s=now_s,
                    started_s=now_s,
                    finished_s=now_s,
                ),
                emulated=True,
            ),
            partition=_REPORT_PARTITION,
        )

    async def run(self) -> None:
        async with self.subscription:
            async for delivery in self.subscription:
                await self.subscription.handle(delivery, self.handle)


async def run_demo(settings: Settings, *, requests: int = 2000, speedup: float = 100.0) -> int:
    trace = bundled_mix()[:requests]
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    tracing = TracingMiddleware(provider)
    run_id = uuid.uuid4().hex[:8]
    settings = settings.model_copy(
        update={
            "topic_prefix": f"{settings.topic_prefix}demo-{run_id}.",
            "state_prefix": f"{settings.state_prefix}demo-{run_id}:",
        }
    )
    broker = MemoryBroker()

    def new_bus(commit_interval_s: float | None = None) -> Bus:
        bus = bus_from_settings(settings, middlewares=[tracing], memory_broker=broker)
        if commit_interval_s is not None:
            bus.commit_interval_s = commit_interval_s
        return bus

    ingress_bus, report_bus = new_bus(), new_bus()
    # Replica a never commits on its own, so everything it handled comes back after the crash.
    bus_a, bus_b = new_bus(commit_interval_s=3600), new_bus()
    state = state_from_settings(settings)
    tally = _Tally()
    where = (
        "in-process memory" if settings.bus == "memory" else f"Kafka at {settings.kafka_bootstrap}"
    )
    print(f"Switchyard foundation demo: {len(trace)} requests from the Azure trace sample,")
    print(f"bus: {where}; state: {settings.state}; replay {speedup:g}x faster than the trace.\n")

    for bus in (ingress_bus, report_bus, bus_a, bus_b):
        await bus.start()
    await state.ping()
    replica_a = _Replica("replica-a", bus_a, state, tally)
    replica_b = _Replica("replica-b", bus_b, state, tally)
    report_stop = asyncio.Event()

    async def report_completions(delivery: Delivery[Completion | OutputChunk]) -> None:
        completion = delivery.message
        if not isinstance(completion, Completion):
            return
        tally.answers[completion.request_id] += 1
        tally.completed.add(completion.request_id)
        tally.hops_ms.append((time.time() - completion.timeline.arrival_s) * 1000)
        if len(tally.completed) >= len(trace):
            report_stop.set()

    # Opened before anything is sent: a partition reader starts at the partition's end.
    report = report_bus.subscribe(
        ANSWERS, group="demo-report", stopping=report_stop, partitions=[_REPORT_PARTITION]
    )
    await report.open()

    async def report_routine() -> None:
        async with report:
            async for delivery in report:
                await report.handle(delivery, report_completions)

    tasks = [
        asyncio.create_task(replica_a.run()),
        asyncio.create_task(replica_b.run()),
        asyncio.create_task(report_routine()),
    ]
    # A group that is still forming when the replay starts may leave a partition of a
    # just-created topic without an owner until its next metadata refresh (Kafka), and
    # the kill below must hit a replica that owns partitions: wait for both to have some.
    if not await _both_own_partitions(
        [replica_a, replica_b], await ingress_bus.partitions_of(REQUESTS)
    ):
        print("  the replicas' group did not settle within 30 s; replaying anyway", flush=True)
    started_s = time.time()
    crashed = False
    for index, row in enumerate(trace):
        delay_s = started_s + row.arrival_s / speedup - time.time()
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        request = InferenceRequest(
            request_id=f"req-{index:05d}",
            app=f"azure-{row.workload.value}",
            payload=LLMPayload(
                model="llama-2-70b",
                prompt_tokens=row.prompt_tokens,
                max_output_tokens=max(row.output_tokens, 1),
                output_tokens_hint=row.output_tokens,
                workload=row.workload,
            ),
            arrival_s=time.time(),
        )
        await ingress_bus.publish(REQUESTS, request)
        if index == len(trace) // 3:
            await ingress_bus.publish_bytes(REQUESTS, b'{"request_id": "truncated', key=b"bad")
        if not crashed and index >= len(trace) // 2:
            crashed = True
            await replica_a.subscription.abort()
            print(
                f"\n  replica-a killed after {tally.handled_by['replica-a']} requests, nothing committed"
            )
        if index % 100 == 0:
            _progress(index + 1, len(trace), len(tally.completed))

    try:
        await asyncio.wait_for(report_stop.wait(), timeout=60)
    except TimeoutError:
        print("\n  not every request completed within 60 s", file=sys.stderr)
    _progress(len(trace), len(trace), len(tally.completed))
    elapsed_s = time.time() - started_s
    replica_b.stopping.set()
    report_stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)

    dead = report_bus.subscribe(DEAD_LETTERS, group="demo-dead-letters")
    async with dead:
        while (letter := await dead.next_within(2.0)) is not None:
            tally.dead_letters.append(f"{letter.message.reason_kind}: {letter.message.reason}")

    trace_ids: dict[str, set[str]] = {}
    for span in spans.get_finished_spans():
        if span.context is not None:
            trace_ids.setdefault(format(span.context.trace_id, "032x"), set()).add(span.name)
    full_traces = sum(
        1 for names in trace_ids.values() if any(n.endswith("answers process") for n in names)
    )

    for bus in (ingress_bus, report_bus, bus_a, bus_b):
        for topic in ALL_TOPICS if settings.bus == "kafka" and bus is ingress_bus else ():
            await bus.transport.delete_topics([bus.topic_name(topic)])
        await bus.stop()
    await state.clear_prefix()
    await state.close()
    provider.shutdown()

    hops = sorted(tally.hops_ms)
    doubled = sum(1 for count in tally.answers.values() if count > 1)
    missing = len(trace) - len(tally.completed)
    rows = [
        ("requests published", f"{len(trace)}"),
        (
            "completions (one per request)",
            f"{len(tally.completed)}   missing {missing}, doubled {doubled}",
        ),
        (
            "handled by replica-a / b",
            f"{tally.handled_by['replica-a']} / {tally.handled_by['replica-b']}",
        ),
        ("redeliveries suppressed", f"{tally.duplicates_suppressed}"),
    ]
    if hops:
        p99 = hops[min(len(hops) - 1, int(0.99 * len(hops)))]
        rows.append(
            ("publish-to-completion P50/P99", f"{statistics.median(hops):.2f} / {p99:.2f} ms")
        )
    rows.append(
        ("requests traced end to end", f"{full_traces} (request publish to completion handled)")
    )
    rows.append(("dead letters", f"{len(tally.dead_letters)}"))
    rows.extend(("", line[:100]) for line in tally.dead_letters)
    rows.append(("wall time", f"{elapsed_s:.1f} s"))
    print("\n")
    for label, value in rows:
        print(f"  {label:32}{value}")
    return 0 if missing == 0 and doubled == 0 else 1


async def _both_own_partitions(
    replicas: list[_Replica], partitions: int, timeout_s: float = 30.0
) -> bool:
    """Whether the replicas came to own all ``partitions`` between them, each some."""
    deadline_s = time.monotonic() + timeout_s
    while time.monotonic() < deadline_s:
        owned = [replica.subscription.assignment() for replica in replicas]
        if all(owned) and len(frozenset().union(*owned)) == partitions:
            return True
        await asyncio.sleep(0.05)
    return False


def _progress(done: int, total: int, completed: int) -> None:
    if not sys.stdout.isatty():
        if done == total or done % 500 == 1:
            print(f"  {done}/{total} published, {completed} completed")
        return
    width = 40
    filled = int(width * done / total)
    sys.stdout.write(
        f"\r  [{'#' * filled}{'.' * (width - filled)}] {done}/{total} published, {completed} completed"
    )
    sys.stdout.flush()
