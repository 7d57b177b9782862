"""Per-tenant rate limits and concurrency quotas, shared by every ingress replica.

A tenant with limits (:class:`~services.ingress.tenants.TenantLimits`) takes one token
of its bucket per inference call (``requests_per_s`` refill, ``bucket_size`` at most)
and holds one place of ``max_concurrent`` until the call is answered. Both live in the
state store (``tenant:{name}:bucket`` and ``tenant:{name}:calls``), checked and taken
in one atomic step (:data:`ADMIT`), so the limits hold across replicas. A call's place
carries an expiry (the answer timeout and a margin): a replica that dies holding places
gives them back by itself.

A refused call gets 429 with ``Retry-After`` and OpenAI's ``x-ratelimit-*`` headers;
nothing was started. An admitted one's answer carries the headers too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from switchyard.state import keys
from switchyard.state.base import Script, ScriptView, StateStore

from services.ingress.errors import ApiError
from services.ingress.tenants import Tenant

RATE_LIMIT_ERROR = "rate_limit_error"


_ADMIT_LUA = """
local now = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local size = tonumber(ARGV[3])
local max_calls = tonumber(ARGV[4])
local hold_ms = tonumber(ARGV[6])
local calls = 0
if max_calls > 0 then
  local held = redis.call('HGETALL', KEYS[2])
  for i = 1, #held, 2 do
    if tonumber(held[i + 1]) <= now then
      redis.call('HDEL', KEYS[2], held[i])
    else
      calls = calls + 1
    end
  end
  if calls >= max_calls then
    return {'concurrency', '1000', '0'}
  end
end
local tokens = size
if rate > 0 then
  local state = redis.call('HMGET', KEYS[1], 'tokens', 'at_ms')
  if state[1] then
    tokens = math.min(size, tonumber(state[1]) + math.max(0, now - tonumber(state[2])) * rate / 1000)
  end
  if tokens < 1 then
    return {'rate', tostring(math.ceil((1 - tokens) * 1000 / rate)), '0'}
  end
  tokens = tokens - 1
  redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at_ms', tostring(now))
  redis.call('PEXPIRE', KEYS[1], math.ceil(size * 1000 / rate) + 1000)
end
if max_calls > 0 then
  redis.call('HSET', KEYS[2], ARGV[5], tostring(now + hold_ms))
  redis.call('PEXPIRE', KEYS[2], hold_ms + 1000)
end
return {'ok', tostring(math.ceil((size - tokens) * 1000 / math.max(rate, 0.001))), tostring(math.floor(tokens))}
"""


def _admit_local(view: ScriptView, keys_: Sequence[str], args: Sequence[str]) -> list[str]:
    bucket, held_calls = keys_
    now = float(args[0])
    rate, size, max_calls, call_id, hold_ms = (
        float(args[1]),
        float(args[2]),
        int(args[3]),
        args[4],
        float(args[5]),
    )
    if max_calls > 0:
        calls = 0
        for held, until in view.hgetall(held_calls).items():
            if float(until) <= now:
                view.hdel(held_calls, held)
            else:
                calls += 1
        if calls >= max_calls:
            return ["concurrency", "1000", "0"]
    tokens = size
    if rate > 0:
        stored, at_ms = view.hmget(bucket, ["tokens", "at_ms"])
        if stored is not None and at_ms is not None:
            tokens = min(size, float(stored) + max(0.0, now - float(at_ms)) * rate / 1000)
        if tokens < 1:
            return ["rate", str(math.ceil((1 - tokens) * 1000 / rate)), "0"]
        tokens -= 1
        view.hset(bucket, {"tokens": repr(tokens), "at_ms": repr(now)})
        view.expire(bucket, (math.ceil(size * 1000 / rate) + 1000) / 1000)
    if max_calls > 0:
        view.hset(held_calls, {call_id: repr(now + hold_ms)})
        view.expire(held_calls, (hold_ms + 1000) / 1000)
    reset_ms = math.ceil((size - tokens) * 1000 / max(rate, 0.001))
    return ["ok", str(reset_ms), str(math.floor(tokens))]


ADMIT = Script("tenant_admit", _ADMIT_LUA, _admit_local)
"""KEYS: bucket, calls; ARGV: now ms, rate/s, bucket size, max calls, call id, hold ms.
Returns ``[verdict, ms, remaining]``: ``ok`` (ms until the bucket is full again),
``rate`` or ``concurrency`` (ms until a retry may pass)."""


@dataclass(frozen=True, slots=True)
class Admission:
    """A call admitted under its tenant's limits, with its ``x-ratelimit-*`` headers."""

    call_id: str
    headers: dict[str, str]


class Quotas:
    """Takes and gives back a tenant's tokens and places in the state store."""

    def __init__(self, state: StateStore, hold_s: float) -> None:
        self.state = state
        self.hold_ms = int(hold_s * 1000)

    async def admit(self, tenant: Tenant, call_id: str, now_s: float) -> Admission:
        """Admit one call of ``tenant`` or raise the 429 that says which limit it hit."""
        assert tenant.name is not None
        limits = tenant.limits
        size = limits.bucket_size
        verdict, ms, remaining = await self.state.run_script(
            ADMIT,
            [keys.tenant_bucket(tenant.name), keys.tenant_calls(tenant.name)],
            [
                repr(now_s * 1000),
                repr(limits.requests_per_s),
                str(size),
                str(limits.max_concurrent),
                call_id,
                str(self.hold_ms),
            ],
        )
        headers = _headers(limits.requests_per_s, size, int(remaining), int(ms))
        if verdict == "ok":
            return Admission(call_id, headers)
        retry_after_s = max(1, math.ceil(int(ms) / 1000))
        headers["Retry-After"] = str(retry_after_s)
        if verdict == "rate":
            message = (
                f"tenant {tenant.name!r} is over its rate limit of "
                f"{limits.requests_per_s:g} requests/s (bursts of {size}); nothing was "
                f"started, retry after {retry_after_s} s"
            )
        else:
            message = (
                f"tenant {tenant.name!r} already has {limits.max_concurrent} calls in "
                f"flight, its limit; nothing was started, retry when one is answered"
            )
        raise ApiError(
            429, message, type_=RATE_LIMIT_ERROR, code="rate_limit_exceeded", headers=headers
        )

    async def release(self, tenant: Tenant, admission: Admission) -> None:
        """The call is answered (or gone): its place is free."""
        if tenant.name is not None and tenant.limits.max_concurrent > 0:
            await self.state.hdel(keys.tenant_calls(tenant.name), admission.call_id)


def _headers(rate: float, size: int, remaining: int, reset_ms: int) -> dict[str, str]:
    if rate <= 0:
        return {}
    return {
        "x-ratelimit-limit-requests": str(size),
        "x-ratelimit-remaining-requests": str(remaining),
        "x-ratelimit-reset-requests": f"{reset_ms / 1000:g}s",
    }
