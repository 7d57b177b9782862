"""What a window scheduler sees: frozen views of one scheduling window.

Every window (100 ms by default) the shell (the simulator now, the live scheduler
later) gathers the classification requests that arrived, attaches SneakPeek's estimate
to each when the scheduler is data-aware, and hands a :class:`WindowSnapshot` to a
:class:`~switchyard.selection.base.WindowScheduler`, which returns a
:class:`~switchyard.selection.base.WindowPlan`. Times are seconds on the shell's
clock; a policy reads no clock of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from switchyard.apps.penalty import Penalty

__all__ = [
    "CONFIDENT_THETA",
    "AppView",
    "VariantView",
    "WindowRequest",
    "WindowSnapshot",
    "WorkerSlot",
]

CONFIDENT_THETA = 0.5
"""SneakPeek's label is trusted (to split groups) when its class frequency exceeds this."""


@dataclass(frozen=True, slots=True, kw_only=True)
class VariantView:
    """One model variant of an application, as profiled.

    ``latency_s`` maps a worker type to {batch size: seconds for one batch of that
    size}. A batch of ``n`` takes the time of the smallest profiled size ``>= n``; a
    batch larger than every profiled size runs as several batches of the largest.
    """

    name: str
    latency_s: Mapping[str, Mapping[int, float]]
    load_s: float
    """Time to swap the variant in on a worker where another one is loaded."""
    accuracy: float
    """Profiled accuracy on the test split: what a data-oblivious scheduler expects."""
    recall: tuple[float, ...]
    """Profiled recall per class."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AppView:
    """One application: its classes, lateness penalty and variants."""

    name: str
    num_classes: int
    penalty: Penalty
    variants: tuple[VariantView, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class WindowRequest:
    """One request to schedule.

    ``theta`` is SneakPeek's posterior class frequencies for the request and
    ``expected_accuracy`` each variant's ``sum_c theta_c * recall_c``; both are ``None``
    when the scheduler is data-oblivious or no estimate arrived in time (the request is
    then scheduled on profiled accuracy).
    """

    request_id: str
    app: str
    arrival_s: float
    deadline_s: float
    """Absolute: the time by which the answer is on time."""
    theta: tuple[float, ...] | None = None
    expected_accuracy: Mapping[str, float] | None = None

    @property
    def predicted_label(self) -> int | None:
        """SneakPeek's label (argmax theta), or ``None`` without an estimate."""
        if self.theta is None:
            return None
        return self.theta.index(max(self.theta))

    @property
    def sneakpeek_accuracy(self) -> float | None:
        """The chance SneakPeek's own label is right: ``max(theta)``."""
        return None if self.theta is None else max(self.theta)

    @property
    def confident(self) -> bool:
        """Whether SneakPeek's label is more likely than all the others together."""
        return self.theta is not None and max(self.theta) > CONFIDENT_THETA

    @property
    def confident_label(self) -> int | None:
        """:attr:`predicted_label` when :attr:`confident`, else ``None``, in one pass."""
        theta = self.theta
        if theta is None:
            return None
        top = max(theta)
        return theta.index(top) if top > CONFIDENT_THETA else None


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerSlot:
    """One worker as the window begins."""

    worker_id: str
    worker_type: str
    free_at_s: float
    """When the work already planned on it ends (``<= now_s``: idle)."""
    loaded: tuple[str, str] | None = None
    """The (application, variant) resident on it, whose next batch needs no swap."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WindowSnapshot:
    """One window to schedule: the requests, the applications they name, the workers."""

    now_s: float
    requests: tuple[WindowRequest, ...]
    apps: Mapping[str, AppView]
    workers: tuple[WorkerSlot, ...]
