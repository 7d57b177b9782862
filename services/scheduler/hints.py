"""The scheduler's join of requests with their predictions and estimates.

Predictions and SneakPeek estimates travel on their own topics and may arrive before
or after the request they belong to. :class:`HintBook` keeps the recent ones by request
id (bounded) and lets the scheduler wait for a set of them with one deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import Iterable
from typing import Generic, TypeVar

H = TypeVar("H")

DEFAULT_CAPACITY = 200_000


class HintBook(Generic[H]):
    """Recent hints by request id, and waiters for the missing ones.

    A hint is kept until taken or until ``capacity`` newer ones pushed it out (a hint
    for a request that never reaches this replica must not stay forever).
    """

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self._capacity = capacity
        self._hints: OrderedDict[str, H] = OrderedDict()
        self._waiters: dict[str, asyncio.Future[None]] = {}

    def __len__(self) -> int:
        return len(self._hints)

    def put(self, request_id: str, hint: H) -> None:
        """Record a hint; wakes whoever waits for it."""
        self._hints[request_id] = hint
        self._hints.move_to_end(request_id)
        while len(self._hints) > self._capacity:
            self._hints.popitem(last=False)
        waiter = self._waiters.pop(request_id, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def get(self, request_id: str) -> H | None:
        return self._hints.get(request_id)

    def take(self, request_id: str) -> H | None:
        """The hint, forgotten from the book (a request is decided once)."""
        return self._hints.pop(request_id, None)

    async def wait_for(self, request_ids: Iterable[str], timeout_s: float) -> None:
        """Return once every one of ``request_ids`` has a hint, or ``timeout_s`` passed."""
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[None]] = []
        for request_id in request_ids:
            if request_id in self._hints:
                continue
            waiter = self._waiters.get(request_id)
            if waiter is None or waiter.done():
                waiter = self._waiters[request_id] = loop.create_future()
            futures.append(waiter)
        if not futures or timeout_s <= 0:
            self._forget(futures)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*futures), timeout_s)
        self._forget(futures)

    def _forget(self, futures: list[asyncio.Future[None]]) -> None:
        done = set(map(id, futures))
        for request_id in [r for r, f in self._waiters.items() if id(f) in done]:
            waiter = self._waiters.pop(request_id)
            if not waiter.done():
                waiter.cancel()
