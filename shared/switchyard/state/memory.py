"""The in-memory state store: the embedded default and the fast test tier.

Single-process and asyncio-safe by construction: no method awaits between reading and
writing, so every operation is atomic with respect to other tasks, as on Redis.
Expiry is lazy (a key is dropped when touched after its deadline) against an injected
clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TypeVar

from switchyard.errors import StateError

T = TypeVar("T")

_Value = str | dict[str, str] | dict[str, float]


class MemoryStateStore:
    """A :class:`~switchyard.state.base.StateStore` in a dict."""

    def __init__(
        self, prefix: str = "switchyard:", *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.prefix = prefix
        self._clock = clock
        self._data: dict[str, tuple[str, _Value]] = {}  # key -> (type name, value)
        self._expires_at: dict[str, float] = {}

    def sharing(self, prefix: str) -> MemoryStateStore:
        """Another client of this store's data under ``prefix``, as a second Redis client
        would be (the embedded mode gives one to each in-process service)."""
        other = MemoryStateStore(prefix, clock=self._clock)
        other._data = self._data
        other._expires_at = self._expires_at
        return other

    async def ping(self) -> None:
        return None

    async def close(self) -> None:
        return None

    # -- internals -------------------------------------------------------------------

    def _live(self, key: str) -> tuple[str, _Value] | None:
        deadline = self._expires_at.get(key)
        if deadline is not None and self._clock() >= deadline:
            self._data.pop(key, None)
            self._expires_at.pop(key, None)
        return self._data.get(key)

    def _typed(self, key: str, kind: str, factory: Callable[[], T]) -> T | None:
        entry = self._live(self.prefix + key)
        if entry is None:
            return None
        if entry[0] != kind:
            raise StateError(f"key {key!r} holds a {entry[0]}, not a {kind}", retriable=False)
        return entry[1]  # type: ignore[return-value]

    def _ensure(self, key: str, kind: str, factory: Callable[[], _Value]) -> _Value:
        full = self.prefix + key
        entry = self._live(full)
        if entry is None:
            entry = (kind, factory())
            self._data[full] = entry
        elif entry[0] != kind:
            raise StateError(f"key {key!r} holds a {entry[0]}, not a {kind}", retriable=False)
        return entry[1]

    def _write(self, key: str, value: str, ttl_s: float | None) -> None:
        full = self.prefix + key
        self._data[full] = ("string", value)
        if ttl_s is None:
            self._expires_at.pop(full, None)
        else:
            self._expires_at[full] = self._clock() + ttl_s

    # -- plain keys ------------------------------------------------------------------

    async def get(self, key: str) -> str | None:
        return self._typed(key, "string", str)

    async def set(self, key: str, value: str, *, ttl_s: float | None = None) -> None:
        self._write(key, value, ttl_s)

    async def set_if_absent(self, key: str, value: str, *, ttl_s: float | None = None) -> bool:
        if self._live(self.prefix + key) is not None:
            return False
        self._write(key, value, ttl_s)
        return True

    async def compare_and_set(
        self, key: str, expected: str | None, new: str, *, ttl_s: float | None = None
    ) -> bool:
        if self._typed(key, "string", str) != expected:
            return False
        self._write(key, new, ttl_s)
        return True

    async def delete(self, *keys: str) -> int:
        deleted = 0
        for key in keys:
            full = self.prefix + key
            if self._live(full) is not None:
                deleted += 1
            self._data.pop(full, None)
            self._expires_at.pop(full, None)
        return deleted

    async def exists(self, key: str) -> bool:
        return self._live(self.prefix + key) is not None

    async def expire(self, key: str, ttl_s: float) -> bool:
        full = self.prefix + key
        if self._live(full) is None:
            return False
        self._expires_at[full] = self._clock() + ttl_s
        return True

    async def ttl_s(self, key: str) -> float | None:
        full = self.prefix + key
        if self._live(full) is None or full not in self._expires_at:
            return None
        return max(0.0, self._expires_at[full] - self._clock())

    # -- counters --------------------------------------------------------------------

    async def incr(self, key: str, amount: int = 1) -> int:
        current = self._typed(key, "string", str) or "0"
        try:
            value = int(current) + amount
        except ValueError:
            raise StateError(f"key {key!r} is not an integer", retriable=False) from None
        self._keep_ttl_write(key, str(value))
        return value

    async def incr_float(self, key: str, amount: float) -> float:
        current = self._typed(key, "string", str) or "0"
        try:
            value = float(current) + amount
        except ValueError:
            raise StateError(f"key {key!r} is not a number", retriable=False) from None
        self._keep_ttl_write(key, repr(value))
        return value

    def _keep_ttl_write(self, key: str, value: str) -> None:
        # Like INCR on Redis: the value changes, the time to live does not.
        self._data[self.prefix + key] = ("string", value)

    # -- hashes ----------------------------------------------------------------------

    def _hash(self, key: str) -> dict[str, str]:
        value = self._ensure(key, "hash", dict)
        assert isinstance(value, dict)
        return value  # type: ignore[return-value]

    async def hset(self, key: str, mapping: Mapping[str, str]) -> None:
        if mapping:
            self._hash(key).update(mapping)

    async def hget(self, key: str, field: str) -> str | None:
        found: dict[str, str] | None = self._typed(key, "hash", dict)
        return None if found is None else found.get(field)

    async def hgetall(self, key: str) -> dict[str, str]:
        found: dict[str, str] | None = self._typed(key, "hash", dict)
        return dict(found or {})

    async def hdel(self, key: str, *fields: str) -> int:
        found: dict[str, str] | None = self._typed(key, "hash", dict)
        if found is None:
            return 0
        deleted = sum(1 for f in fields if found.pop(f, None) is not None)
        if not found:
            await self.delete(key)
        return deleted

    async def hincr_float(self, key: str, field: str, amount: float) -> float:
        fields = self._hash(key)
        try:
            value = float(fields.get(field, "0")) + amount
        except ValueError:
            raise StateError(
                f"field {field!r} of {key!r} is not a number", retriable=False
            ) from None
        fields[field] = repr(value)
        return value

    # -- sorted sets -----------------------------------------------------------------

    def _zset(self, key: str) -> dict[str, float]:
        value = self._ensure(key, "zset", dict)
        return value  # type: ignore[return-value]

    async def zadd(self, key: str, mapping: Mapping[str, float]) -> None:
        if mapping:
            self._zset(key).update({m: float(s) for m, s in mapping.items()})

    async def zrem(self, key: str, *members: str) -> int:
        found: dict[str, float] | None = self._typed(key, "zset", dict)
        if found is None:
            return 0
        removed = sum(1 for m in members if found.pop(m, None) is not None)
        if not found:
            await self.delete(key)
        return removed

    async def zscore(self, key: str, member: str) -> float | None:
        found: dict[str, float] | None = self._typed(key, "zset", dict)
        return None if found is None else found.get(member)

    async def zrange_by_score(
        self, key: str, min_score: float, max_score: float, *, limit: int | None = None
    ) -> list[tuple[str, float]]:
        found: dict[str, float] | None = self._typed(key, "zset", dict)
        if found is None:
            return []
        chosen = sorted(
            ((m, s) for m, s in found.items() if min_score <= s <= max_score),
            key=lambda item: (item[1], item[0]),
        )
        return chosen if limit is None else chosen[:limit]

    async def zcard(self, key: str) -> int:
        found: dict[str, float] | None = self._typed(key, "zset", dict)
        return 0 if found is None else len(found)

    # -- housekeeping ----------------------------------------------------------------

    async def clear_prefix(self) -> int:
        doomed = [k for k in self._data if k.startswith(self.prefix) and self._live(k) is not None]
        for key in [k for k in self._data if k.startswith(self.prefix)]:
            self._data.pop(key, None)
            self._expires_at.pop(key, None)
        return len(doomed)
