"""Bus benchmark on the real Kafka broker: throughput and publish-to-handler latency.

Measures, on the broker at SWITCHYARD_KAFKA_BOOTSTRAP (default 127.0.0.1:9092):

1. Throughput: N messages of about 1 KB produced as fast as the producer accepts them
   and consumed by one group member in another process; messages/s from the first
   send to the last message handled. Twice: raw bytes through the Kafka transport, and
   typed messages through the bus as the services use it (JSON encoding, pydantic
   validation, W3C trace context in headers, batched commits).
2. Latency: typed messages published at a fixed rate (default 1,000/s) by one process
   and handled by another; per message, handler entry time minus the publisher's
   timestamp carried in the message (same machine, same wall clock).

Run ``make bench`` (starts the local broker) or
``python -m bench.bus_bench [--messages N] [--rate R] [--seconds S] [--json OUT]``.
Figures go to stdout as a Markdown table and, with --json, to a file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import statistics
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

from switchyard.bus import Bus, Delivery
from switchyard.bus.kafka import KafkaTransport
from switchyard.bus.records import OutgoingRecord
from switchyard.config import load_settings
from switchyard.contracts.messages import InferenceRequest, LLMPayload
from switchyard.contracts.topics import ALL_TOPICS, REQUESTS
from switchyard.telemetry import TracingMiddleware, configure_telemetry

PROMPT_1KB = "x" * 760  # with the other fields the JSON body is about 1,000 bytes


@dataclass
class Figure:
    name: str
    value: float
    unit: str
    detail: str = ""


def _bootstrap() -> str:
    return os.environ.get("SWITCHYARD_KAFKA_BOOTSTRAP", "127.0.0.1:9092")


def _make_bus(prefix: str, *, tracing: bool) -> Bus:
    middlewares: list[Any] = []
    if tracing:
        # As a service runs it: spans are recorded only when SWITCHYARD_OTLP_ENDPOINT is set.
        telemetry = configure_telemetry("bench", load_settings(), install_global=False)
        middlewares.append(TracingMiddleware(telemetry.tracer_provider, telemetry.meter_provider))
    return Bus(
        KafkaTransport(_bootstrap(), client_id=f"bench-{prefix}"),
        topic_prefix=prefix,
        partitions=4,
        middlewares=middlewares,
    )


def _request(i: int, sent_s: float) -> InferenceRequest:
    return InferenceRequest(
        request_id=f"bench-{i}",
        app="bench",
        payload=LLMPayload(
            model="bench-model", prompt_tokens=200, max_output_tokens=100, prompt=PROMPT_1KB
        ),
        arrival_s=sent_s,
    )


# -- consumer side (runs in its own process) ------------------------------------------


def _consume(prefix: str, group: str, count: int, typed: bool, queue: Any) -> None:
    asyncio.run(_consume_async(prefix, group, count, typed, queue))


async def _consume_async(prefix: str, group: str, count: int, typed: bool, queue: Any) -> None:
    bus = _make_bus(prefix, tracing=True)
    await bus.start()
    latencies_s: list[float] = []
    first_s = last_s = 0.0
    seen = 0
    stopping = asyncio.Event()
    sub = bus.subscribe(REQUESTS, group=group, stopping=stopping)
    async with sub:
        queue.put(("ready", None))
        if typed:

            async def handle(delivery: Delivery[InferenceRequest]) -> None:
                nonlocal seen, first_s, last_s
                now_s = time.time()
                latencies_s.append(now_s - delivery.message.arrival_s)
                seen += 1
                first_s = first_s or now_s
                last_s = now_s
                if seen >= count:
                    stopping.set()

            async for delivery in sub:
                await sub.handle(delivery, handle)
        else:
            consumer = sub._require_consumer()
            while seen < count:
                for _ in await consumer.fetch(0.2, 2000):
                    seen += 1
                last_s = time.time()
    await bus.stop()
    queue.put(("done", {"seen": seen, "last_s": last_s, "latencies_s": latencies_s}))


def _start_consumer(prefix: str, count: int, typed: bool) -> tuple[Any, Any]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_consume, args=(prefix, "bench", count, typed, queue))
    proc.start()
    kind, _ = queue.get(timeout=120)
    assert kind == "ready"
    return proc, queue


# -- scenarios --------------------------------------------------------------------------


async def _cleanup(prefix: str) -> None:
    bus = _make_bus(prefix, tracing=False)
    await bus.start()
    await bus.transport.delete_topics(bus.topic_name(t) for t in ALL_TOPICS)
    await bus.stop()


async def throughput(count: int, *, typed: bool) -> Figure:
    prefix = f"bench{uuid.uuid4().hex[:8]}."
    bus = _make_bus(prefix, tracing=True)
    await bus.start()
    proc, queue = _start_consumer(prefix, count, typed)
    await asyncio.sleep(1.0)  # let the group settle before the clock starts
    start_s = time.time()
    pending = []
    if typed:
        for i in range(count):
            pending.append(await bus.send(REQUESTS, _request(i, time.time())))
    else:
        value = os.urandom(1024)
        name = bus.topic_name(REQUESTS)
        for i in range(count):
            record = OutgoingRecord(name, value, f"k{i}".encode())
            pending.append(await bus.transport.send(record))
    await asyncio.gather(*pending)
    produced_s = time.time() - start_s
    _, result = await asyncio.to_thread(queue.get, True, 600)
    proc.join(30)
    await bus.stop()
    await _cleanup(prefix)
    elapsed_s = result["last_s"] - start_s
    label = "typed bus (JSON + validation + tracing)" if typed else "raw 1 KiB records"
    return Figure(
        f"throughput, {label}",
        count / elapsed_s,
        "msg/s",
        f"{count} messages; producing alone took {produced_s:.2f} s",
    )


async def latency(rate_per_s: float, seconds: float) -> list[Figure]:
    prefix = f"bench{uuid.uuid4().hex[:8]}."
    bus = _make_bus(prefix, tracing=True)
    await bus.start()
    count = int(rate_per_s * seconds)
    proc, queue = _start_consumer(prefix, count, True)
    await asyncio.sleep(1.0)
    interval_s = 1.0 / rate_per_s
    start = time.perf_counter()
    pending = []
    for i in range(count):
        target = start + i * interval_s
        delay = target - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        pending.append(await bus.send(REQUESTS, _request(i, time.time())))
    await asyncio.gather(*pending)
    _, result = await asyncio.to_thread(queue.get, True, 600)
    proc.join(30)
    await bus.stop()
    await _cleanup(prefix)
    hops_ms = sorted(x * 1000 for x in result["latencies_s"])
    # Skip the first second: group join and JIT-free warm-up of connections.
    steady = hops_ms[int(rate_per_s) :] if len(hops_ms) > 2 * rate_per_s else hops_ms
    steady.sort()

    def pct(p: float) -> float:
        return float(steady[min(len(steady) - 1, int(p / 100 * len(steady)))])

    detail = f"{len(steady)} messages at {rate_per_s:.0f}/s, first second excluded"
    return [
        Figure("publish-to-handler latency P50", statistics.median(steady), "ms", detail),
        Figure("publish-to-handler latency P90", pct(90), "ms", detail),
        Figure("publish-to-handler latency P99", pct(99), "ms", detail),
        Figure("publish-to-handler latency max", steady[-1], "ms", detail),
    ]


async def main_async(args: argparse.Namespace) -> list[Figure]:
    """Each scenario ``--repeat`` times; a figure is the median of its runs."""
    runs: list[list[Figure]] = []
    for _ in range(args.repeat):
        figures = [
            await throughput(args.messages, typed=False),
            await throughput(args.messages, typed=True),
        ]
        figures.extend(await latency(args.rate, args.seconds))
        runs.append(figures)
    merged = []
    for column in zip(*runs, strict=True):
        values = [f.value for f in column]
        spread = f"; {len(values)} runs, {min(values):,.1f} to {max(values):,.1f}"
        first = column[0]
        merged.append(
            Figure(first.name, statistics.median(values), first.unit, first.detail + spread)
        )
    return merged


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", dest="json_out", default=None)
    args = parser.parse_args()
    figures = asyncio.run(main_async(args))
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    print(f"\nBus benchmark on Kafka at {_bootstrap()} ({machine}); medians\n")
    print("| figure | median | detail |\n|---|---|---|")
    for f in figures:
        print(f"| {f.name} | {f.value:,.1f} {f.unit} | {f.detail} |")
    if args.json_out:
        os.makedirs(os.path.dirname(args.json_out) or ".", exist_ok=True)
        with open(args.json_out, "w") as out:
            json.dump({"machine": machine, "figures": [asdict(f) for f in figures]}, out, indent=2)


if __name__ == "__main__":
    main()
