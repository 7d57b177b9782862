"""The live stack on real Kafka and Redis: an Azure trace replayed through it.

The stack runs as one process (``switchyard up --embedded --transports configured``:
every service in one process, each with its own Kafka and Redis connections) while this
process generates the load over HTTP with :mod:`loadgen.replay`. What a request costs
each process, and the overhead by offered rate, is :mod:`bench.hot_path_bench`.

``azure``: the first ``--limit`` requests of the Azure conversation trace, arrivals and
emulated time both sped up by ``--speedup``, once per policy: every request answered,
latency percentiles and SLO violations per policy.

The machine is shared by the stack, the broker, Redis and the generator (2 cores here),
so the figures are this machine's, not the design's ceiling. Emulated latencies are a
performance model's output, not measurements.

Run ``make bench-stack`` or ``python -m bench.stack_bench azure [...]``
(Kafka and Redis must be up: ``deploy/local/infra.sh up``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from switchyard.traces import resolve_trace

from loadgen.mixes import build_plan
from loadgen.replay import replay
from loadgen.replay_summary import summarize

RESULTS = Path(__file__).parent / "results" / "stack"
_URL = re.compile(r"HTTP API at (http://\S+)")


class Stack:
    """A ``switchyard up`` process on Kafka and Redis, under prefixes of its own."""

    def __init__(
        self,
        *,
        policy: str,
        time_scale: float,
        llm_workers: str,
        torch_workers: int = 0,
        profile_to: Path | None = None,
    ) -> None:
        prefix = f"bench-{uuid.uuid4().hex[:8]}"
        self.env = {
            **os.environ,
            "SWITCHYARD_BUS": "kafka",
            "SWITCHYARD_STATE": "redis",
            "SWITCHYARD_TOPIC_PREFIX": f"{prefix}.",
            "SWITCHYARD_STATE_PREFIX": f"{prefix}:",
            "SWITCHYARD_LLM_POLICY": policy,
            "SWITCHYARD_WORKER_TIME_SCALE": str(time_scale),
            "SWITCHYARD_LOG_LEVEL": "WARNING",
        }
        command = [
            "up",
            "--embedded",
            "--transports",
            "configured",
            "--port",
            "0",
            "--llm-workers",
            llm_workers,
            "--torch-workers",
            str(torch_workers),
        ]
        if profile_to is not None:
            self.argv = [
                sys.executable,
                "-m",
                "cProfile",
                "-o",
                str(profile_to),
                "-m",
                "switchyard",
                *command,
            ]
        else:
            self.argv = [sys.executable, "-m", "cli", *command]
        self.process: subprocess.Popen[str] | None = None
        self.url = ""

    def __enter__(self) -> Stack:
        RESULTS.mkdir(parents=True, exist_ok=True)
        self.log = open(RESULTS / "stack.log", "w")  # closed in __exit__
        self.process = subprocess.Popen(
            self.argv, env=self.env, stdout=subprocess.PIPE, stderr=self.log, text=True
        )
        assert self.process.stdout is not None
        deadline = time.monotonic() + 180
        for line in self.process.stdout:
            found = _URL.search(line)
            if found:
                self.url = found.group(1)
                break
            if time.monotonic() > deadline:
                break
        if not self.url:
            self.process.kill()
            raise RuntimeError("the stack did not come up")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.log.close()


def warm_up(url: str) -> None:
    """Ten seconds of light load before measuring: the first requests of a fresh stack
    meet consumer groups still settling (joins and rebalances), which a running stack
    does not; they are not what a measurement of the steady state should include."""
    spec = "poisson:rate_rps=10,requests=100,lengths=lognormal,max_tokens=16,seed=99"
    plan = build_plan(resolve_trace(spec), "llm", None, 0)
    asyncio.run(replay(plan, url, speedup=1.0, timeout_s=60, progress=False, run_id="warmup"))


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def run_azure(policies: Sequence[str], limit: int, speedup: float) -> list[dict[str, Any]]:
    plan = build_plan(resolve_trace("azure-conv"), "llm", limit, 0)
    rows: list[dict[str, Any]] = []
    for policy in policies:
        with Stack(
            policy=policy,
            time_scale=speedup,
            llm_workers="a100-80gb/llama-2-7b,a100-80gb/llama-2-7b,l40s-48gb/llama-2-7b,l40s-48gb/llama-2-7b",
        ) as stack:
            warm_up(stack.url)
            result = asyncio.run(
                replay(plan, stack.url, speedup=speedup, timeout_s=300, progress=False)
            )
        s = summarize(result.records, result.duration_s)
        overhead = s.breakdown.get("overhead")
        row = {
            "policy": policy,
            "sent": s.sent,
            "answered": s.answered_ok,
            "p50_s": s.latency_p50_s,
            "p90_s": s.latency_p90_s,
            "p99_s": s.latency_p99_s,
            "mean_s": s.latency_mean_s,
            "slo_violation_rate": s.slo_violation_rate,
            "overhead_p50_s": overhead.p50_s if overhead else None,
            "overhead_p99_s": overhead.p99_s if overhead else None,
        }
        rows.append(row)
        print(f"{policy}: {json.dumps(row)}", flush=True)
    print()
    print(
        f"Azure conversation, first {limit} requests, x{speedup:g} (arrivals and emulated time); "
    )
    print("| policy | answered | P50 | P90 | P99 | mean | SLO violations | overhead P50 / P99 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        rate = r["slo_violation_rate"]
        print(
            f"| {r['policy']} | {r['answered']}/{r['sent']} | {_s(r['p50_s'])} s | {_s(r['p90_s'])} s "
            f"| {_s(r['p99_s'])} s | {_s(r['mean_s'])} s | {'-' if rate is None else f'{rate:.1%}'} "
            f"| {_ms(r['overhead_p50_s'])} / {_ms(r['overhead_p99_s'])} ms |"
        )
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.stack_bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="experiment", required=True)
    az = sub.add_parser("azure")
    az.add_argument("--policies", default="gaps,jsq")
    az.add_argument("--limit", type=int, default=2000)
    az.add_argument("--speedup", type=float, default=10.0)
    args = parser.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    rows = run_azure(args.policies.split(","), args.limit, args.speedup)
    out = RESULTS / f"{args.experiment}.json"
    out.write_text(json.dumps(rows, indent=2))
    print(f"\nwritten {out}")


if __name__ == "__main__":
    main()
