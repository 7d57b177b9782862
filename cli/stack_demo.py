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

The terminal shows the progress bar, the reports and what the user must act on (a stack
that did not start, a service that failed, each naming the log file). Every service log
record goes to a file instead, named on the first line: ``--log-file``, or by default
``$SWITCHYARD_CACHE_DIR/demo/demo-<UTC time>.log`` (``~/.cache/switchyard/demo/…``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from switchyard.config import Settings
from switchyard.errors import SwitchyardError
from switchyard.runtime import loop as event_loop
from switchyard.telemetry import configure_logging

from services.embedded import EmbeddedPlan, EmbeddedStack, EmbeddedStartError

if TYPE_CHECKING:
    from loadgen.mixes import PlannedRequest
    from loadgen.replay_summary import Component


@dataclass(frozen=True, slots=True)
class StackDemoConfig:
    """What the demo replays and how."""

    trace: str = "azure-mix-sample"
    limit: int = 1200
    speedup: float = 10.0
    classification_share: float = 0.3
    policies: tuple[str, ...] = ("gaps", "jsq")
    seed: int = 0

    def plan(self) -> list[PlannedRequest]:
        """The requests replayed, in arrival order."""
        from switchyard.traces import resolve_trace

        from loadgen.mixes import build_plan

        return build_plan(
            resolve_trace(self.trace, seed=self.seed),
            "mixed",
            self.limit,
            self.seed,
            classification_share=self.classification_share,
        )


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
    control_p99_s: float | None
    llm_control_p99_s: float | None
    classification_control_p99_s: float | None
    classification_deadline_miss: float | None
    cpu_ms_per_request: float | None


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _millis(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _p99(component: Component | None) -> float | None:
    return component.p99_s if component is not None else None


def default_log_path(settings: Settings, now: datetime | None = None) -> Path:
    """``{cache_dir}/demo/demo-20261122T175001Z.log``: where the services' logs go."""
    stamp = (now if now is not None else datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    return Path(settings.cache_dir).expanduser() / "demo" / f"demo-{stamp}.log"


def send_logs_to_file(settings: Settings, path: str | os.PathLike[str] | None = None) -> Path:
    """Send every log record at or above ``settings.log_level`` to ``path`` (default
    :func:`default_log_path`), not to the terminal; returns the file.

    The embedded stack keeps this file when it configures its logs (``keep_file``).

    Raises:
        OSError: the file (or its folder) cannot be created.
    """
    target = Path(path).expanduser() if path is not None else default_log_path(settings)
    configure_logging("embedded", settings, path=target)
    return target


async def run_stack_demo(
    settings: Settings, config: StackDemoConfig, *, log_path: Path | None = None
) -> int:
    """Run the demo; returns the exit code (0 when every request got an answer).

    ``log_path``, the file the services log to, is named in the messages about failures.
    """
    from loadgen.replay import replay
    from loadgen.replay_summary import breakdown, per_app_summaries, summarize
    from loadgen.replay_text import format_report

    see_logs = f" (service logs: {log_path})" if log_path is not None else ""

    plan = config.plan()
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
        except (EmbeddedStartError, SwitchyardError) as exc:  # e.g. a bad registry file
            print(f"switchyard demo: {exc}{see_logs}", file=sys.stderr)
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
        control = summary.breakdown.get("control_plane")
        by_kind = {
            kind: breakdown([r for r in result.records if r.kind == kind]).get("control_plane")
            for kind in ("llm", "classification")
        }
        judged = [
            r.deadline_met
            for r in result.records
            if r.kind == "classification" and r.deadline_met is not None
        ]
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
                control_p99_s=control.p99_s if control else None,
                llm_control_p99_s=_p99(by_kind["llm"]),
                classification_control_p99_s=_p99(by_kind["classification"]),
                classification_deadline_miss=(
                    sum(1 for met in judged if not met) / len(judged) if judged else None
                ),
                # The replay's process is the whole embedded stack and the generator.
                cpu_ms_per_request=(
                    result.cpu_s * 1000.0 / summary.sent
                    if result.cpu_s is not None and summary.sent
                    else None
                ),
            )
        )
        # Refusals (429/503 from admission control) are the stack protecting deadlines,
        # not failures; anything else unanswered is.
        unanswered = summary.sent - summary.answered_ok - summary.rejected
        if unanswered > 0:
            print(
                f"switchyard demo: {unanswered} of {summary.sent} requests got no answer "
                f"under {policy}{see_logs}",
                file=sys.stderr,
            )
        if code != 0:
            print(
                f"switchyard demo: a service of the {policy} stack failed (exit code {code})"
                f"{see_logs}",
                file=sys.stderr,
            )
        if unanswered > 0 or code != 0:
            worst = 1
    print("\nPolicies compared (latencies of emulated LLM workers are a performance model's")
    print("output, not measurements; overhead = client latency minus execution, which")
    print("includes the wait in the worker's queue; control plane = client latency minus")
    print("the time at the worker, which for classification includes the scheduler's")
    print("wait for the estimator's accuracy estimate; cls = classification; CPU = this")
    print("process's CPU time during the replay, the whole stack and the load generator,")
    print("per request):")
    print(
        f"{'policy':<8} {'answered':>10} {'P50 s':>6} {'P99 s':>6} {'SLO miss':>9} "
        f"{'overhead P50/P99 s':>19} {'control plane P99 s':>20} {'LLM/cls P99 s':>14} "
        f"{'cls deadline miss':>18} {'CPU ms':>7}"
    )
    for o in outcomes:
        overheads = f"{_seconds(o.overhead_p50_s)}/{_seconds(o.overhead_p99_s)}"
        kinds = f"{_seconds(o.llm_control_p99_s)}/{_seconds(o.classification_control_p99_s)}"
        print(
            f"{o.policy:<8} {f'{o.answered}/{o.sent}':>10} {_seconds(o.p50_s):>6} "
            f"{_seconds(o.p99_s):>6} {_percent(o.slo_violation_rate):>9} {overheads:>19} "
            f"{_seconds(o.control_p99_s):>20} {kinds:>14} "
            f"{_percent(o.classification_deadline_miss):>18} {_millis(o.cpu_ms_per_request):>7}"
        )
    return worst


def run(
    settings: Settings,
    policies: Sequence[str],
    limit: int,
    speedup: float,
    *,
    log_file: str | os.PathLike[str] | None = None,
) -> int:
    """Entry point of ``switchyard demo``: the services log to ``log_file`` (default
    :func:`default_log_path`), named on the first line printed."""
    config = StackDemoConfig(policies=tuple(policies), limit=limit, speedup=speedup)
    try:
        log_path = send_logs_to_file(settings, log_file)
    except OSError as exc:
        print(f"switchyard demo: cannot write the service logs: {exc}", file=sys.stderr)
        return 2
    print(f"service logs: {log_path}", flush=True)
    return event_loop.run(run_stack_demo(settings, config, log_path=log_path))
