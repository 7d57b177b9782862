"""Dead letters counted where an operator looks: ``cluster:stats`` field ``dead_letters``.

The dead-letter topic holds the letters themselves (``switchyard dead-letters`` prints
them); this count is what ``switchyard status`` shows without reading the topic. It is
a bus middleware, so every service counts the letters it sends. The count is
best effort: it starts again when the state store loses its data, and a failed write is
logged, never a reason to fail the service.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from contextlib import AbstractContextManager

from switchyard.bus.records import Envelope
from switchyard.state import keys
from switchyard.state.base import StateStore

log = logging.getLogger(__name__)

_NOTHING: AbstractContextManager[None] = contextlib.nullcontext()


class DeadLetterTally:
    """A :class:`~switchyard.bus.middleware.BusMiddleware` that counts dead letters."""

    def __init__(self, state: StateStore) -> None:
        self.state = state
        self._writes: set[asyncio.Task[None]] = set()

    def publishing(
        self, topic: str, message_type: str, headers: list[tuple[str, bytes]]
    ) -> AbstractContextManager[None]:
        return _NOTHING

    def consuming(
        self, envelope: Envelope, group: str, message_type: str
    ) -> AbstractContextManager[None]:
        return _NOTHING

    def dead_lettered(self, envelope: Envelope, group: str, reason_kind: str) -> None:
        task = asyncio.get_running_loop().create_task(self._count())
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _count(self) -> None:
        try:
            await self.state.hincr_float(keys.CLUSTER_STATS, "dead_letters", 1.0)
        except Exception as exc:
            log.warning("a dead letter was not counted: %s", exc)
