"""A replay's figures as plain text: the table ``python -m loadgen replay`` prints.

:func:`format_report` takes the :class:`~loadgen.replay_summary.Summary` of the whole
replay and one per application and returns the text: the emulated-worker note, one row
per application (and one for all; a pipeline call's application is its pipeline), the
errors by status, SLO and goodput, the latency breakdown, the send lag and the
generator's own CPU; a send lag P99 above :data:`LAG_WARNING_S` adds a warning. Seconds
are shown to about three significant digits, an undefined figure as ``-``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from loadgen.replay_summary import Summary

__all__ = [
    "EMULATED_NOTE",
    "LAG_WARNING_S",
    "MULTIMODEL_NOTE",
    "format_report",
]

EMULATED_NOTE = "latencies of emulated workers are a performance model's output, not measurements"
MULTIMODEL_NOTE = (
    "pipeline calls of the alibaba-lora catalogue; arrivals are the simulator's seconds: "
    "the offered load is the simulator's when --speedup is the workers' time scale; SLO "
    "as each answer's met_slo"
)
LAG_WARNING_S = 0.05
"""A send lag P99 above this is reported as the generator falling behind its schedule."""


def _s(value: float | None) -> str:
    """Seconds with about three significant digits; "-" when undefined."""
    if value is None or not math.isfinite(value):
        return "-"
    if value == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(value)))
    decimals = min(max(2 - magnitude, 0), 6)
    return f"{value:.{decimals}f}"


def _ms(value: float | None) -> str:
    """Seconds shown as milliseconds (three significant digits); "-" when undefined."""
    return "-" if value is None else _s(value * 1000)


def _pct(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value * 100:.1f}"


def _aligned(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(headers[i]), *(len(row[i]) for row in rows)) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = (cell.rjust(width) for cell, width in zip(cells[1:], widths[1:], strict=True))
        return "  ".join([first, *rest]).rstrip()

    return [line(headers), "  ".join("-" * width for width in widths), *(line(r) for r in rows)]


_APP_HEADERS = (
    "app",
    "sent",
    "2xx",
    "rejected",
    "errors",
    "P50 s",
    "P90 s",
    "P99 s",
    "mean s",
    "max s",
    "SLO viol %",
    "goodput/s",
)


def _app_row(name: str, summary: Summary) -> list[str]:
    failed = summary.http_errors + summary.timeouts + summary.transport_errors
    return [
        name,
        str(summary.sent),
        str(summary.answered_ok),
        str(summary.rejected),
        str(failed),
        _s(summary.latency_p50_s),
        _s(summary.latency_p90_s),
        _s(summary.latency_p99_s),
        _s(summary.latency_mean_s),
        _s(summary.latency_max_s),
        _pct(summary.slo_violation_rate),
        _s(summary.goodput_rps),
    ]


def format_report(
    summary: Summary, per_app: Mapping[str, Summary], config: Mapping[str, Any] | None = None
) -> str:
    """The replay as plain text: the emulated-worker note, one row per application and
    one for all, errors by status, the latency breakdown, the send lag."""
    config = config or {}
    out: list[str] = []
    what = ", ".join(
        f"{key} {config[key]}" for key in ("trace", "mix", "target", "speedup") if key in config
    )
    out.append(f"replay{': ' + what if what else ''}")
    if config.get("mix") == "multimodel":
        out.append(MULTIMODEL_NOTE)
    share = summary.emulated_share
    if share is None:
        out.append(f"emulated workers: no 2xx answer ({EMULATED_NOTE})")
    else:
        out.append(
            f"emulated workers served {share * 100:.0f}% of {summary.answered_ok} answers "
            f"({EMULATED_NOTE})"
        )
    rows = [_app_row(app, item) for app, item in per_app.items()]
    if len(per_app) != 1:
        rows.append(_app_row("all", summary))
    out.extend(_aligned(_APP_HEADERS, rows))
    out.append(
        "client end-to-end latency of 2xx answers; errors = other non-2xx, timeouts and "
        "transport errors"
    )
    statuses = ", ".join(f"{code}: {n}" for code, n in summary.errors_by_status.items())
    out.append(
        f"non-2xx by status: {statuses or 'none'}; rejected (429/503): {summary.rejected}; "
        f"timeouts: {summary.timeouts}; transport errors: {summary.transport_errors}"
    )
    out.append(
        f"SLO: {summary.slo_violations} of {summary.slo_judged} judged requests violated "
        f"({_pct(summary.slo_violation_rate)}%); {summary.deadline_unknown} answers did not "
        f"say; goodput {_s(summary.goodput_rps)} req/s, throughput "
        f"{_s(summary.throughput_rps)} req/s over {_s(summary.duration_s)} s"
    )
    if summary.token_slo_judged:
        out.append(
            f"tokens (at the server): TTFT P50 {_s(summary.ttft_p50_s)} s, P99 "
            f"{_s(summary.ttft_p99_s)} s; TPOT P50 {_ms(summary.tpot_p50_s)} ms, P99 "
            f"{_ms(summary.tpot_p99_s)} ms; {_pct(summary.token_slo_attainment)}% of "
            f"{summary.token_slo_judged} LLM requests met their TTFT and TPOT objectives "
            f"(goodput {_s(summary.token_goodput_rps)} req/s)"
        )
    out.append("")
    out.append("latency breakdown (2xx answers with a server timeline)")
    labels = {
        "scheduling": "scheduling (assigned - arrival)",
        "queueing": "queueing (started - assigned)",
        "execution": "execution (finished - started)",
        "overhead": "overhead (client latency - execution)",
        "control_plane": "control plane (client latency - time at the worker)",
    }
    out.extend(
        _aligned(
            ("component", "P50 s", "P99 s", "answers"),
            [
                [labels[name], _s(part.p50_s), _s(part.p99_s), str(part.count)]
                for name, part in summary.breakdown.items()
            ],
        )
    )
    out.append("")
    out.append(
        f"send lag: P50 {_s(summary.send_lag_p50_s)} s, P99 {_s(summary.send_lag_p99_s)} s, "
        f"max {_s(summary.send_lag_max_s)} s"
    )
    per_request_ms = config.get("generator_cpu_ms_per_request")
    cpu_s = config.get("generator_cpu_s")
    if isinstance(per_request_ms, float) and isinstance(cpu_s, float) and summary.duration_s > 0:
        out.append(
            f"generator: {per_request_ms:.3f} ms of CPU per request sent "
            f"({cpu_s / summary.duration_s * 100:.0f}% of one core over the replay)"
        )
    if summary.send_lag_p99_s is not None and summary.send_lag_p99_s > LAG_WARNING_S:
        out.append(
            f"warning: the generator fell behind its schedule (send lag P99 "
            f"{_s(summary.send_lag_p99_s)} s > {LAG_WARNING_S:g} s): the offered load was "
            "lower and burstier than the trace's"
        )
    if summary.not_sent or summary.cancelled:
        out.append(
            f"stopped early: {summary.not_sent} requests never sent, {summary.cancelled} "
            "cancelled while in flight"
        )
    return "\n".join(out) + "\n"
