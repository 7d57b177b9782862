"""Request ids in the ingress, over the in-memory bus with the fake worker of
:mod:`tests.service.ingress_support`: a request's status (``/v1/requests/{id}``) through
its life and from any replica; retries with the same request id answered once, from the
record, on any replica; a publish that failed, hung or lost its acknowledgement answered
503 ``outcome_unknown`` and its retry run once; the drain refusing new calls; several
replicas on one bus each getting their own answers."""

from __future__ import annotations

import asyncio

import httpx
from switchyard.contracts.messages import InferenceRequest

from services.ingress.api import ApiOptions
from tests.service.ingress_support import (
    Replica,
    Stack,
    _pieces,
    _stream,
    answer_text,
    assert_error,
    completion_body,
    features,
    ingress_fixture,  # noqa: F401 (the ``ingress`` fixture)
    sse_events,
    stack_fixture,  # noqa: F401 (the ``stack`` fixture)
)

# -- status ------------------------------------------------------------------------------


async def test_status_before_and_after_the_answer(stack: Stack, ingress: Replica) -> None:
    body = completion_body(prompt="DELAY", switchyard={"request_id": "status-1"})
    call = asyncio.create_task(ingress.client.post("/v1/completions", json=body))
    # The record follows the request through its life: accepted (queued), decided
    # (assigned), then running on its worker for the 0.3 s it takes.
    seen: list[str] = []
    for _ in range(100):
        before = await ingress.client.get("/v1/requests/status-1")
        if before.status_code == 200:
            seen.append(before.json()["status"])
            if seen[-1] == "running":
                break
        await asyncio.sleep(0.01)
    assert before.status_code == 200, before.text
    assert set(seen) <= {"queued", "assigned", "running"}, seen
    running = before.json()
    assert running["request_id"] == "status-1"
    assert running["app"] == "chat"
    assert running["kind"] == "llm"
    assert running["status"] == "running"
    assert running["worker_id"] == "worker-1"
    assert running["timeline"]["arrival_s"] is not None
    # When its worker started it, as the ledger recorded.
    assert running["timeline"]["arrival_s"] <= running["timeline"]["started_s"]
    assert running.get("result") is None

    response = await call
    assert response.status_code == 200, response.text
    after = (await ingress.client.get("/v1/requests/status-1")).json()
    assert after["status"] == "ok"
    assert after["worker_id"] == "worker-1"
    assert after["result"] == {
        "kind": "llm",
        "output_tokens": 3,
        "text": answer_text("status-1"),
        "label": None,  # a completion with no choices answers no label
    }
    assert after["timeline"]["finished_s"] is not None
    assert after["deadline_met"] is True


async def test_status_of_a_request_id_with_a_slash(ingress: Replica) -> None:
    body = completion_body(switchyard={"request_id": "tenant/42"})
    assert (await ingress.client.post("/v1/completions", json=body)).status_code == 200
    status = await ingress.client.get("/v1/requests/tenant/42")
    assert status.status_code == 200, status.text
    assert status.json()["request_id"] == "tenant/42"


async def test_status_of_an_unknown_request_is_a_404(ingress: Replica) -> None:
    response = await ingress.client.get("/v1/requests/nope")
    error = assert_error(response, 404, param="request_id", names="nope")
    assert error["code"] == "request_not_found"


async def test_status_can_be_read_on_another_replica(stack: Stack, ingress: Replica) -> None:
    other = await stack.replica("ingress-b")
    body = completion_body(switchyard={"request_id": "shared-1"})
    assert (await ingress.client.post("/v1/completions", json=body)).status_code == 200
    status = await other.client.get("/v1/requests/shared-1")
    assert status.status_code == 200
    assert status.json()["status"] == "ok"


# -- idempotent retries --------------------------------------------------------------------


async def test_retry_with_the_same_request_id_returns_the_stored_answer(
    stack: Stack, ingress: Replica
) -> None:
    body = completion_body(switchyard={"request_id": "retry-1"})
    first = await ingress.client.post("/v1/completions", json=body)
    second = await ingress.client.post("/v1/completions", json=body)
    assert first.status_code == second.status_code == 200
    assert first.json() == second.json()
    # Answered from the record: not published, let alone run, again.
    assert len(stack.worker.requests_with_id("retry-1")) == 1
    assert len(stack.worker.runs_of("retry-1")) == 1

    # Streamed, the retry gets the stored answer as one chunk.
    streamed = await _stream(ingress.client, "/v1/completions", body)
    events = sse_events(streamed.text)
    assert events[-1] == "[DONE]"
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == answer_text("retry-1")
    assert len(stack.worker.requests_with_id("retry-1")) == 1


async def test_a_retry_with_the_id_the_server_generated_gets_the_stored_answer(
    stack: Stack, ingress: Replica
) -> None:
    first = await ingress.client.post("/v1/completions", json=completion_body())
    assert first.status_code == 200, first.text
    request_id = first.headers["x-switchyard-request-id"]
    assert first.json()["switchyard"]["request_id"] == request_id
    retry = completion_body(switchyard={"request_id": request_id})
    second = await asyncio.wait_for(ingress.client.post("/v1/completions", json=retry), 10)
    assert second.status_code == 200, second.text
    assert second.json()["choices"] == first.json()["choices"]
    assert len(stack.worker.runs_of(request_id)) == 1


async def test_an_id_reused_for_another_request_is_a_409_never_the_others_answer(
    stack: Stack, ingress: Replica
) -> None:
    first_body = completion_body(prompt="first", switchyard={"request_id": "reused-1"})
    first = await ingress.client.post("/v1/completions", json=first_body)
    assert first.status_code == 200, first.text
    other_prompt = completion_body(prompt="second", switchyard={"request_id": "reused-1"})
    other_limit = completion_body(
        prompt="first", max_tokens=3, switchyard={"request_id": "reused-1"}
    )
    classification = {"features": features(), "request_id": "reused-1"}
    for path, body in (
        ("/v1/completions", other_prompt),
        ("/v1/completions", other_limit),
        ("/v1/apps/wine/infer", classification),
    ):
        response = await ingress.client.post(path, json=body)
        error = assert_error(response, 409, param="request_id")
        assert error["code"] == "request_id_reused"
        assert "choices" not in response.json()
    # The first request keeps its one answer, and an exact retry still gets it.
    again = await ingress.client.post("/v1/completions", json=first_body)
    assert again.json()["choices"] == first.json()["choices"]
    assert len(stack.worker.runs_of("reused-1")) == 1


async def test_concurrent_retries_share_one_run(stack: Stack, ingress: Replica) -> None:
    body = completion_body(prompt="DELAY", switchyard={"request_id": "retry-2"})
    first, second = await asyncio.gather(
        ingress.client.post("/v1/completions", json=body),
        ingress.client.post("/v1/completions", json=body),
    )
    assert first.status_code == second.status_code == 200, (first.text, second.text)
    assert first.json()["choices"] == second.json()["choices"]
    # The second call waits with the first on this replica: one publish, one run.
    assert len(stack.worker.requests_with_id("retry-2")) == 1
    assert len(stack.worker.runs_of("retry-2")) == 1
    assert len(ingress.answers) == 0


async def test_retry_on_another_replica_waits_for_the_first(stack: Stack, ingress: Replica) -> None:
    other = await stack.replica("ingress-b")
    body = completion_body(prompt="DELAY", switchyard={"request_id": "retry-3"})
    first = asyncio.create_task(ingress.client.post("/v1/completions", json=body))
    await asyncio.sleep(0.05)
    second = await other.client.post("/v1/completions", json=body)
    assert second.status_code == 200, second.text
    assert (await first).json()["choices"] == second.json()["choices"]
    assert len(stack.worker.runs_of("retry-3")) == 1
    # The answer went to the first call's replica; the retry found it in the record.
    [request] = stack.worker.runs_of("retry-3")
    assert request.reply_to == "ingress-a"
    assert len(other.answers) == 0


async def test_one_id_sent_to_two_replicas_at_once_is_accepted_and_run_once(
    stack: Stack, ingress: Replica
) -> None:
    # The ledger's accept is one atomic create-or-return: whichever replica records the
    # id first publishes it; the other serves the same request (maybe publishing it once
    # more: the ledger decides it once).
    other = await stack.replica("ingress-b")
    body = completion_body(prompt="DELAY", switchyard={"request_id": "both-1"})
    first, second = await asyncio.gather(
        ingress.client.post("/v1/completions", json=body),
        other.client.post("/v1/completions", json=body),
    )
    assert first.status_code == second.status_code == 200, (first.text, second.text)
    assert first.json()["choices"] == second.json()["choices"]
    assert first.json()["choices"][0]["text"] == answer_text("both-1")
    assert len(stack.worker.runs_of("both-1")) == 1
    assert len(ingress.answers) == len(other.answers) == 0


async def test_classification_retry_is_idempotent(stack: Stack, ingress: Replica) -> None:
    body = {"features": features(), "request_id": "wine-retry"}
    first = await ingress.client.post("/v1/apps/wine/infer", json=body)
    second = await ingress.client.post("/v1/apps/wine/infer", json=body)
    assert first.status_code == second.status_code == 200
    assert first.json() == second.json()
    assert len(stack.worker.requests_with_id("wine-retry")) == 1
    assert len(stack.worker.runs_of("wine-retry")) == 1


# -- publishing failures and the drain -----------------------------------------------------


class FlakyPublish:
    """A publisher that fails (``ConnectionError``) or hangs (``hang``) while ``broken``;
    ``lost_after_send``: it hangs only after the request reached the bus (the broker
    stored it, its acknowledgement never came)."""

    def __init__(self, stack: Stack, *, hang: bool = False, lost_after_send: bool = False) -> None:
        self.stack = stack
        self.hang = hang
        self.lost_after_send = lost_after_send
        self.broken = True
        self.attempts: list[str] = []

    async def __call__(self, request: InferenceRequest) -> None:
        self.attempts.append(request.request_id)
        if not self.broken:
            await self.stack.publish(request)
            return
        if self.lost_after_send:
            await self.stack.publish(request)
        if self.hang or self.lost_after_send:
            await asyncio.Event().wait()
        raise ConnectionError("broker unreachable")


def assert_outcome_unknown(response: httpx.Response, request_id: str, *, names: str) -> None:
    """503 ``outcome_unknown`` with ``Retry-After``, naming the request id to retry with."""
    error = assert_error(response, 503, param=None, names=names)
    assert error["code"] == "outcome_unknown"
    assert request_id in error["message"]
    assert "retry with the same request_id" in error["message"]
    assert response.headers["Retry-After"] == "1"
    assert response.json()["switchyard"] == {"request_id": request_id, "status": "unknown"}


async def test_a_failed_publish_is_outcome_unknown_and_the_retry_gets_the_one_answer(
    stack: Stack,
) -> None:
    publish = FlakyPublish(stack)
    replica = await stack.replica(publish=publish)
    body = completion_body(switchyard={"request_id": "unpublished"})
    response = await replica.client.post("/v1/completions", json=body)
    assert_outcome_unknown(response, "unpublished", names="broker unreachable")
    assert len(replica.answers) == 0  # the call stopped waiting
    # The record is kept (the request may yet go out): the id is taken, still queued.
    status = await replica.client.get("/v1/requests/unpublished")
    assert status.status_code == 200, status.text
    assert status.json()["status"] == "queued"
    assert stack.worker.requests_with_id("unpublished") == []

    # The retry, on another replica, publishes the still-queued request and gets its answer.
    working = await stack.replica("ingress-b")
    retry = await working.client.post("/v1/completions", json=body)
    assert retry.status_code == 200, retry.text
    assert retry.json()["choices"][0]["text"] == answer_text("unpublished")
    assert len(stack.worker.runs_of("unpublished")) == 1
    # ... and a retry after that gets the same answer from the record.
    again = await replica.client.post("/v1/completions", json=body)
    assert again.status_code == 200, again.text
    assert again.json() == retry.json()
    assert len(stack.worker.runs_of("unpublished")) == 1
    assert publish.attempts == ["unpublished"]  # an answered request is not published again


async def test_a_timed_out_publish_is_outcome_unknown_and_the_same_replica_serves_the_retry(
    stack: Stack,
) -> None:
    publish = FlakyPublish(stack, hang=True)
    options = ApiOptions(answer_timeout_s=5.0, publish_timeout_s=0.1)
    replica = await stack.replica(options=options, publish=publish)
    body = completion_body(switchyard={"request_id": "hung-1"})
    response = await replica.client.post("/v1/completions", json=body)
    assert_outcome_unknown(response, "hung-1", names="hung-1")
    assert len(replica.answers) == 0
    assert (await replica.client.get("/v1/requests/hung-1")).json()["status"] == "queued"

    publish.broken = False  # the broker is back
    retry = await replica.client.post("/v1/completions", json=body)
    assert retry.status_code == 200, retry.text
    assert retry.json()["choices"][0]["text"] == answer_text("hung-1")
    assert publish.attempts == ["hung-1", "hung-1"]
    assert len(stack.worker.runs_of("hung-1")) == 1
    assert len(replica.answers) == 0


async def test_a_publish_whose_ack_was_lost_runs_once_whatever_the_retries(
    stack: Stack,
) -> None:
    # The broker stored the request but the call timed out waiting for its ack: the
    # request goes on, and retries (re-publishing it while it is still queued) neither
    # run it twice nor get another answer.
    publish = FlakyPublish(stack, lost_after_send=True)
    options = ApiOptions(answer_timeout_s=5.0, publish_timeout_s=0.1)
    replica = await stack.replica(options=options, publish=publish)
    body = completion_body(prompt="DELAY", switchyard={"request_id": "acked-late"})
    response = await replica.client.post("/v1/completions", json=body)
    assert_outcome_unknown(response, "acked-late", names="acked-late")

    publish.broken = False
    other = await stack.replica("ingress-b")
    retries = await asyncio.gather(
        replica.client.post("/v1/completions", json=body),
        other.client.post("/v1/completions", json=body),
    )
    for retry in retries:
        assert retry.status_code == 200, retry.text
        assert retry.json()["choices"][0]["text"] == answer_text("acked-late")
    assert retries[0].json() == retries[1].json()
    assert len(stack.worker.runs_of("acked-late")) == 1
    final = await replica.client.get("/v1/requests/acked-late")
    assert final.json()["status"] == "ok"


async def test_draining_refuses_new_calls(ingress: Replica) -> None:
    ingress.admission.stop_accepting()
    response = await ingress.client.post("/v1/completions", json=completion_body())
    assert_error(response, 503, param=None, names="draining")
    assert response.headers["Retry-After"] == "1"
    health = await ingress.client.get("/healthz")
    assert health.status_code == 503
    assert health.json()["status"] == "draining"


# -- several replicas ----------------------------------------------------------------------


async def test_two_replicas_on_one_bus_each_get_their_own_answers(stack: Stack) -> None:
    a = await stack.replica("ingress-a")
    b = await stack.replica("ingress-b")

    async def call(replica: Replica, n: int) -> tuple[str, httpx.Response]:
        request_id = f"{replica.instance_id}-{n}"
        body = completion_body(switchyard={"request_id": request_id})
        return request_id, await replica.client.post("/v1/completions", json=body)

    results = await asyncio.gather(*(call(r, n) for r in (a, b) for n in range(5)))
    for request_id, response in results:
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["text"] == answer_text(request_id)
        [request] = stack.worker.requests_with_id(request_id)
        assert request.reply_to == request_id.rsplit("-", 1)[0]
        replica = a if request.reply_to == a.instance_id else b
        assert request.reply_partition == replica.answers.reply_partition
    # Each replica reads a partition of its own: answers go to the replica that asked.
    assert a.answers.reply_partition != b.answers.reply_partition

    streams = await asyncio.gather(
        _stream(a.client, "/v1/completions", completion_body()),
        _stream(b.client, "/v1/completions", completion_body()),
    )
    for response in streams:
        events = sse_events(response.text)
        request_id = events[-2]["switchyard"]["request_id"]
        assert [e["choices"][0]["text"] for e in events[:-2]] == _pieces(request_id)
    assert len(a.answers) == len(b.answers) == 0
