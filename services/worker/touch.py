"""Whether the worker may have been declared dead, and what it then stops running.

The monitor declares a worker down once it has heard no heartbeat for the worker
timeout, and its requests are re-assigned. A worker that was frozen (SIGSTOP, a paused
VM) or cut off from the network for that long does not know it: left alone it runs on
what it held, and the ledger's fence can only refuse the answer. :class:`Touch` keeps
when the worker last knew the control plane could see it (a heartbeat the broker took,
or its holdings checked against the ledger). The engine checks it before every step:
once out of touch for longer than the timeout, or after a gap that long between two
heartbeats (a stop the process did not see), :func:`drop_superseded` reads the record of
everything it holds and stops what was given to another worker. Until that read
succeeds (the store unreachable: cut off) it runs nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from switchyard.lifecycle import RequestLedger

from services.worker.backends.base import Backend
from services.worker.holdings import Holdings

log = logging.getLogger(__name__)


class Touch:
    """When the worker last knew the control plane could see it.

    Args:
        timeout_s: the worker timeout: silent this long, the monitor declares it down.
        clock: monotonic seconds.
    """

    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s = timeout_s
        self._clock = clock
        self._last_s = clock()
        self._gap = False

    def heard(self) -> None:
        """A heartbeat reached the broker. After a silence longer than the timeout the
        monitor may have declared the worker down meanwhile: the holdings need a check."""
        now_s = self._clock()
        if now_s - self._last_s > self.timeout_s:
            self._gap = True
        self._last_s = now_s

    def checked(self) -> None:
        """The holdings were checked against the ledger."""
        self._last_s = self._clock()
        self._gap = False

    def needs_check(self) -> bool:
        """Whether what the worker holds must be checked before it runs more of it."""
        return self._gap or self._clock() - self._last_s > self.timeout_s


async def drop_superseded(
    holdings: Holdings,
    backend: Backend,
    ledger: RequestLedger,
    on_dropped: Callable[[str], None] | None = None,
) -> list[str]:
    """Stop holding every request whose record no longer names this worker (it was
    re-assigned, or put back to be decided again, while this worker was out of touch);
    their ids. A waiting one leaves the queue, a running one is preempted (a backend that
    cannot preempt its batch lets it finish: its answer is refused). A request without a
    record is kept, and so is one given back to this worker at a newer epoch.

    Raises:
        StateError: the ledger could not be read (nothing is dropped).
    """
    items = list(holdings.held.values())
    records = await asyncio.gather(*(ledger.read(item.request_id) for item in items))
    dropped: list[str] = []
    for item, record in zip(items, records, strict=True):
        if record is None or record.worker_id == holdings.worker_id:
            continue  # still here (given back at a newer epoch: intake adopts the run)
        request_id = item.request_id
        if holdings.queue.remove(request_id) is None and backend.preempt(request_id) is None:
            continue  # its batch cannot be stopped
        holdings.forget(item)
        holdings.remember(request_id, record.epoch)
        if item.span is not None:
            item.span.end()
            item.span = None
        dropped.append(request_id)
        if on_dropped is not None:
            on_dropped(request_id)
    if dropped:
        log.warning(
            "stopped %d requests given to another worker while this one was out of touch: %s",
            len(dropped),
            ", ".join(dropped[:10]),
        )
    return dropped
