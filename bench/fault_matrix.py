"""The fault matrix (``make faults``): every fault kind during a replay, on real processes.

Each fault of :data:`loadgen.harness.faults.FAULTS` runs on a fresh stack of service
processes over a Kafka broker and a Redis of this run's own (never the servers other
tests share: the broker and Redis faults kill them), during an open-loop replay of
``--requests`` calls at ``--rate`` per second: LLM completions, and for the estimator's
row a third of them classification calls. What the table reports is
defined in :mod:`loadgen.harness.fault_run`. One JSON per fault and ``matrix.md`` (the
table docs/reliability.md quotes) land in ``--out``; the exit status is 1 when any fault
lost a request, answered one by two runs, ran one twice that no worker held when it
was declared down, or refused one that then ran.

    python -m bench.fault_matrix                            # all, 10,000 requests each
    python -m bench.fault_matrix --faults worker-cut,redis-kill --requests 2000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import tempfile
import time
import uuid
from pathlib import Path

from loadgen.harness.fault_run import FaultReport, FaultRunConfig, run_fault
from loadgen.harness.faults import FAULTS
from loadgen.harness.infra import PrivateInfra
from loadgen.harness.network_cut import unavailable


def _markdown(reports: list[FaultReport], config: FaultRunConfig) -> str:
    header = [
        "fault",
        "requests",
        "answered at once",
        "refused (retried)",
        "unknown (retried)",
        "lost",
        "refused, then ran",
        "retry answered differently",
        "answered by two runs",
        "ran twice (held when declared down)",
        "longest stall",
        "longest wait",
        "recovery",
    ]
    lines = [
        f"Each fault during {config.requests:,} calls at {config.rate_rps:g}/s (LLM "
        "completions; in the `estimator-kill` row a third of them classification calls on "
        "a torch worker; in the `models-worker-kill` and `placement-kill` rows a third of "
        "them, in `ingress-kill`, `broker-kill` and `redis-empty` a quarter, calls to the "
        "`txt2img` pipelines on two emulated multi-model nodes; Poisson, emulated workers at "
        f"time scale {config.time_scale:g}, policy "
        f"`{config.policy}`), on {platform.node()} ({platform.machine()}), "
        f"{time.strftime('%Y-%m-%d')}.",
        "",
        "| " + " | ".join(header) + " |",
        "|---|" + "---:|" * (len(header) - 1),
    ]
    for r in reports:
        cells = [
            f"`{r.fault}`",
            f"{r.requests:,}",
            f"{r.answered_first_call:,}",
            str(r.refused),
            str(r.unknown_outcome),
            str(len(r.lost)),
            str(len(r.refused_then_run)),
            f"{len(r.answers_differ)} of {r.answered_retries}",
            str(len(r.answered_by_two_runs)),
            f"{len(r.ran_twice)} ({len(r.ran_twice_held)})",
            "-" if r.stall_s is None else f"{r.stall_s:.1f} s",
            "-" if r.longest_wait_s is None else f"{r.longest_wait_s:.1f} s",
            "-" if r.recovery_s is None else f"{r.recovery_s:.1f} s",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


async def _main(args: argparse.Namespace) -> int:
    names = list(FAULTS) if args.faults == "all" else args.faults.split(",")
    unknown = [n for n in names if n not in FAULTS]
    if unknown:
        print(f"unknown fault(s) {unknown}; known: {', '.join(FAULTS)}", file=sys.stderr)
        return 2
    if "worker-cut" in names and (reason := unavailable()) is not None:
        print(f"worker-cut cannot run here: {reason}", file=sys.stderr)
        return 2
    config = FaultRunConfig(requests=args.requests, rate_rps=args.rate, time_scale=args.time_scale)
    out = Path(args.out)
    await asyncio.to_thread(out.mkdir, parents=True, exist_ok=True)
    logs = Path(tempfile.mkdtemp(prefix="switchyard-faults-"))
    infra = PrivateInfra()
    print(f"broker {infra.kafka_bootstrap}, Redis {infra.redis_url}; process logs in {logs}")
    infra.start()
    reports: list[FaultReport] = []
    try:
        for name in names:
            prefix = f"f{uuid.uuid4().hex[:8]}"
            report = await run_fault(infra, FAULTS[name], config, prefix, logs / name)
            reports.append(report)
            (out / f"{name}.json").write_text(json.dumps(report.to_json(), indent=2) + "\n")
            print(json.dumps(report.summary_row()), flush=True)
    finally:
        infra.stop()
    table = _markdown(reports, config)
    (out / "matrix.md").write_text(table)
    print(table)
    return 0 if all(r.clean for r in reports) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fault_matrix", description=__doc__)
    parser.add_argument("--faults", default="all", help=f"comma-separated: {', '.join(FAULTS)}")
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=80.0, help="requests per second")
    parser.add_argument("--time-scale", type=float, default=50.0)
    parser.add_argument("--out", default="bench/results/faults")
    return asyncio.run(_main(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
