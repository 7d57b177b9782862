"""Output folders and figures shared by every report (the replay's and the research
tools'): the error a report raises, the folder check, and one figure style.

matplotlib is an optional dependency (the ``report`` extra). It is imported inside the
functions that draw, never when this module is imported. Figures are drawn on the Agg
canvas directly, without pyplot, so the caller's matplotlib backend and global figure
state are left untouched.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from switchyard.errors import SwitchyardError

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "INSTALL_HINT",
    "SERIES_COLOURS",
    "SERIES_MARKERS",
    "ReportError",
    "ensure_out_dir",
    "new_figure",
    "require_matplotlib",
]

INSTALL_HINT = "pip install 'switchyard[report]'"

# One colour per series, stable across every figure of a report (tab10, then a few
# more distinct ones); past these, markers tell series apart.
SERIES_COLOURS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
    "#393b79",
    "#637939",
)
SERIES_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


class ReportError(SwitchyardError):
    """A report cannot be built: malformed runs, a missing optional package, a bad path."""


def ensure_out_dir(out_dir: Path) -> Path:
    """Create the report folder if missing; refuse a path that is an existing file.

    Raises:
        ReportError: ``out_dir`` is a file, or cannot be created.
    """
    if out_dir.exists() and not out_dir.is_dir():
        raise ReportError(
            f"cannot write the report into {out_dir}: a file with that name exists; "
            "choose a folder name that is free or already a folder"
        )
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ReportError(
            f"cannot create the report folder {out_dir}: {exc.strerror or exc}"
        ) from exc
    return out_dir


def require_matplotlib() -> None:
    """Raise :class:`ReportError` naming the extra to install when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise ReportError(
            f"plots need matplotlib, which is not installed; install the report extra: {INSTALL_HINT}"
        ) from exc


def new_figure() -> tuple[Figure, Axes]:
    """A figure of the reports' size on an Agg canvas (no pyplot, no global state), with
    one axes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # Constrained layout keeps long legends and labels inside the image without the
    # warnings tight_layout raises for some legends.
    figure = Figure(figsize=(7.0, 4.4), dpi=110, layout="constrained")
    FigureCanvasAgg(figure)
    return figure, figure.add_subplot()
