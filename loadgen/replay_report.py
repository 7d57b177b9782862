"""A replay's report on disk: the ``--json`` document and the ``--report`` HTML page.

:func:`report_document` gathers the run's configuration, the summary, one summary per
application and every request record into one JSON-ready dict, and :func:`write_json`
writes it as strict JSON. :func:`write_report` writes a folder: ``replay.json`` and an
``index.html`` with the text report, the figures of
:func:`loadgen.replay_plots.write_plots` and the configuration (self-contained but for
the PNGs beside it). A file that cannot be written raises
:class:`~switchyard.figures.ReportError`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from html import escape
from pathlib import Path
from typing import Any

from switchyard.figures import ReportError, ensure_out_dir

from loadgen.replay_plots import write_plots
from loadgen.replay_records import ReplayResult
from loadgen.replay_summary import json_ready, per_app_summaries, summarize
from loadgen.replay_text import EMULATED_NOTE, format_report

__all__ = [
    "report_document",
    "write_json",
    "write_report",
]

PAGE_NAME = "index.html"
JSON_NAME = "replay.json"


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
        "config": json_ready({**result.config(), **(config or {})}),
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
