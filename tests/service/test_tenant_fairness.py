"""Tenants share a worker's queue fairly (services/worker/queue.py): on the embedded
stack with one emulated worker, one tenant's burst fills the worker's batch and queues;
another tenant's request, sent a moment later, waits behind only the part of the burst
that was due before it, not behind all of it."""

from __future__ import annotations

import asyncio
import time

import httpx
from switchyard.config import load_settings

from services.embedded import EmbeddedPlan, EmbeddedStack
from services.ingress.tenants import hash_key

BULK_KEY = "sy-key-of-the-bulk-tenant"
CHAT_KEY = "sy-key-of-the-chat-tenant"
BURST = 80


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_one_tenant_s_burst_does_not_hold_back_another_tenant_s_request() -> None:
    settings = load_settings(
        {},
        worker_time_scale=20.0,
        heartbeat_interval_s=0.1,
        log_level="WARNING",
        admission="off",
        auth="api-key",
        api_keys=f"bulk={hash_key(BULK_KEY)},chat={hash_key(CHAT_KEY)}",
    )
    plan = EmbeddedPlan(llm_workers=("a100-80gb/llama-2-7b",), torch_workers=0, http_port=0)
    long_call = {"model": "llama-2-7b", "prompt": "Tell me everything. " * 400, "max_tokens": 1500}
    answered_at: dict[str, float] = {}

    async def call(client: httpx.AsyncClient, name: str, body: dict[str, object], key: str) -> int:
        answer = await client.post("/v1/completions", json=body, headers=bearer(key))
        answered_at[name] = time.monotonic()
        return answer.status_code

    async with (
        EmbeddedStack(settings, plan) as stack,
        httpx.AsyncClient(base_url=stack.url, timeout=120.0) as client,
    ):
        burst = [
            asyncio.create_task(call(client, f"bulk-{i}", long_call, BULK_KEY))
            for i in range(BURST)
        ]
        await asyncio.sleep(0.5)  # the burst is at the worker: a full batch, the rest queued
        chat = await call(
            client, "chat", {"model": "llama-2-7b", "prompt": "Hi", "max_tokens": 16}, CHAT_KEY
        )
        statuses = await asyncio.gather(*burst)
    assert chat == 200
    assert statuses == [200] * BURST
    before_chat = sum(1 for name, at in answered_at.items() if at < answered_at["chat"])
    assert before_chat < BURST // 4, before_chat
