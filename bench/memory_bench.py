"""The embedded stack's memory over a long replay, with small and with default bounds.

Each run starts the embedded stack (every service in this process, the in-memory bus
and state) with one ``MAX_KEYS:BUS_RECORDS`` pair of ``--bounds``
(``SWITCHYARD_MEMORY_MAX_KEYS``, ``SWITCHYARD_MEMORY_BUS_RECORDS``),
replays ``--requests`` short completions (a Poisson trace at ``--rate`` requests/s,
emulated Llama-2-7B workers at time scale 100) and samples, every ``--every-s`` seconds,
the process's resident memory (``VmRSS``) and the state's key count. Records live an hour
(``REQUEST_TTL_S``) and the bus keeps its latest 16 MiB per partition: the keys grow
with every request up to their bound, the bus up to its own, and then the resident
memory levels off.

Each pair runs in a fresh process (``--one``), so that one run's heap does not carry
into the next. Run ``python -m bench.memory_bench`` (``make bench-memory``); JSON in
``bench/results/memory.json``; figures in docs/benchmarks.md, "Memory of the embedded
stack".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


async def one_run(
    max_keys: int, bus_bytes: int, requests: int, rate: float, every_s: float
) -> dict[str, Any]:
    from switchyard.config import load_settings
    from switchyard.traces import resolve_trace

    from loadgen.mixes import build_plan
    from loadgen.replay import replay
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
    trace = resolve_trace(
        f"poisson:rate_rps={rate:g},requests={requests},lengths=azure-conv-sample,seed=5"
    )
    calls = build_plan(trace, "llm")
    samples: list[dict[str, float]] = []
    async with EmbeddedStack(settings, plan) as stack:
        state = stack._memory_state
        assert state is not None
        start_s = time.monotonic()
        done = asyncio.Event()

        async def sample() -> None:
            while not done.is_set():
                samples.append(
                    {
                        "t_s": round(time.monotonic() - start_s, 1),
                        "rss_mib": round(rss_bytes() / 2**20, 1),
                        "keys": len(state._data),
                    }
                )
                await asyncio.sleep(every_s)

        sampler = asyncio.create_task(sample())
        result = await replay(calls, stack.url, speedup=1.0, timeout_s=120, progress=False)
        done.set()
        await sampler
        evicted = state.evicted
    answered = sum(1 for r in result.records if r.status_code == 200)
    return {
        "max_keys": max_keys,
        "bus_bytes": bus_bytes,
        "requests": requests,
        "answered_200": answered,
        "evicted": evicted,
        "samples": samples,
        "final_rss_mib": samples[-1]["rss_mib"],
        "final_keys": samples[-1]["keys"],
        "peak_keys": max(s["keys"] for s in samples),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bounds", default="5000:4194304,500000:16777216")
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--every-s", type=float, default=5.0)
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, default=RESULTS / "memory.json")
    args = parser.parse_args()
    if args.one is not None:
        from switchyard.runtime import loop as event_loop

        keys, bus_bytes = (int(v) for v in args.one.split(":"))
        run = event_loop.run(one_run(keys, bus_bytes, args.requests, args.rate, args.every_s))
        print(json.dumps(run))
        return
    runs = []
    for value in args.bounds.split(","):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.memory_bench",
                "--one",
                value,
                "--requests",
                str(args.requests),
                "--rate",
                str(args.rate),
                "--every-s",
                str(args.every_s),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        run = json.loads(done.stdout.strip().splitlines()[-1])
        runs.append(run)
        print(
            f"bounds {value}: {run['answered_200']}/{run['requests']} answered, keys "
            f"peak {run['peak_keys']} final {run['final_keys']} (evicted {run['evicted']}), "
            f"RSS final {run['final_rss_mib']} MiB; RSS by time: "
            + ", ".join(f"{s['t_s']:g}s {s['rss_mib']:g}" for s in run["samples"][::4])
        )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
