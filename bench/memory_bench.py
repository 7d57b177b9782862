"""The embedded stack's memory over a long replay, with small and with default bounds.

Each run starts the embedded stack (every service in one process, the in-memory bus and
state) in a process of its own, with one ``MAX_KEYS:BUS_BYTES`` pair of ``--bounds``
(``SWITCHYARD_MEMORY_MAX_KEYS``, ``SWITCHYARD_MEMORY_BUS_BYTES``); this process replays
``--requests`` short completions against it (a Poisson trace at ``--rate`` requests/s,
emulated Llama-2-7B workers at time scale 100), so the load generator's own record of
every request is not in the memory measured. The stack's process samples, every
``--every-s`` seconds, its resident memory (``VmRSS``) and the state's key count.
Records live an hour (``REQUEST_TTL_S``) and the bus keeps its latest bytes per
partition: the keys grow with every request up to their bound, the bus up to its own,
and then the resident memory should level off.

Run ``python -m bench.memory_bench`` (``make bench-memory``); JSON in
``bench/results/memory.json``; figures in docs/benchmarks.md, "Memory of the embedded
stack".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


async def serve(max_keys: int, bus_bytes: int, every_s: float) -> dict[str, Any]:
    """The stack's process: serve until SIGTERM, sampling its memory; returns the
    samples and the evictions."""
    from switchyard.config import load_settings

    from services.embedded import EmbeddedPlan, EmbeddedStack

    settings = load_settings(
        {},
        worker_time_scale=100.0,
        log_level="ERROR",
        admission="off",
        memory_max_keys=max_keys,
        memory_bus_bytes=bus_bytes,
    )
    plan = EmbeddedPlan(
        llm_workers=("a100-80gb/llama-2-7b", "a100-80gb/llama-2-7b"), torch_workers=0, http_port=0
    )
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    samples: list[dict[str, float]] = []
    async with EmbeddedStack(settings, plan) as stack:
        state = stack._memory_state
        assert state is not None
        start_s = time.monotonic()
        print(stack.url, flush=True)
        while not stop.is_set():
            samples.append(
                {
                    "t_s": round(time.monotonic() - start_s, 1),
                    "rss_mib": round(rss_bytes() / 2**20, 1),
                    "keys": len(state._data),
                }
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), every_s)
        evicted = state.evicted
    return {"samples": samples, "evicted": evicted}


def one_run(bounds: str, requests: int, rate: float, every_s: float) -> dict[str, Any]:
    """Start the stack's process with ``bounds``, replay against it, stop it."""
    from switchyard.traces import resolve_trace

    from loadgen.mixes import build_plan
    from loadgen.replay import replay

    max_keys, bus_bytes = (int(v) for v in bounds.split(":"))
    trace = resolve_trace(
        f"poisson:rate_rps={rate:g},requests={requests},lengths=azure-conv-sample,seed=5"
    )
    calls = build_plan(trace, "llm")
    with tempfile.TemporaryDirectory() as folder:
        samples_path = Path(folder) / "samples.json"
        argv = [sys.executable, "-m", "bench.memory_bench", "--serve", bounds]
        argv += ["--every-s", str(every_s), "--samples", str(samples_path)]
        stack = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        try:
            assert stack.stdout is not None
            url = stack.stdout.readline().strip()
            if not url.startswith("http"):
                raise SystemExit(f"the stack's process did not start (exit {stack.wait()})")
            result = asyncio.run(
                replay(calls, url, speedup=1.0, timeout_s=120, progress=False, run_id="memory")
            )
        finally:
            stack.send_signal(signal.SIGTERM)
            stack.wait(timeout=60)
        served = json.loads(samples_path.read_text())
    samples = served["samples"]
    answered = sum(1 for r in result.records if r.status_code == 200)
    return {
        "max_keys": max_keys,
        "bus_bytes": bus_bytes,
        "requests": requests,
        "rate_rps": rate,
        "answered_200": answered,
        "generator_cpu_ms_per_request": round((result.cpu_s or 0.0) * 1000 / max(1, answered), 3),
        "evicted": served["evicted"],
        "samples": samples,
        "final_rss_mib": samples[-1]["rss_mib"],
        "final_keys": samples[-1]["keys"],
        "peak_keys": max(s["keys"] for s in samples),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bounds", default="5000:4194304,100000:16777216")
    parser.add_argument("--requests", type=int, default=150_000)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--every-s", type=float, default=5.0)
    parser.add_argument("--serve", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--samples", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, default=RESULTS / "memory.json")
    args = parser.parse_args()
    if args.serve is not None:
        from switchyard.runtime import loop as event_loop

        keys, bus_bytes = (int(v) for v in args.serve.split(":"))
        served = event_loop.run(serve(keys, bus_bytes, args.every_s))
        args.samples.write_text(json.dumps(served))
        return
    runs = []
    for value in args.bounds.split(","):
        run = one_run(value, args.requests, args.rate, args.every_s)
        runs.append(run)
        print(
            f"bounds {value}: {run['answered_200']}/{run['requests']} answered, keys "
            f"peak {run['peak_keys']} final {run['final_keys']} (evicted {run['evicted']}), "
            f"RSS final {run['final_rss_mib']} MiB; RSS by time: "
            + ", ".join(f"{s['t_s']:g}s {s['rss_mib']:g}" for s in run["samples"][::4]),
            flush=True,
        )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
