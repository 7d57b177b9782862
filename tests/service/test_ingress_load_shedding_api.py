"""Admission control in the ingress API, over the in-memory bus with the fake worker of
:mod:`tests.service.ingress_support`: a request no worker can finish before its deadline
gets 429 with ``Retry-After`` and is neither recorded nor published; one for a model no
live worker serves gets 503; nothing is refused before the first cluster read; a retry of
a request accepted before is answered from its record, never judged again; answers that
come later than estimated make the gate refuse what it would otherwise admit."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx
import pytest
from switchyard.bus import Bus, MemoryTransport
from switchyard.cluster import read_cluster
from switchyard.config import load_settings
from switchyard.contracts.messages import InferenceRequest
from switchyard.contracts.topics import requests_topic
from switchyard.state.memory import MemoryStateStore
from switchyard.telemetry import Telemetry, configure_telemetry

from services.ingress.api import ApiOptions, build_app
from services.ingress.calibration import CALIBRATION_MIN_CALLS
from services.ingress.load_shedding import NO_WORKER_RETRY_AFTER_S, AdmissionGate
from tests.service.ingress_support import (
    FakeWorker,
    answer_text,
    assert_error,
    completion_body,
    features,
    make_catalogue,
    routed_answers,
)
from tests.support.services import heartbeat, mark_restored, store_worker


@dataclass
class Gated:
    bus: Bus
    state: MemoryStateStore
    worker: FakeWorker
    gate: AdmissionGate
    client: httpx.AsyncClient
    telemetry: Telemetry
    stopping: asyncio.Event = field(default_factory=asyncio.Event)

    async def refresh(self) -> None:
        """What the ingress's cluster routine does every ~100 ms."""
        self.gate.observe(await read_cluster(self.state, time.time()))

    async def published(self) -> list[InferenceRequest]:
        await asyncio.sleep(0.1)  # anything published has reached the fake worker
        return list(self.worker.seen)


async def _gated(grace_s: float = 10.0) -> AsyncIterator[Gated]:
    bus = Bus(MemoryTransport(), commit_interval_s=0.05)
    await bus.start()
    state = MemoryStateStore()
    await mark_restored(state)
    worker = FakeWorker(bus, state)
    stopping = asyncio.Event()
    answers, routing = await routed_answers(bus, state, "ingress-a", stopping)
    gate = AdmissionGate(slack=1.0, grace_s=grace_s, worker_timeout_s=2.0)
    answers.on_completion = gate.answered  # as the ingress service wires it
    telemetry = configure_telemetry("ingress", load_settings({}), install_global=False)

    async def publish(request: InferenceRequest) -> None:
        await bus.publish(requests_topic(request), request)

    app = build_app(
        make_catalogue(),
        publish,
        answers,
        state,
        options=ApiOptions(answer_timeout_s=5.0),
        gate=gate,
        telemetry=telemetry,
    )
    tasks = [asyncio.create_task(worker.run(stopping)), routing]
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://ingress", timeout=10.0
    )
    try:
        yield Gated(bus, state, worker, gate, client, telemetry, stopping)
    finally:
        stopping.set()
        await client.aclose()
        await worker.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await bus.stop()
        telemetry.shutdown()


@pytest.fixture
async def gated() -> AsyncIterator[Gated]:
    async for made in _gated():
        yield made


@pytest.fixture
async def gated_no_grace() -> AsyncIterator[Gated]:
    async for made in _gated(grace_s=0.0):
        yield made


def _retry_after(response: httpx.Response) -> int:
    value = response.headers["retry-after"]
    assert value.isdigit(), value
    return int(value)


async def test_a_saturated_worker_gets_429_and_nothing_is_recorded_or_published(
    gated: Gated,
) -> None:
    # The only worker of llama-2-7b (the "chat" model) has a full batch and a long queue.
    await store_worker(gated.state, heartbeat("w1", waiting=60, running=8, queued_work_s=600.0))
    await gated.refresh()
    body = completion_body(switchyard={"request_id": "busy-1"})

    refused = await gated.client.post("/v1/completions", json=body)

    error = assert_error(refused, 429, param=None, names="'chat'")
    assert error["code"] == "overloaded"
    assert error["type"] == "server_error"
    assert "estimated wait" in error["message"]
    wait_s = refused.json()["switchyard"]["estimated_wait_s"]
    assert wait_s > 30.0  # beyond chat's 30 s SLO
    assert f"{wait_s:.2f} s" in error["message"]
    assert _retry_after(refused) >= 1
    assert await gated.published() == []
    status = await gated.client.get("/v1/requests/busy-1")
    assert status.status_code == 404  # never recorded

    # The backlog drained: the same id is accepted on retry (nothing held it).
    await store_worker(gated.state, heartbeat("w1", running=1, queued_work_s=0.5))
    await gated.refresh()
    accepted = await gated.client.post("/v1/completions", json=body)
    assert accepted.status_code == 200, accepted.text
    assert [r.request_id for r in await gated.published()] == ["busy-1"]

    assert gated.telemetry.prometheus is not None
    metrics = gated.telemetry.prometheus.render()
    assert (
        'switchyard_ingress_requests_total{app="chat",deadline="none",kind="llm",'
        'outcome="rejected",status_class="4xx"} 1.0' in metrics
    )


async def test_retry_after_grows_with_the_backlog(gated: Gated) -> None:
    after = []
    for work_s in (400.0, 800.0, 1600.0):
        await store_worker(
            gated.state, heartbeat("w1", waiting=60, running=8, queued_work_s=work_s)
        )
        await gated.refresh()
        refused = await gated.client.post("/v1/completions", json=completion_body())
        assert refused.status_code == 429, refused.text
        after.append(_retry_after(refused))
    assert after[0] < after[1] < after[2]


async def test_a_tight_deadline_is_refused_where_the_default_one_fits(gated: Gated) -> None:
    await store_worker(gated.state, heartbeat("w1", waiting=20, running=8, queued_work_s=60.0))
    await gated.refresh()
    fits = await gated.client.post("/v1/completions", json=completion_body())
    assert fits.status_code == 200, fits.text
    tight = await gated.client.post(
        "/v1/completions",
        json=completion_body(),
        headers={"X-Switchyard-Deadline-Ms": "2000"},
    )
    assert tight.status_code == 429, tight.text


async def test_a_classification_app_behind_a_backlog_gets_429(gated: Gated) -> None:
    await store_worker(
        gated.state,
        heartbeat("cpu-0", profile=None, models=("wine/mlp-small",), waiting=40, queued_work_s=2.0),
    )
    await gated.refresh()
    refused = await gated.client.post("/v1/apps/wine/infer", json={"features": features()})
    error = assert_error(refused, 429, param=None, names="'wine'")
    assert error["code"] == "overloaded"
    assert _retry_after(refused) >= 1
    # A later deadline fits behind the same backlog.
    ok = await gated.client.post(
        "/v1/apps/wine/infer", json={"features": features(), "deadline_ms": 5000}
    )
    assert ok.status_code == 200, ok.text


async def test_a_model_without_a_live_worker_gets_503(gated_no_grace: Gated) -> None:
    gated = gated_no_grace
    await store_worker(gated.state, heartbeat("w1", models=("llama-2-13b",)))
    await gated.refresh()
    refused = await gated.client.post("/v1/completions", json=completion_body())
    error = assert_error(refused, 503, param=None, names="'chat'")
    assert error["code"] == "no_worker"
    assert _retry_after(refused) == NO_WORKER_RETRY_AFTER_S
    assert await gated.published() == []
    # Bad input is still a 400 naming the field, not a refusal.
    bad = await gated.client.post("/v1/completions", json=completion_body(max_tokens=10_000))
    assert_error(bad, 400, param="max_tokens")


async def test_nothing_is_refused_before_the_first_cluster_read(gated_no_grace: Gated) -> None:
    gated = gated_no_grace
    assert not gated.gate.ready
    answer = await gated.client.post("/v1/completions", json=completion_body())
    assert answer.status_code == 200, answer.text


async def test_a_retry_of_an_accepted_request_is_answered_not_judged_again(
    gated: Gated,
) -> None:
    await store_worker(gated.state, heartbeat("w1", running=1, queued_work_s=0.5))
    await gated.refresh()
    body = completion_body(switchyard={"request_id": "kept-1"})
    first = await gated.client.post("/v1/completions", json=body)
    assert first.status_code == 200, first.text

    # Now the worker is saturated: a new request is refused ...
    await store_worker(gated.state, heartbeat("w1", waiting=60, running=8, queued_work_s=600.0))
    await gated.refresh()
    fresh = await gated.client.post("/v1/completions", json=completion_body())
    assert fresh.status_code == 429, fresh.text
    # ... but a retry of the accepted one gets its answer from the record, not run again.
    retry = await gated.client.post("/v1/completions", json=body)
    assert retry.status_code == 200, retry.text
    assert retry.json() == first.json()
    assert retry.json()["choices"][0]["text"] == answer_text("kept-1")
    assert [r.request_id for r in await gated.published()] == ["kept-1"]
    assert len(gated.worker.runs_of("kept-1")) == 1


async def test_answers_later_than_estimated_calibrate_the_gate(gated: Gated) -> None:
    # An idle worker whose profile, at time scale 1,000, says a short completion takes
    # milliseconds; its answers come 0.3 s after each call (the fake worker's DELAY).
    fast = heartbeat("w1").model_copy(update={"time_scale": 1000.0})
    await store_worker(gated.state, fast)
    await gated.refresh()
    tight = {"X-Switchyard-Deadline-Ms": "150"}
    fits = await gated.client.post("/v1/completions", json=completion_body(), headers=tight)
    assert fits.status_code == 200, fits.text
    slow = await asyncio.gather(
        *(
            gated.client.post("/v1/completions", json=completion_body(prompt=f"DELAY {i}"))
            for i in range(CALIBRATION_MIN_CALLS)
        )
    )
    assert [r.status_code for r in slow] == [200] * CALIBRATION_MIN_CALLS
    await store_worker(gated.state, fast.model_copy(update={"sent_at_s": time.time()}))
    await gated.refresh()
    # About 0.3 s late at the 0.9 quantile: a 150 ms deadline no longer fits ...
    assert gated.gate.margin_s("llama-2-7b", time.time()) > 0.2
    refused = await gated.client.post("/v1/completions", json=completion_body(), headers=tight)
    assert refused.status_code == 429, refused.text
    # ... a 2 s one still does.
    loose = {"X-Switchyard-Deadline-Ms": "2000"}
    ok = await gated.client.post("/v1/completions", json=completion_body(), headers=loose)
    assert ok.status_code == 200, ok.text
