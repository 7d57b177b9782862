"""The window scheduler Protocol, its plan, and the arithmetic every scheduler shares.

A scheduler is pure and synchronous: given a :class:`WindowSnapshot` and a
:class:`~switchyard.policies.base.DecisionContext` it returns a :class:`WindowPlan`
(which variant serves which requests, on which worker, when), and nothing else. The
shell executes the plan: it runs each batch's real model, and scores every request by
whether its answer was right and how late it came.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from switchyard.policies.base import DecisionContext
from switchyard.selection.snapshot import AppView, VariantView, WindowRequest, WindowSnapshot

__all__ = [
    "PlannedBatch",
    "WindowPlan",
    "WindowScheduler",
    "batch_latency_s",
    "expected_accuracy",
    "priority",
]


@dataclass(frozen=True, slots=True)
class PlannedBatch:
    """One batch on one worker: a swap (when ``swap_s`` > 0), then one inference."""

    worker_id: str
    app: str
    variant: str
    request_ids: tuple[str, ...]
    start_s: float
    """When the worker starts on it (the swap, if any, comes first)."""
    swap_s: float
    end_s: float
    """When every answer of the batch is ready."""


@dataclass(frozen=True, slots=True)
class WindowPlan:
    """A window's decisions. Every request of the snapshot appears exactly once: in a
    batch, among ``short_circuited`` (answered at ``now_s`` with SneakPeek's own label),
    or among ``rejected`` with the reason."""

    batches: tuple[PlannedBatch, ...]
    short_circuited: tuple[str, ...] = ()
    rejected: tuple[tuple[str, str], ...] = ()
    expected_utility: float = 0.0
    """The utility the scheduler expects of the plan (its own objective's value)."""


class WindowScheduler(Protocol):
    """Plans one window. ``data_aware`` tells the shell to attach SneakPeek estimates."""

    @property
    def name(self) -> str: ...

    @property
    def data_aware(self) -> bool: ...

    def schedule(self, snapshot: WindowSnapshot, ctx: DecisionContext) -> WindowPlan: ...


def batch_latency_s(variant: VariantView, worker_type: str, size: int) -> float:
    """Seconds for ``variant`` to answer ``size`` requests at once on ``worker_type``.

    The smallest profiled batch size ``>= size`` gives the time; a batch larger than
    every profiled size runs as ``ceil(size / largest)`` batches of the largest, one
    after another. Example: profile {1: 0.002, 8: 0.005, 32: 0.012}: size 5 -> 0.005 s,
    size 40 -> 2 x 0.012 = 0.024 s.

    Raises:
        KeyError: when the variant has no profile for ``worker_type``.
    """
    if size <= 0:
        return 0.0
    by_size = variant.latency_s[worker_type]
    fits = [b for b in by_size if b >= size]
    if fits:
        return by_size[min(fits)]
    largest = max(by_size)
    return math.ceil(size / largest) * by_size[largest]


def expected_accuracy(request: WindowRequest, variant: VariantView) -> float:
    """The scheduler's belief that ``variant`` answers ``request`` right: SneakPeek's
    estimate when the request carries one, else the variant's profiled accuracy."""
    if request.expected_accuracy is not None and variant.name in request.expected_accuracy:
        return request.expected_accuracy[variant.name]
    return variant.accuracy


def priority(request: WindowRequest, app: AppView, now_s: float) -> float:
    """``(1 + Var[accuracy across the app's variants]) * exp(-d)``, ``d`` the time left to
    the deadline in seconds: urgent requests, and requests whose variant choice matters
    more, come first. Example: variants expected at 0.9 and 0.7 (variance 0.01), 150 ms
    left: ``1.01 * exp(-0.15) = 0.869``."""
    accuracies = [expected_accuracy(request, v) for v in app.variants]
    mean = sum(accuracies) / len(accuracies)
    variance = sum((a - mean) ** 2 for a in accuracies) / len(accuracies)
    left_s = request.deadline_s - now_s
    return (1.0 + variance) * math.exp(-left_s)
