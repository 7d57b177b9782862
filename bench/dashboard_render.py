"""The provisioned dashboard's panels, drawn from a Prometheus: a picture of what the
Grafana dashboard (``deploy/helm/switchyard/files/dashboard.json``) shows.

:func:`query_panels` asks Prometheus's HTTP API (``/api/v1/query_range``) every target
of every panel over a time range, as Grafana asks it (``$__rate_interval`` written out,
each series named by the target's ``legendFormat``); :func:`render` draws the panels
on the dashboard's grid with matplotlib, in the panels' units (``reqps``,
``percentunit``, ``s``, ``short``), dark like Grafana's default theme. It is a rendering
of the dashboard's own queries on real data, not Grafana: panel options other than the
title, the unit and the legend are not drawn.
"""

from __future__ import annotations

import math
import re
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

__all__ = ["PanelData", "Series", "legend", "query_panels", "render"]

_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")


@dataclass(frozen=True, slots=True)
class Series:
    """One line of a panel: its legend, seconds since the range's start and values."""

    legend: str
    times_s: tuple[float, ...]
    values: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class PanelData:
    """One panel: its title, unit and the series its targets returned, and its place on
    the dashboard's grid (Grafana's ``gridPos``: 24 columns)."""

    title: str
    unit: str
    series: tuple[Series, ...]
    grid: Mapping[str, int]


def legend(template: str, labels: Mapping[str, str]) -> str:
    """A series' name: ``template`` with each ``{{label}}`` replaced by its value (an
    absent label by nothing), as Grafana names it; the labels themselves without one."""
    if not template:
        return ", ".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "__name__")
    return _LABEL.sub(lambda m: labels.get(m.group(1), ""), template)


def query_panels(
    base_url: str,
    dashboard: Mapping[str, Any],
    *,
    start_s: float,
    end_s: float,
    step_s: float = 2.0,
    rate_interval: str = "30s",
    timeout_s: float = 30.0,
) -> list[PanelData]:
    """Every panel of ``dashboard`` with its targets' series over ``[start_s, end_s]``
    (epoch seconds), NaN points dropped.

    Raises:
        RuntimeError: Prometheus refused a query (the message names the panel and the
            query) or could not be reached.
    """
    panels = []
    with httpx.Client(base_url=base_url, timeout=timeout_s) as client:
        for panel in dashboard["panels"]:
            series: list[Series] = []
            for target in panel.get("targets", []):
                expr = target["expr"].replace("$__rate_interval", rate_interval)
                try:
                    answer = client.get(
                        "/api/v1/query_range",
                        params={"query": expr, "start": start_s, "end": end_s, "step": step_s},
                    )
                    body = answer.json()
                except (httpx.HTTPError, ValueError) as exc:
                    raise RuntimeError(f"{base_url}: cannot query Prometheus: {exc}") from None
                if answer.status_code != 200 or body.get("status") != "success":
                    raise RuntimeError(
                        f"panel {panel['title']!r}: Prometheus refused {expr!r}: "
                        f"{body.get('error', answer.status_code)}"
                    )
                for result in body["data"]["result"]:
                    points = [
                        (float(t) - start_s, float(v))
                        for t, v in result["values"]
                        if math.isfinite(float(v))
                    ]
                    if points:
                        times, values = zip(*points, strict=True)
                        name = legend(target.get("legendFormat", ""), result["metric"])
                        series.append(Series(name, tuple(times), tuple(values)))
            unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
            panels.append(PanelData(panel["title"], unit, tuple(series), panel["gridPos"]))
    return panels


# Grafana's dark theme, roughly: page, panel, text, grid.
_PAGE, _PANEL, _TEXT, _GRID = "#111217", "#181b1f", "#ccccdc", "#2c3235"
_MOST_SERIES = 8
"""Lines drawn per panel (a consumer-lag panel has one per group and topic)."""
_PALETTE = ("#73bf69", "#f2cc0c", "#8ab8ff", "#ff780a", "#f2495c", "#5794f2", "#b877d9")


def _scaled(unit: str, values: Sequence[float], top: float) -> tuple[list[float], str]:
    """Values in the unit a reader wants on the axis, and its label."""
    if unit == "percentunit":
        return [100.0 * v for v in values], "%"
    if unit == "s":
        return ([1000.0 * v for v in values], "ms") if top < 1.0 else (list(values), "s")
    if unit == "reqps":
        return list(values), "req/s"
    return list(values), ""


def render(panels: Sequence[PanelData], out: Path, *, span_s: float, title: str, note: str) -> None:
    """Draw ``panels`` (``span_s`` seconds of each) on their grid into the PNG ``out``,
    under ``title`` and over ``note`` (what was running, and that this is a rendering,
    not Grafana)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    rows = max(p.grid["y"] + p.grid["h"] for p in panels)
    row_in, header_in, footer_in, width_in = 0.42, 0.7, 0.5, 16.0
    height_in = rows * row_in + header_in + footer_in
    figure = pyplot.figure(figsize=(width_in, height_in), dpi=90, facecolor=_PAGE)
    figure.text(0.01, 1 - 0.25 / height_in, title, color=_TEXT, fontsize=15, va="top")
    note = "\n".join(textwrap.wrap(f"{note} Horizontal axes: seconds from the start.", 190))
    figure.text(0.01, 0.08 / height_in, note, color="#8e8e8e", fontsize=8.5, va="bottom")
    # Each panel on its grid cell (24 columns, rows of row_in inches), room left inside it
    # for its title above and its tick labels beside and below.
    pad_left_in, pad_right_in, pad_top_in, pad_bottom_in = 0.6, 0.15, 0.35, 0.3
    for panel in panels:
        grid = panel.grid
        left_in = grid["x"] / 24 * width_in + pad_left_in
        axes = figure.add_axes(
            (
                left_in / width_in,
                1 - (header_in + (grid["y"] + grid["h"]) * row_in - pad_bottom_in) / height_in,
                (grid["w"] / 24 * width_in - pad_left_in - pad_right_in) / width_in,
                (grid["h"] * row_in - pad_top_in - pad_bottom_in) / height_in,
            )
        )
        axes.set_facecolor(_PANEL)
        axes.set_title(panel.title, color=_TEXT, fontsize=10, loc="left")
        axes.tick_params(colors="#9fa7b3", labelsize=8)
        axes.grid(color=_GRID, linewidth=0.6)
        for spine in axes.spines.values():
            spine.set_color(_GRID)
        top = max((max(s.values) for s in panel.series), default=0.0)
        label, highest = "", 0.0
        for index, series in enumerate(panel.series[:_MOST_SERIES]):
            values, label = _scaled(panel.unit, series.values, top)
            highest = max(highest, max(values))
            axes.plot(
                series.times_s,
                values,
                color=_PALETTE[index % len(_PALETTE)],
                linewidth=1.4,
                label=series.legend[:48] or "value",
            )
        axes.set_ylabel(label, color="#9fa7b3", fontsize=8)
        axes.set_xlim(0.0, span_s)
        if panel.series:
            axes.legend(
                fontsize=7, facecolor=_PANEL, edgecolor=_GRID, labelcolor=_TEXT, loc="upper left"
            )
        else:
            axes.text(0.5, 0.5, "No data", color="#8e8e8e", ha="center", transform=axes.transAxes)
        # Headroom above the highest line, so a series at its ceiling (100 %) shows.
        axes.set_ylim(0.0, highest * 1.1 if highest > 0 else 1.0)
    figure.savefig(out, facecolor=_PAGE)
    pyplot.close(figure)
