"""Streamed answers from the ingress, over the in-memory bus with the fake worker of
:mod:`tests.service.ingress_support`: server-sent events in order, then the final chunk
and ``[DONE]``; redelivered chunks and completions dropped; chunks a completion overtook
waited for; chat chunks with deltas; a failed request a 502."""

from __future__ import annotations

from switchyard.contracts.messages import LLMPayload

from tests.service.ingress_support import (
    Replica,
    Stack,
    _pieces,
    _stream,
    answer_text,
    assert_error,
    completion_body,
    ingress_fixture,  # noqa: F401 (the ``ingress`` fixture)
    sse_events,
    stack_fixture,  # noqa: F401 (the ``stack`` fixture)
)

# -- streaming ---------------------------------------------------------------------------


async def test_stream_sends_chunks_in_order_then_the_final_chunk_and_done(
    stack: Stack, ingress: Replica
) -> None:
    response = await _stream(ingress.client, "/v1/completions", completion_body())
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    *chunks, final = events[:-1]
    request_id = final["switchyard"]["request_id"]
    assert response.headers["X-Switchyard-Request-Id"] == request_id
    assert [c["choices"][0]["text"] for c in chunks] == _pieces(request_id)
    for chunk in chunks:
        assert chunk["object"] == "text_completion"
        assert chunk["id"] == request_id
        assert chunk["choices"][0]["finish_reason"] is None
    assert final["choices"][0]["finish_reason"] == "length"
    assert final["choices"][0]["text"] == ""
    assert "usage" not in final  # only with stream_options.include_usage
    assert final["switchyard"]["status"] == "ok"
    [request] = stack.worker.requests_with_id(request_id)
    assert isinstance(request.payload, LLMPayload)
    assert request.payload.stream is True


async def test_stream_drops_redelivered_chunks_and_completions(ingress: Replica) -> None:
    response = await _stream(ingress.client, "/v1/completions", completion_body(prompt="DUP"))
    assert response.status_code == 200, response.text
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    request_id = events[-2]["switchyard"]["request_id"]
    texts = [e["choices"][0]["text"] for e in events[:-2]]
    assert texts == _pieces(request_id)
    assert sum(1 for e in events if e != "[DONE]" and "switchyard" in e) == 1


async def test_stream_waits_for_chunks_the_completion_overtook(ingress: Replica) -> None:
    response = await _stream(ingress.client, "/v1/completions", completion_body(prompt="LATE"))
    assert response.status_code == 200, response.text
    events = sse_events(response.text)
    request_id = events[-2]["switchyard"]["request_id"]
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == answer_text(request_id)
    assert events[-2]["choices"][0]["finish_reason"] == "length"


async def test_stream_waits_for_chunks_a_completion_without_text_overtook(
    ingress: Replica,
) -> None:
    body = completion_body(prompt="LATE NOTEXT")
    response = await _stream(ingress.client, "/v1/completions", body)
    assert response.status_code == 200, response.text
    events = sse_events(response.text)
    request_id = events[-2]["switchyard"]["request_id"]
    assert [e["choices"][0]["text"] for e in events[:-2]] == _pieces(request_id)


async def test_chat_stream_uses_chunk_objects_with_deltas(ingress: Replica) -> None:
    body = {"model": "chat", "messages": [{"role": "user", "content": "Hi"}]}
    response = await _stream(ingress.client, "/v1/chat/completions", body)
    assert response.status_code == 200, response.text
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    *chunks, final = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in events[:-1])
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    content = "".join(c["choices"][0]["delta"]["content"] for c in chunks)
    assert content == answer_text(final["id"])
    assert final["choices"][0] == {"index": 0, "delta": {}, "finish_reason": "length"}


async def test_stream_of_a_failed_request_is_a_502(ingress: Replica) -> None:
    response = await _stream(ingress.client, "/v1/completions", completion_body(prompt="FAIL"))
    error = assert_error(response, 502, param=None, names="CUDA out of memory")
    assert error["code"] == "worker_failed"
