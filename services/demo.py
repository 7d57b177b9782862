"""The live-stack demo behind ``make demo``: the embedded stack, a trace replayed over HTTP.

For each LLM policy asked for, it starts the embedded stack (every service in this
process, over the in-memory bus and state), replays a bundled trace sample through the
HTTP API with :mod:`loadgen.replay` (LLM and classification requests mixed, open-loop at
the trace's times divided by ``speedup``), prints the load generator's report and stops
the stack; then a one-line-per-policy comparison.

The LLM workers are emulated: they spend the time the performance model gives, sped up
by the same factor as the arrivals (``SWITCHYARD_WORKER_TIME_SCALE = speedup``), so the
cluster sees the trace's real load in compressed time. Their latencies are a model's
output, not measurements; classification requests run real torch and scikit-learn
models.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from switchyard.config import Settings

from services.embedded import EmbeddedPlan, EmbeddedStack, EmbeddedStartError


@dataclass(frozen=True, slots=True)
class StackDemoConfig:
    """What the demo replays and how."""

    trace: str = "azure-mix-sample"
    limit: int = 1200
    speedup: float = 10.0
    classification_share: float = 0.3
    policies: tuple[str, ...] = ("gaps", "jsq")
    seed: int = 0


@dataclass(frozen=True, slots=True)
class _Outcome:
    policy: str
    answered: int
    sent: int
    p50_s: float | None
    p99_s: float | None
    slo_violation_rate: float | None
    overhead_p50_s: float | None
    overhead_p99_s: float | None


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


async def run_stack_demo(settings: Settings, config: StackDemoConfig) -> int:
    """Run the demo; returns the exit code (0 when every request got an answer)."""
    from loadgen.mixes import build_plan
    from loadgen.replay import replay
    from loadgen.replay_report import format_report, per_app_summaries, summarize
    from loadgen.traces import resolve_trace

    plan = build_plan(
        resolve_trace(config.trace, seed=config.seed),
        "mixed",
        config.limit,
        config.seed,
        classification_share=config.classification_share,
    )
    span_s = plan[-1].arrival_s - plan[0].arrival_s if plan else 0.0
    print(
        f"Replaying {len(plan)} requests of {config.trace} ({config.classification_share:.0%} "
        f"turned into classification requests) over {span_s / config.speedup:.0f} s "
        f"(x{config.speedup:g}) through the embedded stack, once per policy: "
        f"{', '.join(config.policies)}."
    )
    outcomes: list[_Outcome] = []
    worst = 0
    for policy in config.policies:
        stack_settings = settings.model_copy(
            update={"llm_policy": policy, "worker_time_scale": config.speedup}
        )
        stack = EmbeddedStack(stack_settings, EmbeddedPlan(http_port=0))
        print(f"\n== policy {policy}: starting the embedded stack ...", flush=True)
        try:
            await stack.start()
        except EmbeddedStartError as exc:
            print(f"switchyard demo: {exc}", file=sys.stderr)
            return 1
        try:
            result = await replay(plan, stack.url, speedup=config.speedup, timeout_s=120.0)
        finally:
            code = await stack.stop()
        summary = summarize(result.records, result.duration_s)
        print(
            format_report(
                summary,
                per_app_summaries(result.records, result.duration_s),
                {"policy": policy, "trace": config.trace, "speedup": config.speedup},
            )
        )
        overhead = summary.breakdown.get("overhead")
        outcomes.append(
            _Outcome(
                policy=policy,
                answered=summary.answered_ok,
                sent=summary.sent,
                p50_s=summary.latency_p50_s,
                p99_s=summary.latency_p99_s,
                slo_violation_rate=summary.slo_violation_rate,
                overhead_p50_s=overhead.p50_s if overhead else None,
                overhead_p99_s=overhead.p99_s if overhead else None,
            )
        )
        # Refusals (429/503 from admission control) are the stack protecting deadlines,
        # not failures; anything else unanswered is.
        if summary.answered_ok + summary.rejected < summary.sent or code != 0:
            worst = 1
    print("\nPolicies compared (latencies of emulated LLM workers are a performance model's")
    print("output, not measurements; overhead = client latency minus execution):")
    print(
        f"{'policy':<10} {'answered':>12} {'P50 s':>8} {'P99 s':>8} {'SLO miss':>9} "
        f"{'overhead P50 s':>15} {'overhead P99 s':>15}"
    )
    for o in outcomes:
        miss = "-" if o.slo_violation_rate is None else f"{o.slo_violation_rate:.1%}"
        print(
            f"{o.policy:<10} {f'{o.answered}/{o.sent}':>12} {_seconds(o.p50_s):>8} "
            f"{_seconds(o.p99_s):>8} {miss:>9} {_seconds(o.overhead_p50_s):>15} "
            f"{_seconds(o.overhead_p99_s):>15}"
        )
    return worst


def run(settings: Settings, policies: Sequence[str], limit: int, speedup: float) -> int:
    """Entry point of ``switchyard demo``."""
    config = StackDemoConfig(policies=tuple(policies), limit=limit, speedup=speedup)
    return asyncio.run(run_stack_demo(settings, config))
