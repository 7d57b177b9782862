"""What one completion call costs the ingress's HTTP app in Python, apart from sockets,
the broker and Redis: CPU microseconds per ``POST /v1/completions``.

The app is the ingress's own (:func:`services.ingress.api.build_app`, with the request
metrics and SERVER spans of the service's default telemetry: no exporter, spans
unsampled), over the in-memory state store. Its ``publish`` answers each request at
once: a :class:`Completion` handed to the answer registry on the next turn of the loop,
as the answers routine would. Calls go straight into the ASGI app (a prepared scope and
body; no HTTP parsing, no socket), ``--concurrency`` at a time, so the group commit
batches as it does under load.

Every setting (``--young-allocations``: how often the garbage collector's youngest
generation is collected, CPython's default against the services') is measured
``--runs`` times interleaved in one process; the medians of CPU seconds
(``time.process_time``) over calls are reported, with the collector's pauses over the
calls (how many, their P50 and longest, timed through ``gc.callbacks``): a pause stalls
every call in flight. What it leaves out (uvicorn's
HTTP parsing, the Kafka producer, the Redis round trip) is in ``make bench-stack``.

Run ``python -m bench.ingress_app_bench``; JSON in ``bench/results/ingress_app.json``.
Figures in docs/benchmarks.md, "The hot path".
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import time
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from switchyard import heap
from switchyard.config import load_settings
from switchyard.contracts.messages import (
    Completion,
    CompletionStatus,
    InferenceRequest,
    LLMResult,
    RequestTimeline,
)
from switchyard.runtime import loop as event_loop
from switchyard.serving.catalogue import DEFAULT_LLM_APPLICATIONS, ServingCatalogue
from switchyard.state.memory import MemoryStateStore
from switchyard.telemetry import configure_telemetry

from services.ingress.answers import AnswerRegistry
from services.ingress.api import ApiOptions, build_app

RESULTS = Path(__file__).parent / "results"
CPYTHON_DEFAULT_YOUNG = 700
BODY = json.dumps(
    {"model": "llama-2-7b", "prompt": "Say hello in five words.", "max_tokens": 8}
).encode()
SCOPE: dict[str, Any] = {
    "type": "http",
    "asgi": {"version": "3.0"},
    "http_version": "1.1",
    "method": "POST",
    "scheme": "http",
    "path": "/v1/completions",
    "raw_path": b"/v1/completions",
    "query_string": b"",
    "root_path": "",
    "headers": [
        (b"host", b"127.0.0.1:8080"),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(BODY)).encode()),
        (b"user-agent", b"switchyard-bench"),
    ],
    "client": ("127.0.0.1", 50000),
    "server": ("127.0.0.1", 8080),
}


def _completion(request: InferenceRequest) -> Completion:
    now = time.time()
    return Completion(
        request_id=request.request_id,
        app=request.app,
        worker_id="worker-0",
        worker_type="a100-80gb",
        variant="llama-2-7b",
        status=CompletionStatus.OK,
        result=LLMResult(output_tokens=8, text="hello there from the bench"),
        timeline=RequestTimeline(
            arrival_s=request.arrival_s,
            assigned_s=now,
            started_s=now,
            first_token_s=now,
            finished_s=now,
        ),
        reply_to=request.reply_to,
    )


@dataclass
class _Run:
    cpu_s_per_call: float
    pauses_s: list[float]
    """Each collection's wall time over the measured calls."""


class _Pauses:
    """The collector's pauses, timed from its callbacks while attached."""

    def __init__(self) -> None:
        self.pauses_s: list[float] = []
        self._started_s = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        del info
        if phase == "start":
            self._started_s = time.perf_counter()
        else:
            self.pauses_s.append(time.perf_counter() - self._started_s)


async def _calls(count: int, concurrency: int, young_allocations: int) -> _Run:
    """CPU seconds per call over ``count`` calls on a fresh app, the heap settled as a
    service settles it once started, with the youngest generation collected every
    ``young_allocations``."""
    telemetry = configure_telemetry("ingress-bench", load_settings({}), install_global=False)
    answers = AnswerRegistry("ingress-bench", reply_partition=0)
    loop = asyncio.get_running_loop()

    async def publish(request: InferenceRequest) -> None:
        loop.call_soon(answers.deliver, _completion(request))

    app = build_app(
        ServingCatalogue(llm={a.name: a for a in DEFAULT_LLM_APPLICATIONS}, classification={}),
        publish,
        answers,
        MemoryStateStore(),
        options=ApiOptions(answer_timeout_s=5.0),
        telemetry=telemetry,
    )
    statuses: list[int] = []

    async def one() -> None:
        sent = False

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if sent:
                await asyncio.sleep(3600)
            sent = True
            return {"type": "http.request", "body": BODY, "more_body": False}

        async def send(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                statuses.append(int(message["status"]))

        await app(dict(SCOPE, headers=list(SCOPE["headers"])), receive, send)

    await asyncio.gather(*(one() for _ in range(concurrency)))  # warm-up
    heap.settle_heap()
    gc.set_threshold(young_allocations, *gc.get_threshold()[1:])
    statuses.clear()
    pauses = _Pauses()
    gc.callbacks.append(pauses)
    started = time.process_time()
    try:
        for _ in range(count // concurrency):
            await asyncio.gather(*(one() for _ in range(concurrency)))
        spent = time.process_time() - started
    finally:
        gc.callbacks.remove(pauses)
    if set(statuses) != {200}:
        raise SystemExit(f"the app answered {sorted(set(statuses))}, not only 200")
    return _Run(spent / len(statuses), pauses.pauses_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--young-allocations",
        default=f"{CPYTHON_DEFAULT_YOUNG},{heap.YOUNG_COLLECTION_ALLOCATIONS}",
        help="comma-separated settings of the youngest generation's collection threshold, "
        "interleaved run by run (default: CPython's and the services')",
    )
    parser.add_argument("--json", type=Path, default=RESULTS / "ingress_app.json")
    args = parser.parse_args()
    settings = [int(x) for x in args.young_allocations.split(",")]
    runs_us: dict[int, list[float]] = {young: [] for young in settings}
    pauses_ms: dict[int, list[float]] = {young: [] for young in settings}
    for _ in range(args.runs):
        for young in settings:
            run = event_loop.run(_calls(args.calls, args.concurrency, young))
            runs_us[young].append(1e6 * run.cpu_s_per_call)
            pauses_ms[young].extend(1e3 * pause_s for pause_s in run.pauses_s)
    result: dict[str, Any] = {"calls": args.calls, "concurrency": args.concurrency}
    result["young_allocations"] = {
        str(young): {
            "runs_us": us,
            "median_us": statistics.median(us),
            "collections_per_1000_calls": 1000 * len(pauses_ms[young]) / (args.runs * args.calls),
            "pauses_ms": pauses_ms[young],
        }
        for young, us in runs_us.items()
    }
    for young, us in runs_us.items():
        pauses = sorted(pauses_ms[young])
        print(
            f"POST /v1/completions through the ingress app, young generation collected "
            f"every {young} allocations: {statistics.median(us):.0f} us of CPU a call "
            f"(median of {args.runs}; runs {', '.join(f'{x:.0f}' for x in us)}); "
            + (
                f"{1000 * len(pauses) / (args.runs * args.calls):.1f} collections per "
                f"1,000 calls, pause P50 {statistics.median(pauses):.2f} ms, longest "
                f"{pauses[-1]:.2f} ms"
                if pauses
                else "no collection"
            )
        )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
