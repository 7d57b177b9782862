"""The embedded default under the demo's load: CPU per request and control-plane latency.

``make demo`` replays 1,200 requests of the bundled Azure samples (30 % turned into
classification calls) at ten times the recorded rate through the embedded stack (every
service in this process, the in-memory bus and state). This benchmark runs the same
replay ``--runs`` times per policy, each on a fresh stack, and reports per run:

- CPU milliseconds per request of this process during the replay (the whole stack and
  the load generator: they share the process, as in the demo);
- the control plane's share (client latency minus the time at the worker) by kind, P50
  and P99, over every request and over the *steady* part only: requests that did not
  arrive in a burst. A burst is where the plan's arrivals in the surrounding second exceed
  twice the replay's mean rate (the bundled sample ends with half a second at about five
  times its mean, where one process runs out of CPU);
- classification deadline misses.

Medians over the runs are printed last. Emulated LLM latencies are a performance
model's output, not measurements. Run ``python -m bench.embedded_bench`` (``make
bench-embedded``); JSON in ``bench/results/embedded.json``. Figures in
docs/benchmarks.md, "The embedded default".
"""

from __future__ import annotations

import argparse
import bisect
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from switchyard.config import Settings
from switchyard.runtime import loop as event_loop

from cli.stack_demo import StackDemoConfig, send_logs_to_file
from loadgen.replay import replay
from loadgen.replay_records import RequestRecord
from loadgen.replay_summary import breakdown
from services.embedded import EmbeddedPlan, EmbeddedStack

RESULTS = Path(__file__).parent / "results"
KINDS = ("llm", "classification")
BURST_FACTOR = 2.0
"""A request arrived in a burst when the plan's arrival rate around it (one second of
replay) is more than this many times the replay's mean rate."""


def burst_flags(arrivals_s: Sequence[float], window_s: float = 1.0) -> list[bool]:
    """For each of ``arrivals_s`` (replay seconds): whether it arrived in a burst."""
    ordered = sorted(arrivals_s)
    if len(ordered) < 2:
        return [False] * len(ordered)
    span_s = ordered[-1] - ordered[0]
    mean_rps = len(ordered) / span_s if span_s > 0 else float("inf")
    flags = []
    for t in arrivals_s:
        around = bisect.bisect_right(ordered, t + window_s / 2) - bisect.bisect_left(
            ordered, t - window_s / 2
        )
        flags.append(around / window_s > BURST_FACTOR * mean_rps)
    return flags


def _control_plane(records: Sequence[RequestRecord]) -> dict[str, float | None]:
    component = breakdown(records).get("control_plane")
    if component is None or component.count == 0:
        return {"p50_ms": None, "p99_ms": None, "count": 0}
    return {
        "p50_ms": None if component.p50_s is None else component.p50_s * 1000,
        "p99_ms": None if component.p99_s is None else component.p99_s * 1000,
        "count": component.count,
    }


async def one_run(policy: str, config: StackDemoConfig) -> dict[str, Any]:
    """One replay of the demo's plan through a fresh embedded stack."""
    plan = config.plan()
    # Records keep the plan's order (their ``index``).
    bursty = burst_flags([p.arrival_s / config.speedup for p in plan])
    settings = Settings().model_copy(
        update={"llm_policy": policy, "worker_time_scale": config.speedup}
    )
    stack = EmbeddedStack(settings, EmbeddedPlan(http_port=0))
    await stack.start()
    try:
        result = await replay(plan, stack.url, speedup=config.speedup, timeout_s=120.0)
    finally:
        await stack.stop()
    records = result.records
    run: dict[str, Any] = {
        "policy": policy,
        "sent": len(records),
        "cpu_ms_per_request": (result.cpu_s or 0.0) * 1000 / max(1, len(records)),
        "burst_requests": sum(bursty),
    }
    for kind in KINDS:
        of_kind = [r for r in records if r.kind == kind]
        run[f"{kind}_all"] = _control_plane(of_kind)
        run[f"{kind}_steady"] = _control_plane([r for r in of_kind if not bursty[r.index]])
    judged = [r.deadline_met for r in records if r.kind == "classification"]
    known = [met for met in judged if met is not None]
    run["classification_deadline_miss"] = (
        sum(1 for met in known if not met) / len(known) if known else None
    )
    return run


def _line(run: dict[str, Any]) -> str:
    def p99(key: str) -> str:
        value = run[key]["p99_ms"]
        return "-" if value is None else f"{value:.1f}"

    miss = run["classification_deadline_miss"]
    return (
        f"{run['policy']:<6} CPU {run['cpu_ms_per_request']:5.2f} ms/request  control plane "
        f"P99 ms: LLM {p99('llm_all')} (steady {p99('llm_steady')}), classification "
        f"{p99('classification_all')} (steady {p99('classification_steady')}); "
        f"classification deadline misses {'-' if miss is None else f'{miss:.1%}'}"
    )


def _median(runs: list[dict[str, Any]], key: str, inner: str | None = None) -> float | None:
    values = [r[key] if inner is None else r[key][inner] for r in runs]
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.embedded_bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--policies", default="gaps,jsq")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path, default=RESULTS / "embedded.json")
    parser.add_argument("--log-file", type=Path, default=RESULTS / "embedded-services.log")
    args = parser.parse_args(argv)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    send_logs_to_file(Settings(), args.log_file)
    config = StackDemoConfig()
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    runs: list[dict[str, Any]] = []
    for _ in range(args.runs):
        for policy in policies:
            run = event_loop.run(one_run(policy, config))
            print(_line(run), flush=True)
            runs.append(run)
    print("\nmedians over the runs:")
    summary: dict[str, Any] = {}
    for policy in policies:
        mine = [r for r in runs if r["policy"] == policy]
        summary[policy] = {
            "cpu_ms_per_request": _median(mine, "cpu_ms_per_request"),
            **{
                f"{kind}_{part}_p99_ms": _median(mine, f"{kind}_{part}", "p99_ms")
                for kind in KINDS
                for part in ("all", "steady")
            },
            "classification_deadline_miss": _median(mine, "classification_deadline_miss"),
        }
        print(
            f"  {policy}: " + json.dumps({k: v and round(v, 3) for k, v in summary[policy].items()})
        )
    args.json.write_text(json.dumps({"runs": runs, "medians": summary}, indent=2))
    print(f"\nwritten {args.json}")


if __name__ == "__main__":
    main()
