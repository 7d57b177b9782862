"""The in-memory state store: the embedded default and the fast test tier.

Single-process and asyncio-safe by construction: no method awaits between reading and
writing, so every operation is atomic with respect to other tasks, as on Redis.
Expiry is against an injected clock, lazy (a key is dropped when touched after its
deadline) and active, as on Redis: each write that sets a deadline also drops the keys
whose deadlines passed, so keys never read again do not pile up. ``max_keys`` bounds the
key count as Redis's ``maxmemory-policy volatile-ttl`` bounds memory: past it, the keys
with a deadline nearest to it go first (request records, then other expiring keys; a key
without a deadline is never evicted). It refuses what Redis refuses, with the same :class:`StateError` flags, so code
tested against it behaves the same on Redis.
"""

from __future__ import annotations

import heapq
import logging
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence

from switchyard.errors import StateError
from switchyard.state.base import (
    INT64_MAX,
    INT64_MIN,
    Script,
    check_limit,
    check_ttl_s,
    format_float,
)

# What Redis accepts as an integer (string2ll) and as a float (string2ld), near enough.
_INTEGER = re.compile(r"-?(?:0|[1-9][0-9]*)")
_FLOAT = re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")


class _Hash(dict[str, str]):
    """The value of a hash key (a distinct type, so a string key is never mistaken)."""


class _SortedSet(dict[str, float]):
    """The value of a sorted set key: member -> score."""


_Value = str | _Hash | _SortedSet


def _kind(value: _Value) -> str:
    if isinstance(value, _Hash):
        return "hash"
    if isinstance(value, _SortedSet):
        return "sorted set"
    return "string"


def _wrong_type(key: str, value: _Value, wanted: str) -> StateError:
    return StateError(
        f"key {key!r} holds a {_kind(value)}, not a {wanted} (wrong type of value)",
        retriable=False,
    )


def _parse_int(key: str, text: str) -> int:
    if not _INTEGER.fullmatch(text) or not INT64_MIN <= int(text) <= INT64_MAX:
        raise StateError(f"key {key!r}: value {text!r} is not an integer", retriable=False)
    return int(text)


def _add_float(where: str, text: str, amount: float) -> float:
    if not _FLOAT.fullmatch(text) or not math.isfinite(float(text)):
        raise StateError(f"{where}: value {text!r} is not a valid float", retriable=False)
    value = float(text) + amount
    if not math.isfinite(value):
        raise StateError(f"{where}: increment would produce NaN or Infinity", retriable=False)
    return value


log = logging.getLogger("switchyard.state")


class _Expiry:
    """The deadlines of one store's keys, shared by every client of its data: a dict to
    read them and a heap (stale entries skipped) to find the next ones to go."""

    def __init__(self, max_keys: int | None) -> None:
        self.at: dict[str, float] = {}  # full key -> clock deadline
        self.heap: list[tuple[float, str]] = []
        self.max_keys = max_keys
        self.evicted = 0


class MemoryStateStore:
    """A :class:`~switchyard.state.base.StateStore` in a dict.

    Args:
        prefix: namespace of every key this store touches.
        clock: seconds from a monotonic clock; tests inject a fake to drive expiry.
        max_keys: the most keys it holds (see the module docstring); None: no bound.
    """

    def __init__(
        self,
        prefix: str = "switchyard:",
        *,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int | None = None,
    ) -> None:
        self.prefix = prefix
        self._clock = clock
        self._data: dict[str, _Value] = {}  # full key -> value
        self._expiry = _Expiry(max_keys)
        self._expires_at = self._expiry.at

    def sharing(self, prefix: str) -> MemoryStateStore:
        """Another client of this store's data under ``prefix``, as a second Redis client
        would be (the embedded mode gives one to each in-process service)."""
        other = MemoryStateStore(prefix, clock=self._clock)
        other._data = self._data
        other._expiry = self._expiry
        other._expires_at = self._expiry.at
        return other

    @property
    def evicted(self) -> int:
        """Keys dropped before their deadline to stay within ``max_keys``."""
        return self._expiry.evicted

    def _set_deadline(self, full: str, deadline: float) -> None:
        expiry = self._expiry
        expiry.at[full] = deadline
        heapq.heappush(expiry.heap, (deadline, full))
        if len(expiry.heap) > 4 * len(expiry.at) + 1024:
            # Each new deadline of a key leaves its old entry behind: rebuild from the
            # live ones, so the heap stays within a few times the keys that expire.
            expiry.heap = [(at, key) for key, at in expiry.at.items()]
            heapq.heapify(expiry.heap)
        self._reap()

    def _reap(self) -> None:
        """Drop the keys whose deadlines passed, then, past ``max_keys``, the ones whose
        deadlines come first."""
        expiry, now = self._expiry, self._clock()
        heap = expiry.heap
        while heap and heap[0][0] <= now:
            deadline, full = heapq.heappop(heap)
            if expiry.at.get(full) == deadline:
                del expiry.at[full]
                self._data.pop(full, None)
        if expiry.max_keys is None or len(self._data) <= expiry.max_keys:
            return
        dropped = 0
        while heap and len(self._data) > expiry.max_keys:
            deadline, full = heapq.heappop(heap)
            if expiry.at.get(full) == deadline:
                del expiry.at[full]
                self._data.pop(full, None)
                dropped += 1
        before, expiry.evicted = expiry.evicted, expiry.evicted + dropped
        if dropped and (before == 0 or before // 10_000 != expiry.evicted // 10_000):
            log.warning(
                "the in-memory state holds %d keys, its bound (SWITCHYARD_MEMORY_MAX_KEYS): "
                "the records nearest their expiry are dropped early (%d so far)",
                expiry.max_keys,
                expiry.evicted,
                extra={"event": "state_evicted"},
            )

    async def ping(self) -> None:
        return None

    async def close(self) -> None:
        return None

    # -- internals -------------------------------------------------------------------

    def _live(self, full: str) -> _Value | None:
        """The value at a full key, dropping it first when its deadline has passed."""
        deadline = self._expires_at.get(full)
        if deadline is not None and self._clock() >= deadline:
            del self._expires_at[full]
            self._data.pop(full, None)
        return self._data.get(full)

    def _string(self, key: str) -> str | None:
        value = self._live(self.prefix + key)
        if value is None or isinstance(value, str):
            return value
        raise _wrong_type(key, value, "string")

    def _hash(self, key: str, *, create: bool = False) -> _Hash | None:
        full = self.prefix + key
        value = self._live(full)
        if value is None:
            if not create:
                return None
            value = self._data[full] = _Hash()
        if isinstance(value, _Hash):
            return value
        raise _wrong_type(key, value, "hash")

    def _zset(self, key: str, *, create: bool = False) -> _SortedSet | None:
        full = self.prefix + key
        value = self._live(full)
        if value is None:
            if not create:
                return None
            value = self._data[full] = _SortedSet()
        if isinstance(value, _SortedSet):
            return value
        raise _wrong_type(key, value, "sorted set")

    def _write(self, key: str, value: str, ttl_s: float | None) -> None:
        full = self.prefix + key
        self._data[full] = value
        if ttl_s is None:
            self._expires_at.pop(full, None)
        else:
            self._set_deadline(full, self._clock() + ttl_s)

    def _drop(self, full: str) -> None:
        self._data.pop(full, None)
        self._expires_at.pop(full, None)

    # -- plain keys ------------------------------------------------------------------

    async def get(self, key: str) -> str | None:
        return self._string(key)

    def _set_now(self, key: str, value: str, ttl_s: float | None) -> None:
        check_ttl_s(ttl_s)
        self._write(key, value, ttl_s)

    async def get_many(self, keys: Sequence[str]) -> list[str | None]:
        values: list[str | None] = []
        for key in keys:
            value = self._live(self.prefix + key)
            values.append(value if isinstance(value, str) else None)
        return values

    async def set(self, key: str, value: str, *, ttl_s: float | None = None) -> None:
        self._set_now(key, value, ttl_s)

    async def set_if_absent(self, key: str, value: str, *, ttl_s: float | None = None) -> bool:
        check_ttl_s(ttl_s)
        if self._live(self.prefix + key) is not None:
            return False
        self._write(key, value, ttl_s)
        return True

    async def compare_and_set(
        self, key: str, expected: str | None, new: str, *, ttl_s: float | None = None
    ) -> bool:
        check_ttl_s(ttl_s)
        if self._string(key) != expected:
            return False
        self._write(key, new, ttl_s)
        return True

    async def delete(self, *keys: str) -> int:
        return self._delete_now(*keys)

    def _delete_now(self, *keys: str) -> int:
        deleted = 0
        for key in keys:
            full = self.prefix + key
            if self._live(full) is not None:
                deleted += 1
                self._drop(full)
        return deleted

    async def exists(self, key: str) -> bool:
        return self._live(self.prefix + key) is not None

    async def expire(self, key: str, ttl_s: float) -> bool:
        return self._expire_now(key, ttl_s)

    def _expire_now(self, key: str, ttl_s: float) -> bool:
        check_ttl_s(ttl_s)
        full = self.prefix + key
        if self._live(full) is None:
            return False
        self._set_deadline(full, self._clock() + ttl_s)
        return True

    async def ttl_s(self, key: str) -> float | None:
        full = self.prefix + key
        if self._live(full) is None:
            return None
        deadline = self._expires_at.get(full)
        return None if deadline is None else max(0.0, deadline - self._clock())

    # -- counters --------------------------------------------------------------------
    # Like INCRBY on Redis, these change the value and keep the time to live.

    async def incr(self, key: str, amount: int = 1) -> int:
        current = self._string(key)
        value = _parse_int(key, "0" if current is None else current) + amount
        if not INT64_MIN <= value <= INT64_MAX:
            raise StateError(f"key {key!r}: increment would overflow", retriable=False)
        self._data[self.prefix + key] = str(value)
        return value

    async def incr_float(self, key: str, amount: float) -> float:
        current = self._string(key)
        value = _add_float(f"key {key!r}", "0" if current is None else current, amount)
        self._data[self.prefix + key] = format_float(value)
        return value

    # -- hashes ----------------------------------------------------------------------

    async def hset(self, key: str, mapping: Mapping[str, str]) -> None:
        self._hset_now(key, mapping)

    def _hset_now(self, key: str, mapping: Mapping[str, str]) -> None:
        if mapping:
            fields = self._hash(key, create=True)
            assert fields is not None
            fields.update(mapping)

    async def hget(self, key: str, field: str) -> str | None:
        fields = self._hash(key)
        return None if fields is None else fields.get(field)

    async def hgetall(self, key: str) -> dict[str, str]:
        return dict(self._hash(key) or {})

    async def hdel(self, key: str, *fields: str) -> int:
        return self._hdel_now(key, *fields)

    def _hdel_now(self, key: str, *fields: str) -> int:
        if not fields:
            return 0
        found = self._hash(key)
        if found is None:
            return 0
        deleted = sum(1 for field in set(fields) if found.pop(field, None) is not None)
        if not found:
            self._drop(self.prefix + key)
        return deleted

    async def hincr_float(self, key: str, field: str, amount: float) -> float:
        current = self._hash(key)
        text = "0" if current is None else current.get(field, "0")
        value = _add_float(f"field {field!r} of key {key!r}", text, amount)
        fields = self._hash(key, create=True)
        assert fields is not None
        fields[field] = format_float(value)
        return value

    # -- sorted sets -----------------------------------------------------------------

    async def zadd(self, key: str, mapping: Mapping[str, float]) -> None:
        self._zadd_now(key, mapping)

    def _zadd_now(self, key: str, mapping: Mapping[str, float]) -> None:
        if not mapping:
            return
        scores = {member: float(score) for member, score in mapping.items()}
        if any(math.isnan(score) for score in scores.values()):
            raise StateError(f"zadd {key!r}: a score is not a number (NaN)", retriable=False)
        found = self._zset(key, create=True)
        assert found is not None
        found.update(scores)

    async def zrem(self, key: str, *members: str) -> int:
        return self._zrem_now(key, *members)

    def _zrem_now(self, key: str, *members: str) -> int:
        if not members:
            return 0
        found = self._zset(key)
        if found is None:
            return 0
        removed = sum(1 for member in set(members) if found.pop(member, None) is not None)
        if not found:
            self._drop(self.prefix + key)
        return removed

    async def zscore(self, key: str, member: str) -> float | None:
        found = self._zset(key)
        return None if found is None else found.get(member)

    async def zrange_by_score(
        self, key: str, min_score: float, max_score: float, *, limit: int | None = None
    ) -> list[tuple[str, float]]:
        check_limit(limit)
        found = self._zset(key)
        if found is None:
            return []
        chosen = sorted(
            ((member, score) for member, score in found.items() if min_score <= score <= max_score),
            key=lambda item: (item[1], item[0]),
        )
        return chosen if limit is None else chosen[:limit]

    async def zcard(self, key: str) -> int:
        found = self._zset(key)
        return 0 if found is None else len(found)

    # -- scripts ---------------------------------------------------------------------

    async def run_script(
        self, script: Script, keys: Sequence[str], args: Sequence[str]
    ) -> list[str]:
        # The Python body runs to its end without awaiting: atomic, as a script on Redis.
        return list(script.local(_ScriptView(self), keys, args))

    async def run_script_many(
        self, script: Script, calls: Sequence[tuple[Sequence[str], Sequence[str]]]
    ) -> list[list[str]]:
        view = _ScriptView(self)
        return [list(script.local(view, keys, args)) for keys, args in calls]

    # -- housekeeping ----------------------------------------------------------------

    async def clear_prefix(self) -> int:
        mine = [full for full in self._data if full.startswith(self.prefix)]
        deleted = 0
        for full in mine:
            if self._live(full) is not None:  # an expired key was not there to delete
                deleted += 1
                self._drop(full)
        return deleted


class _ScriptView:
    """The synchronous operations a script's Python body uses (:class:`ScriptView`), on
    this store's data and un-prefixed keys."""

    __slots__ = ("_store",)

    def __init__(self, store: MemoryStateStore) -> None:
        self._store = store

    def get(self, key: str) -> str | None:
        return self._store._string(key)

    def set(self, key: str, value: str, ttl_s: float | None = None) -> None:
        self._store._set_now(key, value, ttl_s)

    def delete(self, *keys: str) -> int:
        return self._store._delete_now(*keys)

    def exists(self, key: str) -> bool:
        return self._store._live(self._store.prefix + key) is not None

    def expire(self, key: str, ttl_s: float) -> bool:
        return self._store._expire_now(key, ttl_s)

    def hget(self, key: str, field: str) -> str | None:
        fields = self._store._hash(key)
        return None if fields is None else fields.get(field)

    def hmget(self, key: str, fields: Sequence[str]) -> list[str | None]:
        found: Mapping[str, str] = self._store._hash(key) or {}
        return [found.get(field) for field in fields]

    def hgetall(self, key: str) -> dict[str, str]:
        return dict(self._store._hash(key) or {})

    def hset(self, key: str, mapping: Mapping[str, str]) -> None:
        self._store._hset_now(key, mapping)

    def hdel(self, key: str, *fields: str) -> int:
        return self._store._hdel_now(key, *fields)

    def hincrby(self, key: str, field: str, amount: int) -> int:
        fields = self._store._hash(key, create=True)
        assert fields is not None
        value = _parse_int(f"{key} {field}", fields.get(field, "0")) + amount
        fields[field] = str(value)
        return value

    def zadd(self, key: str, mapping: Mapping[str, float]) -> None:
        self._store._zadd_now(key, mapping)

    def zrem(self, key: str, *members: str) -> int:
        return self._store._zrem_now(key, *members)

    def zrange(self, key: str) -> list[str]:
        found: Mapping[str, float] = self._store._zset(key) or {}
        return [member for member, _ in sorted(found.items(), key=lambda item: (item[1], item[0]))]

    def zscore(self, key: str, member: str) -> float | None:
        found = self._store._zset(key)
        return None if found is None else found.get(member)
