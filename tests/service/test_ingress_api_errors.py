"""The ingress's errors, in the OpenAI error shape, over the in-memory bus with the fake
worker of :mod:`tests.service.ingress_support`: a worker's failure a 502, an expiry or no
answer in time a 504, the state store being down a 503, and bad input (JSON, fields, the
``switchyard`` options and headers, chat messages, features, body size, content type,
method and path) a 4xx naming what was wrong."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from services.ingress.api import ApiOptions
from tests.service.ingress_support import (
    CHAT_MAX_OUTPUT,
    CHAT_MAX_PROMPT,
    WINE_FEATURES,
    Replica,
    Stack,
    _stream,
    assert_error,
    completion_body,
    features,
    ingress_fixture,  # noqa: F401 (the ``ingress`` fixture)
    stack_fixture,  # noqa: F401 (the ``stack`` fixture)
)

# -- failures and timeouts ----------------------------------------------------------------


async def test_failed_completion_is_a_502_with_the_workers_error(ingress: Replica) -> None:
    response = await ingress.client.post("/v1/completions", json=completion_body(prompt="FAIL"))
    error = assert_error(response, 502, param=None, names="CUDA out of memory")
    assert "worker-1" in error["message"]
    assert response.json()["switchyard"]["status"] == "failed"


async def test_expired_completion_is_a_504(ingress: Replica) -> None:
    response = await ingress.client.post("/v1/completions", json=completion_body(prompt="EXPIRE"))
    error = assert_error(response, 504, param=None, names="expired")
    assert error["code"] == "deadline_expired"


async def test_no_answer_in_time_is_a_504_naming_the_request_id(stack: Stack) -> None:
    replica = await stack.replica(options=ApiOptions(answer_timeout_s=0.2))
    body = completion_body(prompt="SLOW", switchyard={"request_id": "slow-1"})
    response = await replica.client.post("/v1/completions", json=body)
    error = assert_error(response, 504, param=None, names="slow-1")
    assert error["code"] == "answer_timeout"
    assert "/v1/requests/slow-1" in error["message"]
    assert response.headers["X-Switchyard-Request-Id"] == "slow-1"
    assert response.json()["switchyard"]["request_id"] == "slow-1"
    assert len(replica.answers) == 0  # the waiter was released

    # Accepted and kept: nothing decided it yet.
    status = await replica.client.get("/v1/requests/slow-1")
    assert status.status_code == 200
    assert status.json()["status"] == "queued"
    assert status.json()["worker_id"] is None


async def test_stream_without_an_answer_in_time_is_a_504(stack: Stack) -> None:
    replica = await stack.replica(options=ApiOptions(answer_timeout_s=0.2))
    response = await _stream(replica.client, "/v1/completions", completion_body(prompt="SLOW"))
    error = assert_error(response, 504, param=None, names="no answer")
    assert error["code"] == "answer_timeout"


async def test_the_state_store_being_down_is_a_503(stack: Stack) -> None:
    replica = await stack.replica()

    async def refuse(*args: object, **kwargs: object) -> bool:
        raise ConnectionError("state store unreachable")

    with contextlib.ExitStack() as patches:
        monkeypatch = pytest.MonkeyPatch()
        patches.callback(monkeypatch.undo)
        # Reading a record (a retry's look-up, a status) and every ledger transition.
        monkeypatch.setattr(stack.state, "hgetall", refuse)
        monkeypatch.setattr(stack.state, "run_script", refuse)
        monkeypatch.setattr(stack.state, "run_script_many", refuse)
        for body in (completion_body(), completion_body(switchyard={"request_id": "x-1"})):
            response = await replica.client.post("/v1/completions", json=body)
            assert_error(response, 503, param=None, names="unreachable")
            assert response.headers["Retry-After"] == "1"
        status = await replica.client.get("/v1/requests/x-1")
        assert_error(status, 503, param=None, names="unreachable")
    # Nothing was published: nothing was recorded.
    assert stack.worker.seen == []
    assert len(replica.answers) == 0


# -- bad input -----------------------------------------------------------------------------


async def test_invalid_json_is_a_400(ingress: Replica) -> None:
    response = await ingress.client.post(
        "/v1/completions",
        content=b'{"model": "chat",',
        headers={"content-type": "application/json"},
    )
    error = assert_error(response, 400, param=None, names="not valid JSON")
    assert error["code"] == "invalid_json"


async def test_empty_body_is_a_400(ingress: Replica) -> None:
    response = await ingress.client.post(
        "/v1/completions", content=b"", headers={"content-type": "application/json"}
    )
    assert_error(response, 400, param=None, names="empty")


async def test_a_body_that_is_not_an_object_is_a_400(ingress: Replica) -> None:
    response = await ingress.client.post("/v1/completions", json=["chat"])
    assert_error(response, 400, param=None, names="JSON object")


async def test_a_list_of_prompts_is_a_400_naming_prompt(ingress: Replica) -> None:
    response = await ingress.client.post(
        "/v1/completions", json=completion_body(prompt=["one", "two"])
    )
    error = assert_error(response, 400, param="prompt")
    assert "list" in error["message"]


async def test_missing_model_is_a_400(ingress: Replica) -> None:
    body = completion_body()
    del body["model"]
    error = assert_error(
        await ingress.client.post("/v1/completions", json=body), 400, param="model"
    )
    assert error["code"] == "missing_field"


async def test_missing_prompt_is_a_400(ingress: Replica) -> None:
    body = completion_body()
    del body["prompt"]
    response = await ingress.client.post("/v1/completions", json=body)
    error = assert_error(response, 400, param="prompt")
    assert error["code"] == "missing_field"


@pytest.mark.parametrize("max_tokens", [0, -1])
async def test_zero_or_negative_max_tokens_is_a_400(ingress: Replica, max_tokens: int) -> None:
    response = await ingress.client.post(
        "/v1/completions", json=completion_body(max_tokens=max_tokens)
    )
    assert_error(response, 400, param="max_tokens")


@pytest.mark.parametrize("value", ["16", 1.5, True])
async def test_max_tokens_of_the_wrong_type_is_a_400(ingress: Replica, value: object) -> None:
    response = await ingress.client.post("/v1/completions", json=completion_body(max_tokens=value))
    assert_error(response, 400, param="max_tokens")


async def test_max_tokens_above_the_models_limit_is_a_400(ingress: Replica) -> None:
    response = await ingress.client.post(
        "/v1/completions", json=completion_body(max_tokens=CHAT_MAX_OUTPUT + 1)
    )
    error = assert_error(response, 400, param="max_tokens")
    assert str(CHAT_MAX_OUTPUT) in error["message"]


async def test_a_prompt_too_long_is_a_400(ingress: Replica) -> None:
    prompt = "x" * (CHAT_MAX_PROMPT * 4 + 1)
    response = await ingress.client.post("/v1/completions", json=completion_body(prompt=prompt))
    error = assert_error(response, 400, param="prompt")
    assert error["code"] == "context_length_exceeded"


async def test_prompt_tokens_above_the_limit_is_a_400(ingress: Replica) -> None:
    body = completion_body(switchyard={"prompt_tokens": CHAT_MAX_PROMPT + 1})
    response = await ingress.client.post("/v1/completions", json=body)
    assert_error(response, 400, param="switchyard.prompt_tokens")


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("prompt_tokens", 0),
        ("prompt_tokens", -3),
        ("output_tokens_hint", 0),
        ("deadline_ms", 0),
        ("deadline_ms", -5),
        ("deadline_ms", "100"),
        ("priority", 1001),
        ("priority", -1),
        ("workload", "poetry"),
        ("request_id", "has space"),
        ("request_id", ""),
    ],
)
async def test_bad_switchyard_options_are_400s(
    ingress: Replica, option: str, value: object
) -> None:
    body = completion_body(switchyard={option: value})
    response = await ingress.client.post("/v1/completions", json=body)
    assert_error(response, 400, param=f"switchyard.{option}")


async def test_an_unknown_switchyard_option_is_a_400(ingress: Replica) -> None:
    body = completion_body(switchyard={"deadline": 100})
    error = assert_error(
        await ingress.client.post("/v1/completions", json=body), 400, param="switchyard.deadline"
    )
    assert error["code"] == "unknown_field"


@pytest.mark.parametrize("value", ["abc", "-1", "0", "nan", "inf", ""])
async def test_a_bad_deadline_header_is_a_400(ingress: Replica, value: str) -> None:
    response = await ingress.client.post(
        "/v1/completions", json=completion_body(), headers={"X-Switchyard-Deadline-Ms": value}
    )
    assert_error(response, 400, param="X-Switchyard-Deadline-Ms")


@pytest.mark.parametrize("value", ["high", "-1", "1001", "1.5"])
async def test_a_bad_priority_header_is_a_400(ingress: Replica, value: str) -> None:
    response = await ingress.client.post(
        "/v1/completions", json=completion_body(), headers={"X-Switchyard-Priority": value}
    )
    assert_error(response, 400, param="X-Switchyard-Priority")


async def test_stream_of_the_wrong_type_is_a_400(ingress: Replica) -> None:
    response = await ingress.client.post("/v1/completions", json=completion_body(stream="yes"))
    assert_error(response, 400, param="stream")


async def test_an_unknown_model_is_a_404_listing_the_served_ones(ingress: Replica) -> None:
    response = await ingress.client.post("/v1/completions", json=completion_body(model="gpt-9"))
    error = assert_error(response, 404, param="model", names="unknown model 'gpt-9'")
    assert "served models: chat, coder" in error["message"]
    assert error["code"] == "model_not_found"


@pytest.mark.parametrize(
    ("path", "param", "value"),
    [
        ("/v1/completions", "n", 2),
        ("/v1/completions", "best_of", 3),
        ("/v1/completions", "logprobs", 0),
        ("/v1/completions", "echo", True),
        ("/v1/completions", "stop", ["\n"]),
        ("/v1/completions", "suffix", "end"),
        ("/v1/chat/completions", "n", 2),
        ("/v1/chat/completions", "logprobs", True),
        ("/v1/chat/completions", "stop", "END"),
        ("/v1/chat/completions", "tools", [{"type": "function", "function": {"name": "f"}}]),
        ("/v1/chat/completions", "tool_choice", "required"),
        ("/v1/chat/completions", "response_format", {"type": "json_object"}),
    ],
)
async def test_a_parameter_that_would_change_the_answer_is_refused_not_ignored(
    ingress: Replica, path: str, param: str, value: object
) -> None:
    body: dict[str, Any] = (
        completion_body()
        if path == "/v1/completions"
        else {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
    )
    response = await ingress.client.post(path, json={**body, param: value})
    error = assert_error(response, 400, param=param, names=f"'{param}' is not supported")
    assert error["code"] == "unsupported_parameter"


@pytest.mark.parametrize(
    ("param", "value"),
    [("n", 1), ("stop", None), ("logprobs", False), ("response_format", {"type": "text"})],
)
async def test_a_neutral_value_of_an_unsupported_parameter_is_accepted(
    ingress: Replica, param: str, value: object
) -> None:
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], param: value}
    response = await ingress.client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([], "messages"),
        ("hello", "messages"),
        ([{"role": "wizard", "content": "hi"}], "messages[0].role"),
        ([{"role": "user", "content": 5}], "messages[0].content"),
        ([{"role": "user", "content": "a"}, {"content": "b"}], "messages[1].role"),
    ],
)
async def test_bad_chat_messages_are_400s(ingress: Replica, messages: object, param: str) -> None:
    body = {"model": "chat", "messages": messages}
    response = await ingress.client.post("/v1/chat/completions", json=body)
    assert_error(response, 400, param=param)


async def test_missing_chat_messages_is_a_400(ingress: Replica) -> None:
    response = await ingress.client.post("/v1/chat/completions", json={"model": "chat"})
    assert_error(response, 400, param="messages")


async def test_an_unknown_app_is_a_404(ingress: Replica) -> None:
    response = await ingress.client.post("/v1/apps/beer/infer", json={"features": features()})
    error = assert_error(response, 404, param="app", names="unknown application 'beer'")
    assert "wine" in error["message"]


@pytest.mark.parametrize("count", [WINE_FEATURES - 1, WINE_FEATURES + 1])
async def test_the_wrong_feature_count_is_a_400(ingress: Replica, count: int) -> None:
    response = await ingress.client.post("/v1/apps/wine/infer", json={"features": [0.0] * count})
    error = assert_error(response, 400, param="features")
    assert f"takes exactly {WINE_FEATURES}" in error["message"]


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
async def test_non_finite_features_are_400s(ingress: Replica, literal: str) -> None:
    values = ["0.5"] * WINE_FEATURES
    values[3] = literal
    raw = '{"features": [' + ", ".join(values) + "]}"
    response = await ingress.client.post(
        "/v1/apps/wine/infer", content=raw.encode(), headers={"content-type": "application/json"}
    )
    error = assert_error(response, 400, param="features[3]")
    assert "finite" in error["message"]


@pytest.mark.parametrize(
    ("path", "raw", "param"),
    [
        ("/v1/completions", '{"model": "chat", "prompt": "hi \\ud800 there"}', "prompt"),
        (
            "/v1/chat/completions",
            '{"model": "chat", "messages": [{"role": "user", "content": "\\udfff"}]}',
            "messages[0].content",
        ),
    ],
)
async def test_a_lone_surrogate_escape_is_a_400_naming_the_field(
    ingress: Replica, path: str, raw: str, param: str
) -> None:
    response = await ingress.client.post(
        path, content=raw.encode(), headers={"content-type": "application/json"}
    )
    error = assert_error(response, 400, param=param)
    assert "surrogate" in error["message"]


async def test_a_surrogate_pair_is_text_and_served(ingress: Replica) -> None:
    raw = '{"model": "chat", "prompt": "smile \\ud83d\\ude00", "max_tokens": 3}'
    response = await ingress.client.post(
        "/v1/completions", content=raw.encode(), headers={"content-type": "application/json"}
    )
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("literal", ["1e39", "-1e39", "1e308"])
async def test_features_beyond_float32_are_400s(ingress: Replica, literal: str) -> None:
    """Finite as a 64-bit float but infinite as the 32-bit float the models read: a
    request that would poison the estimator and the workers is refused at the door."""
    values = ["0.5"] * WINE_FEATURES
    values[2] = literal
    raw = '{"features": [' + ", ".join(values) + "]}"
    response = await ingress.client.post(
        "/v1/apps/wine/infer", content=raw.encode(), headers={"content-type": "application/json"}
    )
    error = assert_error(response, 400, param="features[2]")
    assert "32-bit float" in error["message"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "features"),
        ({"features": "0.5"}, "features"),
        ({"features": [True] * WINE_FEATURES}, "features[0]"),
        ({"features": ["0.5"] * WINE_FEATURES}, "features[0]"),
        ({"features": features(), "deadline_ms": 0}, "deadline_ms"),
        ({"features": features(), "priority": 5000}, "priority"),
        # Switchyard's own body: an unknown field is refused, not left to the default
        # deadline (the completions' ``switchyard`` block does not belong here).
        ({"features": features(), "switchyard": {"deadline_ms": 9000}}, "switchyard"),
        ({"features": features(), "deadline": 9000}, "deadline"),
    ],
)
async def test_bad_infer_bodies_are_400s(
    ingress: Replica, body: dict[str, Any], param: str
) -> None:
    response = await ingress.client.post("/v1/apps/wine/infer", json=body)
    assert_error(response, 400, param=param)


async def test_a_body_over_the_limit_is_a_413(stack: Stack) -> None:
    replica = await stack.replica(options=ApiOptions(max_body_bytes=1024))
    big = completion_body(prompt="x" * 2000)
    response = await replica.client.post("/v1/completions", json=big)
    error = assert_error(response, 413, param=None, names="1024 bytes")
    assert error["code"] == "body_too_large"


async def test_a_body_over_the_limit_without_content_length_is_a_413(stack: Stack) -> None:
    replica = await stack.replica(options=ApiOptions(max_body_bytes=1024))
    sent: list[int] = []

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"model": "chat", "prompt": "'
        for _ in range(100):  # 100 KiB, far past the limit: reading must stop early
            sent.append(1)
            yield b"x" * 1024
        yield b'"}'

    response = await replica.client.post(
        "/v1/completions", content=chunks(), headers={"content-type": "application/json"}
    )
    assert "content-length" not in response.request.headers
    assert_error(response, 413, param=None, names="1024 bytes")


async def test_a_non_json_content_type_is_a_415(ingress: Replica) -> None:
    response = await ingress.client.post(
        "/v1/completions",
        content=json.dumps(completion_body()).encode(),
        headers={"content-type": "text/plain"},
    )
    error = assert_error(response, 415, param="Content-Type", names="text/plain")
    assert error["code"] == "unsupported_media_type"


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/v1/completions"), ("POST", "/v1/models"), ("DELETE", "/v1/apps/wine/infer")],
)
async def test_the_wrong_method_is_a_405(ingress: Replica, method: str, path: str) -> None:
    response = await ingress.client.request(method, path)
    error = assert_error(response, 405, param=None, names=method)
    assert error["code"] == "method_not_allowed"


async def test_an_unknown_path_is_a_404_in_the_error_shape(ingress: Replica) -> None:
    response = await ingress.client.get("/v2/nothing")
    assert_error(response, 404, param=None, names="/v2/nothing")
