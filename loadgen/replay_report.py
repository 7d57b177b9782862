"""What a replay measured: counts, latency percentiles, SLO violations, goodput, the
server-side latency breakdown, and the report as text, JSON, plots and an HTML page.

Everything here is a pure function of a list of :class:`~loadgen.replay.RequestRecord`
(and, for rates, the replay's duration), so it can be checked on hand-built records and
re-run on the ``requests`` of a saved JSON file.

Definitions (also in ``docs``-facing help):

- **sent**: requests that went out; **answered_ok**: 2xx answers.
- **errors_by_status**: every non-2xx answer by status code (429 and 503 included);
  **rejected**: the 429 and 503 answers among them; **http_errors**: the other non-2xx
  answers; **timeouts** and **transport_errors**: no answer at all.
- **latency**: client end-to-end latency (send to whole answer read) of 2xx answers.
  There is no TTFT: answers are not streamed.
- **SLO violation**: a 2xx answer with ``deadline_met`` false, or any request that got
  no 2xx answer (error, rejection, timeout, transport error). A 2xx answer that does not
  say whether its deadline was met is not judged (``deadline_unknown``); the rate is
  violations over judged requests. Requests cancelled by a stop are not judged.
- **goodput_rps**: 2xx answers with ``deadline_met`` true per second of replay (from
  the start to the last answer); **throughput_rps** counts every 2xx answer.
- **breakdown** (2xx answers carrying a server timeline; each component over the
  answers that have both of its fields): scheduling = ``assigned_s - arrival_s``,
  queueing = ``started_s - assigned_s``, execution = ``finished_s - started_s``,
  overhead = client latency - execution (the control plane, the network and the
  worker's own queue), control plane = client latency - (``finished_s -
  assigned_s``) (what the request spent anywhere but at its worker: the ingress, the
  bus, the scheduler, the answer's way back).
- **emulated_share**: the share of 2xx answers with ``emulated`` true. Their latencies
  are a performance model's output, not measurements, and the table says so.
- **send lag**: how late the generator sent requests against its schedule.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any

from switchyard.figures import ReportError, ensure_out_dir
from switchyard.stats import quantile

from loadgen.replay import (
    CANCELLED,
    HTTP_ERROR,
    NOT_SENT,
    OK,
    REJECTED,
    TIMEOUT,
    TRANSPORT_ERROR,
    ReplayResult,
    RequestRecord,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = [
    "BREAKDOWN_COMPONENTS",
    "EMULATED_NOTE",
    "LAG_WARNING_S",
    "Component",
    "Summary",
    "breakdown",
    "format_report",
    "per_app_summaries",
    "report_document",
    "summarize",
    "write_json",
    "write_plots",
    "write_report",
]

EMULATED_NOTE = "latencies of emulated workers are a performance model's output, not measurements"
BREAKDOWN_COMPONENTS = ("scheduling", "queueing", "execution", "overhead", "control_plane")
LAG_WARNING_S = 0.05
"""A send lag P99 above this is reported as the generator falling behind its schedule."""

PAGE_NAME = "index.html"
JSON_NAME = "replay.json"


@dataclass(frozen=True, slots=True)
class Component:
    """One part of the latency breakdown: median and P99 in seconds over ``count``
    answers (None when no answer had the fields)."""

    p50_s: float | None
    p99_s: float | None
    count: int


@dataclass(frozen=True, slots=True)
class Summary:
    """The figures of a replay, or of one application of it (see the module docs)."""

    planned: int
    sent: int
    not_sent: int
    answered_ok: int
    errors_by_status: dict[str, int]
    rejected: int
    http_errors: int
    timeouts: int
    transport_errors: int
    cancelled: int
    duration_s: float
    throughput_rps: float | None
    goodput_rps: float | None
    latency_p50_s: float | None
    latency_p90_s: float | None
    latency_p99_s: float | None
    latency_mean_s: float | None
    latency_max_s: float | None
    slo_judged: int
    slo_violations: int
    slo_violation_rate: float | None
    deadline_unknown: int
    emulated_answers: int
    emulated_share: float | None
    send_lag_p50_s: float | None
    send_lag_p99_s: float | None
    send_lag_max_s: float | None
    breakdown: dict[str, Component] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The summary as a JSON-ready dict (``breakdown`` nested by component)."""
        document: dict[str, Any] = _finite(asdict(self))
        return document


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(key): _finite(inner) for key, inner in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(inner) for inner in value]
    return value


def _q(values: Sequence[float], q: float) -> float | None:
    return quantile(sorted(values), q) if values else None


def _mean(values: Sequence[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def _rate(count: int, duration_s: float) -> float | None:
    return count / duration_s if duration_s > 0 and math.isfinite(duration_s) else None


def _difference(record: RequestRecord, later: str, earlier: str) -> float | None:
    timeline = record.timeline
    if timeline is None or later not in timeline or earlier not in timeline:
        return None
    return timeline[later] - timeline[earlier]


def _component_values(record: RequestRecord) -> dict[str, float | None]:
    execution = _difference(record, "finished_s", "started_s")
    overhead = (
        record.latency_s - execution
        if record.latency_s is not None and execution is not None
        else None
    )
    at_worker = _difference(record, "finished_s", "assigned_s")
    control_plane = (
        record.latency_s - at_worker
        if record.latency_s is not None and at_worker is not None
        else None
    )
    return {
        "scheduling": _difference(record, "assigned_s", "arrival_s"),
        "queueing": _difference(record, "started_s", "assigned_s"),
        "execution": execution,
        "overhead": overhead,
        "control_plane": control_plane,
    }


def breakdown(records: Sequence[RequestRecord]) -> dict[str, Component]:
    """Median and P99 of each :data:`BREAKDOWN_COMPONENTS` over the 2xx answers that
    carry both timeline fields it needs (overhead also needs the client latency)."""
    values: dict[str, list[float]] = {name: [] for name in BREAKDOWN_COMPONENTS}
    for record in records:
        if record.outcome != OK or record.timeline is None:
            continue
        for name, value in _component_values(record).items():
            if value is not None:
                values[name].append(value)
    return {
        name: Component(p50_s=_q(found, 0.5), p99_s=_q(found, 0.99), count=len(found))
        for name, found in values.items()
    }


def is_violation(record: RequestRecord) -> bool | None:
    """Whether ``record`` violates its SLO: True, False, or None when it is not judged
    (never sent, cancelled by a stop, or a 2xx answer silent about its deadline)."""
    if record.outcome in (NOT_SENT, CANCELLED):
        return None
    if record.outcome == OK:
        return None if record.deadline_met is None else not record.deadline_met
    return True


def summarize(records: Sequence[RequestRecord], duration_s: float) -> Summary:
    """The figures of ``records`` (see the module documentation for each definition).

    Args:
        records: the per-request records (all of a replay, or one application's).
        duration_s: seconds of replay that rates are taken over (> 0 for rates).
    """
    outcomes = Counter(record.outcome for record in records)
    sent = [record for record in records if record.was_sent]
    ok = [record for record in records if record.outcome == OK]
    latencies = [record.latency_s for record in ok if record.latency_s is not None]
    by_status = Counter(
        record.status_code
        for record in records
        if record.status_code is not None and not 200 <= record.status_code < 300
    )
    verdicts = [is_violation(record) for record in records]
    judged = [verdict for verdict in verdicts if verdict is not None]
    lags = [record.send_lag_s for record in sent if record.send_lag_s is not None]
    emulated = sum(1 for record in ok if record.emulated is True)
    good = sum(1 for record in ok if record.deadline_met is True)
    return Summary(
        planned=len(records),
        sent=len(sent),
        not_sent=outcomes[NOT_SENT],
        answered_ok=len(ok),
        errors_by_status={str(code): count for code, count in sorted(by_status.items())},
        rejected=outcomes[REJECTED],
        http_errors=outcomes[HTTP_ERROR],
        timeouts=outcomes[TIMEOUT],
        transport_errors=outcomes[TRANSPORT_ERROR],
        cancelled=outcomes[CANCELLED],
        duration_s=duration_s,
        throughput_rps=_rate(len(ok), duration_s),
        goodput_rps=_rate(good, duration_s),
        latency_p50_s=_q(latencies, 0.5),
        latency_p90_s=_q(latencies, 0.9),
        latency_p99_s=_q(latencies, 0.99),
        latency_mean_s=_mean(latencies),
        latency_max_s=max(latencies) if latencies else None,
        slo_judged=len(judged),
        slo_violations=sum(judged),
        slo_violation_rate=sum(judged) / len(judged) if judged else None,
        deadline_unknown=sum(1 for record in ok if record.deadline_met is None),
        emulated_answers=emulated,
        emulated_share=emulated / len(ok) if ok else None,
        send_lag_p50_s=_q(lags, 0.5),
        send_lag_p99_s=_q(lags, 0.99),
        send_lag_max_s=max(lags) if lags else None,
        breakdown=breakdown(records),
    )


def per_app_summaries(records: Sequence[RequestRecord], duration_s: float) -> dict[str, Summary]:
    """:func:`summarize` for each application, by name (sorted); rates over the whole
    replay's ``duration_s``."""
    apps = sorted({record.app for record in records})
    return {
        app: summarize([record for record in records if record.app == app], duration_s)
        for app in apps
    }


# --------------------------------------------------------------------------- JSON


def report_document(
    result: ReplayResult, config: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """``{"config", "summary", "per_app", "requests"}``: the ``--json`` document.

    ``config`` holds the result's own settings (:meth:`ReplayResult.config`) updated
    with the given ``config`` (trace, mix, seed, ... from the command line).
    """
    summary = summarize(result.records, result.duration_s)
    apps = per_app_summaries(result.records, result.duration_s)
    return {
        "config": _finite({**result.config(), **(config or {})}),
        "summary": summary.to_json(),
        "per_app": {app: item.to_json() for app, item in apps.items()},
        "requests": [record.to_json() for record in result.records],
    }


def write_json(document: Mapping[str, Any], path: Path) -> Path:
    """Write ``document`` as strict JSON (its folder is created); return ``path``.

    Raises:
        ReportError: the file cannot be written.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(document, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    except OSError as exc:
        raise ReportError(f"cannot write {path}: {exc.strerror or exc}") from exc
    return path


# --------------------------------------------------------------------------- text


def _s(value: float | None) -> str:
    """Seconds with about three significant digits; "-" when undefined."""
    if value is None or not math.isfinite(value):
        return "-"
    if value == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(value)))
    decimals = min(max(2 - magnitude, 0), 6)
    return f"{value:.{decimals}f}"


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
        "transport errors; no TTFT (answers are not streamed)"
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


# --------------------------------------------------------------------------- plots

_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2")


def _require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise ReportError(
            "plots need matplotlib, which is not installed; install the report extra: "
            "pip install 'switchyard[report]'"
        ) from exc


def rolling_quantile(values: Sequence[float], window: int, q: float) -> list[float]:
    """The ``q``-quantile of each value and the ``window - 1`` before it."""
    out: list[float] = []
    for end in range(1, len(values) + 1):
        out.append(quantile(sorted(values[max(0, end - window) : end]), q))
    return out


def _save(draw: Callable[[Axes], None], path: Path) -> Path:
    from switchyard.figures import new_figure

    figure, axes = new_figure()
    draw(axes)
    try:
        figure.savefig(path, format="png")
    except OSError as exc:
        raise ReportError(f"cannot write {path}: {exc.strerror or exc}") from exc
    return path


def write_plots(records: Sequence[RequestRecord], out_dir: Path) -> list[Path]:
    """Draw ``latency_cdf.png`` (per application), ``latency_over_time.png`` (each 2xx
    answer at its send time, with a rolling P99) and ``breakdown.png`` (median and P99
    of each component) into ``out_dir``; return their paths.

    Raises:
        ReportError: matplotlib is missing, or a file cannot be written.
    """
    _require_matplotlib()
    ensure_out_dir(out_dir)
    ok = [r for r in records if r.outcome == OK and r.latency_s is not None]
    apps = sorted({r.app for r in ok})
    emulated = any(r.emulated for r in ok)
    suffix = " (emulated: modelled latencies)" if emulated else ""

    def cdf(axes: Axes) -> None:
        for number, app in enumerate(apps):
            values = sorted(r.latency_s for r in ok if r.app == app and r.latency_s is not None)
            heights = [(i + 1) / len(values) for i in range(len(values))]
            axes.step(values, heights, where="post", label=app, color=_COLOURS[number % 7])
        axes.set_xlabel("client end-to-end latency (s)")
        axes.set_ylabel("fraction of 2xx answers")
        axes.set_title("latency CDF per application" + suffix)
        if apps:
            axes.legend()
        axes.grid(alpha=0.3)

    def over_time(axes: Axes) -> None:
        for number, app in enumerate(apps):
            mine = [r for r in ok if r.app == app]
            axes.scatter(
                [r.sent_s or 0.0 for r in mine],
                [r.latency_s or 0.0 for r in mine],
                s=6,
                alpha=0.4,
                label=app,
                color=_COLOURS[number % 7],
            )
        ordered = sorted(ok, key=lambda r: r.sent_s or 0.0)
        if ordered:
            window = max(10, min(200, len(ordered) // 10))
            axes.plot(
                [r.sent_s or 0.0 for r in ordered],
                rolling_quantile([r.latency_s or 0.0 for r in ordered], window, 0.99),
                color="black",
                linewidth=1.4,
                label=f"rolling P99 ({window} answers)",
            )
            axes.legend()
        axes.set_xlabel("send time (s after the start)")
        axes.set_ylabel("client end-to-end latency (s)")
        axes.set_title("latency over time" + suffix)
        axes.grid(alpha=0.3)

    def bars(axes: Axes) -> None:
        parts = breakdown(records)
        positions = list(range(len(parts)))
        series = (
            ("P50", [part.p50_s or 0.0 for part in parts.values()]),
            ("P99", [part.p99_s or 0.0 for part in parts.values()]),
        )
        for offset, (label, heights) in enumerate(series):
            axes.bar(
                [p + (offset - 0.5) * 0.38 for p in positions],
                heights,
                width=0.38,
                label=label,
                color=_COLOURS[offset],
            )
        axes.set_xticks(positions, [f"{name}\n(n={c.count})" for name, c in parts.items()])
        axes.set_ylabel("seconds")
        axes.set_title("latency breakdown of 2xx answers" + suffix)
        axes.legend()
        axes.grid(alpha=0.3, axis="y")

    return [
        _save(cdf, out_dir / "latency_cdf.png"),
        _save(over_time, out_dir / "latency_over_time.png"),
        _save(bars, out_dir / "breakdown.png"),
    ]


# --------------------------------------------------------------------------- HTML

_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; color: #1d2330; margin: 2rem auto;
       max-width: 72rem; padding: 0 1rem; }
h2 { font-size: 1.15rem; margin-top: 2rem; border-bottom: 1px solid #d8dce3; }
.note { background: #fff6e0; border-left: 4px solid #e0a100; padding: .4rem .8rem; }
pre { background: #f6f8fa; padding: .8rem; overflow-x: auto; }
table { border-collapse: collapse; }
td { padding: .2rem .6rem; border-bottom: 1px solid #e6e8ec; font-family: monospace; }
.figures { display: flex; flex-wrap: wrap; gap: 1rem; }
figure { margin: 0; flex: 1 1 30rem; max-width: 40rem; }
figure img { width: 100%; border: 1px solid #e6e8ec; }
"""


def write_report(
    result: ReplayResult,
    out_dir: Path,
    config: Mapping[str, Any] | None = None,
    *,
    plots: bool = True,
) -> Path:
    """Write ``out_dir/index.html`` with the text report, the configuration and the
    figures of :func:`write_plots`, and ``out_dir/replay.json``; return the page's path.

    The page is self-contained (inline style, figures beside it by relative path).

    Raises:
        ReportError: ``out_dir`` cannot be created or written, or matplotlib is missing
            while ``plots`` is true.
    """
    ensure_out_dir(out_dir)
    document = report_document(result, config)
    write_json(document, out_dir / JSON_NAME)
    summary = summarize(result.records, result.duration_s)
    apps = per_app_summaries(result.records, result.duration_s)
    text = format_report(summary, apps, document["config"])
    figures = write_plots(result.records, out_dir) if plots else []
    config_rows = "\n".join(
        f"<tr><td>{escape(str(key))}</td><td>{escape(json.dumps(value, default=str))}</td></tr>"
        for key, value in document["config"].items()
    )
    figure_html = "\n".join(
        f"<figure><img src='{escape(path.name)}' alt='{escape(path.stem)}'>"
        f"<figcaption>{escape(path.stem.replace('_', ' '))}</figcaption></figure>"
        for path in figures
    )
    note = ""
    if summary.emulated_answers:
        note = (
            f"<p class='note'>{summary.emulated_answers} of {summary.answered_ok} answers "
            f"came from emulated workers: {escape(EMULATED_NOTE)}.</p>"
        )
    page = f"""<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>Switchyard replay {escape(result.run_id)}</title>
<style>{_CSS}</style></head>
<body>
<h1>Switchyard replay {escape(result.run_id)}</h1>
{note}
<p>Raw records: <a href="{JSON_NAME}">{JSON_NAME}</a></p>
<h2>Results</h2>
<pre>{escape(text)}</pre>
<h2>Figures</h2>
<div class="figures">
{figure_html}
</div>
<h2>Configuration</h2>
<table>
{config_rows}
</table>
</body>
</html>
"""
    path = out_dir / PAGE_NAME
    try:
        path.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise ReportError(f"cannot write {path}: {exc.strerror or exc}") from exc
    return path
