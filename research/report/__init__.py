"""Reports of ``switchyard simulate``: tables, plots and an HTML page from run records.

- :mod:`research.report.runs`: the run record's shape (:func:`check_runs`,
  ``runs.json`` in and out).
- :mod:`research.report.table`: :func:`aggregate` over seeds, and the comparison as
  plain text (:func:`format_table`) or GitHub markdown (:func:`format_markdown_table`).
- :mod:`research.report.plots`: PNG figures (:func:`write_plots`); needs the
  ``report`` extra (matplotlib), imported only when drawing.
- :mod:`research.report.html`: a self-contained report folder (:func:`write_report`).

Example::

    runs = simulate(...)                      # list of run dicts
    print(format_table(runs))
    write_report(runs, {"trace": "azure-conv"}, Path("report"))  # report/index.html
"""

from __future__ import annotations

from switchyard.figures import ReportError

from research.report.html import write_report
from research.report.plots import PlotFile, write_plot_files, write_plots
from research.report.runs import (
    REQUIRED_KEYS,
    AggregateRow,
    Run,
    check_runs,
    load_runs,
    runs_to_json,
    write_runs_json,
)
from research.report.table import (
    COLUMNS,
    BestPolicy,
    aggregate,
    best_by_p99,
    format_markdown_table,
    format_table,
)

__all__ = [
    "COLUMNS",
    "REQUIRED_KEYS",
    "AggregateRow",
    "BestPolicy",
    "PlotFile",
    "ReportError",
    "Run",
    "aggregate",
    "best_by_p99",
    "check_runs",
    "format_markdown_table",
    "format_table",
    "load_runs",
    "runs_to_json",
    "write_plot_files",
    "write_plots",
    "write_report",
    "write_runs_json",
]
