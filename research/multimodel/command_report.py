"""The tables and plots of ``switchyard multimodel`` (:mod:`research.multimodel.command`):
means over seeds per policy and swept value, a plain-text table, and one PNG per metric
with an ``index.html``."""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["METRICS", "SWEEP_LABELS", "aggregate", "format_table", "write_report"]

SWEEP_LABELS = {
    "update-frequency": "placement update frequency (Hz)",
    "fluctuation": "load fluctuation intensity",
    "heterogeneity": "cluster heterogeneity ratio (share of slow workers)",
    "invocation-ratio": "model invocation ratio",
}

# (run key, column title, axis label, format)
METRICS: tuple[tuple[str, str, str], ...] = (
    ("utilization", "util %", "resource utilisation (%)"),
    ("load_cov", "load CoV", "load balance: CoV of worker load (lower is better)"),
    ("stability", "stability", "stability (1 - CoV of windowed latency, steady segments)"),
    ("responsiveness_s", "resp s", "adaptation responsiveness (s, lower is better)"),
    ("p99_s", "P99 s", "P99 latency (s)"),
    ("slo_violation_rate", "SLO viol", "SLO violation rate"),
    ("decision_p99_s", "dec ms P99", "decision time per update, P99 (s)"),
    ("llm_utilization", "LLM busy %", "LLM workers: share of time prefilling or decoding (%)"),
    ("placement_changes", "changes", "placement changes (loads + evictions)"),
)


# --------------------------------------------------------------------------- table


def aggregate(runs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Means over seeds, one row per (policy, value), in first-seen order. A metric that
    is ``None`` in some seeds (responsiveness without a step) averages the others."""
    groups: dict[tuple[str, Any], list[Mapping[str, Any]]] = {}
    for run in runs:
        groups.setdefault((run["policy"], run["value"]), []).append(run)
    rows = []
    for (policy, value), members in groups.items():
        row: dict[str, Any] = {"policy": policy, "value": value, "seeds": len(members)}
        for key, _, _ in METRICS:
            numbers = [
                float(m[key])
                for m in members
                if m.get(key) is not None and math.isfinite(float(m[key]))
            ]
            row[key] = sum(numbers) / len(numbers) if numbers else None
        rows.append(row)
    return rows


def _cell(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key == "slo_violation_rate":
        return f"{100 * value:.1f}%"
    if key == "placement_changes":
        return f"{value:.0f}"
    if key in ("utilization", "llm_utilization"):
        return f"{value:.1f}"
    if key == "decision_p99_s":  # seconds in the runs, milliseconds on screen
        return f"{value * 1e3:.3g}"
    return f"{value:.3g}"


def format_table(runs: Sequence[Mapping[str, Any]]) -> str:
    """A plain-text table of :func:`aggregate`'s rows."""
    rows = aggregate(runs)
    sweep = next((run["sweep"] for run in runs if run.get("sweep")), None)
    # The LLM workers' column only for runs that have them.
    shown = [
        (key, title)
        for key, title, _ in METRICS
        if key != "llm_utilization" or any(row[key] is not None for row in rows)
    ]
    head = ["policy", *([sweep] if sweep else []), *(title for _, title in shown)]
    body = [
        [
            row["policy"],
            *([f"{row['value']:g}"] if sweep else []),
            *(_cell(key, row[key]) for key, _ in shown),
        ]
        for row in rows
    ]
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(cells, widths, strict=True))
        )

    return "\n".join([line(head), line(["-" * w for w in widths]), *(line(r) for r in body)])


# --------------------------------------------------------------------------- report


def write_report(
    runs: Sequence[Mapping[str, Any]], config: Mapping[str, Any], table: str, out_dir: Path
) -> Path:
    """One PNG per metric (against the swept value, or a bar per policy without a sweep)
    and ``index.html``; returns the page's path."""
    from switchyard.figures import (
        INSTALL_HINT,
        SERIES_COLOURS,
        SERIES_MARKERS,
        ReportError,
        ensure_out_dir,
        new_figure,
    )

    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ReportError(
            f"plots need matplotlib, which is not installed; install the report extra: {INSTALL_HINT}"
        ) from None
    ensure_out_dir(out_dir)
    rows = aggregate(runs)
    policies = list(dict.fromkeys(row["policy"] for row in rows))
    sweep = config.get("sweep")
    images: list[tuple[str, str]] = []
    for key, _, label in METRICS:
        figure, axes = new_figure()
        drawn = False
        for index, policy in enumerate(policies):
            colour = SERIES_COLOURS[index % len(SERIES_COLOURS)]
            marker = SERIES_MARKERS[(index // len(SERIES_COLOURS)) % len(SERIES_MARKERS)]
            points = [
                (row["value"], row[key])
                for row in rows
                if row["policy"] == policy and row[key] is not None
            ]
            if not points:
                continue
            drawn = True
            if sweep:
                points.sort()
                axes.plot(
                    [x for x, _ in points],
                    [y for _, y in points],
                    label=policy,
                    color=colour,
                    marker=marker,
                    linewidth=1.6,
                )
            else:
                axes.bar([index], [points[0][1]], color=colour, label=policy)
        if not drawn:
            continue
        if sweep:
            axes.set_xlabel(SWEEP_LABELS.get(str(sweep), str(sweep)))
            if sweep == "update-frequency":
                axes.set_xscale("log")
        else:
            axes.set_xticks(range(len(policies)), policies, rotation=20, fontsize=8)
        axes.set_ylabel(label, fontsize=9)
        axes.set_title(
            f"{label} ({config.get('workload')}, {config.get('workers')} workers)", fontsize=10
        )
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize=8)
        name = f"{sweep or 'policies'}_{key}.png"
        try:
            figure.savefig(out_dir / name, format="png")
        except OSError as exc:
            raise ReportError(f"cannot write {out_dir / name}: {exc.strerror or exc}") from None
        images.append((name, label))
    config_rows = "".join(
        f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>"
        for k, v in config.items()
    )
    figures = "".join(
        f'<figure><img src="{html.escape(name)}" alt="{html.escape(label)}">'
        f"<figcaption>{html.escape(label)}</figcaption></figure>"
        for name, label in images
    )
    page = out_dir / "index.html"
    text = (
        "<!doctype html>\n<html><head><meta charset='utf-8'><title>switchyard multimodel</title>"
        "<style>body{font-family:sans-serif;margin:2em}figure{display:inline-block;margin:1em}"
        "table{border-collapse:collapse}th,td{text-align:left;padding:2px 8px}</style></head>"
        f"<body><h1>Multi-model placement policies</h1><h2>Configuration</h2><table>{config_rows}"
        f"</table><h2>Results (means over seeds)</h2><pre>{html.escape(table)}</pre>"
        f"<h2>Plots</h2>{figures}</body></html>\n"
    )
    try:
        page.write_text(text)
    except OSError as exc:
        raise ReportError(f"cannot write {page}: {exc.strerror or exc}") from None
    return page
