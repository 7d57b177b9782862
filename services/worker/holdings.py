"""What a worker holds: the requests waiting in its queue or running, by request id.

Shared by the worker's intake (which adds), its engine and reporting (which remove), and
its heartbeats (which list). Pure data: no I/O.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

from services.worker.queue import LocalQueue, WorkItem

SEEN_LIMIT = 100_000
"""Most request ids whose highest taken epoch is remembered in memory (oldest forgotten;
the request ledger's fence still catches a duplicate after that)."""


class Holdings:
    """The worker's queue, what it holds (waiting or running), and the epochs it took.

    Attributes:
        worker_id: whose holdings these are.
        queue: the waiting requests, in scheduler order.
        held: every request waiting or running here, by id.
        wake: set when new work arrives, so the engine looks again.
    """

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self.queue = LocalQueue()
        self.held: dict[str, WorkItem] = {}
        self.wake = asyncio.Event()
        self._seen: OrderedDict[str, int] = OrderedDict()

    def seen_epoch(self, request_id: str) -> int | None:
        """The highest epoch of ``request_id`` this worker took, or None."""
        return self._seen.get(request_id)

    def remember(self, request_id: str, epoch: int) -> None:
        """Remember that ``epoch`` of ``request_id`` was taken (or passed over)."""
        self._seen[request_id] = max(epoch, self._seen.get(request_id, epoch))
        self._seen.move_to_end(request_id)
        while len(self._seen) > SEEN_LIMIT:
            self._seen.popitem(last=False)

    def add(self, item: WorkItem) -> None:
        """Queue ``item`` and wake the engine."""
        self.queue.push(item)
        self.held[item.request_id] = item
        self.wake.set()

    def forget(self, item: WorkItem) -> None:
        """``item`` finished, failed or moved: it is held no more."""
        if self.held.get(item.request_id) is item:
            del self.held[item.request_id]

    @property
    def running(self) -> int:
        """Requests held that are not waiting: they run."""
        return max(0, len(self.held) - len(self.queue))
