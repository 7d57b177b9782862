"""The Redis state store, on ``redis.asyncio``.

Compare-and-set runs as a Lua script on the server (registered once, called by SHA), so
it is atomic across every client. Connection failures become retriable
:class:`~switchyard.errors.StateError`\\ s naming the server and the operation; a key of
the wrong type becomes a non-retriable one.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Mapping
from typing import Any

import redis.asyncio as aioredis
from redis import exceptions as redis_errors

from switchyard.errors import StateError

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


def _opt_str(value: object) -> str | None:
    return None if value is None else str(value)


def _ttl_ms(ttl_s: float | None) -> int | None:
    return None if ttl_s is None else max(1, int(ttl_s * 1000))


class RedisStateStore:
    """A :class:`~switchyard.state.base.StateStore` on a Redis server.

    Args:
        url: ``redis://host:port/db`` (``rediss://`` for TLS).
        prefix: namespace of every key this store touches.
        timeout_s: socket connect and read timeout.
    """

    def __init__(self, url: str, *, prefix: str = "switchyard:", timeout_s: float = 5.0) -> None:
        self.url = url
        self.prefix = prefix
        self._redis: aioredis.Redis = aioredis.Redis.from_url(
            url,
            decode_responses=True,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
        )
        self._cas = self._redis.register_script(_CAS_SCRIPT)

    async def _call(self, operation: str, call: Awaitable[Any]) -> Any:
        # redis-py's types cannot see decode_responses=True; callers convert the result.
        try:
            return await call
        except redis_errors.ResponseError as exc:
            if "WRONGTYPE" in str(exc):
                raise StateError(
                    f"{operation}: a key holds another type of value ({exc})", retriable=False
                ) from None
            raise StateError(
                f"{operation} failed on Redis at {self.url}: {exc}", retriable=False
            ) from None
        except (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError) as exc:
            raise StateError(
                f"{operation} failed: Redis at {self.url} is unreachable ({exc})", retriable=True
            ) from None

    def _k(self, key: str) -> str:
        return self.prefix + key

    async def ping(self) -> None:
        await self._call("ping", self._redis.ping())

    async def close(self) -> None:
        await self._redis.aclose()

    # -- plain keys ------------------------------------------------------------------

    async def get(self, key: str) -> str | None:
        return _opt_str(await self._call(f"get {key}", self._redis.get(self._k(key))))

    async def set(self, key: str, value: str, *, ttl_s: float | None = None) -> None:
        await self._call(f"set {key}", self._redis.set(self._k(key), value, px=_ttl_ms(ttl_s)))

    async def set_if_absent(self, key: str, value: str, *, ttl_s: float | None = None) -> bool:
        written = await self._call(
            f"set_if_absent {key}",
            self._redis.set(self._k(key), value, px=_ttl_ms(ttl_s), nx=True),
        )
        return bool(written)

    async def compare_and_set(
        self, key: str, expected: str | None, new: str, *, ttl_s: float | None = None
    ) -> bool:
        ttl_ms = _ttl_ms(ttl_s)
        args = [
            "1" if expected is None else "0",
            expected or "",
            new,
            "" if ttl_ms is None else str(ttl_ms),
        ]
        written = await self._call(
            f"compare_and_set {key}", self._cas(keys=[self._k(key)], args=args)
        )
        return bool(written)

    async def delete(self, *keys: str) -> int:
        if not keys:
            return 0
        deleted: int = await self._call("delete", self._redis.delete(*(self._k(k) for k in keys)))
        return deleted

    async def exists(self, key: str) -> bool:
        return bool(await self._call(f"exists {key}", self._redis.exists(self._k(key))))

    async def expire(self, key: str, ttl_s: float) -> bool:
        return bool(
            await self._call(
                f"expire {key}", self._redis.pexpire(self._k(key), max(1, int(ttl_s * 1000)))
            )
        )

    async def ttl_s(self, key: str) -> float | None:
        left_ms: int = await self._call(f"ttl {key}", self._redis.pttl(self._k(key)))
        return None if left_ms < 0 else left_ms / 1000.0

    # -- counters --------------------------------------------------------------------

    async def incr(self, key: str, amount: int = 1) -> int:
        value: int = await self._call(f"incr {key}", self._redis.incrby(self._k(key), amount))
        return value

    async def incr_float(self, key: str, amount: float) -> float:
        value = await self._call(f"incr_float {key}", self._redis.incrbyfloat(self._k(key), amount))
        return float(value)

    # -- hashes ----------------------------------------------------------------------

    async def hset(self, key: str, mapping: Mapping[str, str]) -> None:
        if mapping:
            fields: dict[Any, Any] = dict(mapping)
            await self._call(f"hset {key}", self._redis.hset(self._k(key), mapping=fields))

    async def hget(self, key: str, field: str) -> str | None:
        return _opt_str(await self._call(f"hget {key}", self._redis.hget(self._k(key), field)))

    async def hgetall(self, key: str) -> dict[str, str]:
        value: dict[str, str] = await self._call(
            f"hgetall {key}", self._redis.hgetall(self._k(key))
        )
        return dict(value)

    async def hdel(self, key: str, *fields: str) -> int:
        if not fields:
            return 0
        deleted: int = await self._call(f"hdel {key}", self._redis.hdel(self._k(key), *fields))
        return deleted

    async def hincr_float(self, key: str, field: str, amount: float) -> float:
        value = await self._call(
            f"hincr_float {key}",
            self._redis.hincrbyfloat(self._k(key), field, amount),
        )
        return float(value)

    # -- sorted sets -----------------------------------------------------------------

    async def zadd(self, key: str, mapping: Mapping[str, float]) -> None:
        if mapping:
            scores: dict[Any, Any] = dict(mapping)
            await self._call(f"zadd {key}", self._redis.zadd(self._k(key), scores))

    async def zrem(self, key: str, *members: str) -> int:
        if not members:
            return 0
        removed: int = await self._call(f"zrem {key}", self._redis.zrem(self._k(key), *members))
        return removed

    async def zscore(self, key: str, member: str) -> float | None:
        score: float | None = await self._call(
            f"zscore {key}", self._redis.zscore(self._k(key), member)
        )
        return score

    async def zrange_by_score(
        self, key: str, min_score: float, max_score: float, *, limit: int | None = None
    ) -> list[tuple[str, float]]:
        kwargs: dict[str, Any] = {"withscores": True}
        if limit is not None:
            kwargs.update(start=0, num=limit)
        rows = await self._call(
            f"zrange_by_score {key}",
            self._redis.zrangebyscore(self._k(key), min_score, max_score, **kwargs),
        )
        return [(str(row[0]), float(row[1])) for row in rows]

    async def zcard(self, key: str) -> int:
        count: int = await self._call(f"zcard {key}", self._redis.zcard(self._k(key)))
        return count

    # -- housekeeping ----------------------------------------------------------------

    async def clear_prefix(self) -> int:
        pattern = _GLOB_SPECIAL.sub(r"\\\1", self.prefix) + "*"
        deleted = 0
        batch: list[str] = []
        async for key in self._redis.scan_iter(match=pattern, count=500):
            batch.append(key)
            if len(batch) >= 500:
                deleted += await self._call("clear_prefix", self._redis.unlink(*batch))
                batch = []
        if batch:
            deleted += await self._call("clear_prefix", self._redis.unlink(*batch))
        return deleted
