"""PNG charts and an HTML page for ``switchyard window --report DIR``.

* ``utility.png``, ``accuracy.png``: bars by scheduler, the mean over seeds with min-max
  whiskers; for a sweep, one bar per swept value within each scheduler's group.
* For a sweep ``NAME`` also ``utility_vs_NAME.png`` (utility against the swept value)
  and ``violations_vs_NAME.png`` (deadline violation rate against it): one line per
  scheduler, the mean over seeds, with a min-max band.

matplotlib is an optional dependency (the ``report`` extra), imported inside
:func:`write_report` only; figures are drawn on the Agg canvas directly, without pyplot,
so the caller's backend and global figure state are left untouched (as
:mod:`research.report.plots` does).
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from research.window.sweep import Sweep

from switchyard.figures import INSTALL_HINT, SERIES_COLOURS, SERIES_MARKERS, new_figure

__all__ = ["PlotError", "format_value", "write_report"]

# The palette and markers of the simulation report, so both reports look alike.
_COLOURS = SERIES_COLOURS
_MARKERS = SERIES_MARKERS


def format_value(value: object) -> str:
    """A swept value as shown: numbers without a needless ``.0`` (``50.0`` -> ``50``)."""
    return f"{value:g}" if isinstance(value, float) else str(value)


class PlotError(ValueError):
    """The report cannot be drawn (matplotlib missing); one line naming ``--report``."""


def _names(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    return list(dict.fromkeys(str(row["scheduler"]) for row in rows))


def _values(rows: Sequence[Mapping[str, Any]]) -> list[Any]:
    return list(dict.fromkeys(row.get("value") for row in rows))


def _row(rows: Sequence[Mapping[str, Any]], name: str, value: Any) -> Mapping[str, Any]:
    for row in rows:
        if row["scheduler"] == name and row.get("value") == value:
            return row
    raise KeyError(f"no row for scheduler {name!r} at value {value!r}")


def _bars(
    rows: Sequence[Mapping[str, Any]], key: str, title: str, sweep: Sweep | None, footer: str
) -> Figure:
    figure, axes = new_figure()
    names = _names(rows)
    values = _values(rows)
    width = 0.8 / len(values)
    for j, value in enumerate(values):
        picked = [_row(rows, name, value) for name in names]
        means = [float(r[key]) for r in picked]
        below = [m - float(r[f"{key}_min"]) for m, r in zip(means, picked, strict=True)]
        above = [float(r[f"{key}_max"]) - m for m, r in zip(means, picked, strict=True)]
        offset = (j - (len(values) - 1) / 2) * width
        axes.bar(
            [i + offset for i in range(len(names))],
            means,
            width=width,
            yerr=[below, above],
            capsize=3,
            color=(
                [_COLOURS[i % len(_COLOURS)] for i in range(len(names))]
                if sweep is None
                else _COLOURS[j % len(_COLOURS)]
            ),
            label=None if sweep is None else format_value(value),
        )
    axes.set_xticks(range(len(names)), names)
    axes.set_ylim(0.0, 1.05)
    axes.set_ylabel(f"mean {title} per request")
    axes.set_title(f"{title} by scheduler (mean over seeds; whiskers: min-max)", fontsize=10)
    axes.tick_params(axis="x", labelrotation=20)
    if sweep is not None:
        axes.legend(
            title=sweep.label,
            fontsize=7,
            title_fontsize=7,
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
        )
    figure.suptitle(footer, fontsize=7, color="#555555")
    return figure


def _lines(
    rows: Sequence[Mapping[str, Any]], key: str, ylabel: str, sweep: Sweep, footer: str
) -> Figure:
    figure, axes = new_figure()
    values = _values(rows)
    xs: list[Any] = list(values) if sweep.numeric else list(range(len(values)))
    for i, name in enumerate(_names(rows)):
        picked = [_row(rows, name, value) for value in values]
        colour = _COLOURS[i % len(_COLOURS)]
        axes.plot(
            xs,
            [float(r[key]) for r in picked],
            marker=_MARKERS[i % len(_MARKERS)],
            color=colour,
            label=name,
        )
        axes.fill_between(
            xs,
            [float(r[f"{key}_min"]) for r in picked],
            [float(r[f"{key}_max"]) for r in picked],
            color=colour,
            alpha=0.12,
            linewidth=0,
        )
    if not sweep.numeric:
        axes.set_xticks(xs, [str(v) for v in values])
    elif sweep.name == "heterogeneity":
        axes.set_xscale("log", base=2)
        axes.set_xticks(xs, [format_value(v) for v in values])
    axes.set_xlabel(sweep.label)
    axes.set_ylabel(ylabel)
    axes.set_ylim(-0.02, 1.05)
    axes.set_title(f"{ylabel} against {sweep.name} (mean over seeds; band: min-max)", fontsize=10)
    axes.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    axes.grid(alpha=0.3)
    figure.suptitle(footer, fontsize=7, color="#555555")
    return figure


def write_report(
    rows: Sequence[Mapping[str, Any]],
    document: Mapping[str, Any],
    out_dir: Path,
    *,
    table: str,
    sweep: Sweep | None = None,
) -> Path:
    """Write the charts and ``index.html`` (the table, the charts, the configuration)
    into ``out_dir``; returns the page.

    Args:
        rows: one per scheduler (x swept value): ``scheduler``, ``value`` (None without a
            sweep) and, for ``utility``, ``accuracy`` and ``deadline_violation_rate``,
            the mean over seeds and its ``_min`` and ``_max``.
        document: the command's JSON document (its ``config`` is shown; its
            ``config.emulation`` labels every chart).
        out_dir: created when absent.
        table: the printed table, shown on the page.
        sweep: the sweep the rows vary over, if any.

    Raises:
        PlotError: matplotlib is not installed.
    """
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise PlotError(
            f"--report: plots need matplotlib; install the report extra: {INSTALL_HINT}"
        ) from None
    out_dir.mkdir(parents=True, exist_ok=True)
    config = document["config"]
    footer = str(config["emulation"])
    figures: list[tuple[str, Figure]] = [
        ("utility.png", _bars(rows, "utility", "utility", sweep, footer)),
        ("accuracy.png", _bars(rows, "accuracy", "accuracy", sweep, footer)),
    ]
    if sweep is not None:
        figures.append(
            (
                f"utility_vs_{sweep.name}.png",
                _lines(rows, "utility", "mean utility per request", sweep, footer),
            )
        )
        figures.append(
            (
                f"violations_vs_{sweep.name}.png",
                _lines(rows, "deadline_violation_rate", "deadline violation rate", sweep, footer),
            )
        )
    for file_name, figure in figures:
        figure.savefig(out_dir / file_name, format="png")
    images = "\n".join(
        f'<h3>{html.escape(name)}</h3>\n<p><img src="{html.escape(name)}" alt="{html.escape(name)}"></p>'
        for name, _ in figures
    )
    listing = "\n".join(
        f'<li><a href="{html.escape(name)}">{html.escape(name)}</a></li>' for name, _ in figures
    )
    heading = "Window schedulers (SneakPeek)"
    if sweep is not None:
        heading += f": sweep over {sweep.name} ({sweep.label})"
    page = out_dir / "index.html"
    page.write_text(
        "<!doctype html>\n<html><head><meta charset='utf-8'>"
        "<title>switchyard window</title></head><body>\n"
        f"<h1>{html.escape(heading)}</h1>\n"
        f"<p><strong>{html.escape(footer)}</strong>: not measured on an edge device.</p>\n"
        f"<pre>{html.escape(table)}</pre>\n<h2>Charts</h2>\n<ul>\n{listing}\n</ul>\n"
        f"{images}\n<h2>Configuration</h2>\n"
        f"<pre>{html.escape(json.dumps(config, indent=2))}</pre>\n"
        "</body></html>\n",
        encoding="utf-8",
    )
    return page
