"""The ingress's OpenAI-style calls answered, over the in-memory bus with the fake worker
of :mod:`tests.service.ingress_support`: ``/v1/completions`` (the answer's shape, the
request the worker gets, max_tokens, the ``switchyard`` block and headers setting tokens,
deadline and priority), ``/v1/chat/completions`` (the prompt made of the messages) and
the header an emulated answer carries."""

from __future__ import annotations

import math
import time

import pytest
from switchyard.contracts.messages import LLMPayload, WorkloadType

from services.ingress.api import ApiOptions
from services.ingress.tokens import chat_prompt
from tests.service.ingress_support import (
    CHAT_SLO_S,
    Replica,
    Stack,
    _stream,
    answer_text,
    assert_error,
    completion_body,
    ingress_fixture,  # noqa: F401 (the ``ingress`` fixture)
    sse_events,
    stack_fixture,  # noqa: F401 (the ``stack`` fixture)
)

# -- /v1/completions ---------------------------------------------------------------------


async def test_completion_answers_in_openai_shape(stack: Stack, ingress: Replica) -> None:
    before = time.time()
    response = await ingress.client.post("/v1/completions", json=completion_body())
    assert response.status_code == 200, response.text
    body = response.json()
    request_id = body["switchyard"]["request_id"]
    assert request_id.startswith("req-")
    assert body["id"] == request_id
    assert response.headers["X-Switchyard-Request-Id"] == request_id
    assert "X-Switchyard-Emulated" not in response.headers
    assert body["object"] == "text_completion"
    assert body["model"] == "chat"
    assert isinstance(body["created"], int)
    assert body["choices"] == [
        {"index": 0, "text": answer_text(request_id), "finish_reason": "length", "logprobs": None}
    ]
    # "Say hello" is 9 bytes: ceil(9 / 4) = 3 prompt tokens.
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
    block = body["switchyard"]
    assert block["status"] == "ok"
    assert block["worker_id"] == "worker-1"
    assert block["worker_type"] == "cpu"
    assert block["variant"] == "llama-2-7b"
    assert block["emulated"] is False
    assert block["deadline_met"] is True
    assert set(block["timeline"]) == {
        "arrival_s",
        "assigned_s",
        "started_s",
        "first_token_s",
        "finished_s",
    }
    # The request the worker got, addressed back to this replica's answer partition.
    [request] = stack.worker.requests_with_id(request_id)
    assert request.app == "chat"
    assert request.reply_to == "ingress-a"
    assert request.reply_partition == ingress.answers.reply_partition
    assert request.priority == 0
    assert before <= request.arrival_s <= time.time()
    assert request.deadline_s == pytest.approx(request.arrival_s + CHAT_SLO_S)
    assert block["deadline_s"] == pytest.approx(request.deadline_s)
    payload = request.payload
    assert isinstance(payload, LLMPayload)
    assert payload.model == "llama-2-7b"
    assert payload.prompt == "Say hello"
    assert payload.prompt_tokens == 3
    assert payload.max_output_tokens == 8
    assert payload.workload == "conversation"
    assert payload.stream is False
    assert payload.ttft_slo_s == 1.0  # the conversation class's default objective


async def test_the_default_deadline_runs_in_the_emulated_time_scale(stack: Stack) -> None:
    replica = await stack.replica(options=ApiOptions(answer_timeout_s=5.0, llm_time_scale=10.0))
    response = await replica.client.post("/v1/completions", json=completion_body())
    assert response.status_code == 200, response.text
    [request] = stack.worker.requests_with_id(response.json()["id"])
    assert request.deadline_s == pytest.approx(request.arrival_s + CHAT_SLO_S / 10.0)
    assert isinstance(request.payload, LLMPayload)
    assert request.payload.ttft_slo_s == pytest.approx(0.1)  # so is its TTFT objective


async def test_max_tokens_defaults_to_16(stack: Stack, ingress: Replica) -> None:
    body = completion_body()
    del body["max_tokens"]
    response = await ingress.client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    [request] = stack.worker.requests_with_id(response.json()["id"])
    assert isinstance(request.payload, LLMPayload)
    assert request.payload.max_output_tokens == 16


async def test_switchyard_block_sets_tokens_deadline_and_priority(
    stack: Stack, ingress: Replica
) -> None:
    body = completion_body(
        prompt="",
        switchyard={
            "deadline_ms": 2500,
            "priority": 7,
            "prompt_tokens": 50,
            "output_tokens_hint": 100,
            "workload": "code",
        },
    )
    response = await ingress.client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    [request] = stack.worker.requests_with_id(response.json()["id"])
    payload = request.payload
    assert isinstance(payload, LLMPayload)
    assert payload.prompt_tokens == 50
    # The predictor's workload feature: the client's class, not the application's.
    assert payload.workload is WorkloadType.CODE
    assert payload.output_tokens_hint == 8  # capped at max_tokens
    assert request.priority == 7
    assert request.deadline_s == pytest.approx(request.arrival_s + 2.5)
    assert response.json()["usage"]["prompt_tokens"] == 50


async def test_prompt_may_be_left_out_when_prompt_tokens_is_given(
    stack: Stack, ingress: Replica
) -> None:
    body = {"model": "chat", "max_tokens": 4, "switchyard": {"prompt_tokens": 12}}
    response = await ingress.client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    [request] = stack.worker.requests_with_id(response.json()["id"])
    assert isinstance(request.payload, LLMPayload)
    assert request.payload.prompt is None
    assert request.payload.prompt_tokens == 12


async def test_prompts_that_share_leading_text_share_leading_block_ids(
    stack: Stack, ingress: Replica
) -> None:
    # 4 bytes a token, 512 tokens a block: 2,048 bytes of text a block.
    shared = "You are a careful assistant. " * 100  # 2,900 bytes
    payloads = []
    for question in ("What is Kafka?" * 100, "What is Redis?" * 100):
        body = completion_body(model="coder", prompt=shared + question)
        response = await ingress.client.post("/v1/completions", json=body)
        assert response.status_code == 200, response.text
        [request] = stack.worker.requests_with_id(response.json()["id"])
        assert isinstance(request.payload, LLMPayload)
        payloads.append(request.payload)
    first, second = (p.prefix_blocks for p in payloads)
    assert len(first) == len(second) == 2  # 4,300 bytes: two full blocks, one partial
    assert first[0] == second[0]  # the first 2,048 bytes are the same
    assert first[1] != second[1]  # the second block holds part of the question


async def test_a_replay_names_its_prompt_blocks_and_too_many_are_refused(
    stack: Stack, ingress: Replica
) -> None:
    body = {"model": "coder", "max_tokens": 4, "switchyard": {"prompt_tokens": 600}}
    ok = await ingress.client.post(
        "/v1/completions",
        json={**body, "switchyard": {"prompt_tokens": 600, "prefix_blocks": [7, 9]}},
    )
    assert ok.status_code == 200, ok.text
    [request] = stack.worker.requests_with_id(ok.json()["id"])
    assert isinstance(request.payload, LLMPayload)
    assert request.payload.prefix_blocks == [7, 9]
    too_many = await ingress.client.post(
        "/v1/completions",
        json={**body, "switchyard": {"prompt_tokens": 600, "prefix_blocks": [1, 2, 3]}},
    )
    assert_error(too_many, 400, param="switchyard.prefix_blocks", names="at most 2")


async def test_headers_give_deadline_and_priority_and_the_body_wins(
    stack: Stack, ingress: Replica
) -> None:
    headers = {"X-Switchyard-Deadline-Ms": "1500", "X-Switchyard-Priority": "42"}
    response = await ingress.client.post("/v1/completions", json=completion_body(), headers=headers)
    assert response.status_code == 200, response.text
    [request] = stack.worker.requests_with_id(response.json()["id"])
    assert request.priority == 42
    assert request.deadline_s == pytest.approx(request.arrival_s + 1.5)

    body = completion_body(switchyard={"deadline_ms": 3000, "priority": 1})
    response = await ingress.client.post("/v1/completions", json=body, headers=headers)
    assert response.status_code == 200, response.text
    [request] = stack.worker.requests_with_id(response.json()["id"])
    assert request.priority == 1
    assert request.deadline_s == pytest.approx(request.arrival_s + 3.0)


async def test_other_openai_fields_are_ignored(ingress: Replica) -> None:
    body = completion_body(temperature=0.2, top_p=0.9, n=1, user="someone")
    response = await ingress.client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text


# -- /v1/chat/completions ----------------------------------------------------------------


async def test_chat_completion(stack: Stack, ingress: Replica) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "!"}],
        },
    ]
    body = {"model": "chat", "messages": messages, "max_tokens": 5}
    response = await ingress.client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["object"] == "chat.completion"
    request_id = answer["id"]
    assert answer["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": answer_text(request_id)},
            "finish_reason": "length",
        }
    ]
    [request] = stack.worker.requests_with_id(request_id)
    assert isinstance(request.payload, LLMPayload)
    expected = chat_prompt([("system", "Be brief."), ("user", "Hi!")])
    assert expected == "system: Be brief.\nuser: Hi!\nassistant:"
    assert request.payload.prompt == expected
    assert answer["usage"]["prompt_tokens"] == math.ceil(len(expected.encode()) / 4)


async def test_chat_max_completion_tokens_wins(stack: Stack, ingress: Replica) -> None:
    body = {
        "model": "chat",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 5,
        "max_completion_tokens": 9,
    }
    response = await ingress.client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    [request] = stack.worker.requests_with_id(response.json()["id"])
    assert isinstance(request.payload, LLMPayload)
    assert request.payload.max_output_tokens == 9


# -- emulated ----------------------------------------------------------------------------


async def test_emulated_answers_carry_the_header(ingress: Replica) -> None:
    response = await ingress.client.post("/v1/completions", json=completion_body(prompt="EMULATED"))
    assert response.status_code == 200, response.text
    assert response.headers["X-Switchyard-Emulated"] == "true"
    assert response.json()["switchyard"]["emulated"] is True

    streamed = await _stream(ingress.client, "/v1/completions", completion_body(prompt="EMULATED"))
    assert streamed.status_code == 200, streamed.text
    assert streamed.headers["X-Switchyard-Emulated"] == "true"
    assert sse_events(streamed.text)[-2]["switchyard"]["emulated"] is True
