"""What the bus costs a message in Python, apart from any broker: CPU microseconds per
publish-and-consume on the in-memory bus, and its pieces measured alone.

Three settings of the tracing middleware, each run ``--runs`` times interleaved in one
process, medians reported:

- ``none``: no middleware (encoding, the transport, decoding, commit bookkeeping);
- ``spans``: the middleware making an unsampled span per publish and per consume (a
  tracer provider whose sampler drops every span, but not the ``always_off`` sampler the
  middleware recognises), as it did before it learnt to skip them;
- ``propagate``: the default without an exporter (``configure_telemetry`` with no
  endpoint): the received context is handed on, no span per message;
- ``propagate+idle``: ``propagate`` while ``--idle-consumers`` other subscriptions (12 by
  default, about as many as the embedded stack's services hold) wait on other
  partitions, as in one process running every service: what a record costs those that
  do not read it.

The pieces (one ``Assignment`` of a short completion): a consuming scope and a
publishing scope of each tracing setting, the ``switchyard.bus.handler.duration``
histogram's ``record``, and decoding and encoding the message.

Run ``python -m bench.bus_overhead_bench`` (``make bench-bus-overhead``); JSON in
``bench/results/bus_overhead.json``. Figures in docs/benchmarks.md, "The hot path".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import Decision, StaticSampler
from switchyard.bus import Bus, MemoryTransport, Subscription
from switchyard.bus.records import Envelope
from switchyard.config import load_settings
from switchyard.contracts.messages import Assignment, InferenceRequest, LLMPayload
from switchyard.contracts.topics import WORKER_INBOX
from switchyard.telemetry import TracingMiddleware, configure_telemetry

RESULTS = Path(__file__).parent / "results"
SETTINGS = ("none", "spans", "propagate", "propagate+idle")


def _assignment() -> Assignment:
    request = InferenceRequest(
        request_id="req-0123456789abcdef0123456789abcdef",
        app="llama-2-7b",
        payload=LLMPayload(model="llama-2-7b", prompt_tokens=120, max_output_tokens=16),
        arrival_s=100.0,
        deadline_s=110.0,
        reply_to="ingress-a",
        reply_partition=0,
    )
    return Assignment(
        request=request,
        worker_id="worker-0",
        variant="llama-2-7b",
        order=100.0,
        policy="jsq",
        epoch=0,
        assigned_at_s=100.01,
    )


def _middlewares(setting: str) -> list[TracingMiddleware]:
    telemetry = configure_telemetry("bench", load_settings({}), install_global=False)
    if setting == "none":
        return []
    if setting == "spans":
        # Drops every span as always_off does, but is not that sampler: the middleware
        # cannot tell that nothing records, and makes its spans.
        provider = TracerProvider(sampler=StaticSampler(Decision.DROP))
        return [TracingMiddleware(provider, telemetry.meter_provider)]
    return [TracingMiddleware(telemetry.tracer_provider, telemetry.meter_provider)]


async def _idle(sub: Subscription[Any]) -> None:
    """A consumer with nothing to read, fetching as a service's routine does."""
    while True:
        await sub.next_within(0.5)


async def _round_trips(setting: str, messages: int, idle_consumers: int) -> float:
    """CPU microseconds per publish and consume of one message on the memory bus."""
    bus = Bus(
        MemoryTransport(),
        middlewares=_middlewares(setting.removesuffix("+idle")),
        commit_interval_s=0.2,
    )
    await bus.start()
    message = _assignment()
    sub = bus.subscribe(WORKER_INBOX, group="bench", partitions=[0])
    await sub.open()
    idle = [
        bus.subscribe(WORKER_INBOX, group=f"idle-{n}", partitions=[1 + n])
        for n in range(idle_consumers if setting.endswith("+idle") else 0)
    ]
    for other in idle:
        await other.open()
    idlers = [asyncio.create_task(_idle(other)) for other in idle]
    await asyncio.sleep(0.05)  # every idle consumer waits for a record
    try:
        for _ in range(200):  # warm-up
            await bus.publish(WORKER_INBOX, message, partition=0)
            await sub.next_within(1.0)
        started = time.process_time()
        for _ in range(messages):
            await bus.publish(WORKER_INBOX, message, partition=0)
            # The consumed message's context stays current until the next is read, so
            # the next publish happens inside it, as a service's does.
            await sub.next_within(1.0)
        return (time.process_time() - started) / messages * 1e6
    finally:
        for task in idlers:
            task.cancel()
        await asyncio.gather(*idlers, return_exceptions=True)
        for other in idle:
            await other.close()
        await sub.close()
        await bus.stop()


def _per_call_us(action: Callable[[], object], calls: int) -> float:
    started = time.process_time()
    for _ in range(calls):
        action()
    return (time.process_time() - started) / calls * 1e6


def _pieces(calls: int) -> dict[str, float]:
    """CPU microseconds of each piece, measured alone."""
    message = _assignment()
    value = message.model_dump_json().encode()
    found: dict[str, float] = {}
    for setting in ("spans", "propagate"):
        (tracing,) = _middlewares(setting)
        headers: list[tuple[str, bytes]] = []
        with tracing.publishing("t", "assignment", headers):
            pass
        record = Envelope("t", 0, 1, b"k", value, tuple(headers), 0)

        def consume(tracing: TracingMiddleware = tracing, record: Envelope = record) -> None:
            with tracing.consuming(record, "g", "assignment"):
                pass

        def publish(tracing: TracingMiddleware = tracing) -> None:
            with tracing.publishing("t", "assignment", []):
                pass

        found[f"consume scope ({setting})"] = _per_call_us(consume, calls)
        # Publishing inside a handled message, as a service does.
        with tracing.consuming(record, "g", "assignment"):
            found[f"publish scope ({setting})"] = _per_call_us(publish, calls)
    # The middleware's handler-duration histogram: a histogram with its attributes on a
    # meter provider configured as a service's (a Prometheus reader).
    meter = configure_telemetry("bench", load_settings({}), install_global=False).meter_provider
    histogram = meter.get_meter("bench").create_histogram("bench.handler.duration", unit="s")
    attributes = {"topic": "t", "group": "g", "outcome": "ok"}
    found["handler-duration histogram record"] = _per_call_us(
        lambda: histogram.record(0.001, attributes), calls
    )
    found["decode Assignment"] = _per_call_us(lambda: Assignment.model_validate_json(value), calls)
    found["encode Assignment"] = _per_call_us(message.model_dump_json, calls)
    return found


def run(runs: int, messages: int, calls: int, idle_consumers: int) -> dict[str, Any]:
    per_setting: dict[str, list[float]] = {setting: [] for setting in SETTINGS}
    for _ in range(runs):
        for setting in SETTINGS:
            trips = _round_trips(setting, messages, idle_consumers)
            per_setting[setting].append(asyncio.run(trips))
    pieces = [_pieces(calls) for _ in range(runs)]
    return {
        "runs": runs,
        "messages": messages,
        "idle_consumers": idle_consumers,
        "round_trip_us": {s: statistics.median(v) for s, v in per_setting.items()},
        "round_trip_us_all": per_setting,
        "pieces_us": {k: statistics.median(p[k] for p in pieces) for k in pieces[0]},
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.bus_overhead_bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--messages", type=int, default=4000)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--idle-consumers", type=int, default=12)
    parser.add_argument("--json", type=Path, default=RESULTS / "bus_overhead.json")
    args = parser.parse_args(argv)
    document = run(args.runs, args.messages, args.calls, args.idle_consumers)
    print("publish + consume on the memory bus, CPU us per message (median of runs):")
    for setting, us in document["round_trip_us"].items():
        print(f"  {setting:15} {us:7.1f}")
    print("pieces alone, CPU us per call (median of runs):")
    for piece, us in document["pieces_us"].items():
        print(f"  {piece:40} {us:6.1f}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(document, indent=2))
    print(f"\nwritten {args.json}")


if __name__ == "__main__":
    main()
