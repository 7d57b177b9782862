"""Aggregation of ``switchyard simulate``'s runs over seeds, and the comparison tables.

Runs (their keys in :mod:`research.report.runs`) that differ only in their seed form a
*group*; :func:`aggregate` averages each group. Groups that differ only in their policy
form a *scenario*; tables compare the policies of each scenario and name the best by
P99 latency.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from switchyard.figures import ReportError

from research.report.runs import (
    GROUP_KEYS,
    METRIC_KEYS,
    OPTIONAL_METRIC_KEYS,
    SCENARIO_KEYS,
    SPREAD_KEYS,
    AggregateRow,
    Run,
    check_runs,
)

# --------------------------------------------------------------------------- aggregation


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values) if values else math.nan


def aggregate(runs: Iterable[Mapping[str, Any]]) -> list[AggregateRow]:
    """Average runs over seeds: one row per (policy, workers, load_scale, predictor_error,
    trace, gpu).

    Each row holds the group keys; ``seeds`` (sorted) and ``n_seeds``; ``reference``
    (true when any run of the group is one); ``slo_scale`` and every metric of
    :data:`METRIC_KEYS` as the mean over seeds (NaN propagates: a seed without a P99
    makes the group's P99 unknown rather than optimistic); for :data:`SPREAD_KEYS`
    also ``{key}_min``, ``{key}_max`` and ``{key}_std`` (sample standard deviation, 0
    for one seed); and ``latency_quantiles_s``, the per-percentile mean (averaging
    quantiles, not pooling latencies, keeps each seed's weight equal), when every run
    of the group has quantiles of one length.

    Rows are ordered by scenario (in order of first appearance), then by policy (in
    order of first appearance in ``runs``), so each scenario's policies sit together.

    Example: two seeds of ``gaps`` with ``p99_s`` 1.0 and 3.0 give one row with
    ``p99_s`` 2.0, ``p99_s_min`` 1.0, ``p99_s_max`` 3.0, ``p99_s_std`` 1.414.

    Raises:
        ReportError: a run is malformed (see :func:`check_runs`).
    """
    checked = check_runs(runs)
    groups: dict[tuple[Any, ...], list[Run]] = {}
    policy_order: dict[str, int] = {}
    scenario_order: dict[tuple[Any, ...], int] = {}
    for run in checked:
        policy_order.setdefault(run["policy"], len(policy_order))
        scenario_order.setdefault(scenario_key(run), len(scenario_order))
        groups.setdefault(tuple(run[key] for key in GROUP_KEYS), []).append(run)

    rows: list[AggregateRow] = []
    for members in groups.values():
        first = members[0]
        row: AggregateRow = {key: first[key] for key in GROUP_KEYS}
        row["seeds"] = sorted(run["seed"] for run in members)
        row["n_seeds"] = len(members)
        row["reference"] = any(run["reference"] for run in members)
        row["slo_scale"] = _mean([run["slo_scale"] for run in members])
        for key in METRIC_KEYS:
            row[key] = _mean([run[key] for run in members])
        for key in OPTIONAL_METRIC_KEYS:
            row[key] = _mean([run.get(key, math.nan) for run in members])
        for key in SPREAD_KEYS:
            values = [run[key] for run in members]
            if any(math.isnan(v) for v in values):
                for suffix in ("min", "max", "std"):
                    row[f"{key}_{suffix}"] = math.nan
                continue
            row[f"{key}_min"] = min(values)
            row[f"{key}_max"] = max(values)
            row[f"{key}_std"] = statistics.stdev(values) if len(values) > 1 else 0.0
        quantiles = [run.get("latency_quantiles_s") for run in members]
        lengths = {len(q) for q in quantiles if q is not None}
        if None not in quantiles and len(lengths) == 1 and lengths != {0}:
            row["latency_quantiles_s"] = [_mean(column) for column in zip(*quantiles, strict=True)]
        rows.append(row)
    rows.sort(key=lambda r: (scenario_order[scenario_key(r)], policy_order[r["policy"]]))
    return rows


def scenario_key(row: Mapping[str, Any]) -> tuple[Any, ...]:
    """The scenario a run or row belongs to: its values of :data:`SCENARIO_KEYS`."""
    return tuple(row[key] for key in SCENARIO_KEYS)


def varying_keys(
    rows: Sequence[Mapping[str, Any]], keys: Sequence[str] = SCENARIO_KEYS
) -> list[str]:
    """Those of ``keys`` that take more than one value across ``rows``."""
    return [key for key in keys if len({row[key] for row in rows}) > 1]


# --------------------------------------------------------------------------- formatting


def _sig(value: float, digits: int = 3) -> str:
    """A number with about ``digits`` significant digits and never an exponent.

    1.23456 -> "1.23", 0.012345 -> "0.0123", 1234.5 -> "1234".
    """
    if not math.isfinite(value):
        return "n/a"
    if value == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(value)))
    decimals = min(max(digits - 1 - magnitude, 0), 6)
    return f"{value:.{decimals}f}"


def _percent(value: float) -> str:
    if not math.isfinite(value):
        return "n/a"
    percent = value * 100
    # One decimal would print a rare violation (0.04 %) as 0.0, which reads as none.
    if 0 < abs(percent) < 0.05:
        return _sig(percent, 1)
    return f"{percent:.1f}"


def _count(value: float) -> str:
    # A count averaged over seeds may be fractional (1.5 migrations); keep it honest.
    if not math.isfinite(value):
        return "n/a"
    return str(round(value)) if float(value).is_integer() else f"{value:.1f}"


def format_scale(value: float) -> str:
    """A load scale as short text: 2.0 -> "2", 0.5 -> "0.5"."""
    return f"{value:g}"


def format_error(value: float) -> str:
    """A predictor error level as a percentage without the sign: 0.2 -> "20"."""
    return f"{value * 100:g}"


def describe_scenario(row: Mapping[str, Any], keys: Sequence[str]) -> str:
    """Human words for the scenario fields ``keys`` of ``row``, comma separated.

    Example:
        >>> describe_scenario({"workers": 8, "load_scale": 2.0, "predictor_error": 0.2},
        ...                   ["workers", "load_scale", "predictor_error"])
        '8 workers, load x2, predictor error 20%'
    """
    words = {
        "trace": lambda r: f"trace {r['trace']}",
        "gpu": lambda r: f"gpu {r['gpu']}",
        "workers": lambda r: f"{r['workers']} workers",
        "load_scale": lambda r: f"load x{format_scale(r['load_scale'])}",
        "predictor_error": lambda r: f"predictor error {format_error(r['predictor_error'])}%",
    }
    return ", ".join(words[key](row) for key in keys)


def policy_label(row: Mapping[str, Any]) -> str:
    """The policy name as shown in tables and legends, with " (ref)" for a reference."""
    return f"{row['policy']} (ref)" if row.get("reference") else str(row["policy"])


@dataclass(frozen=True, slots=True)
class Column:
    """One table column: its header (with the unit) and how a row renders in it."""

    key: str
    header: str
    render: Callable[[AggregateRow], str]
    numeric: bool = True


def _p99_range(row: AggregateRow) -> str:
    if row["n_seeds"] < 2:
        return "-"
    return f"{_sig(row['p99_s_min'])}..{_sig(row['p99_s_max'])}"


COLUMNS: dict[str, Column] = {
    column.key: column
    for column in (
        Column("policy", "policy", policy_label, numeric=False),
        Column("trace", "trace", lambda r: str(r["trace"]), numeric=False),
        Column("gpu", "gpu", lambda r: str(r["gpu"]), numeric=False),
        Column("workers", "workers", lambda r: str(r["workers"])),
        Column("load_scale", "load x", lambda r: format_scale(r["load_scale"])),
        Column("predictor_error", "pred err %", lambda r: format_error(r["predictor_error"])),
        Column("slo_scale", "SLO x", lambda r: format_scale(r["slo_scale"])),
        Column("n_seeds", "seeds", lambda r: str(r["n_seeds"])),
        Column("requests", "requests", lambda r: _count(r["requests"])),
        Column("completed", "completed", lambda r: _count(r["completed"])),
        Column("p50_s", "P50 s", lambda r: _sig(r["p50_s"])),
        Column("p90_s", "P90 s", lambda r: _sig(r["p90_s"])),
        Column("p99_s", "P99 s", lambda r: _sig(r["p99_s"])),
        Column("p99_range", "P99 min..max s", _p99_range),
        Column("p99_s_std", "P99 sd s", lambda r: _sig(r["p99_s_std"])),
        Column("slo_violation_rate", "SLO viol %", lambda r: _percent(r["slo_violation_rate"])),
        Column("ttft_p99_s", "TTFT P99 s", lambda r: _sig(r["ttft_p99_s"])),
        Column("tpot_p99_s", "TPOT P99 ms", lambda r: _sig(r["tpot_p99_s"] * 1000)),
        Column("slo_attainment", "SLO met %", lambda r: _percent(r["slo_attainment"])),
        Column("goodput_rps", "goodput/s", lambda r: _sig(r["goodput_rps"])),
        Column("refused", "refused %", lambda r: _percent(r["refused"] / r["requests"])),
        Column("migrations", "migrations", lambda r: _count(r["migrations"])),
        Column("migration_cost_s", "mig cost s", lambda r: _sig(r["migration_cost_s"])),
        Column("mean_utilization", "util %", lambda r: _percent(r["mean_utilization"])),
        Column("load_cov", "load CoV", lambda r: _sig(r["load_cov"])),
        Column("throughput_rps", "req/s", lambda r: _sig(r["throughput_rps"])),
        Column("sim_wall_s", "sim wall s", lambda r: _sig(r["sim_wall_s"])),
    )
}
"""Every column a table can show, by key (the ``columns`` argument of the formatters)."""

DEFAULT_METRIC_COLUMNS: tuple[str, ...] = (
    "p50_s",
    "p90_s",
    "p99_s",
    "p99_range",
    "slo_violation_rate",
    "ttft_p99_s",
    "tpot_p99_s",
    "slo_attainment",
    "goodput_rps",
    "refused",
    "migrations",
    "migration_cost_s",
    "mean_utilization",
    "load_cov",
    "throughput_rps",
    "sim_wall_s",
)
"""The result columns shown when no ``columns`` are given."""


@dataclass(frozen=True, slots=True)
class BestPolicy:
    """The best contender of one scenario by P99 latency, and how far ahead it is.

    ``ratio`` is the runner-up's P99 over the best's (1.25: the runner-up's tail is 25 %
    longer); ``None`` when the scenario has one contender.
    """

    scenario: tuple[Any, ...]
    policy: str
    p99_s: float
    runner_up: str | None
    runner_up_p99_s: float | None
    ratio: float | None


def best_by_p99(rows: Sequence[AggregateRow]) -> list[BestPolicy]:
    """For each scenario of aggregated ``rows``, the non-reference policy with the lowest
    mean P99, and its runner-up. A policy that refused requests is no contender: its P99
    is over the requests it chose to serve, and would crown shedding as speed. Scenarios
    without a finite contender P99 are left out."""
    by_scenario: dict[tuple[Any, ...], list[AggregateRow]] = {}
    for row in rows:
        by_scenario.setdefault(scenario_key(row), []).append(row)
    found: list[BestPolicy] = []
    for scenario, members in by_scenario.items():
        contenders = sorted(
            (
                r
                for r in members
                if not r["reference"] and math.isfinite(r["p99_s"]) and not r["refused"] > 0
            ),
            key=lambda r: r["p99_s"],
        )
        if not contenders:
            continue
        best = contenders[0]
        runner = contenders[1] if len(contenders) > 1 else None
        ratio: float | None = None
        if runner is not None:
            ratio = runner["p99_s"] / best["p99_s"] if best["p99_s"] > 0 else math.inf
        found.append(
            BestPolicy(
                scenario=scenario,
                policy=best["policy"],
                p99_s=best["p99_s"],
                runner_up=None if runner is None else runner["policy"],
                runner_up_p99_s=None if runner is None else runner["p99_s"],
                ratio=ratio,
            )
        )
    return found


@dataclass(frozen=True, slots=True)
class Table:
    """A rendered comparison, independent of its output format.

    ``caption``: the scenario fields that are the same in every row (left out of the
    columns). ``headers``/``rows``: cell text. ``numeric``: which columns align right.
    ``reference``: which rows are a reference. ``best``: one sentence per scenario
    naming its best policy by P99.
    """

    caption: str
    headers: list[str]
    rows: list[list[str]]
    numeric: list[bool]
    reference: list[bool]
    best: list[str]


def _best_sentence(best: BestPolicy, varying: Sequence[str]) -> str:
    where = ""
    if varying:
        sample = dict(zip(SCENARIO_KEYS, best.scenario, strict=True))
        where = f" ({describe_scenario(sample, varying)})"
    head = f"best P99{where}: {best.policy} {_sig(best.p99_s)} s"
    if best.runner_up is None or best.ratio is None:
        return f"{head}; the only contender"
    ratio = "inf" if math.isinf(best.ratio) else f"{best.ratio:.2f}"
    return f"{head}; runner-up {best.runner_up} {_sig(best.runner_up_p99_s or 0.0)} s is {ratio}x slower"


def build_table(
    runs: Iterable[Mapping[str, Any]], *, columns: Sequence[str] | None = None
) -> Table:
    """Aggregate ``runs`` and lay out the comparison table shared by every format.

    Default columns: the policy, the scenario fields that vary, ``seeds`` when groups
    have different seed counts, then :data:`DEFAULT_METRIC_COLUMNS`. Scenario fields
    that do not vary go into the caption instead, which keeps the table narrow.

    Raises:
        ReportError: malformed runs, or an unknown column key.
    """
    rows = aggregate(runs)
    varying = varying_keys(rows)
    if columns is None:
        chosen: list[str] = ["policy", *varying]
        if len({row["n_seeds"] for row in rows}) > 1:
            chosen.append("n_seeds")
        chosen.extend(DEFAULT_METRIC_COLUMNS)
    else:
        unknown = [key for key in columns if key not in COLUMNS]
        if unknown:
            raise ReportError(
                f"unknown table columns {', '.join(unknown)}; known: {', '.join(COLUMNS)}"
            )
        chosen = list(columns)
    caption_keys = [key for key in SCENARIO_KEYS if key not in varying and key not in chosen]
    caption = describe_scenario(rows[0], caption_keys) if rows and caption_keys else ""
    seed_counts = {row["n_seeds"] for row in rows}
    if len(seed_counts) == 1 and "n_seeds" not in chosen:
        (count,) = seed_counts
        caption = ", ".join(part for part in (caption, f"{count} seed{'s' * (count != 1)}") if part)
    return Table(
        caption=caption,
        headers=[COLUMNS[key].header for key in chosen],
        rows=[[COLUMNS[key].render(row) for key in chosen] for row in rows],
        numeric=[COLUMNS[key].numeric for key in chosen],
        reference=[bool(row["reference"]) for row in rows],
        best=[_best_sentence(best, varying) for best in best_by_p99(rows)],
    )


def format_table(runs: Iterable[Mapping[str, Any]], *, columns: Sequence[str] | None = None) -> str:
    """The comparison as aligned plain text: a caption, the table, and the best policies.

    One row per group (policy first, a reference marked " (ref)"), metrics averaged over
    seeds; under the table, one line per scenario naming the best non-reference policy
    by P99 and its ratio to the runner-up. ``columns`` picks keys of :data:`COLUMNS`.

    Example (abridged)::

        trace azure-conv, gpu a100-80gb/llama-2-7b, load x1, predictor error 0%, 3 seeds
        policy        workers  P50 s  P90 s  P99 s  ...
        ------------  -------  -----  -----  -----
        gaps                8  0.412   1.10   2.31
        jsq                 8  0.455   1.32   3.02
        oracle (ref)        8  0.398   0.97   1.88
        best P99 (8 workers): gaps 2.31 s; runner-up jsq 3.02 s is 1.31x slower

    Raises:
        ReportError: malformed runs, or an unknown column key.
    """
    table = build_table(runs, columns=columns)
    widths = [
        max(len(header), *(len(row[i]) for row in table.rows)) if table.rows else len(header)
        for i, header in enumerate(table.headers)
    ]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            cell.rjust(width) if numeric else cell.ljust(width)
            for cell, width, numeric in zip(cells, widths, table.numeric, strict=True)
        ).rstrip()

    out: list[str] = []
    if table.caption:
        out.append(table.caption)
    out.append(line(table.headers))
    out.append("  ".join("-" * width for width in widths))
    out.extend(line(row) for row in table.rows)
    out.extend(table.best)
    return "\n".join(out) + "\n"


def _md_cell(text: str) -> str:
    # A pipe would end the cell early; GitHub markdown takes the backslash escape.
    return text.replace("\\", "\\\\").replace("|", "\\|")


def format_markdown_table(
    runs: Iterable[Mapping[str, Any]], *, columns: Sequence[str] | None = None
) -> str:
    """The comparison as GitHub markdown, for pasting into ``docs/benchmarks.md``.

    The caption (scenario fields common to every row) as a paragraph, the table with
    numeric columns right-aligned, then the best policies as a bullet list.

    Raises:
        ReportError: malformed runs, or an unknown column key.
    """
    table = build_table(runs, columns=columns)
    out: list[str] = []
    if table.caption:
        out.extend([_md_cell(table.caption), ""])
    out.append("| " + " | ".join(_md_cell(h) for h in table.headers) + " |")
    out.append("|" + "|".join("---:" if numeric else "---" for numeric in table.numeric) + "|")
    out.extend("| " + " | ".join(_md_cell(cell) for cell in row) + " |" for row in table.rows)
    if table.best:
        out.append("")
        out.extend(f"- {_md_cell(sentence)}" for sentence in table.best)
    return "\n".join(out) + "\n"
