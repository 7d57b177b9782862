"""The embedded stack with prefill/decode pools (``switchyard up --prefill-workers``): every
LLM request is prefilled on the prefill worker and decoded on a decode worker, answered
once over HTTP, streamed or not, under the policy the stack runs."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio
from switchyard.config import load_settings

from services.embedded import EmbeddedPlan, EmbeddedStack
from services.worker.service import WorkerService

A100 = "a100-80gb/llama-2-7b"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack() -> AsyncIterator[EmbeddedStack]:
    settings = load_settings(
        {}, worker_time_scale=50.0, log_level="WARNING", heartbeat_interval_s=0.2
    )
    plan = EmbeddedPlan(
        llm_workers=(A100, A100, A100),
        torch_workers=0,
        http_port=0,
        prefill_workers=1,
    )
    embedded = EmbeddedStack(settings, plan)
    await embedded.start()
    yield embedded
    assert await embedded.stop() == 0


pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_the_plan_gives_the_first_workers_the_prefill_role() -> None:
    plan = EmbeddedPlan(llm_workers=(A100, A100, A100), prefill_workers=1)
    roles = [s.worker_role for s in plan.worker_settings(load_settings({}))[:3]]
    assert roles == ["prefill", "decode", "decode"]
    assert EmbeddedPlan(llm_workers=(A100, A100)).llm_role(1) == "mixed"


async def test_completions_are_prefilled_on_one_pool_and_decoded_on_the_other(
    stack: EmbeddedStack,
) -> None:
    async with httpx.AsyncClient(base_url=stack.url, timeout=60.0) as client:

        async def complete(i: int) -> httpx.Response:
            return await client.post(
                "/v1/completions",
                json={"model": "llama-2-7b", "prompt": f"trains {i} " * 40, "max_tokens": 24},
            )

        answers = await asyncio.gather(*(complete(i) for i in range(8)))
        for answer in answers:
            assert answer.status_code == 200, answer.text
            body = answer.json()
            assert body["usage"]["completion_tokens"] == 24
            info = body["switchyard"]
            assert info["worker_id"] in {"llm-1", "llm-2"}  # the decode pool answers
            t = info["timeline"]
            assert t["arrival_s"] <= t["started_s"] <= t["first_token_s"] <= t["finished_s"]
            status = await client.get(f"/v1/requests/{info['request_id']}")
            assert status.json()["status"] == "ok"
    prefill = next(
        w for w in stack.workers() if isinstance(w, WorkerService) and w.worker_id == "llm-0"
    )
    assert isinstance(prefill, WorkerService)
    assert prefill.holdings.held == {}  # every request it prefilled left it


async def test_a_streamed_answer_keeps_every_token_across_the_hand_off(
    stack: EmbeddedStack,
) -> None:
    async with (
        httpx.AsyncClient(base_url=stack.url, timeout=60.0) as client,
        client.stream(
            "POST",
            "/v1/chat/completions",
            json={
                "model": "llama-2-7b",
                "messages": [{"role": "user", "content": "a long trip"}],
                "max_tokens": 30,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        ) as answer,
    ):
        assert answer.status_code == 200
        text, usage = "", None
        async for line in answer.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            for choice in chunk.get("choices", []):
                text += choice.get("delta", {}).get("content") or ""
            usage = chunk.get("usage") or usage
    assert usage is not None
    assert usage["completion_tokens"] == 30
    assert len(text.split()) == 30  # the emulated filler: one word a token, none lost
