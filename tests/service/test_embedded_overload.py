"""Back-pressure end to end: the embedded stack (one emulated Llama-2-7B worker) under a
Poisson replay at several times its capacity sheds load at the ingress with 429 and
``Retry-After``, so the requests it admits meet their deadlines and the worker's queue
stays short; every admitted request is answered.

For scale: the worker serves about 3.5 requests of the conversation sample per modelled
second (about 17 per wall second at time scale 5); the replay sends 70 per wall second.
Without admission control (``SWITCHYARD_ADMISSION=off``) the same replay queues over a
hundred requests at the worker and most answers miss their deadline.
"""

from __future__ import annotations

import asyncio
import time

import httpx
from switchyard.cluster import read_cluster
from switchyard.config import load_settings
from switchyard.traces import resolve_trace

from loadgen.mixes import build_plan
from loadgen.replay import replay
from loadgen.replay_records import OK, REJECTED
from services.embedded import EmbeddedPlan, EmbeddedStack
from tests.support.services import eventually

TIME_SCALE = 5.0
RATE_RPS = 70.0
REQUESTS = 250


async def test_overload_is_shed_with_429_and_admitted_requests_meet_their_deadlines() -> None:
    settings = load_settings(
        {},
        worker_time_scale=TIME_SCALE,
        heartbeat_interval_s=0.1,
        log_level="WARNING",
        admission="deadline",
    )
    plan = EmbeddedPlan(llm_workers=("a100-80gb/llama-2-7b",), torch_workers=0, http_port=0)
    trace = resolve_trace(
        f"poisson:rate_rps={RATE_RPS:g},requests={REQUESTS},lengths=azure-conv-sample,seed=3"
    )
    requests = build_plan(trace, "llm")
    async with EmbeddedStack(settings, plan) as stack:
        longest_queue = 0
        watching = True

        async def watch_queue() -> None:
            nonlocal longest_queue
            while watching:
                view = await read_cluster(stack.state, time.time())
                for record in view.workers:
                    if record.heartbeat is not None:
                        longest_queue = max(longest_queue, record.heartbeat.queue_length)
                await asyncio.sleep(0.05)

        watcher = asyncio.create_task(watch_queue())
        try:
            result = await replay(requests, stack.url, speedup=1.0, timeout_s=60.0, progress=False)
        finally:
            watching = False
            await watcher

        async def drained() -> bool:
            view = await read_cluster(stack.state, time.time())
            beat = view.workers[0].heartbeat
            return beat is not None and beat.queue_length == 0 and beat.running == 0

        await eventually(drained, timeout_s=5.0)

    records = result.records
    rejected = [r for r in records if r.outcome == REJECTED]
    admitted = [r for r in records if r.outcome != REJECTED]
    # Shed: 429 with an integral Retry-After, never 503 (the worker is alive).
    assert len(rejected) >= REQUESTS // 10, [r.outcome for r in records]
    assert {r.status_code for r in rejected} == {429}
    assert {r.error_code for r in rejected} == {"overloaded"}
    for refused in rejected:
        assert refused.retry_after_s is not None
        assert refused.retry_after_s >= 1
        assert float(refused.retry_after_s).is_integer()
    # Accepted work is never lost: every admitted request got its answer.
    unanswered = [r for r in admitted if r.outcome != OK and r.error_code != "deadline_expired"]
    assert unanswered == []
    met = sum(1 for r in admitted if r.deadline_met)
    assert met >= 0.9 * len(admitted), f"{met} of {len(admitted)} admitted met their deadline"
    # The queue stays bounded (without admission it grows past 100 on this replay).
    assert longest_queue < REQUESTS // 4, longest_queue


async def test_giant_requests_that_cannot_be_on_time_do_not_starve_a_normal_one() -> None:
    """The starvation of the report: 60 completions of 4,096 tokens with a 1 ms deadline,
    then a normal 64-token one. The giants that fit the KV cache start (late whatever
    happens), the others are refused at once; the normal request is answered promptly,
    served or told when to retry, never left waiting behind them."""
    settings = load_settings(
        {},
        worker_time_scale=20.0,
        heartbeat_interval_s=0.1,
        log_level="WARNING",
        admission="deadline",
    )
    plan = EmbeddedPlan(llm_workers=("h100-80gb/llama-2-13b",), torch_workers=0, http_port=0)
    giant = {
        "model": "llama-2-13b",
        "prompt": "Tell me everything. " * 200,
        "max_tokens": 4096,
        "switchyard": {"deadline_ms": 1},
    }
    async with (
        EmbeddedStack(settings, plan) as stack,
        httpx.AsyncClient(base_url=stack.url, timeout=120.0) as client,
    ):
        # Once the ingress has read the worker's heartbeat.
        await asyncio.sleep(0.5)
        giants = [
            asyncio.create_task(client.post("/v1/completions", json=giant)) for _ in range(60)
        ]
        await asyncio.sleep(0.5)
        started_s = time.monotonic()
        normal = await client.post(
            "/v1/completions",
            json={"model": "llama-2-13b", "prompt": "Hello", "max_tokens": 64},
        )
        answered_s = time.monotonic() - started_s
        for task in giants:
            task.cancel()
        await asyncio.gather(*giants, return_exceptions=True)
    assert normal.status_code in (200, 429), normal.text
    assert answered_s < 10.0
    if normal.status_code == 429:
        assert int(normal.headers["Retry-After"]) >= 1
    statuses = [t.result().status_code for t in giants if not t.cancelled() and t.done()]
    # The giants beyond what the KV cache holds were refused, not queued.
    assert statuses.count(429) >= 30, statuses
