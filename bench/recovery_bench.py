"""Worker-kill recovery on the live stack, every service a separate OS process.

Each run starts the stack as processes over the local Kafka and Redis
(``loadgen/harness/process_stack.py``: ingress, monitor, scheduler, two emulated LLM
workers), replays the first ``--requests`` requests of the Azure conversation sample
through the ingress at ``--speedup``, and a third of the way in (by requests sent)
SIGKILLs the worker holding more requests. Then it reads back the bus and the state
store (``loadgen/harness/recovery.py``) and records:

- **detection**: kill to the ``WorkerDown`` on ``switchyard.worker-events`` (the
  broker's timestamp of the record, i.e. when the monitor published it);
- **re-assignment**: kill to the ``assigned_at_s`` of the last orphan's new assignment
  (``assignment:{id}`` with epoch >= 1);
- **requests affected**: the orphans the ``WorkerDown`` lists (the dead worker's
  assigned set plus its last heartbeat's outstanding requests), of which those
  assigned to the dead worker after the kill but before it was declared down;
- **lost**: requests without a 200 answer; **doubled**: requests answered twice, and
  requests that ran to completion on two workers (or epochs).

Settings: heartbeats every 0.25 s, ``SWITCHYARD_WORKER_TIMEOUT_S=1.5``, emulated time
scale 20, JSQ, ingress admission control off (every request queued). Wall times on one
machine shared by the stack, Kafka, Redis and the load generator (2 cores here).

Run ``make bench-recovery`` or ``python -m bench.recovery_bench [--runs 3]`` (Kafka and
Redis must be up: ``deploy/local/infra.sh up``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from switchyard.traces import resolve_trace

from loadgen.harness.process_stack import ProcessStack
from loadgen.harness.recovery import (
    RecoveryReport,
    analyse,
    busiest_worker,
    replay_with_kill,
    start_stack,
)
from loadgen.mixes import build_plan

WORKERS = ("worker-a", "worker-b")
DEFAULT_OUT = Path("bench/results/recovery")


async def one_run(args: argparse.Namespace, index: int, log_root: Path) -> dict[str, Any]:
    """One worker-kill experiment; returns its JSON record."""
    stack = ProcessStack(
        os.environ.get("SWITCHYARD_KAFKA_BOOTSTRAP", "127.0.0.1:9092"),
        os.environ.get("SWITCHYARD_REDIS_URL", "redis://127.0.0.1:6379/0"),
        f"bench-recovery-{uuid.uuid4().hex[:8]}",
        log_root / f"run-{index}",
        heartbeat_interval_s=args.heartbeat_interval_s,
        worker_timeout_s=args.worker_timeout_s,
        time_scale=args.time_scale,
        llm_policy=args.policy,
        extra_env={"SWITCHYARD_ADMISSION": "off"},
    )
    try:
        await start_stack(stack, WORKERS)
        plan = build_plan(resolve_trace(args.trace), "llm", args.requests, 0)

        async def busiest() -> str:
            return await busiest_worker(stack, WORKERS)

        result, victim, killed_at_s = await replay_with_kill(
            stack, plan, busiest, speedup=args.speedup, timeout_s=args.timeout_s
        )
        report: RecoveryReport = await analyse(
            stack, result, killed=victim, killed_at_s=killed_at_s
        )
    finally:
        codes = await stack.close()
    return {
        "run": index,
        "config": {
            "trace": args.trace,
            "requests": args.requests,
            "speedup": args.speedup,
            "time_scale": args.time_scale,
            "policy": args.policy,
            "heartbeat_interval_s": args.heartbeat_interval_s,
            "worker_timeout_s": args.worker_timeout_s,
            "workers": list(WORKERS),
        },
        "summary": report.summary(),
        "report": report.to_json(),
        "exit_codes": codes,
    }


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def markdown(runs: list[dict[str, Any]]) -> str:
    """The Markdown table of ``runs`` (one row each, then the mean where it means
    something)."""
    lines = [
        "| run | detection (s) | re-assignment (s) | requests affected | of which assigned "
        "after the kill | in flight at the kill | answered 200 | lost | answers doubled "
        "| ran twice |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        s = run["summary"]
        lines.append(
            f"| {run['run']} | {_fmt(s['detection_s'])} | {_fmt(s['reassignment_s'])} "
            f"| {s['orphans']} | {s['assigned_to_killed_after_kill']} "
            f"| {s['in_flight_at_kill']} | {s['answered_ok']}/{s['requests']} | {s['lost']} "
            f"| {s['answers_doubled']} | {s['runs_doubled']} |"
        )
    detection = [r["summary"]["detection_s"] for r in runs if r["summary"]["detection_s"]]
    reassign = [r["summary"]["reassignment_s"] for r in runs if r["summary"]["reassignment_s"]]
    if detection and reassign:
        lines.append(
            f"| mean | {statistics.fmean(detection):.2f} | {statistics.fmean(reassign):.2f} "
            f"| {statistics.fmean(r['summary']['orphans'] for r in runs):.1f} | | | "
            f"| {sum(r['summary']['lost'] for r in runs)} "
            f"| {sum(r['summary']['answers_doubled'] for r in runs)} "
            f"| {sum(r['summary']['runs_doubled'] for r in runs)} |"
        )
    return "\n".join(lines)


async def run_all(args: argparse.Namespace, log_root: Path) -> list[dict[str, Any]]:
    runs = []
    for index in range(1, args.runs + 1):
        print(f"run {index}/{args.runs} ...", file=sys.stderr, flush=True)
        run = await one_run(args, index, log_root)
        print(f"  {run['summary']}", file=sys.stderr, flush=True)
        runs.append(run)
    return runs


def write_results(out: Path, runs: list[dict[str, Any]], table: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for run in runs:
        (out / f"run-{run['run']}.json").write_text(json.dumps(run, indent=2) + "\n")
    summary = {"runs": [r["summary"] for r in runs], "config": runs[0]["config"], "table": table}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--requests", type=int, default=150)
    parser.add_argument("--trace", default="azure-conv-sample")
    parser.add_argument("--speedup", type=float, default=10.0)
    parser.add_argument("--time-scale", type=float, default=20.0)
    parser.add_argument("--policy", default="jsq")
    parser.add_argument("--heartbeat-interval-s", type=float, default=0.25)
    parser.add_argument("--worker-timeout-s", type=float, default=1.5)
    parser.add_argument("--timeout-s", type=float, default=60.0, help="client timeout")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    log_root = Path(tempfile.mkdtemp(prefix="switchyard-recovery-"))
    runs = asyncio.run(run_all(args, log_root))
    table = markdown(runs)
    write_results(args.out, runs, table)
    print(table)
    print(f"\nJSON in {args.out}/; process logs in {log_root}/", file=sys.stderr)
    bad = sum(r["summary"]["lost"] + r["summary"]["answers_doubled"] for r in runs)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
