"""The embedded stack end to end: every service in one process, answering over HTTP.

Real services (ingress, monitor, predictor, estimator, scheduler, rebalancer, workers)
over the in-memory bus and state: an emulated LLM worker, a torch worker running the
real classification variants and the tiny language model.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio
from switchyard.bus import MemoryBroker
from switchyard.bus.records import OutgoingRecord, RecordMetadata
from switchyard.config import load_settings
from switchyard.contracts.topics import WORKER_INBOX

from services.embedded import EmbeddedPlan, EmbeddedStack


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack() -> AsyncIterator[EmbeddedStack]:
    settings = load_settings(
        {},
        worker_time_scale=50.0,
        log_level="WARNING",
        heartbeat_interval_s=0.2,
    )
    plan = EmbeddedPlan(llm_workers=("a100-80gb/llama-2-7b",), torch_workers=1, http_port=0)
    embedded = EmbeddedStack(settings, plan)
    await embedded.start()
    yield embedded
    assert await embedded.stop() == 0


@pytest_asyncio.fixture(loop_scope="module")
async def client(stack: EmbeddedStack) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=stack.url, timeout=60.0) as http:
        yield http


pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_an_llm_completion_is_served_by_the_emulated_worker(
    client: httpx.AsyncClient,
) -> None:
    answer = await client.post(
        "/v1/completions",
        json={"model": "llama-2-7b", "prompt": "Tell me about trains", "max_tokens": 40},
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["usage"]["completion_tokens"] == 40
    info = body["switchyard"]
    assert info["worker_id"] == "llm-0"
    assert info["emulated"] is True
    assert answer.headers["x-switchyard-emulated"] == "true"
    t = info["timeline"]
    assert t["arrival_s"] <= t["assigned_s"] <= t["started_s"] <= t["finished_s"]
    # Judged by the application's token objectives (llama-2-7b: a conversation, 1 s to
    # the first token, 0.1 s a token after it, at this unloaded stack's pace).
    assert info["ttft_s"] == pytest.approx(t["first_token_s"] - t["arrival_s"])
    assert info["tpot_s"] == pytest.approx((t["finished_s"] - t["first_token_s"]) / 39)
    assert info["token_slo_met"] is True
    status = await client.get(f"/v1/requests/{info['request_id']}")
    assert status.json()["status"] == "ok"


async def test_the_tiny_language_model_really_generates_on_the_torch_worker(
    client: httpx.AsyncClient,
) -> None:
    answer = await client.post(
        "/v1/completions", json={"model": "tiny-lm", "prompt": "switch", "max_tokens": 12}
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["switchyard"]["worker_id"] == "torch-0"
    assert body["switchyard"]["emulated"] is False
    assert body["choices"][0]["text"]  # real tokens, decoded as bytes
    assert body["usage"]["completion_tokens"] == 12


async def test_a_streamed_chat_answer_arrives_in_chunks_then_done(
    client: httpx.AsyncClient,
) -> None:
    events: list[str] = []
    async with client.stream(
        "POST",
        "/v1/chat/completions",
        json={
            "model": "tiny-lm",
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 16,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    ) as answer:
        assert answer.status_code == 200
        async for line in answer.aiter_lines():
            if line.startswith("data: "):
                events.append(line[len("data: ") :])
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    content = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert len(content) >= 2  # the tokens come as they are generated, not in one piece
    finish, usage = chunks[-2:]
    assert finish["choices"][0]["finish_reason"] == "length"
    assert "usage" not in finish
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == 16


async def test_a_classification_request_gets_a_label_from_a_real_variant(
    client: httpx.AsyncClient,
) -> None:
    from switchyard.apps.datasets import load_dataset

    data = load_dataset("digits")
    answers = []
    for row in range(8):
        answer = await client.post(
            "/v1/apps/digits/infer", json={"features": [float(v) for v in data.x_test[row]]}
        )
        assert answer.status_code == 200, answer.text
        answers.append(answer.json())
    right = sum(a["label"] == int(data.y_test[i]) for i, a in enumerate(answers))
    assert right >= 6  # real models: most of these rows are labelled right
    assert {a["variant"] for a in answers} <= {"logreg-pca4", "mlp-small", "mlp-large", "estimator"}


async def test_bad_requests_get_a_4xx_naming_the_problem(client: httpx.AsyncClient) -> None:
    unknown = await client.post("/v1/completions", json={"model": "gpt-9", "prompt": "x"})
    assert unknown.status_code == 404
    assert "gpt-9" in unknown.json()["error"]["message"]
    negative = await client.post(
        "/v1/completions", json={"model": "llama-2-7b", "prompt": "x", "max_tokens": -3}
    )
    assert negative.status_code == 400
    assert negative.json()["error"]["param"] == "max_tokens"


async def test_an_assignment_lost_on_its_way_to_a_live_worker_is_answered_all_the_same(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The call's assignment goes to a partition its worker does not read: the worker
    # stays alive and never sees it. The monitor finds it unlisted by the worker's later
    # heartbeats and takes it back, and the scheduler sends it again.
    append = MemoryBroker.append
    misdirected: list[OutgoingRecord] = []

    def misdirect(
        self: MemoryBroker, record: OutgoingRecord, default_partitions: int
    ) -> RecordMetadata:
        if (
            not misdirected
            and record.topic.endswith(WORKER_INBOX.name)
            and record.partition is not None
            and b"lost-on-the-way" in record.value
        ):
            others = self.partition_count(record.topic)
            record = dataclasses.replace(record, partition=(record.partition + 1) % others)
            misdirected.append(record)
        return append(self, record, default_partitions)

    monkeypatch.setattr(MemoryBroker, "append", misdirect)
    started_s = time.monotonic()
    answer = await client.post(
        "/v1/completions",
        json={
            "model": "llama-2-7b",
            "prompt": "Where did my request go?",
            "max_tokens": 4,
            "switchyard": {"request_id": "lost-on-the-way"},
        },
    )
    waited_s = time.monotonic() - started_s

    assert misdirected, "the assignment was never sent"
    assert answer.status_code == 200, answer.text
    assert answer.json()["switchyard"]["worker_id"] == "llm-0"
    status = await client.get("/v1/requests/lost-on-the-way")
    assert status.json()["status"] == "ok", status.text
    # Without the sweep the call would wait out the client's 60 s timeout.
    print(f"\nlost assignment: answered after {waited_s:.1f} s")


async def test_after_the_state_store_lost_its_data_a_retry_gets_its_one_answer(
    stack: EmbeddedStack, client: httpx.AsyncClient
) -> None:
    body = {
        "model": "llama-2-7b",
        "prompt": "Remember me",
        "max_tokens": 6,
        "switchyard": {"request_id": "survives-the-loss"},
    }
    first = await client.post("/v1/completions", json=body)
    assert first.status_code == 200, first.text

    await stack.state.clear_prefix()  # as a Redis restarted without persistence
    statuses = []
    for _ in range(100):
        retry = await client.post("/v1/completions", json=body)
        statuses.append(retry.status_code)
        if retry.status_code != 503:
            break
        # Until the monitor has read the answers back: refused, never run again.
        assert retry.json()["error"]["code"] == "state_restoring", retry.text
        await asyncio.sleep(0.05)
    assert retry.status_code == 200, (statuses, retry.text)
    # The first run's answer, from the answers topic: the same run, not a second one.
    assert retry.json()["switchyard"]["timeline"] == first.json()["switchyard"]["timeline"]
    assert retry.json()["choices"] == first.json()["choices"]
