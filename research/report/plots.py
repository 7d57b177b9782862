"""PNG plots of simulation runs: latency CDFs and sweeps over workers, load and error.

matplotlib is an optional dependency (the ``report`` extra). It is imported inside the
functions that draw, never when this module is imported, so ``switchyard simulate``
without ``--report`` neither needs it nor pays its start-up time. Figures are drawn on
the Agg canvas directly, without pyplot, so the caller's matplotlib backend and global
figure state are left untouched.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from switchyard.figures import (
    SERIES_COLOURS,
    SERIES_MARKERS,
    ReportError,
    ensure_out_dir,
    new_figure,
    require_matplotlib,
)

from research.report.runs import SCENARIO_KEYS, AggregateRow
from research.report.table import (
    aggregate,
    describe_scenario,
    format_error,
    format_scale,
    policy_label,
    varying_keys,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# The sweep axes: the run key, the short name used in file names, the axis label.
_SWEEPS: tuple[tuple[str, str, str], ...] = (
    ("workers", "workers", "workers (cluster size)"),
    ("load_scale", "load", "load scale (x trace arrival rate)"),
    ("predictor_error", "error", "injected predictor error (%)"),
)


@dataclass(frozen=True, slots=True)
class PlotFile:
    """A written figure: where it is, a one-line title to show beside it, and its kind
    (``"cdf"`` for a latency CDF, ``"sweep"`` for a metric against a swept field)."""

    path: Path
    title: str
    kind: str


def _slug(text: str) -> str:
    """A file-name-safe form: lower case, runs of other characters become one dash."""
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-.") or "x"


def _name_part(key: str, value: Any) -> str:
    if key == "trace":
        return _slug(str(value))
    if key == "gpu":
        return "gpu-" + _slug(str(value))
    if key == "workers":
        return f"w{value}"
    if key == "load_scale":
        return f"load{_slug(format_scale(value))}"
    return f"err{_slug(format_error(value))}"


class _Names:
    """Hands out file names, suffixing a repeat so no figure overwrites another."""

    def __init__(self) -> None:
        self._used: set[str] = set()

    def take(self, stem: str) -> str:
        name, n = f"{stem}.png", 2
        while name in self._used:
            name, n = f"{stem}-{n}.png", n + 1
        self._used.add(name)
        return name


def _styles(rows: Sequence[AggregateRow]) -> dict[str, dict[str, Any]]:
    styles: dict[str, dict[str, Any]] = {}
    for row in rows:
        policy = row["policy"]
        if policy in styles:
            continue
        index = len(styles)
        styles[policy] = {
            "color": SERIES_COLOURS[index % len(SERIES_COLOURS)],
            "marker": SERIES_MARKERS[(index // len(SERIES_COLOURS)) % len(SERIES_MARKERS)],
            # The oracle is a yardstick, not a contender: dashed sets it apart.
            "linestyle": "--" if row["reference"] else "-",
        }
    return styles


def _save(figure: Figure, path: Path) -> None:
    try:
        figure.savefig(path, format="png")
    except OSError as exc:
        raise ReportError(f"cannot write {path}: {exc.strerror or exc}") from exc


def _cdf_plots(
    rows: Sequence[AggregateRow],
    out_dir: Path,
    names: _Names,
    styles: Mapping[str, Mapping[str, Any]],
    limit: int,
) -> list[PlotFile]:
    # gpu only splits figures when the runs hold several profiles; otherwise the key
    # is the brief's (trace, workers, load, error) and file names stay short.
    keys = ["trace", "workers", "load_scale", "predictor_error"]
    if len({row["gpu"] for row in rows}) > 1:
        keys.insert(1, "gpu")
    groups: dict[tuple[Any, ...], list[AggregateRow]] = {}
    for row in rows:
        if row.get("latency_quantiles_s"):
            groups.setdefault(tuple(row[k] for k in keys), []).append(row)
    written: list[PlotFile] = []
    for group in groups.values():
        if len(written) >= limit:
            break
        figure, axes = new_figure()
        drawn = 0
        for row in group:
            quantiles: list[float] = row["latency_quantiles_s"]
            levels = [i / (len(quantiles) - 1) for i in range(len(quantiles))]
            # A log axis cannot show zero latency; those points carry no shape anyway.
            points = [
                (q, p) for q, p in zip(quantiles, levels, strict=True) if q > 0 and math.isfinite(q)
            ]
            if not points:
                continue
            style = styles[row["policy"]]
            axes.plot(
                [q for q, _ in points],
                [p for _, p in points],
                label=policy_label(row),
                color=style["color"],
                linestyle=style["linestyle"],
                linewidth=1.6,
            )
            drawn += 1
        if not drawn:
            continue
        title = f"Latency CDF: {describe_scenario(group[0], keys)}"
        axes.set_xscale("log")
        axes.set_xlabel("request latency (s, log scale)")
        axes.set_ylabel("fraction of requests")
        axes.set_ylim(0.0, 1.0)
        axes.set_title(title, fontsize=10)
        axes.grid(True, which="both", alpha=0.3)
        axes.legend(fontsize=8, loc="lower right")
        path = out_dir / names.take("cdf_" + "_".join(_name_part(k, group[0][k]) for k in keys))
        _save(figure, path)
        written.append(PlotFile(path, title, "cdf"))
    return written


def _sweep_plots(
    rows: Sequence[AggregateRow],
    out_dir: Path,
    names: _Names,
    styles: Mapping[str, Mapping[str, Any]],
    limit: int,
) -> list[PlotFile]:
    varying = set(varying_keys(rows))
    written: list[PlotFile] = []
    for axis, short, axis_label in _SWEEPS:
        if axis not in varying:
            continue
        # The trace is always named (the brief's p99_vs_workers_azure-conv.png); other
        # fixed fields only when the runs vary them, so each file name is unique.
        fixed = [k for k in SCENARIO_KEYS if k != axis and (k == "trace" or k in varying)]
        groups: dict[tuple[Any, ...], list[AggregateRow]] = {}
        for row in rows:
            groups.setdefault(tuple(row[k] for k in fixed), []).append(row)
        for group in groups.values():
            if len({row[axis] for row in group}) < 2:
                continue
            for metric, metric_label, scale in (
                ("p99_s", "P99 latency (s)", 1.0),
                ("slo_violation_rate", "SLO violation rate (%)", 100.0),
            ):
                if len(written) >= limit:
                    return written
                written.append(
                    _sweep_figure(
                        group,
                        axis=axis,
                        axis_label=axis_label,
                        metric=metric,
                        metric_label=metric_label,
                        scale=scale,
                        styles=styles,
                        title=f"{metric_label} vs {short}: {describe_scenario(group[0], fixed)}",
                        path=out_dir
                        / names.take(
                            f"{'p99' if metric == 'p99_s' else 'slo'}_vs_{short}_"
                            + "_".join(_name_part(k, group[0][k]) for k in fixed)
                        ),
                    )
                )
    return written


def _sweep_figure(
    group: Sequence[AggregateRow],
    *,
    axis: str,
    axis_label: str,
    metric: str,
    metric_label: str,
    scale: float,
    styles: Mapping[str, Mapping[str, Any]],
    title: str,
    path: Path,
) -> PlotFile:
    figure, axes = new_figure()
    x_scale = 100.0 if axis == "predictor_error" else 1.0
    by_policy: dict[str, list[AggregateRow]] = {}
    for row in group:
        by_policy.setdefault(row["policy"], []).append(row)
    for policy, members in by_policy.items():
        members = sorted(members, key=lambda r: r[axis])
        xs = [r[axis] * x_scale for r in members]
        ys = [r[metric] * scale for r in members]
        # Error bars span the lowest to the highest seed: with three seeds a range says
        # more than a standard deviation.
        below = [max(0.0, (r[metric] - r[f"{metric}_min"]) * scale) for r in members]
        above = [max(0.0, (r[f"{metric}_max"] - r[metric]) * scale) for r in members]
        style = styles[policy]
        axes.errorbar(
            xs,
            ys,
            yerr=[
                [0.0 if math.isnan(v) else v for v in below],
                [0.0 if math.isnan(v) else v for v in above],
            ],
            label=policy_label(members[0]),
            color=style["color"],
            linestyle=style["linestyle"],
            marker=style["marker"],
            markersize=4,
            capsize=3,
            linewidth=1.5,
        )
    values = sorted({row[axis] * x_scale for row in group})
    if axis == "workers" and values[0] > 0:
        # Cluster sizes grow geometrically (4, 8, 16, 32): even spacing on a log axis.
        axes.set_xscale("log", base=2)
        axes.minorticks_off()
    axes.set_xticks(values, labels=[f"{v:g}" for v in values])
    axes.set_xlabel(axis_label)
    axes.set_ylabel(metric_label)
    axes.set_ylim(bottom=0.0)
    axes.set_title(title, fontsize=10)
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8)
    _save(figure, path)
    return PlotFile(path, title, "sweep")


def write_plot_files(
    runs: Iterable[Mapping[str, Any]],
    out_dir: Path,
    *,
    max_cdf_figures: int = 12,
    max_sweep_figures: int = 24,
) -> list[PlotFile]:
    """Like :func:`write_plots`, returning each figure's title with its path."""
    require_matplotlib()
    rows = aggregate(runs)
    ensure_out_dir(out_dir)
    if not rows:
        return []
    names = _Names()
    styles = _styles(rows)
    return [
        *_cdf_plots(rows, out_dir, names, styles, max_cdf_figures),
        *_sweep_plots(rows, out_dir, names, styles, max_sweep_figures),
    ]


def write_plots(
    runs: Iterable[Mapping[str, Any]],
    out_dir: Path,
    *,
    max_cdf_figures: int = 12,
    max_sweep_figures: int = 24,
) -> list[Path]:
    """Draw the report's figures as PNG files in ``out_dir`` (created if missing).

    Runs are first averaged over seeds (:func:`~research.report.table.aggregate`).

    - ``cdf_{trace}_w{workers}_load{scale}_err{percent}.png``: one latency CDF per
      (trace, workers, load scale, predictor error), one line per policy, log latency
      axis; the first ``max_cdf_figures`` such groups, in run order. Needs
      ``latency_quantiles_s`` in the runs.
    - ``p99_vs_workers_{trace}.png`` and ``slo_vs_workers_{trace}.png`` when the runs
      hold several cluster sizes; likewise ``*_vs_load_*`` for several load scales and
      ``*_vs_error_*`` for several predictor error levels. One line per policy, error
      bars from the lowest to the highest seed, the reference dashed. When the runs
      vary another field too, its value joins the name (``p99_vs_workers_azure-conv_err20.png``).
      At most ``max_sweep_figures`` of them.

    A ``gpu-{profile}`` part joins every name when the runs hold several GPU profiles.

    Returns:
        The written paths, CDFs first.

    Raises:
        ReportError: matplotlib is missing (install ``switchyard[report]``), ``out_dir``
            is a file, or the runs are malformed.
    """
    files = write_plot_files(
        runs, out_dir, max_cdf_figures=max_cdf_figures, max_sweep_figures=max_sweep_figures
    )
    return [plot.path for plot in files]
