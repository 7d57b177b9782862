"""The hot path: what one request costs the live stack, process by process.

The stack runs as separate processes on the local Kafka and Redis, as an operator runs
it (``loadgen/harness/process_stack.py``): ingress, monitor, predictor, estimator,
scheduler, rebalancer and emulated llama-2-7b workers at time scale 100 (so execution
is a few milliseconds and what is measured is the control plane), admission control
off. This process generates open-loop Poisson arrivals of short completions (1 to 16
output tokens) with the replay engine's lean HTTP client.

For each offered rate it reports, over the measured window (first request sent to last
answer read):

- **CPU milliseconds per answered request** of every process: each service, the Kafka
  broker, redis-server, and the generator itself, read from ``/proc`` (user + system)
  (:mod:`bench.proc_cpu`); the headline is the sum over the stack, broker and Redis;
- **overhead** P50 and P99: client latency minus execution on the worker;
- the share answered, and the generator's send lag P99 (is it on schedule?);
- **records read per request**: every consumer's decoded and skipped records
  (``switchyard_bus_records_total`` scraped from each service's ``/metrics``) over
  answered requests.

Before the rates, an idle window measures what the stack costs doing nothing (CPU
seconds per second of each process). Every rate is run ``--runs`` times on one stack,
rates interleaved, and the median of each figure is reported. The sustained rate is
the highest rate offered whose median run has overhead P99 under 50 ms, at least 99.9 %
answered, and a send lag P99 under 10 ms.

``--profile-rate R`` also records each service with py-spy (a sampling profiler) during
one run at rate R and writes flame graphs (``bench/results/stack/profile-{name}.svg``).
``--trace-ratio X`` exports traces to a stand-in OTLP collector (accepts and drops),
recording a share X of them: what tracing costs (by default nothing is exported, and
unsampled spans cost little).

``fanout`` is the routing experiment: at a fixed modest rate, stacks of 1, 8 and 32
workers and 1 and 4 ingress replicas, reporting records decoded (and skipped) per request
by each kind of consumer. If every consumer read only what is addressed to it, the
figures stay flat as workers and replicas are added.

Run ``make bench-stack`` (both, then the Azure replay) or
``python -m bench.hot_path_bench rates|fanout [...]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from switchyard.config import load_settings
from switchyard.traces import resolve_trace

from bench.proc_cpu import CpuSampler, listener_pid
from loadgen.harness.process_stack import ProcessStack, free_port
from loadgen.mixes import build_plan
from loadgen.replay import replay
from loadgen.replay_records import OK, RequestRecord
from loadgen.replay_summary import summarize

RESULTS = Path(__file__).parent / "results" / "stack"
PROFILE = "a100-80gb/llama-2-7b"
TIME_SCALE = 100.0
CONTROL = ("ingress", "monitor", "predictor", "estimator", "scheduler", "rebalancer")
SUSTAINED_P99_S = 0.050
SUSTAINED_ANSWERED = 0.999
SUSTAINED_LAG_S = 0.010
_RECORDS = re.compile(
    r"^switchyard_bus_records_total\{(?P<labels>[^}]*)\}\s+(?P<value>[0-9.eE+-]+)", re.M
)
_LABEL = re.compile(r'(\w+)="([^"]*)"')


class OtlpSink:
    """A stand-in OTLP/HTTP collector on loopback that accepts and drops everything: what
    recording and exporting spans costs the services, without a collector's own cost."""

    def __init__(self) -> None:
        import http.server
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", "0")))
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                return

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()


@dataclass
class Stack:
    """A process stack with every service's health (metrics) port known."""

    processes: ProcessStack
    metrics_ports: dict[str, int]

    def pids(self) -> dict[str, int]:
        pids = {name: p.pid for name, p in self.processes.processes.items()}
        settings = load_settings({})
        kafka_port = int(settings.kafka_bootstrap.rsplit(":", 1)[1])
        redis_port = httpx.URL(settings.redis_url).port or 6379
        for name, port in (("kafka", kafka_port), ("redis", redis_port)):
            pid = listener_pid(port)
            if pid is not None:
                pids[name] = pid
        return pids

    def records(self) -> dict[tuple[str, str, str], float]:
        """Every consumer's record counts: (process, topic kind, outcome) -> count."""
        counts: dict[tuple[str, str, str], float] = defaultdict(float)
        prefix = self.processes.topic_prefix
        for name, port in self.metrics_ports.items():
            try:
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
            except httpx.HTTPError:
                continue
            for found in _RECORDS.finditer(text):
                labels = dict(_LABEL.findall(found["labels"]))
                topic = labels.get("topic", "").removeprefix(prefix).removeprefix("switchyard.")
                counts[name, topic, labels.get("outcome", "")] += float(found["value"])
        return counts


@contextmanager
def running_stack(
    workers: int, ingress_replicas: int = 1, env: Mapping[str, str] | None = None
) -> Iterator[Stack]:
    """The stack under a fresh prefix (``env``: more ``SWITCHYARD_*`` variables for every
    process); stopped and cleaned up on exit."""
    from loadgen.harness.process_stack import DEFAULT_HEARTBEAT_INTERVAL_S

    settings = load_settings({})
    prefix = f"hot-{uuid.uuid4().hex[:8]}"
    log_dir = RESULTS / "logs"
    if log_dir.exists():
        shutil.rmtree(log_dir)
    processes = ProcessStack(
        settings.kafka_bootstrap,
        settings.redis_url,
        prefix,
        log_dir,
        heartbeat_interval_s=DEFAULT_HEARTBEAT_INTERVAL_S,
        worker_timeout_s=2.0,
        time_scale=TIME_SCALE,
        llm_policy="jsq",
        extra_env={
            "SWITCHYARD_ADMISSION": "off",
            "SWITCHYARD_LOG_LEVEL": "WARNING",
            **(env or {}),
        },
    )
    ports: dict[str, int] = {}

    def start(service: str, name: str, env: Mapping[str, str] | None = None) -> None:
        ports[name] = free_port()
        own = {"SWITCHYARD_HEALTH_PORT": str(ports[name]), **(env or {})}
        if service == "worker":
            processes.start_worker(name, PROFILE, env=own)
        else:
            processes.start_service(service, name=name, env=own)

    try:
        for service in CONTROL:
            if service == "ingress":
                for index in range(ingress_replicas):
                    start("ingress", "ingress" if index == 0 else f"ingress-{index}")
            else:
                start(service, service)
        for index in range(workers):
            start("worker", f"worker-{index}")
        asyncio.run(processes.wait_ready(workers=workers, timeout_s=300))
        yield Stack(processes, ports)
    finally:
        asyncio.run(processes.close())


def short_completions(rate_rps: float, requests: int, seed: int) -> list[Any]:
    """Open-loop Poisson arrivals of short completions (1 to 16 output tokens)."""
    spec = (
        f"poisson:rate_rps={rate_rps:g},requests={requests},lengths=lognormal,"
        f"max_tokens=16,seed={seed}"
    )
    return build_plan(resolve_trace(spec), "llm", None, 0)


def warm_up(url: str) -> None:
    """A few seconds of light load: a fresh stack's first requests meet consumer groups
    still settling, which a running one does not."""
    asyncio.run(
        replay(short_completions(50, 300, 99), url, timeout_s=60, progress=False, run_id="warm")
    )


@dataclass
class RateRun:
    """One run at one rate."""

    rate_rps: float
    sent: int
    answered: int
    overhead_p50_s: float | None
    overhead_p99_s: float | None
    send_lag_p99_s: float | None
    window_s: float
    cpu_ms: dict[str, float]
    """CPU milliseconds per answered request, by process (and ``generator``)."""
    records: dict[str, float]
    """Records per answered request, by ``process topic outcome``."""
    legs_p50_s: dict[str, float | None] = field(default_factory=dict)
    """Median of each leg of the overhead (:func:`legs`)."""

    @property
    def answered_share(self) -> float:
        return self.answered / self.sent if self.sent else 0.0

    def stack_cpu_ms(self) -> float:
        """Every process but the generator: services, broker and Redis."""
        return sum(v for name, v in self.cpu_ms.items() if name != "generator")

    def sustained(self) -> bool:
        return (
            self.overhead_p99_s is not None
            and self.overhead_p99_s < SUSTAINED_P99_S
            and self.answered_share >= SUSTAINED_ANSWERED
            and (self.send_lag_p99_s or 0.0) < SUSTAINED_LAG_S
        )


def run_rate(
    stack: Stack, rate_rps: float, duration_s: float, seed: int, profile: bool = False
) -> RateRun:
    """Offer ``rate_rps`` for ``duration_s`` and measure (see the module docstring)."""
    requests = max(1, int(rate_rps * duration_s))
    plan = short_completions(rate_rps, requests, seed)
    sampler = CpuSampler(stack.pids())
    records_before = stack.records()
    profilers = _start_profilers(stack, duration_s) if profile else []
    before = sampler.sample()
    started = time.monotonic()
    result = asyncio.run(
        replay(
            plan,
            stack.processes.url,
            timeout_s=60,
            progress=False,
            run_id=f"r{rate_rps:g}-{seed}-{uuid.uuid4().hex[:6]}",
        )
    )
    window_s = time.monotonic() - started
    spent = sampler.since(before)
    records_after = stack.records()
    for profiler in profilers:
        profiler.wait(timeout=duration_s + 60)
    summary = summarize(result.records, result.duration_s)
    answered = max(1, summary.answered_ok)
    cpu_ms = {name: seconds * 1000.0 / answered for name, seconds in spent.items()}
    cpu_ms["generator"] = (result.cpu_s or 0.0) * 1000.0 / answered
    records = {
        " ".join(key): (records_after[key] - records_before.get(key, 0.0)) / answered
        for key in records_after
        if records_after[key] - records_before.get(key, 0.0) > 0
    }
    overhead = summary.breakdown.get("overhead")
    return RateRun(
        rate_rps=rate_rps,
        sent=summary.sent,
        answered=summary.answered_ok,
        overhead_p50_s=overhead.p50_s if overhead else None,
        overhead_p99_s=overhead.p99_s if overhead else None,
        send_lag_p99_s=summary.send_lag_p99_s,
        window_s=window_s,
        cpu_ms=cpu_ms,
        records=records,
        legs_p50_s=legs(result.records),
    )


def legs(records: Sequence[RequestRecord]) -> dict[str, float | None]:
    """Median of the overhead's two legs over the answered requests: ``to_worker``, from
    the ingress's arrival to the worker taking the request (the decision, the record, one
    Kafka hop, the worker's start), and ``back``, from the worker's finish to the client
    reading the answer (the finish's record, one Kafka hop, the ingress, HTTP; it also
    holds the HTTP way in, which the server's clock cannot see)."""
    to_worker: list[float] = []
    back: list[float] = []
    for record in records:
        timeline = record.timeline
        if record.outcome != OK or timeline is None or record.latency_s is None:
            continue
        if {"arrival_s", "started_s", "finished_s"} <= timeline.keys():
            to_worker.append(timeline["started_s"] - timeline["arrival_s"])
            back.append(record.latency_s - (timeline["finished_s"] - timeline["arrival_s"]))
    return {
        "to_worker": statistics.median(to_worker) if to_worker else None,
        "back": statistics.median(back) if back else None,
    }


PROFILE_FORMAT = "flamegraph"
"""py-spy's output: ``flamegraph`` (SVG) for docs, ``raw`` (collapsed stacks) for analysis."""


def _start_profilers(stack: Stack, duration_s: float) -> list[subprocess.Popen[bytes]]:
    py_spy = Path(sys.executable).with_name("py-spy")
    if not py_spy.exists():
        raise SystemExit("py-spy is not installed in this environment: pip install py-spy")
    started = []
    for name, process in stack.processes.processes.items():
        suffix = "svg" if PROFILE_FORMAT == "flamegraph" else "txt"
        out = RESULTS / f"profile-{name}.{suffix}"
        started.append(
            subprocess.Popen(
                [
                    str(py_spy),
                    "record",
                    "--pid",
                    str(process.pid),
                    "--duration",
                    str(int(duration_s)),
                    "--rate",
                    "200",
                    "--format",
                    PROFILE_FORMAT,
                    "--output",
                    str(out),
                    "--nonblocking",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    return started


def idle_cost(stack: Stack, window_s: float) -> dict[str, float]:
    """CPU seconds per second of each process while nothing is sent."""
    sampler = CpuSampler(stack.pids())
    before = sampler.sample()
    time.sleep(window_s)
    return {name: seconds / window_s for name, seconds in sampler.since(before).items()}


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _median_run(runs: Sequence[RateRun]) -> RateRun:
    """The run with the median overhead P99 (its own figures, all from one run)."""
    ordered = sorted(runs, key=lambda r: r.overhead_p99_s or float("inf"))
    return ordered[len(ordered) // 2]


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


def rates_experiment(args: argparse.Namespace) -> dict[str, Any]:
    rates = [float(r) for r in args.rates.split(",")]
    runs: dict[float, list[RateRun]] = defaultdict(list)
    env = _env(args.env)
    sink = None
    if args.trace_ratio is not None:
        sink = OtlpSink()
        env |= {
            "SWITCHYARD_OTLP_ENDPOINT": sink.url,
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": repr(args.trace_ratio),
        }
    with running_stack(args.workers, env=env) as stack:
        warm_up(stack.processes.url)
        idle = idle_cost(stack, args.idle_s) if args.idle_s > 0 else {}
        if idle:
            print("idle CPU (s/s): " + ", ".join(f"{k} {v:.3f}" for k, v in sorted(idle.items())))
        for repeat in range(args.runs):
            for rate in rates:
                profile = args.profile_rate == rate and repeat == 0
                run = run_rate(stack, rate, args.duration_s, seed=repeat + 1, profile=profile)
                runs[rate].append(run)
                print(
                    f"run {repeat + 1} rate {rate:g}/s: {run.answered}/{run.sent} answered, "
                    f"overhead P50 {_ms(run.overhead_p50_s)} ms P99 {_ms(run.overhead_p99_s)} ms"
                    f" (P50 legs: to the worker {_ms(run.legs_p50_s.get('to_worker'))} ms, "
                    f"back {_ms(run.legs_p50_s.get('back'))} ms),"
                    f" lag P99 {_ms(run.send_lag_p99_s)} ms, stack CPU "
                    f"{run.stack_cpu_ms():.2f} ms/request, generator "
                    f"{run.cpu_ms['generator']:.2f} ms/request",
                    flush=True,
                )
    if sink is not None:
        sink.close()
    rows: list[dict[str, Any]] = []
    for rate in rates:
        chosen = _median_run(runs[rate])
        names = sorted({name for run in runs[rate] for name in run.cpu_ms})
        rows.append(
            {
                "rate_rps": rate,
                "runs": len(runs[rate]),
                "answered_share": chosen.answered_share,
                "overhead_p50_s": _median([r.overhead_p50_s for r in runs[rate]]),
                "overhead_p99_s": _median([r.overhead_p99_s for r in runs[rate]]),
                "send_lag_p99_s": _median([r.send_lag_p99_s for r in runs[rate]]),
                "stack_cpu_ms": _median([r.stack_cpu_ms() for r in runs[rate]]),
                "cpu_ms": {n: _median([r.cpu_ms.get(n) for r in runs[rate]]) for n in names},
                "records_per_request": chosen.records,
                "sustained": chosen.sustained(),
                "all_runs": [r.__dict__ for r in runs[rate]],
            }
        )
    passing = [rate for rate in rates if _median_run(runs[rate]).sustained()]
    document = {
        "machine": _machine(),
        "trace_ratio": args.trace_ratio,
        "env": env,
        "workers": args.workers,
        "duration_s": args.duration_s,
        "idle_cpu_s_per_s": idle,
        "rates": rows,
        "sustained_rate_rps": max(passing) if passing else None,
    }
    _print_rates(document)
    return document


def _print_rates(document: Mapping[str, Any]) -> None:
    rows = document["rates"]
    names = sorted({n for row in rows for n in row["cpu_ms"]}, key=_process_order)
    print()
    print(
        "| offered | answered | overhead P50 | overhead P99 | lag P99 | stack+broker+Redis "
        "CPU/request | " + " | ".join(names) + " |"
    )
    print("|---:|---:|---:|---:|---:|---:|" + "---:|" * len(names))
    for row in rows:
        cells = " | ".join(
            "-" if row["cpu_ms"].get(n) is None else f"{row['cpu_ms'][n]:.2f}" for n in names
        )
        print(
            f"| {row['rate_rps']:g}/s | {row['answered_share']:.2%} "
            f"| {_ms(row['overhead_p50_s'])} ms | {_ms(row['overhead_p99_s'])} ms "
            f"| {_ms(row['send_lag_p99_s'])} ms | {row['stack_cpu_ms']:.2f} ms | {cells} |"
        )
    print(
        f"\nsustained rate (overhead P99 < 50 ms, >= 99.9 % answered, lag P99 < 10 ms): "
        f"{document['sustained_rate_rps'] or 'none of the rates offered'}"
    )
    idle = document["idle_cpu_s_per_s"]
    if not idle:
        return
    print(
        "idle CPU, seconds per second: "
        + ", ".join(f"{n} {idle[n]:.3f}" for n in sorted(idle, key=_process_order))
        + f" (total {sum(idle.values()):.3f})"
    )


def _process_order(name: str) -> tuple[int, str]:
    order = [*CONTROL, "worker", "kafka", "redis", "generator"]
    for index, prefix in enumerate(order):
        if name.startswith(prefix):
            return index, name
    return len(order), name


def fanout_experiment(args: argparse.Namespace) -> dict[str, Any]:
    rows = []
    for workers in [int(w) for w in args.workers_list.split(",")]:
        for replicas in [int(r) for r in args.replicas_list.split(",")]:
            with running_stack(workers, replicas) as stack:
                warm_up(stack.processes.url)
                run = run_rate(stack, args.rate, args.duration_s, seed=1)
            by_kind: dict[str, float] = defaultdict(float)
            for key, per_request in run.records.items():
                process, topic, outcome = key.split(" ")
                kind = re.sub(r"-\d+$", "", process)
                by_kind[f"{kind} {topic} {outcome}"] += per_request
            decoded = sum(v for k, v in by_kind.items() if k.endswith(" decoded"))
            skipped = sum(v for k, v in by_kind.items() if k.endswith(" skipped"))
            row = {
                "workers": workers,
                "ingress_replicas": replicas,
                "answered": run.answered,
                "decoded_per_request": decoded,
                "skipped_per_request": skipped,
                "by_consumer": dict(sorted(by_kind.items())),
                "stack_cpu_ms": run.stack_cpu_ms(),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    print()
    print("| workers | ingress replicas | records decoded / request | skipped / request |")
    print("|---:|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row['workers']} | {row['ingress_replicas']} | "
            f"{row['decoded_per_request']:.2f} | {row['skipped_per_request']:.2f} |"
        )
    return {"machine": _machine(), "rate_rps": args.rate, "rows": rows}


def _env(pairs: Sequence[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--env takes NAME=VALUE, got {pair!r}")
        env[name] = value
    return env


def _machine() -> str:
    import os
    import platform

    return f"{platform.node()}: {os.cpu_count()} CPUs, {platform.python_version()}"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.hot_path_bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="experiment", required=True)
    rates = sub.add_parser("rates", help="CPU per request and overhead by offered rate")
    rates.add_argument("--rates", default="100,200,500,1000")
    rates.add_argument("--duration-s", type=float, default=20.0)
    rates.add_argument("--runs", type=int, default=3)
    rates.add_argument("--workers", type=int, default=2)
    rates.add_argument(
        "--idle-s", type=float, default=10.0, help="idle window measured first (0: none)"
    )
    rates.add_argument("--profile-rate", type=float, default=None)
    rates.add_argument("--profile-format", choices=("flamegraph", "raw"), default="flamegraph")
    rates.add_argument(
        "--env", action="append", default=[], help="NAME=VALUE for every process (repeatable)"
    )
    rates.add_argument(
        "--trace-ratio",
        type=float,
        default=None,
        help="export traces to a stand-in collector, recording this share of them",
    )
    fan = sub.add_parser("fanout", help="records decoded per request by workers and replicas")
    fan.add_argument("--workers-list", default="1,8,32")
    fan.add_argument("--replicas-list", default="1,4")
    fan.add_argument("--rate", type=float, default=100.0)
    fan.add_argument("--duration-s", type=float, default=15.0)
    args = parser.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    if args.experiment == "rates":
        global PROFILE_FORMAT
        PROFILE_FORMAT = args.profile_format
    experiment = rates_experiment if args.experiment == "rates" else fanout_experiment
    document = experiment(args)
    out = RESULTS / f"hot_path_{args.experiment}.json"
    out.write_text(json.dumps(document, indent=2, default=str))
    print(f"\nwritten {out}")


if __name__ == "__main__":
    main()
