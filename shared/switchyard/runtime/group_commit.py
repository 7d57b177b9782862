"""Group commit: many callers' small writes go out as one batch, with no added wait.

A caller :meth:`GroupCommit.submit`\\ s one item and awaits its own result. While no
batch is in flight, the first item starts one at once (nothing waits for company); items
that arrive while a batch is in flight wait for it to finish and then go out together in
the next. Under light load every item is its own batch, as a direct call would be; under
heavy load the batches grow with the round trip, so a store is asked once per round trip
instead of once per item (the ingress's request records at 1,000 calls a second).

At most one batch is in flight, so results come back in submission order. When a batch
fails, every caller in it gets the exception; the next batch is unaffected.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

Flush = Callable[[Sequence[T]], Awaitable[Sequence[R]]]
"""Writes a batch; returns one result per item, in order."""


class GroupCommit(Generic[T, R]):
    """Batches concurrent :meth:`submit` calls into calls of ``flush`` (module docs).

    Args:
        flush: writes a batch and returns a result per item, in order.
        max_batch: the most items one flush takes; the rest wait for the next.
    """

    def __init__(self, flush: Flush[T, R], *, max_batch: int = 256) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        self._flush = flush
        self._max_batch = max_batch
        self._pending: list[tuple[T, asyncio.Future[R]]] = []
        self._running: asyncio.Task[None] | None = None
        self.batches = 0
        """Flushes made so far (batch size = items / batches)."""

    async def submit(self, item: T) -> R:
        """Write ``item`` with whatever else is waiting; its result, or the batch's error."""
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        if self._running is None:
            self._running = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        try:
            while self._pending:
                batch = self._pending[: self._max_batch]
                del self._pending[: self._max_batch]
                self.batches += 1
                try:
                    results = await self._flush([item for item, _ in batch])
                    if len(results) != len(batch):
                        raise RuntimeError(
                            f"a flush of {len(batch)} items returned {len(results)} results"
                        )
                except BaseException as exc:
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    if isinstance(exc, asyncio.CancelledError):
                        raise
                    continue
                for (_, future), result in zip(batch, results, strict=True):
                    if not future.done():
                        future.set_result(result)
        finally:
            self._running = None
            for _, future in self._pending:
                if not future.done():
                    future.cancel()
            self._pending.clear()


__all__ = ["Flush", "GroupCommit"]
