"""Bus middleware: code that wraps every publish and every handled message.

Tracing lives here (see :mod:`switchyard.telemetry.bus_tracing`), never in handlers.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
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
