"""The window schedulers by name, one line each, shared by the simulator and the live shell.

Table order: the four data-oblivious schedulers, then their data-aware forms, then
SneakPeek (data-aware grouping with short-circuit inference).

Example:
    >>> make_window_scheduler("lo-edf").name
    'lo-edf'
"""

from __future__ import annotations

from collections.abc import Callable

from switchyard.selection.base import WindowScheduler
from switchyard.selection.edf import ChoiceKind, OrderKind, SequentialScheduler
from switchyard.selection.grouped import DEFAULT_TAU, GroupedScheduler

__all__ = ["UnknownSchedulerError", "make_window_scheduler", "window_scheduler_names"]


class UnknownSchedulerError(ValueError):
    """A window scheduler name that is not registered; the message lists the known ones."""


def _seq(
    name: str, data_aware: bool, order: OrderKind, choice: ChoiceKind
) -> Callable[[int], WindowScheduler]:
    def make(tau: int) -> WindowScheduler:
        del tau  # request-by-request: no search to bound
        return SequentialScheduler(name=name, data_aware=data_aware, order=order, choice=choice)

    return make


def _grouped(name: str, data_aware: bool, short_circuit: bool) -> Callable[[int], WindowScheduler]:
    def make(tau: int) -> WindowScheduler:
        return GroupedScheduler(
            name=name, data_aware=data_aware, short_circuit=short_circuit, tau=tau
        )

    return make


_SCHEDULERS: dict[str, Callable[[int], WindowScheduler]] = {
    "maxacc-edf": _seq("maxacc-edf", False, "deadline", "max-accuracy"),
    "lo-edf": _seq("lo-edf", False, "deadline", "locally-optimal"),
    "lo-priority": _seq("lo-priority", False, "priority", "locally-optimal"),
    "grouped": _grouped("grouped", False, False),
    "maxacc-edf-da": _seq("maxacc-edf-da", True, "deadline", "max-accuracy"),
    "lo-edf-da": _seq("lo-edf-da", True, "deadline", "locally-optimal"),
    "lo-priority-da": _seq("lo-priority-da", True, "priority", "locally-optimal"),
    "grouped-da": _grouped("grouped-da", True, False),
    "sneakpeek": _grouped("sneakpeek", True, True),
}


def window_scheduler_names() -> tuple[str, ...]:
    """Every registered name, in table order."""
    return tuple(_SCHEDULERS)


def make_window_scheduler(name: str, *, tau: int = DEFAULT_TAU) -> WindowScheduler:
    """A fresh scheduler by name; ``tau`` bounds the exact search of the grouped ones.

    Raises:
        UnknownSchedulerError: for a name not registered (the message lists the known).
        ValueError: naming ``tau`` when it is negative.
    """
    make = _SCHEDULERS.get(name)
    if make is None:
        raise UnknownSchedulerError(
            f"unknown window scheduler {name!r}; known: {', '.join(_SCHEDULERS)}"
        )
    if tau < 0:
        raise ValueError(f"tau: must be >= 0, got {tau!r}")
    return make(tau)
