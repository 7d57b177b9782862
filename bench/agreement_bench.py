"""Sim-to-live agreement: the same Azure trace slice and policy through the live stack on
Kafka and Redis (emulated workers, every service a process of its own) and through the
simulator, P50 and P99 compared in trace seconds.

For each trace and policy: the first ``--limit`` rows, replayed at that trace's speed-up
(``--speedups``: the workers' emulated time runs as much faster, so live latencies times
the speed-up are trace seconds), on one emulated worker per ``--workers`` profile; the
simulator runs the same rows on the same profiles in the same order. Admission control
is off (the simulator has none). :mod:`research.llm.agreement` defines every figure.

The speed-up is a trade: the control plane's own delay (a few tens of milliseconds of
wall time per request on this machine) counts ``speedup`` times over in trace seconds,
and bursts of arrivals compressed by it queue in the control plane of a small machine;
a slower replay takes as much longer. The defaults (conversation x2, code x1) keep the
overhead to a few percent of a median latency.

``--chunked-prefill TOKENS`` runs both sides with chunked prefill at that budget (the
workers' ``SWITCHYARD_WORKER_CHUNKED_PREFILL_TOKENS``, the simulator's option of the
same name).

``--prefill-workers N`` disaggregates both sides: the first N workers only prefill and
hand each request with its KV cache to one of the others (the workers'
``SWITCHYARD_WORKER_ROLE``, the simulator's ``--prefill-workers``). The live placer picks
the decode worker when the request arrives, so the simulator does too
(``--decode-at-arrival``).

The simulated policy decides on heartbeats as the live placer does: every 0.25 s of the
stack's wall time, so every 0.25 times the speed-up in trace seconds
(:func:`research.llm.agreement_stack.sim_heartbeat_s`).

``--sensitivity`` runs the simulator alone: the same slices with every arrival delayed by
an exponential jitter of mean ``--jitter-ms`` (six seeds), to show how far the simulated
P50 and P99 move with timing differences smaller than the live control plane's.

Run ``make bench-agreement`` or ``python -m bench.agreement_bench [--limit N ...]``
(Kafka and Redis must be up: ``deploy/local/infra.sh up``). Emulated latencies are a
performance model's output, not measurements.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from switchyard.perf import performance_model
from switchyard.stats import quantile
from switchyard.traces import resolve_trace
from switchyard.traces.transform import head

from loadgen.replay_records import OK
from research.llm.agreement import DEFAULT_TOLERANCE, Agreement, format_table, simulate
from research.llm.agreement_stack import measure, sim_heartbeat_s

RESULTS = Path(__file__).parent / "results" / "agreement"
DEFAULT_WORKERS = "a100-80gb/llama-2-7b,l40s-48gb/llama-2-7b,a100-80gb/llama-2-7b"


def _speedups(text: str) -> dict[str, float]:
    speedups: dict[str, float] = {}
    for part in text.split(","):
        trace, _, value = part.partition("=")
        speedups[trace.strip()] = float(value)
    return speedups


def sensitivity(args: argparse.Namespace, profiles: list[str], seeds: int = 6) -> None:
    """The simulated P50 and P99 of each slice and policy, plain and with ``seeds``
    draws of exponential arrival jitter of mean ``args.jitter_ms``."""
    print(f"simulator only; arrivals jittered by Exp(mean {args.jitter_ms:g} ms), {seeds} seeds")
    print("| trace | policy | P50 plain | P50 jittered (min-max) | P99 plain | P99 jittered |")
    print("|---|---|---:|---:|---:|---:|")
    speedups = _speedups(args.speedups)
    for trace in args.traces.split(","):
        rows = head(resolve_trace(trace), args.limit).requests
        heartbeat_s = sim_heartbeat_s(speedups.get(trace, 1.0))
        for policy in args.policies.split(","):
            runs = [list(rows)]
            for seed in range(seeds):
                rng = random.Random(seed)
                jittered = [
                    replace(r, arrival_s=r.arrival_s + rng.expovariate(1000.0 / args.jitter_ms))
                    for r in rows
                ]
                runs.append(sorted(jittered, key=lambda r: r.arrival_s))
            p50: list[float] = []
            p99: list[float] = []
            for run in runs:
                latencies = sorted(
                    s.latency_s
                    for s in simulate(
                        run,
                        policy=policy,
                        profiles=profiles,
                        chunked_prefill_tokens=args.chunked_prefill,
                        prefill_workers=args.prefill_workers,
                        decode_at_arrival=args.prefill_workers is not None,
                        heartbeat_s=heartbeat_s,
                    ).values()
                )
                p50.append(quantile(latencies, 0.5))
                p99.append(quantile(latencies, 0.99))
            print(
                f"| {trace} | {policy} | {p50[0]:.2f} s | {min(p50[1:]):.2f}-{max(p50[1:]):.2f} s "
                f"| {p99[0]:.2f} s | {min(p99[1:]):.2f}-{max(p99[1:]):.2f} s |"
            )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.agreement_bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--traces", default="azure-conv,azure-code")
    parser.add_argument("--policies", default="gaps,jsq")
    parser.add_argument("--limit", type=int, default=2000)
    parser.add_argument(
        "--speedups",
        default="azure-conv=2,azure-code=1",
        help="speed-up per trace, TRACE=FACTOR,... (default: %(default)s)",
    )
    parser.add_argument("--workers", default=DEFAULT_WORKERS, help="worker profiles, in order")
    parser.add_argument(
        "--chunked-prefill",
        type=int,
        default=None,
        metavar="TOKENS",
        help="chunked prefill at this token budget, live and simulated (default: off)",
    )
    parser.add_argument(
        "--prefill-workers",
        type=int,
        default=None,
        metavar="N",
        help="the first N workers only prefill, the others only decode, live and simulated "
        "(default: off)",
    )
    parser.add_argument("--sensitivity", action="store_true", help="simulator only, jittered")
    parser.add_argument("--jitter-ms", type=float, default=10.0)
    args = parser.parse_args(argv)
    speedups = _speedups(args.speedups)
    profiles = args.workers.split(",")
    if args.chunked_prefill is not None:
        for profile in profiles:
            problem = performance_model(profile).chunk_budget_problem(args.chunked_prefill)
            if problem is not None:
                parser.error(f"--chunked-prefill: {problem}")
    if args.prefill_workers is not None and not 1 <= args.prefill_workers < len(profiles):
        parser.error(f"--prefill-workers must leave both pools non-empty: 1 to {len(profiles) - 1}")
    if args.sensitivity:
        sensitivity(args, profiles)
        return
    RESULTS.mkdir(parents=True, exist_ok=True)
    rows: list[Agreement] = []
    records: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="agreement-") as logs:
        for trace in args.traces.split(","):
            speedup = speedups.get(trace, 1.0)
            for policy in args.policies.split(","):
                agreement, result = asyncio.run(
                    measure(
                        trace,
                        args.limit,
                        policy=policy,
                        speedup=speedup,
                        profiles=profiles,
                        log_dir=Path(logs) / f"{trace}-{policy}",
                        chunked_prefill_tokens=args.chunked_prefill,
                        prefill_workers=args.prefill_workers,
                    )
                )
                rows.append(agreement)
                for record in result.records:
                    if record.outcome != OK or record.latency_s is None:
                        print(
                            f"  not answered live: row {record.index} ({record.prompt_tokens} "
                            f"prompt tokens): {record.outcome} {record.status_code} "
                            f"{record.error_code} {record.error_message}",
                            flush=True,
                        )
                records.append(
                    {
                        **agreement.to_json(),
                        "chunked_prefill_tokens": args.chunked_prefill,
                        "prefill_workers": args.prefill_workers,
                        "sim_heartbeat_s": sim_heartbeat_s(speedup),
                        "replay": result.config(),
                    }
                )
                verdict = "agrees" if agreement.within() else "disagrees"
                print(
                    f"{trace} {policy} x{speedup:g}: P50 {agreement.p50_gap:+.1%}, "
                    f"P99 {agreement.p99_gap:+.1%} ({verdict} within "
                    f"{DEFAULT_TOLERANCE:.0%})",
                    flush=True,
                )
    print()
    chunking = "off" if args.chunked_prefill is None else f"{args.chunked_prefill} tokens"
    print(
        f"first {args.limit} rows; workers {', '.join(profiles)}; chunked prefill "
        f"{chunking}; prefill workers {args.prefill_workers or 'none'}; trace seconds; the "
        f"simulated policy decides on heartbeats every {sim_heartbeat_s(1.0):g} s "
        "times the speed-up, as the live one"
    )
    print(format_table(rows))
    name = "agreement"
    if args.chunked_prefill is not None:
        name += f"-chunked-{args.chunked_prefill}"
    if args.prefill_workers is not None:
        name += f"-prefill-{args.prefill_workers}"
    out = RESULTS / f"{name}.json"
    out.write_text(json.dumps(records, indent=2))
    print(f"\nwritten {out}")


if __name__ == "__main__":
    main()
