"""The Redis state store, on ``redis.asyncio``.

Compare-and-set runs as a Lua script on the server (registered once, called by SHA with
``EVALSHA``), so it is atomic across every client. Every redis-py exception becomes a
:class:`~switchyard.errors.StateError` naming the server (password hidden) and the
operation: retriable for connection failures and timeouts, not retriable when Redis
refuses the command (a key of the wrong type, a value that is not a number).

This module imports redis; :func:`switchyard.state.state_from_settings` imports it only
when Redis is configured.
"""

from __future__ import annotations

import math
import re
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis import exceptions as redis_errors

from switchyard.errors import StateError
from switchyard.state.base import Script, check_limit, check_ttl_s

# KEYS[1] key; ARGV: 1 "1" when the key must be absent, 2 expected, 3 new, 4 ttl in ms or "".
_CAS_SCRIPT = """
local current = redis.call('GET', KEYS[1])
if ARGV[1] == '1' then
  if current then return 0 end
elseif current ~= ARGV[2] then
  return 0
end
if ARGV[4] ~= '' then
  redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[4])
else
  redis.call('SET', KEYS[1], ARGV[3])
end
return 1
"""

_GLOB_SPECIAL = re.compile(r"([*?\[\]\\])")
_SCAN_COUNT = 500


def _opt_str(value: object) -> str | None:
    return None if value is None else str(value)


def _ttl_ms(ttl_s: float | None) -> int | None:
    check_ttl_s(ttl_s)
    return None if ttl_s is None else max(1, math.ceil(ttl_s * 1000))


def _redacted(url: str) -> str:
    """``url`` with its password, if any, replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


class RedisStateStore:
    """A :class:`~switchyard.state.base.StateStore` on a Redis server.

    Args:
        url: ``redis://[user:password@]host:port/db`` (``rediss://`` for TLS).
        prefix: namespace of every key this store touches.
        timeout_s: socket connect and read timeout of each command, and the longest a
            command waits for a free connection.
        max_connections: connections this client opens at most.
    """

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "switchyard:",
        timeout_s: float = 5.0,
        max_connections: int = 64,
    ) -> None:
        self.url = _redacted(url)
        self.prefix = prefix
        # A blocking pool: a burst of concurrent commands waits for a free connection
        # (up to the timeout) instead of failing with "Too many connections".
        pool = aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            timeout=timeout_s,
            decode_responses=True,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
        )
        self._redis: aioredis.Redis = aioredis.Redis.from_pool(pool)  # owns the pool: closes it
        self._cas = self._redis.register_script(_CAS_SCRIPT)
        self._shas: dict[str, str] = {}  # script name -> SHA1 of its loaded Lua

    async def _call(self, operation: str, call: Awaitable[Any]) -> Any:
        # redis-py's types cannot see decode_responses=True; callers convert the result.
        try:
            return await call
        except redis_errors.ResponseError as exc:
            if "WRONGTYPE" in str(exc):
                raise StateError(
                    f"{operation}: the key holds another type of value (wrong type of value)",
                    retriable=False,
                ) from None
            raise StateError(
                f"{operation} refused by Redis at {self.url}: {exc}", retriable=False
            ) from None
        except (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError) as exc:
            raise StateError(
                f"{operation} failed: Redis at {self.url} is unreachable ({exc})", retriable=True
            ) from None
        except redis_errors.RedisError as exc:
            raise StateError(
                f"{operation} failed on Redis at {self.url}: {type(exc).__name__}: {exc}",
                retriable=True,
            ) from None

    def _k(self, key: str) -> str:
        return self.prefix + key

    async def ping(self) -> None:
        await self._call("ping", self._redis.ping())

    async def close(self) -> None:
        await self._redis.aclose()

    # -- plain keys ------------------------------------------------------------------

    async def get(self, key: str) -> str | None:
        return _opt_str(await self._call(f"get {key!r}", self._redis.get(self._k(key))))

    async def get_many(self, keys: Sequence[str]) -> list[str | None]:
        if not keys:
            return []
        # MGET answers nil for a key of another type, as the contract asks.
        values = await self._call(
            f"mget of {len(keys)} keys", self._redis.mget([self._k(k) for k in keys])
        )
        return [_opt_str(v) for v in values]

    async def set(self, key: str, value: str, *, ttl_s: float | None = None) -> None:
        ttl_ms = _ttl_ms(ttl_s)
        await self._call(f"set {key!r}", self._redis.set(self._k(key), value, px=ttl_ms))

    async def set_if_absent(self, key: str, value: str, *, ttl_s: float | None = None) -> bool:
        ttl_ms = _ttl_ms(ttl_s)
        written = await self._call(
            f"set_if_absent {key!r}", self._redis.set(self._k(key), value, px=ttl_ms, nx=True)
        )
        return bool(written)

    async def compare_and_set(
        self, key: str, expected: str | None, new: str, *, ttl_s: float | None = None
    ) -> bool:
        ttl_ms = _ttl_ms(ttl_s)
        args = [
            "1" if expected is None else "0",
            "" if expected is None else expected,
            new,
            "" if ttl_ms is None else str(ttl_ms),
        ]
        written = await self._call(
            f"compare_and_set {key!r}", self._cas(keys=[self._k(key)], args=args)
        )
        return bool(written)

    async def delete(self, *keys: str) -> int:
        if not keys:
            return 0
        deleted: int = await self._call(
            f"delete {', '.join(map(repr, keys))}", self._redis.delete(*map(self._k, keys))
        )
        return deleted

    async def exists(self, key: str) -> bool:
        return bool(await self._call(f"exists {key!r}", self._redis.exists(self._k(key))))

    async def expire(self, key: str, ttl_s: float) -> bool:
        check_ttl_s(ttl_s)
        ttl_ms = max(1, math.ceil(ttl_s * 1000))
        return bool(await self._call(f"expire {key!r}", self._redis.pexpire(self._k(key), ttl_ms)))

    async def ttl_s(self, key: str) -> float | None:
        left_ms: int = await self._call(f"ttl_s {key!r}", self._redis.pttl(self._k(key)))
        return None if left_ms < 0 else left_ms / 1000.0  # -1: no expiry, -2: missing

    # -- counters --------------------------------------------------------------------

    async def incr(self, key: str, amount: int = 1) -> int:
        value: int = await self._call(f"incr {key!r}", self._redis.incrby(self._k(key), amount))
        return value

    async def incr_float(self, key: str, amount: float) -> float:
        value = await self._call(
            f"incr_float {key!r}", self._redis.incrbyfloat(self._k(key), amount)
        )
        return float(value)

    # -- hashes ----------------------------------------------------------------------

    async def hset(self, key: str, mapping: Mapping[str, str]) -> None:
        if mapping:
            fields: dict[Any, Any] = dict(mapping)
            await self._call(f"hset {key!r}", self._redis.hset(self._k(key), mapping=fields))

    async def hget(self, key: str, field: str) -> str | None:
        return _opt_str(await self._call(f"hget {key!r}", self._redis.hget(self._k(key), field)))

    async def hgetall(self, key: str) -> dict[str, str]:
        value: dict[str, str] = await self._call(
            f"hgetall {key!r}", self._redis.hgetall(self._k(key))
        )
        return dict(value)

    async def hdel(self, key: str, *fields: str) -> int:
        if not fields:
            return 0
        deleted: int = await self._call(f"hdel {key!r}", self._redis.hdel(self._k(key), *fields))
        return deleted

    async def hincr_float(self, key: str, field: str, amount: float) -> float:
        value = await self._call(
            f"hincr_float {key!r}", self._redis.hincrbyfloat(self._k(key), field, amount)
        )
        return float(value)

    # -- sorted sets -----------------------------------------------------------------

    async def zadd(self, key: str, mapping: Mapping[str, float]) -> None:
        if mapping:
            scores: dict[Any, Any] = {member: float(score) for member, score in mapping.items()}
            await self._call(f"zadd {key!r}", self._redis.zadd(self._k(key), scores))

    async def zrem(self, key: str, *members: str) -> int:
        if not members:
            return 0
        removed: int = await self._call(f"zrem {key!r}", self._redis.zrem(self._k(key), *members))
        return removed

    async def zscore(self, key: str, member: str) -> float | None:
        score = await self._call(f"zscore {key!r}", self._redis.zscore(self._k(key), member))
        return None if score is None else float(score)

    async def zrange_by_score(
        self, key: str, min_score: float, max_score: float, *, limit: int | None = None
    ) -> list[tuple[str, float]]:
        check_limit(limit)
        if limit == 0:
            return []  # spare the round trip
        kwargs: dict[str, Any] = {"withscores": True}
        if limit is not None:
            kwargs.update(start=0, num=limit)
        rows = await self._call(
            f"zrange_by_score {key!r}",
            self._redis.zrangebyscore(self._k(key), min_score, max_score, **kwargs),
        )
        return [(str(member), float(score)) for member, score in rows]

    async def zcard(self, key: str) -> int:
        count: int = await self._call(f"zcard {key!r}", self._redis.zcard(self._k(key)))
        return count

    # -- scripts ---------------------------------------------------------------------

    async def _load(self, script: Script) -> str:
        sha = str(
            await self._call(f"loading script {script.name}", self._redis.script_load(script.lua))
        )
        self._shas[script.name] = sha
        return sha

    def _evalsha_args(self, sha: str, keys: Sequence[str], args: Sequence[str]) -> list[Any]:
        return [sha, len(keys), *(self._k(k) for k in keys), *args]

    async def run_script(
        self, script: Script, keys: Sequence[str], args: Sequence[str]
    ) -> list[str]:
        sha = self._shas.get(script.name) or await self._load(script)
        for attempt in (1, 2):
            try:
                result = await self._redis.evalsha(*self._evalsha_args(sha, keys, args))
            except redis_errors.NoScriptError:
                # The server lost its script cache (a restart, SCRIPT FLUSH): load again.
                if attempt == 2:
                    raise StateError(
                        f"script {script.name} could not be loaded", retriable=True
                    ) from None
                sha = await self._load(script)
                continue
            except Exception as exc:
                await self._call(f"script {script.name}", _raise(exc))
            return _strings(result)
        raise AssertionError("unreachable")

    async def run_script_many(
        self, script: Script, calls: Sequence[tuple[Sequence[str], Sequence[str]]]
    ) -> list[list[str]]:
        if not calls:
            return []
        sha = self._shas.get(script.name) or await self._load(script)
        results: list[list[str] | None] = [None] * len(calls)
        todo = list(range(len(calls)))
        for attempt in (1, 2):
            pipe = self._redis.pipeline(transaction=False)
            for index in todo:
                keys, args = calls[index]
                pipe.evalsha(*self._evalsha_args(sha, keys, args))
            replies = await self._call(
                f"{len(todo)} runs of script {script.name}", pipe.execute(raise_on_error=False)
            )
            missing: list[int] = []
            for index, reply in zip(todo, replies, strict=True):
                if isinstance(reply, redis_errors.NoScriptError):
                    missing.append(index)  # not run: the server lost its script cache
                elif isinstance(reply, Exception):
                    await self._call(f"script {script.name}", _raise(reply))
                else:
                    results[index] = _strings(reply)
            if not missing:
                break
            if attempt == 2:
                raise StateError(f"script {script.name} could not be loaded", retriable=True)
            sha = await self._load(script)
            todo = missing
        return [result if result is not None else [] for result in results]

    # -- housekeeping ----------------------------------------------------------------

    async def clear_prefix(self) -> int:
        """SCAN for the prefix's keys and UNLINK them in batches (never KEYS)."""
        pattern = _GLOB_SPECIAL.sub(r"\\\1", self.prefix) + "*"
        deleted = 0
        cursor: int = 0
        while True:
            cursor, keys = await self._call(
                "clear_prefix (scan)",
                self._redis.scan(cursor=cursor, match=pattern, count=_SCAN_COUNT),
            )
            if keys:
                deleted += await self._call("clear_prefix (unlink)", self._redis.unlink(*keys))
            if cursor == 0:
                return deleted


async def _raise(exc: BaseException) -> None:
    """An awaitable that raises ``exc``: lets :meth:`RedisStateStore._call` map an error
    caught elsewhere (a pipeline reply) like one it caught itself."""
    raise exc


def _strings(reply: Any) -> list[str]:
    """A script's reply (a Lua table of strings and integers) as a list of strings."""
    if reply is None:
        return []
    if isinstance(reply, list):
        return [str(item) for item in reply]
    return [str(reply)]
