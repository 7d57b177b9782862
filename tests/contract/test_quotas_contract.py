"""Tenants' rate limits and concurrency quotas (the ingress's atomic admit step), against
the memory store and a real Redis: the same verdicts from the Lua and the Python body."""

from __future__ import annotations

import pytest
from switchyard.state import StateStore

from services.ingress.errors import ApiError
from services.ingress.quotas import Quotas
from services.ingress.tenants import Tenant, TenantLimits

NOW_S = 1_800_000_000.0


async def test_the_bucket_refills_at_the_rate_up_to_its_size(store: StateStore) -> None:
    quotas = Quotas(store, hold_s=60)
    tenant = Tenant("acme", TenantLimits(requests_per_s=2.0, burst=3))
    taken = [await quotas.admit(tenant, f"call-{i}", NOW_S) for i in range(3)]
    assert [a.headers["x-ratelimit-remaining-requests"] for a in taken] == ["2", "1", "0"]
    with pytest.raises(ApiError) as refused:
        await quotas.admit(tenant, "call-3", NOW_S + 0.1)
    assert refused.value.status == 429
    assert refused.value.headers["Retry-After"] == "1"
    assert "2 requests/s" in refused.value.message
    # Half a second refills one token (2/s); ten seconds refill only up to the size.
    await quotas.admit(tenant, "call-4", NOW_S + 0.5)
    refilled = await quotas.admit(tenant, "call-5", NOW_S + 10.5)
    assert refilled.headers["x-ratelimit-remaining-requests"] == "2"


async def test_tenants_have_buckets_of_their_own(store: StateStore) -> None:
    quotas = Quotas(store, hold_s=60)
    one = Tenant("one", TenantLimits(requests_per_s=1.0))
    two = Tenant("two", TenantLimits(requests_per_s=1.0))
    await quotas.admit(one, "a", NOW_S)
    with pytest.raises(ApiError):
        await quotas.admit(one, "b", NOW_S)
    await quotas.admit(two, "c", NOW_S)


async def test_places_are_held_until_released_or_expired(store: StateStore) -> None:
    quotas = Quotas(store, hold_s=30)
    tenant = Tenant("acme", TenantLimits(max_concurrent=2))
    first = await quotas.admit(tenant, "call-1", NOW_S)
    await quotas.admit(tenant, "call-2", NOW_S)
    with pytest.raises(ApiError) as refused:
        await quotas.admit(tenant, "call-3", NOW_S)
    assert "2 calls in flight" in refused.value.message
    await quotas.release(tenant, first)
    await quotas.admit(tenant, "call-4", NOW_S + 1)
    # Places of calls never released (their replica died) expire after the hold.
    await quotas.admit(tenant, "call-5", NOW_S + 31)
