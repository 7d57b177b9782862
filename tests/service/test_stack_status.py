"""``switchyard status`` and ``GET /status`` against a running embedded stack: the
workers, every service replica, answers and their rate, dead letters."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from switchyard.bus import bus_from_settings
from switchyard.config import load_settings
from switchyard.contracts.topics import REQUESTS
from switchyard.runtime.presence import read_replicas

from services.embedded import EmbeddedPlan, EmbeddedStack

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack() -> AsyncIterator[EmbeddedStack]:
    settings = load_settings(
        {}, worker_time_scale=50.0, log_level="WARNING", heartbeat_interval_s=0.2
    )
    plan = EmbeddedPlan(
        llm_workers=("a100-80gb/llama-2-7b", "a100-80gb/llama-2-7b"), torch_workers=0, http_port=0
    )
    embedded = EmbeddedStack(settings, plan)
    await embedded.start()
    yield embedded
    assert await embedded.stop() == 0


async def _health_url(stack: EmbeddedStack, service: str) -> str:
    replicas = await read_replicas(stack.state, time.time())
    return next(r.health_url for r in replicas if r.name == service)


async def _status(url: str) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=10.0) as http:
        answer = await http.get(url + "/status")
    assert answer.status_code == 200, answer.text
    document: dict[str, Any] = answer.json()
    return document


async def test_every_service_replica_and_worker_is_listed(stack: EmbeddedStack) -> None:
    document = await _status(await _health_url(stack, "monitor"))
    services = {(s["name"], s["instance"], s["state"]) for s in document["services"]}
    # No torch worker, so no classification applications and no estimator.
    for name in ("ingress", "monitor", "scheduler", "rebalancer", "predictor"):
        assert (name, f"{name}-0", "ready") in services, services
    assert {("worker", "llm-0", "ready"), ("worker", "llm-1", "ready")} <= services
    workers = {w["worker_id"]: w for w in document["workers"]}
    assert set(workers) == {"llm-0", "llm-1"}
    assert all(w["state"] == "alive" for w in workers.values())
    assert workers["llm-0"]["profile"] == "a100-80gb/llama-2-7b"
    assert workers["llm-0"]["emulated"] is True


async def test_answers_show_in_the_counts_and_the_rate(stack: EmbeddedStack) -> None:
    url = await _health_url(stack, "ingress")
    before = await _status(url)
    async with httpx.AsyncClient(base_url=stack.url, timeout=60.0) as client:
        answers = await asyncio.gather(
            *(
                client.post(
                    "/v1/completions",
                    json={"model": "llama-2-7b", "prompt": "count me", "max_tokens": 4},
                )
                for _ in range(6)
            )
        )
    assert all(a.status_code == 200 for a in answers)
    after = await _status(url)
    totals_before, totals = before["totals"], after["totals"]
    assert totals["completed"] - totals_before["completed"] == 6
    assert totals["answers_per_s"] > 0
    assert totals["slo_attainment"] is not None
    per_worker = sum(w["completed"] for w in after["workers"])
    assert per_worker == totals["completed"]


async def test_a_message_no_consumer_can_read_is_counted_as_a_dead_letter(
    stack: EmbeddedStack,
) -> None:
    url = await _health_url(stack, "scheduler")
    before = (await _status(url))["totals"]["dead_letters"]
    bus = bus_from_settings(stack.settings, memory_broker=stack.broker)
    await bus.start()
    try:
        await bus.publish_bytes(REQUESTS, b"\xff not a request", key=b"garbage")
    finally:
        await bus.stop()
    deadline_s = time.monotonic() + 10
    while (await _status(url))["totals"]["dead_letters"] == before:
        assert time.monotonic() < deadline_s, "the dead letter was never counted"
        await asyncio.sleep(0.1)


async def test_the_command_prints_the_stack_and_its_json(stack: EmbeddedStack) -> None:
    url = await _health_url(stack, "monitor")
    screen = await _command("status", "--url", url, "--once")
    assert "workers 2/2 up" in screen, screen
    for shown in ("llm-0", "llm-1", "a100-80gb/llama-2-7b (emulated)", "scheduler", "ingress"):
        assert shown in screen, screen
    document = json.loads(await _command("status", "--url", url, "--once", "--json"))
    assert {w["worker_id"] for w in document["workers"]} == {"llm-0", "llm-1"}


async def _command(*args: str) -> str:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "cli",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()
    return out.decode()


async def test_an_unreachable_stack_or_an_in_memory_store_gets_a_clear_error() -> None:
    in_memory = await _failing("status", "--once", env={"SWITCHYARD_STATE": "memory"})
    assert "--url" in in_memory
    unreachable = await _failing("status", "--url", "http://127.0.0.1:9", "--once")
    assert "http://127.0.0.1:9" in unreachable


async def _failing(*args: str, env: dict[str, str] | None = None) -> str:
    """What the command printed on stderr; it must exit non-zero, without a traceback."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "cli",
        *args,
        stderr=asyncio.subprocess.PIPE,
        env=None if env is None else {**os.environ, **env},
    )
    _, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode != 0
    assert "Traceback" not in err.decode(), err.decode()
    return err.decode()
