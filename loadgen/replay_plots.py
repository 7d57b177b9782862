"""A replay's figures as PNG plots: the latency CDF per application, latency over time
with a rolling P99, and the latency breakdown.

matplotlib (the ``report`` extra) is imported only when :func:`write_plots` draws;
without it :func:`write_plots` raises :class:`~switchyard.figures.ReportError` naming
the extra. When emulated workers answered, the titles say the latencies are modelled.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from switchyard.figures import ReportError, ensure_out_dir
from switchyard.stats import quantile

from loadgen.replay_records import OK, RequestRecord
from loadgen.replay_summary import breakdown

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = [
    "write_plots",
]

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
        out.append(quantile(values[max(0, end - window) : end], q))
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
