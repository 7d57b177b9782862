"""The state store contract: the shared state the scheduler and monitor keep.

Values are strings (numbers are written as decimal text); every key lives under the
store's prefix, which callers never repeat. Redis implements it for deployments, memory
for the embedded mode and the fast tests; ``tests/contract/test_state_contract.py`` holds
both to the same behaviour.

Errors, the same in both implementations:

* :class:`~switchyard.errors.StateError` with ``retriable=True``: the store could not be
  reached or did not answer in time (the message names the server and the operation).
* :class:`~switchyard.errors.StateError` with ``retriable=False``: the store refused the
  operation and always will, e.g. a hash operation on a key that holds a plain string,
  ``incr`` on a value that is not an integer, or a NaN score.
* :class:`ValueError`: the caller passed an argument no store accepts (a time to live that
  is not a positive finite number, a negative ``limit``); raised before any I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Protocol

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


def check_ttl_s(ttl_s: float | None) -> None:
    """Raise ``ValueError`` unless ``ttl_s`` is None or a positive finite number of seconds."""
    if ttl_s is not None and not (math.isfinite(ttl_s) and ttl_s > 0):
        raise ValueError(f"ttl_s must be a positive finite number of seconds, got {ttl_s!r}")


def check_limit(limit: int | None) -> None:
    """Raise ``ValueError`` unless ``limit`` is None or a non-negative count."""
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit!r}")


def format_float(value: float) -> str:
    """Decimal text of a float as counters store it: positional, no trailing zeros
    (``3`` rather than ``3.0``, ``0.00001`` rather than ``1e-05``), as Redis writes the
    result of ``INCRBYFLOAT``."""
    text = format(Decimal(repr(value)), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


class ScriptView(Protocol):
    """What the Python body of a :class:`Script` may do: synchronous operations on
    un-prefixed keys of the in-memory store, each the counterpart of one Redis command
    its Lua body uses (``GET``, ``SET``/``PX``, ``DEL``, ``EXISTS``, ``PEXPIRE``,
    ``HGET``, ``HMGET``, ``HGETALL``, ``HSET``, ``HDEL``, ``HINCRBY``, ``ZADD``,
    ``ZREM``, ``ZRANGE key 0 -1``, ``ZSCORE``)."""

    def get(self, key: str) -> str | None: ...

    def set(self, key: str, value: str, ttl_s: float | None = None) -> None: ...

    def delete(self, *keys: str) -> int: ...

    def exists(self, key: str) -> bool: ...

    def expire(self, key: str, ttl_s: float) -> bool: ...

    def hget(self, key: str, field: str) -> str | None: ...

    def hmget(self, key: str, fields: Sequence[str]) -> list[str | None]: ...

    def hgetall(self, key: str) -> dict[str, str]: ...

    def hset(self, key: str, mapping: Mapping[str, str]) -> None: ...

    def hdel(self, key: str, *fields: str) -> int: ...

    def hincrby(self, key: str, field: str, amount: int) -> int: ...

    def zadd(self, key: str, mapping: Mapping[str, float]) -> None: ...

    def zrem(self, key: str, *members: str) -> int: ...

    def zrange(self, key: str) -> list[str]:
        """Every member, by score (ties by member), as ``ZRANGE key 0 -1``."""
        ...

    def zscore(self, key: str, member: str) -> float | None: ...


ScriptBody = Callable[[ScriptView, Sequence[str], Sequence[str]], Sequence[str]]
"""``body(view, keys, args) -> result``: the in-memory form of a script."""


@dataclass(frozen=True, slots=True)
class Script:
    """An operation on several keys that the store runs as one atomic step.

    Redis runs ``lua`` server-side (loaded once, called by SHA), the memory store runs
    ``local`` to its end without yielding; the two forms of a script stand side by side
    in the module that owns the keys it touches, and one contract suite runs against
    both stores. ``KEYS`` and ``keys`` are un-prefixed keys (the store prefixes them),
    ``ARGV`` and ``args`` strings. The result is a list of strings (a Lua table of
    strings; ``false``/nil entries are not allowed, use ``""``).
    """

    name: str
    lua: str
    local: ScriptBody


class StateStore(Protocol):
    """Async access to shared state, namespaced by :attr:`prefix`.

    Every method may raise :class:`~switchyard.errors.StateError` (see the module
    docstring): retriable when the store is unreachable, not retriable when the store
    refuses the operation (a key of another type, a value that is not a number).

    Each operation is atomic with respect to every other client of the same store.
    Expired keys behave exactly as missing ones.

    Time to live: ``set`` and ``compare_and_set`` replace the whole value, so they drop
    any earlier time to live unless given a new ``ttl_s``; the counter, hash and sorted
    set operations keep it.
    """

    prefix: str
    """Prepended to every key; callers pass un-prefixed keys."""

    async def ping(self) -> None:
        """Return when the store answers; raise a retriable ``StateError`` otherwise."""
        ...

    async def close(self) -> None:
        """Release connections. The store must not be used afterwards."""
        ...

    # -- plain keys ------------------------------------------------------------------

    async def get(self, key: str) -> str | None:
        """The string at ``key``; None when missing. A non-string key is an error."""
        ...

    async def get_many(self, keys: Sequence[str]) -> list[str | None]:
        """The strings at ``keys``, in order, in one round trip (None for a missing key or
        one holding another type: a batch read should not fail on one odd key)."""
        ...

    async def set(self, key: str, value: str, *, ttl_s: float | None = None) -> None:
        """Write ``value`` (replacing a value of any type).

        With ``ttl_s`` the key disappears that many seconds later; without, it never
        expires (an earlier time to live is dropped).
        """
        ...

    async def set_if_absent(self, key: str, value: str, *, ttl_s: float | None = None) -> bool:
        """Write only when the key does not exist; True when this call wrote it.

        The building block of idempotency: the first handler of a request claims it.
        A key of another type counts as existing.
        """
        ...

    async def compare_and_set(
        self, key: str, expected: str | None, new: str, *, ttl_s: float | None = None
    ) -> bool:
        """Atomically write ``new`` if the key holds ``expected``; True when written.

        ``expected=None`` means "only if the key does not exist". Atomic across every
        client of the store (a server-side script on Redis, never a read then a write).
        ``ttl_s`` as for :meth:`set`. A key of another type is an error.
        """
        ...

    async def delete(self, *keys: str) -> int:
        """Delete keys of any type; returns how many of them existed."""
        ...

    async def exists(self, key: str) -> bool:
        """Whether ``key`` holds a value of any type."""
        ...

    async def expire(self, key: str, ttl_s: float) -> bool:
        """Make an existing key disappear ``ttl_s`` seconds from now (replacing any earlier
        time to live); False, and nothing happens, when the key does not exist."""
        ...

    async def ttl_s(self, key: str) -> float | None:
        """Seconds the key has left to live.

        None in two cases the caller tells apart with :meth:`exists` when it matters:
        the key does not exist, or it exists and never expires.
        """
        ...

    # -- counters --------------------------------------------------------------------

    async def incr(self, key: str, amount: int = 1) -> int:
        """Add ``amount`` to a 64-bit integer counter (missing counts as 0); returns the
        new value. A value that is not an integer, or overflow, is an error."""
        ...

    async def incr_float(self, key: str, amount: float) -> float:
        """Add ``amount`` to a float counter (missing counts as 0); returns the new value,
        stored as decimal text (see :func:`format_float`). A value that is not a number,
        or a result that is not finite, is an error."""
        ...

    # -- hashes ----------------------------------------------------------------------

    async def hset(self, key: str, mapping: Mapping[str, str]) -> None:
        """Set fields of the hash at ``key``, creating it; other fields stay."""
        ...

    async def hget(self, key: str, field: str) -> str | None:
        """One field of a hash; None when the key or the field is missing."""
        ...

    async def hgetall(self, key: str) -> dict[str, str]:
        """Every field of a hash (a copy); empty when the key is missing."""
        ...

    async def hdel(self, key: str, *fields: str) -> int:
        """Remove fields; returns how many existed. A hash left empty is deleted."""
        ...

    async def hincr_float(self, key: str, field: str, amount: float) -> float:
        """Add ``amount`` to a numeric field (missing counts as 0); returns the new value."""
        ...

    # -- sorted sets -----------------------------------------------------------------

    async def zadd(self, key: str, mapping: Mapping[str, float]) -> None:
        """Add members with scores, or update the scores of existing members.
        A NaN score is an error; infinities are allowed."""
        ...

    async def zrem(self, key: str, *members: str) -> int:
        """Remove members; returns how many existed. A set left empty is deleted."""
        ...

    async def zscore(self, key: str, member: str) -> float | None:
        """The score of ``member``; None when it or the key is missing."""
        ...

    async def zrange_by_score(
        self, key: str, min_score: float, max_score: float, *, limit: int | None = None
    ) -> list[tuple[str, float]]:
        """``(member, score)`` pairs with ``min_score <= score <= max_score``, ascending by
        score, ties by member (code point order); at most ``limit`` of them."""
        ...

    async def zcard(self, key: str) -> int:
        """How many members the sorted set has; 0 when the key is missing."""
        ...

    # -- scripts ---------------------------------------------------------------------

    async def run_script(
        self, script: Script, keys: Sequence[str], args: Sequence[str]
    ) -> list[str]:
        """Run ``script`` atomically on ``keys`` with ``args``; its result."""
        ...

    async def run_script_many(
        self, script: Script, calls: Sequence[tuple[Sequence[str], Sequence[str]]]
    ) -> list[list[str]]:
        """Run ``script`` once per ``(keys, args)`` in ``calls``, in order, in one round
        trip (each run atomic on its own, not the batch as a whole); the results in
        order. For handling a consumed batch with one write to the store."""
        ...

    # -- housekeeping ----------------------------------------------------------------

    async def clear_prefix(self) -> int:
        """Delete every key under this store's prefix; returns how many were deleted.

        Keys under other prefixes are untouched (a prefix that is an extension of this
        one, e.g. ``a:`` and ``a:b:``, is *under* it).
        """
        ...
