"""An emulated worker on real Kafka: does publishing its answers keep up with the model?

One emulated LLM worker (``a100-80gb/llama-2-7b``, time scale 1, so one modelled second
is one wall second) is given a burst of ``--requests`` assignments at once, each with a
200-token prompt and ``--output`` tokens to generate, all of them streamed (an output
chunk for every engine step that gave a request tokens) or none. The wall time from the burst to the last completion is
compared with the time the performance model gave the same work (the backend's
modelled clock): a ratio above 1 is time the worker spent on its messages rather than
on the model, which a real GPU worker would lose the same way.

Each setting runs ``--runs`` times, alternating; medians are reported. Needs Kafka
(``deploy/local/infra.sh up``); run ``make bench-worker-stream`` or
``python -m bench.worker_stream_bench``. Emulated times are a performance model's
output, not measurements; the wall times are this machine's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import time
import uuid
from pathlib import Path

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from switchyard.bus import Bus
from switchyard.bus.kafka import KafkaTransport
from switchyard.config import load_settings
from switchyard.contracts.messages import Assignment, Completion, InferenceRequest, LLMPayload
from switchyard.contracts.topics import ANSWERS, WORKER_INBOX
from switchyard.lifecycle import Assign, RequestLedger
from switchyard.perf import performance_model
from switchyard.runtime.service import ServiceContext
from switchyard.state.memory import MemoryStateStore
from switchyard.telemetry import Telemetry

from services.worker.backends.emulated_llm import EmulatedLlmBackend
from services.worker.service import WorkerService

PROFILE = "a100-80gb/llama-2-7b"
_REPLY_PARTITION = 0
PROMPT_TOKENS = 200
RESULTS = Path(__file__).parent / "results" / "worker_stream.json"


async def one_run(
    bootstrap: str, *, stream: bool, requests: int, output_tokens: int
) -> tuple[float, float]:
    """Wall and modelled seconds of one burst through a fresh worker."""
    bus = Bus(KafkaTransport(bootstrap), topic_prefix=f"wsb{uuid.uuid4().hex[:8]}.")
    await bus.start()
    settings = load_settings(
        {}, worker_id="bench-worker", heartbeat_interval_s=0.5, worker_profile=PROFILE
    )
    state = MemoryStateStore("bench:")
    ledger = RequestLedger(state)
    ctx = ServiceContext(
        name="worker",
        settings=settings,
        bus=bus,
        state=state,
        telemetry=Telemetry(TracerProvider(), MeterProvider()),
        logger=logging.getLogger("bench.worker"),
        stopping=asyncio.Event(),
    )
    backend = EmulatedLlmBackend(performance_model(PROFILE), time_scale=1.0)
    worker = WorkerService(ctx, backend)
    await worker.start()
    try:
        answers = bus.subscribe(ANSWERS, group="bench", partitions=[_REPLY_PARTITION])
        async with answers as completions:
            modelled_before_s = backend.modelled_now_s
            started = time.monotonic()
            now_s = time.time()
            sends = []
            for index in range(requests):
                request = InferenceRequest(
                    request_id=f"r{index}",
                    app="llama-2-7b",
                    payload=LLMPayload(
                        model="llama-2-7b",
                        prompt_tokens=PROMPT_TOKENS,
                        max_output_tokens=output_tokens,
                        stream=stream,
                    ),
                    arrival_s=now_s,
                    reply_to="bench",
                    reply_partition=_REPLY_PARTITION,
                )
                assignment = Assignment(
                    request=request,
                    worker_id="bench-worker",
                    variant="llama-2-7b",
                    order=float(index),
                    policy="bench",
                    assigned_at_s=now_s,
                )
                # Recorded as the scheduler records its decisions: the worker fences on it.
                await ledger.accept(request)
                await ledger.assign(Assign(assignment))
                sends.append(
                    await bus.send(WORKER_INBOX, assignment, partition=worker.inbox.partition)
                )
            await asyncio.gather(*sends)
            answered = 0
            while answered < requests:
                delivery = await completions.next_within(300.0)
                if delivery is None:
                    raise RuntimeError("a completion did not come within 300 s")
                answered += isinstance(delivery.message, Completion)
            wall_s = time.monotonic() - started
        return wall_s, backend.modelled_now_s - modelled_before_s
    finally:
        ctx.stopping.set()
        await worker.drain()
        await worker.cancel_routines()
        await bus.stop()


async def main_async(args: argparse.Namespace) -> dict[str, object]:
    ratios: dict[str, list[float]] = {"streamed": [], "not streamed": []}
    walls: dict[str, list[float]] = {"streamed": [], "not streamed": []}
    modelled: list[float] = []
    for run in range(args.runs):
        for stream in (False, True):
            label = "streamed" if stream else "not streamed"
            wall_s, modelled_s = await one_run(
                args.bootstrap, stream=stream, requests=args.requests, output_tokens=args.output
            )
            ratios[label].append(wall_s / modelled_s)
            walls[label].append(wall_s)
            modelled.append(modelled_s)
            print(
                f"run {run + 1} {label:>12}: wall {wall_s:6.2f} s, modelled {modelled_s:6.2f} s, "
                f"ratio {wall_s / modelled_s:.3f}",
                flush=True,
            )
    summary = {
        label: {
            "median_wall_s": round(statistics.median(walls[label]), 3),
            "median_ratio": round(statistics.median(ratios[label]), 3),
            "max_ratio": round(max(ratios[label]), 3),
        }
        for label in ratios
    }
    print(f"\n{args.requests} requests x {args.output} output tokens, {args.runs} runs each:")
    for label, figures in summary.items():
        print(
            f"  {label:>12}: median wall {figures['median_wall_s']:.2f} s, "
            f"median wall/modelled {figures['median_ratio']:.3f} "
            f"(max {figures['max_ratio']:.3f})"
        )
    return {
        "profile": PROFILE,
        "requests": args.requests,
        "output_tokens": args.output,
        "runs": args.runs,
        "modelled_s": round(statistics.median(modelled), 3),
        "results": summary,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092", help="Kafka bootstrap servers")
    parser.add_argument("--requests", type=int, default=128, help="assignments in the burst")
    parser.add_argument("--output", type=int, default=256, help="output tokens per request")
    parser.add_argument("--runs", type=int, default=5, help="runs of each setting")
    parser.add_argument("--json", type=Path, default=RESULTS, help="where to write the figures")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    result = asyncio.run(main_async(args))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"figures written to {args.json}")


if __name__ == "__main__":
    main()
