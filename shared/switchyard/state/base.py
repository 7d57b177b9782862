"""The state store contract: the shared state the scheduler and monitor keep.

Values are strings (numbers are written as decimal text); every key lives under the
store's prefix, which callers never repeat. Redis implements it for deployments, memory
for the embedded mode and the fast tests; ``tests/contract/test_state_contract.py`` holds
both to the same behaviour.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol


class StateStore(Protocol):
    """Async access to shared state. Every method may raise :class:`~switchyard.errors.StateError`:
    retriable when the store is unreachable, not retriable when a key holds another type."""

    prefix: str

    async def ping(self) -> None:
        """Return when the store answers; raise a retriable ``StateError`` otherwise."""
        ...

    async def close(self) -> None: ...

    # -- plain keys ------------------------------------------------------------------

    async def get(self, key: str) -> str | None: ...

    async def set(self, key: str, value: str, *, ttl_s: float | None = None) -> None:
        """Write ``value``; with ``ttl_s`` the key disappears that many seconds later."""
        ...

    async def set_if_absent(self, key: str, value: str, *, ttl_s: float | None = None) -> bool:
        """Write only when the key does not exist; True when this call wrote it.

        The building block of idempotency: the first handler of a request claims it.
        """
        ...

    async def compare_and_set(
        self, key: str, expected: str | None, new: str, *, ttl_s: float | None = None
    ) -> bool:
        """Atomically write ``new`` if the key holds ``expected`` (``None``: does not exist).

        Returns True when written. Atomic across every client of the store.
        """
        ...

    async def delete(self, *keys: str) -> int:
        """Delete keys of any type; returns how many existed."""
        ...

    async def exists(self, key: str) -> bool: ...

    async def expire(self, key: str, ttl_s: float) -> bool:
        """Give an existing key a time to live; False when the key does not exist."""
        ...

    async def ttl_s(self, key: str) -> float | None:
        """Seconds left to live; None when the key does not exist or never expires."""
        ...

    # -- counters --------------------------------------------------------------------

    async def incr(self, key: str, amount: int = 1) -> int:
        """Add ``amount`` to an integer counter (missing counts as 0); returns the new value."""
        ...

    async def incr_float(self, key: str, amount: float) -> float: ...

    # -- hashes ----------------------------------------------------------------------

    async def hset(self, key: str, mapping: Mapping[str, str]) -> None: ...

    async def hget(self, key: str, field: str) -> str | None: ...

    async def hgetall(self, key: str) -> dict[str, str]: ...

    async def hdel(self, key: str, *fields: str) -> int: ...

    async def hincr_float(self, key: str, field: str, amount: float) -> float: ...

    # -- sorted sets -----------------------------------------------------------------

    async def zadd(self, key: str, mapping: Mapping[str, float]) -> None:
        """Add members with scores, or update the scores of existing members."""
        ...

    async def zrem(self, key: str, *members: str) -> int: ...

    async def zscore(self, key: str, member: str) -> float | None: ...

    async def zrange_by_score(
        self, key: str, min_score: float, max_score: float, *, limit: int | None = None
    ) -> list[tuple[str, float]]:
        """Members with ``min_score <= score <= max_score``, ascending by score then member."""
        ...

    async def zcard(self, key: str) -> int: ...

    # -- housekeeping ----------------------------------------------------------------

    async def clear_prefix(self) -> int:
        """Delete every key under this store's prefix; returns how many were deleted."""
        ...
