"""Tenants through the HTTP API: API keys (401), request ids scoped to their tenant (no
tenant reads, overwrites or gets another's answer), and per-tenant rate limits and
concurrency quotas (429 with ``x-ratelimit-*`` and ``Retry-After``) that leave the
other tenants served."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from services.ingress.tenants import KeyRing, TenantLimits, hash_key
from tests.service.ingress_support import (
    Replica,
    Stack,
    answer_text,
    assert_error,
    completion_body,
    features,
    stack_fixture,  # noqa: F401 (the ``stack`` fixture)
)

KEY_A = "sy-key-of-tenant-a"
KEY_B = "sy-key-of-tenant-b"
KEY_LIMITED = "sy-key-of-a-limited-tenant"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def key_ring(limited: TenantLimits | None = None) -> KeyRing:
    return KeyRing.from_entries(
        [
            ("tenant-a", hash_key(KEY_A), TenantLimits()),
            ("tenant-b", hash_key(KEY_B), TenantLimits()),
            ("limited", hash_key(KEY_LIMITED), limited or TenantLimits()),
        ]
    )


class Clock:
    def __init__(self) -> None:
        self.now_s = time.time()

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture
async def ingress(stack: Stack) -> Replica:
    return await stack.replica(keys=key_ring())


async def test_a_call_without_a_known_key_is_refused_401(ingress: Replica) -> None:
    missing = await ingress.client.post("/v1/completions", json=completion_body())
    error = assert_error(missing, 401, param=None, names="API key")
    assert error["code"] == "invalid_api_key"
    assert missing.headers["WWW-Authenticate"].startswith("Bearer")
    wrong = await ingress.client.post(
        "/v1/completions", json=completion_body(), headers=bearer("sy-guessed")
    )
    assert_error(wrong, 401, param=None, names="incorrect API key")
    models = await ingress.client.get("/v1/models", headers={"Authorization": "Basic abc"})
    assert models.status_code == 401
    # Probes and the API's description need no key.
    assert (await ingress.client.get("/healthz")).status_code == 200
    assert (await ingress.client.get("/openapi.json")).status_code == 200
    assert (await ingress.client.get("/v1/models", headers=bearer(KEY_A))).status_code == 200


async def test_two_tenants_may_use_one_request_id_and_each_gets_its_own_answer(
    stack: Stack, ingress: Replica
) -> None:
    a = await ingress.client.post(
        "/v1/completions",
        json=completion_body(prompt="from a", switchyard={"request_id": "order-1"}),
        headers=bearer(KEY_A),
    )
    b = await ingress.client.post(
        "/v1/completions",
        json=completion_body(
            prompt="something else from b", max_tokens=4, switchyard={"request_id": "order-1"}
        ),
        headers=bearer(KEY_B),
    )
    assert a.status_code == b.status_code == 200, (a.text, b.text)
    # Each sees its own id and its own request's answer; both ran.
    assert a.json()["id"] == b.json()["id"] == "order-1"
    assert a.headers["X-Switchyard-Request-Id"] == "order-1"
    assert a.json()["choices"][0]["text"] == answer_text("tenant-a~order-1")
    assert b.json()["choices"][0]["text"] == answer_text("tenant-b~order-1")
    assert len(stack.worker.runs_of("tenant-a~order-1")) == 1
    assert len(stack.worker.runs_of("tenant-b~order-1")) == 1

    # A retry of a's call is a's answer again; a different body under a's id a 409.
    again = await ingress.client.post(
        "/v1/completions",
        json=completion_body(prompt="from a", switchyard={"request_id": "order-1"}),
        headers=bearer(KEY_A),
    )
    assert again.json()["choices"] == a.json()["choices"]
    reused = await ingress.client.post(
        "/v1/completions",
        json=completion_body(prompt="other", switchyard={"request_id": "order-1"}),
        headers=bearer(KEY_A),
    )
    assert_error(reused, 409, param="request_id", names="'order-1'")


async def test_a_tenant_cannot_read_another_tenants_request(ingress: Replica) -> None:
    served = await ingress.client.post(
        "/v1/apps/wine/infer", json={"features": features()}, headers=bearer(KEY_A)
    )
    assert served.status_code == 200, served.text
    request_id = served.json()["request_id"]
    assert "~" not in request_id  # the client's view: no tenant in it

    own = await ingress.client.get(f"/v1/requests/{request_id}", headers=bearer(KEY_A))
    assert own.status_code == 200
    assert own.json()["request_id"] == request_id
    assert own.json()["status"] == "ok"
    other = await ingress.client.get(f"/v1/requests/{request_id}", headers=bearer(KEY_B))
    assert_error(other, 404, param="request_id", names=request_id)
    # Nor by spelling out the recorded id: a client's id cannot name another tenant.
    spelled = await ingress.client.get(f"/v1/requests/tenant-a~{request_id}", headers=bearer(KEY_B))
    assert spelled.status_code == 404


async def test_a_rate_limited_tenant_gets_429_with_rate_limit_headers(stack: Stack) -> None:
    clock = Clock()
    limits = TenantLimits(requests_per_s=1.0, burst=2)
    ingress = await stack.replica(keys=key_ring(limits), clock=clock)

    first = await ingress.client.post(
        "/v1/completions", json=completion_body(), headers=bearer(KEY_LIMITED)
    )
    assert first.status_code == 200, first.text
    assert first.headers["x-ratelimit-limit-requests"] == "2"
    assert first.headers["x-ratelimit-remaining-requests"] == "1"
    second = await ingress.client.post(
        "/v1/completions", json=completion_body(), headers=bearer(KEY_LIMITED)
    )
    assert second.headers["x-ratelimit-remaining-requests"] == "0"
    refused = await ingress.client.post(
        "/v1/completions", json=completion_body(), headers=bearer(KEY_LIMITED)
    )
    error = assert_error(refused, 429, param=None, names="rate limit")
    assert error["code"] == "rate_limit_exceeded"
    assert refused.headers["Retry-After"] == "1"
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    # Nothing of the refused call was started.
    assert len(stack.worker.ran) == 2

    # Another tenant is not slowed by it.
    other = await ingress.client.post(
        "/v1/completions", json=completion_body(), headers=bearer(KEY_B)
    )
    assert other.status_code == 200
    # A second later the bucket holds a token again.
    clock.now_s += 1.0
    later = await ingress.client.post(
        "/v1/completions", json=completion_body(), headers=bearer(KEY_LIMITED)
    )
    assert later.status_code == 200, later.text


async def test_a_tenant_at_its_concurrency_quota_cannot_starve_another(stack: Stack) -> None:
    ingress = await stack.replica(keys=key_ring(TenantLimits(max_concurrent=2)))
    slow = [
        asyncio.create_task(
            ingress.client.post(
                "/v1/completions",
                json=completion_body(prompt=f"DELAY {i}"),
                headers=bearer(KEY_LIMITED),
            )
        )
        for i in range(2)
    ]
    await _until(lambda: len(stack.worker.ran) == 2)
    refused = await ingress.client.post(
        "/v1/completions", json=completion_body(), headers=bearer(KEY_LIMITED)
    )
    assert_error(refused, 429, param=None, names="in flight")
    assert "Retry-After" in refused.headers
    others = await asyncio.gather(
        *(
            ingress.client.post("/v1/completions", json=completion_body(), headers=bearer(KEY_A))
            for _ in range(4)
        )
    )
    assert [r.status_code for r in others] == [200] * 4
    assert [r.status_code for r in await asyncio.gather(*slow)] == [200, 200]
    # Answered: its places are free again.
    after = await ingress.client.post(
        "/v1/completions", json=completion_body(), headers=bearer(KEY_LIMITED)
    )
    assert after.status_code == 200, after.text


async def test_without_keys_every_call_is_served_and_ids_are_as_given(stack: Stack) -> None:
    ingress = await stack.replica()
    served = await ingress.client.post(
        "/v1/completions", json=completion_body(switchyard={"request_id": "plain-1"})
    )
    assert served.status_code == 200
    assert served.json()["choices"][0]["text"] == answer_text("plain-1")
    assert "x-ratelimit-limit-requests" not in served.headers


async def _until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)
