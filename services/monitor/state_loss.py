"""Noticing that the state store lost its data (a Redis restarted without persistence, or
flushed), and giving it its answers back.

The store holds a random *generation* (``state:generation``, no time to live) once its
answers are in it, and every monitor reads it each liveness period. When it is gone,
everything in the store went with it: request records, worker records and assigned
sets, leases, tenants' buckets. The monitor says so at ERROR with event ``state_lost``
and counts it (``switchyard.monitor.state_losses``), then reads the answers of the last
hour back from the answers topic, and the requests and assignments from theirs
(:mod:`services.monitor.restore`, in a task of its own while liveness goes on), and
only then writes a new generation. Meanwhile the request ledger refuses calls that name
their request id (503 ``state_restoring``): one that was answered before the loss gets
its answer once it is back, and one still in flight waits for its one answer, never a
second run. Workers record themselves again with their next heartbeat. The monitor's
unclaimed sweep waits as well (:meth:`MonitorService.sweep_unclaimed
<services.monitor.service.MonitorService.sweep_unclaimed>`).

A store without a generation when the monitor starts (a new one, or one that lost its
data while no monitor ran) is restored the same way; on a new stack the topics are
empty and that takes a moment. What cannot come back: what the broker no longer holds
(past its retention, or older than a record's lifetime), and an epoch the monitor moved
on without a message (an unclaimed assignment taken back comes back under the
assignment's own epoch, so the lost message, should it turn up, could start it).
docs/reliability.md says which Redis persistence prevents the loss.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable

from switchyard.state import StateStore, keys


class StateWatch:
    """Compares the store's generation with the one seen last, and restores a store
    without one (see the module docstring).

    Args:
        state: the store to watch.
        logger: where the loss is reported.
        on_loss: called once per loss noticed (a metric).
        restore: writes the answers back; returns how many (none: nothing to restore).
    """

    def __init__(
        self,
        state: StateStore,
        logger: logging.Logger,
        on_loss: Callable[[], None],
        restore: Callable[[], Awaitable[int]] | None = None,
    ) -> None:
        self.state = state
        self.logger = logger
        self.on_loss = on_loss
        self._restore = restore
        self._restoring: asyncio.Task[None] | None = None
        self.known: str | None = None
        self.losses = 0
        self.restored = 0

    @property
    def restoring(self) -> bool:
        """Whether a restore runs now."""
        return self._restoring is not None and not self._restoring.done()

    async def check(self) -> bool:
        """True when the store lost its data since the last check."""
        current = await self.state.get(keys.STATE_GENERATION)
        if current is None:
            lost = self.known is not None
            self.known = None
            if lost:
                self._report_loss()
            self._start_restoring()
            return lost
        # Another replica may have noticed the loss and restored it before this one looked.
        lost = self.known is not None and current != self.known
        self.known = current
        if lost:
            self._report_loss()
        return lost

    def _report_loss(self) -> None:
        self.losses += 1
        self.on_loss()
        self.logger.error(
            "the state store lost its data (a Redis restart without persistence, or a "
            "flush): answers and requests in flight are being restored from the broker, "
            "and calls that name a request_id get 503 until then. Run Redis with the "
            "append-only file (docs/reliability.md)",
            extra={"event": "state_lost"},
        )

    def _start_restoring(self) -> None:
        task = self._restoring
        if task is not None and not task.done():
            return
        if task is not None and not task.cancelled() and (error := task.exception()):
            self.logger.warning("restoring the answers failed, trying again: %s", error)
        self._restoring = asyncio.create_task(self._restore_then_mark())

    async def _restore_then_mark(self) -> None:
        began = time.monotonic()
        restored = await self._restore() if self._restore is not None else 0
        self.restored += restored
        fresh = uuid.uuid4().hex
        if not await self.state.set_if_absent(keys.STATE_GENERATION, fresh):
            fresh = await self.state.get(keys.STATE_GENERATION) or fresh
        self.known = fresh
        # After a loss, a warning: it ends the refusals the loss began.
        self.logger.log(
            logging.WARNING if self.losses else logging.INFO,
            "the state store has its answers: %d restored from the broker in %.1f s; calls "
            "that name a request_id are accepted",
            restored,
            time.monotonic() - began,
            extra={"event": "state_restored", "restored": restored},
        )

    async def settled(self) -> None:
        """Wait for the restore in progress, if any (for tests and a clean stop)."""
        if self._restoring is not None:
            await asyncio.gather(self._restoring, return_exceptions=True)

    async def close(self) -> None:
        """Stop a restore in progress (the next monitor starts it again)."""
        if self._restoring is not None and not self._restoring.done():
            self._restoring.cancel()
            await asyncio.gather(self._restoring, return_exceptions=True)
