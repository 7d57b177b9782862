"""A self-contained HTML page for a ``switchyard simulate`` report.

The page needs nothing from the network: the style sheet is inline, the figures are
PNG files beside it referenced by relative path, and the raw runs sit beside it as
``runs.json``. The folder can be zipped, attached or served as it is. Every piece of
text that comes from runs or configuration is escaped, so a policy or trace name can
never inject markup.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any
from urllib.parse import quote

from switchyard.figures import ReportError, ensure_out_dir

from research.report.plots import PlotFile, write_plot_files
from research.report.runs import check_runs, write_runs_json
from research.report.table import Table, build_table

PAGE_NAME = "index.html"
RUNS_NAME = "runs.json"

_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1d2330;
       margin: 2rem auto; max-width: 72rem; padding: 0 1rem; }
h1 { font-size: 1.5rem; margin-bottom: .2rem; }
h2 { font-size: 1.15rem; margin-top: 2rem; border-bottom: 1px solid #d8dce3; }
.meta, .caption { color: #5a6272; }
table { border-collapse: collapse; margin: .6rem 0; }
th, td { padding: .25rem .6rem; border-bottom: 1px solid #e6e8ec; }
th { background: #f3f5f8; text-align: left; font-weight: 600; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.ref td { color: #5a6272; font-style: italic; }
table.config td:first-child { font-family: ui-monospace, monospace; color: #38406b; }
table.config td { font-family: ui-monospace, monospace; white-space: pre-wrap; }
ul.best li { margin: .15rem 0; }
.figures { display: flex; flex-wrap: wrap; gap: 1rem; }
figure { margin: 0; flex: 1 1 30rem; max-width: 40rem; }
figure img { width: 100%; height: auto; border: 1px solid #e6e8ec; }
figcaption { font-size: .85rem; color: #5a6272; }
"""


def _config_value(value: Any) -> str:
    if isinstance(value, str):
        return value
    # Lists and nested settings read best as JSON; default=str covers paths and enums.
    return json.dumps(value, default=str, sort_keys=isinstance(value, Mapping))


def _config_section(config: Mapping[str, Any]) -> str:
    if not config:
        return "<p class='meta'>No configuration recorded.</p>"
    rows = "\n".join(
        f"<tr><td>{escape(str(key))}</td><td>{escape(_config_value(value))}</td></tr>"
        for key, value in config.items()
    )
    return f"<table class='config'>\n{rows}\n</table>"


def _results_section(table: Table) -> str:
    parts: list[str] = []
    if table.caption:
        parts.append(f"<p class='caption'>{escape(table.caption)}</p>")
    head = "".join(
        f"<th class='num'>{escape(h)}</th>" if numeric else f"<th>{escape(h)}</th>"
        for h, numeric in zip(table.headers, table.numeric, strict=True)
    )
    body: list[str] = []
    for row, reference in zip(table.rows, table.reference, strict=True):
        css = " class='ref'" if reference else ""
        cells = "".join(
            f"<td class='num'>{escape(cell)}</td>" if numeric else f"<td>{escape(cell)}</td>"
            for cell, numeric in zip(row, table.numeric, strict=True)
        )
        body.append(f"<tr{css}>{cells}</tr>")
    parts.append(
        "<table class='results'>\n<thead><tr>"
        + head
        + "</tr></thead>\n<tbody>\n"
        + "\n".join(body)
        + "\n</tbody>\n</table>"
    )
    if table.best:
        items = "\n".join(f"<li>{escape(sentence)}</li>" for sentence in table.best)
        parts.append(f"<ul class='best'>\n{items}\n</ul>")
    return "\n".join(parts)


def _figures(plots: Sequence[PlotFile], out_dir: Path) -> str:
    figures: list[str] = []
    for plot in plots:
        # Relative to the page, so the folder stays valid when moved or served.
        src = quote(plot.path.relative_to(out_dir).as_posix())
        title = escape(plot.title)
        figures.append(
            f"<figure><a href='{escape(src)}'><img src='{escape(src)}' alt='{title}'></a>"
            f"<figcaption>{title}</figcaption></figure>"
        )
    return "<div class='figures'>\n" + "\n".join(figures) + "\n</div>"


def _plots_section(plots: Sequence[PlotFile], out_dir: Path) -> str:
    if not plots:
        return "<p class='meta'>No figures: the runs hold no latency quantiles and no sweep.</p>"
    parts: list[str] = []
    # Sweeps first: they carry the comparison across scenarios; CDFs are the detail.
    for kind, heading in (("sweep", "Sweeps"), ("cdf", "Latency distributions")):
        chosen = [plot for plot in plots if plot.kind == kind]
        if chosen:
            parts.append(f"<h3>{heading}</h3>\n{_figures(chosen, out_dir)}")
    return "\n".join(parts)


def write_report(
    runs: Sequence[Mapping[str, Any]],
    config: Mapping[str, Any],
    out_dir: Path,
    *,
    title: str = "Switchyard simulation report",
    plots: bool = True,
) -> Path:
    """Write a report folder: ``index.html``, the PNG figures, and ``runs.json``.

    The page shows ``config`` (what the simulation was asked to do, key by key), the
    comparison table averaged over seeds with the best policy per scenario, and the
    figures of :func:`~research.report.plots.write_plots`. ``plots=False`` leaves
    the figures out (and needs no matplotlib).

    Args:
        runs: the simulator's runs (see :mod:`research.report.table` for their keys).
        config: the settings to show; values that are not strings are shown as JSON.
        out_dir: the report folder, created with its parents if missing; files of an
            earlier report there are overwritten.
        title: the page heading.
        plots: whether to draw the figures.

    Returns:
        The path of ``index.html``.

    Raises:
        ReportError: ``out_dir`` is an existing file or cannot be written, matplotlib is
            missing while ``plots`` is true, or the runs are malformed.

    Example:
        >>> page = write_report(runs, {"trace": "azure-conv"}, Path("report"))  # doctest: +SKIP
        >>> page.name  # doctest: +SKIP
        'index.html'
    """
    checked = check_runs(runs)
    ensure_out_dir(out_dir)
    table = build_table(checked)
    figures = write_plot_files(checked, out_dir) if plots else []
    write_runs_json(checked, out_dir / RUNS_NAME)

    policies = list(dict.fromkeys(run["policy"] for run in checked))
    meta = (
        f"{len(checked)} run{'s' * (len(checked) != 1)}, {len(policies)} "
        f"polic{'ies' if len(policies) != 1 else 'y'}. Raw runs: "
    )
    page = f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)}</title>
<style>{_CSS}</style>
</head>
<body>
<h1>{escape(title)}</h1>
<p class="meta">{escape(meta)}<a href="{RUNS_NAME}">{RUNS_NAME}</a></p>
<h2>Configuration</h2>
{_config_section(config)}
<h2>Results (mean over seeds)</h2>
{_results_section(table)}
{"<h2>Figures</h2>" + chr(10) + _plots_section(figures, out_dir) if plots else ""}
</body>
</html>
"""
    path = out_dir / PAGE_NAME
    try:
        path.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise ReportError(f"cannot write {path}: {exc.strerror or exc}") from exc
    return path
