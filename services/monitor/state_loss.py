"""Noticing that the state store lost its data: a Redis restarted without persistence, or
flushed.

The first monitor to start writes a random *generation* (``state:generation``, no time to
live) and every monitor reads it each liveness period. When it is gone, everything in the
store went with it: request records (accepted requests not yet answered are lost, and a
retry with their ``request_id`` is a new request), worker records and assigned sets,
leases, tenants' buckets. The monitor says so at ERROR with event ``state_lost`` and
counts it (``switchyard.monitor.state_losses``), then writes a new generation; workers
record themselves again with their next heartbeat. docs/reliability.md says which Redis
persistence prevents it.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

from switchyard.state import StateStore, keys


class StateWatch:
    """Compares the store's generation with the one seen last (see the module docstring).

    Args:
        state: the store to watch.
        logger: where the loss is reported.
        on_loss: called once per loss noticed (a metric).
    """

    def __init__(
        self, state: StateStore, logger: logging.Logger, on_loss: Callable[[], None]
    ) -> None:
        self.state = state
        self.logger = logger
        self.on_loss = on_loss
        self.known: str | None = None
        self.losses = 0

    async def check(self) -> bool:
        """True when the store lost its data since the last check."""
        current = await self.state.get(keys.STATE_GENERATION)
        if current is None:
            fresh = uuid.uuid4().hex
            if not await self.state.set_if_absent(keys.STATE_GENERATION, fresh):
                fresh = await self.state.get(keys.STATE_GENERATION) or fresh
            current = fresh
        lost = self.known is not None and current != self.known
        self.known = current
        if lost:
            self.losses += 1
            self.on_loss()
            self.logger.error(
                "the state store lost its data (a Redis restart without persistence, or a "
                "flush): the records of requests accepted before are gone and those not yet "
                "answered will not be; clients must retry them. Run Redis with the "
                "append-only file (docs/reliability.md)",
                extra={"event": "state_lost"},
            )
        return lost
