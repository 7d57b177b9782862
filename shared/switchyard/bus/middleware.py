"""Bus middleware: code that wraps every publish and every handled message, and the
helpers that enter and leave the scopes of several middlewares at once.

Tracing lives here (see :mod:`switchyard.telemetry.bus_tracing`), never in handlers.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Protocol

from switchyard.bus.records import Envelope


class BusMiddleware(Protocol):
    """Hooks the bus calls around publishing and handling."""

    def publishing(
        self, topic: str, message_type: str, headers: list[tuple[str, bytes]]
    ) -> AbstractContextManager[None]:
        """Wrap one publish. May append to ``headers`` before the record is built."""
        ...

    def consuming(
        self, envelope: Envelope, group: str, message_type: str
    ) -> AbstractContextManager[None]:
        """Wrap the handling of one delivered message.

        The context is entered after the message was decoded and exited when its handler
        finished; an exception from the handler is passed to ``__exit__``.
        """
        ...

    def dead_lettered(self, envelope: Envelope, group: str, reason_kind: str) -> None:
        """Called once a message was published to the dead-letter topic."""
        ...


class enter_all(AbstractContextManager[None]):  # noqa: N801 - used like contextlib helpers
    """Enter several context managers in order and exit them in reverse."""

    def __init__(self, managers: Iterable[AbstractContextManager[None]]) -> None:
        self._managers = list(managers)
        self._entered: list[AbstractContextManager[None]] = []

    def __enter__(self) -> None:
        for manager in self._managers:
            manager.__enter__()
            self._entered.append(manager)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        exit_all(self._entered, exc)


def exit_all(entered: list[AbstractContextManager[None]], exc: BaseException | None) -> None:
    """Exit the ``entered`` context managers in reverse order, passing them ``exc``."""
    for manager in reversed(entered):
        if exc is None:
            manager.__exit__(None, None, None)
        else:
            manager.__exit__(type(exc), exc, exc.__traceback__)
