"""Streamed LLM answers: server-sent events from the chunks a worker sends.

A stream waits for the first chunk (or the whole answer) before it answers, so a request
that fails or times out before any output gets a proper HTTP error and the
``X-Switchyard-Emulated`` header is known. Then every chunk is an event, and the answer's
final chunk ends the stream. Chunks and the answer reach this replica on one partition,
in order; should the answer still come before the last chunks (a chunk whose publish was
retried), its text finishes the stream, and without text the missing chunks get
``stream_grace_s`` to arrive.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send
from switchyard.contracts.messages import Completion, OutputChunk

from services.ingress.answers import Waiter
from services.ingress.calls import Accepted, RequestDesk, status_error
from services.ingress.responses import (
    LlmCall,
    answer_headers,
    judged,
    llm_chunk,
    llm_final_chunk,
    llm_usage_chunk,
    output_of,
    token_block,
)
from services.ingress.telemetry import CallRecord

_DONE = b"data: [DONE]\n\n"


def _sse(data: Any) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


class SseResponse(StreamingResponse):
    """A ``text/event-stream`` answer that runs ``on_close`` however the stream ends
    (finished, failed, or the client went away before it started)."""

    def __init__(
        self,
        content: AsyncIterator[bytes],
        *,
        headers: dict[str, str],
        on_close: Callable[[], None],
    ) -> None:
        super().__init__(
            content,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **headers},
        )
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


async def stream_answer(
    desk: RequestDesk,
    call: LlmCall,
    accepted: Accepted,
    *,
    stream_grace_s: float,
    telemetry: CallRecord | None = None,
    receive: Receive | None = None,
) -> Response:
    """The streamed answer of an accepted LLM call (see the module docstring). With the
    call's ``receive``, a client that goes away before the first chunk cancels the
    request if it has not started (:meth:`RequestDesk.first_event`)."""
    waiter = accepted.waiter
    deadline = time.monotonic() + desk.options.answer_timeout_s

    def close() -> None:
        desk.release(accepted)

    try:
        first: OutputChunk | Completion | None
        if waiter is not None and waiter.stream and receive is not None:
            first = await desk.first_event(
                accepted.request_id, waiter, deadline - time.monotonic(), receive
            )
        elif waiter is not None and waiter.stream:
            first = await waiter.next_event(deadline - time.monotonic())
        else:  # a retry: the whole answer comes as one piece
            first = await desk.completion(accepted, deadline - time.monotonic())
        if first is None:
            raise desk.timeout(call.request_id)
        error = status_error(first, call.deadline_s) if isinstance(first, Completion) else None
        if error is not None:
            raise error
    except BaseException:
        close()
        raise
    events = _events(desk, call, first, waiter, deadline, stream_grace_s, telemetry)
    headers = answer_headers(call.request_id, emulated=first.emulated)
    return SseResponse(events, headers=headers, on_close=close)


async def _events(
    desk: RequestDesk,
    call: LlmCall,
    first: OutputChunk | Completion,
    waiter: Waiter | None,
    deadline: float,
    stream_grace_s: float,
    telemetry: CallRecord | None,
) -> AsyncIterator[bytes]:
    streamed: list[str] = []
    tokens = 0
    event: OutputChunk | Completion | None = first
    while isinstance(event, OutputChunk):
        streamed.append(event.text)
        tokens += event.tokens
        yield _sse(llm_chunk(call, event.text, first=len(streamed) == 1))
        assert waiter is not None  # chunks come only through a streaming waiter
        event = await waiter.next_event(deadline - time.monotonic())
    if event is None:
        if telemetry is not None:
            telemetry.outcome = "timeout"
        yield _sse(desk.timeout(call.request_id).body())
        yield _DONE
        return
    completion = event
    text, output_tokens = output_of(completion)
    covered = bool(text) and text.startswith("".join(streamed))
    if waiter is not None and tokens < output_tokens and not covered:
        grace_end = time.monotonic() + stream_grace_s
        while tokens < output_tokens:
            late = await waiter.next_event(grace_end - time.monotonic())
            if not isinstance(late, OutputChunk):
                break
            streamed.append(late.text)
            tokens += late.tokens
            yield _sse(llm_chunk(call, late.text, first=len(streamed) == 1))
    so_far = "".join(streamed)
    if len(text) > len(so_far) and text.startswith(so_far):
        streamed.append(text[len(so_far) :])
        yield _sse(llm_chunk(call, streamed[-1], first=len(streamed) == 1))
    error = status_error(completion, call.deadline_s)
    if telemetry is not None:
        telemetry.deadline_met = judged(completion, call.deadline_s)
        telemetry.judged_tokens(token_block(completion, call.token_slo))
    if error is not None and telemetry is not None:
        telemetry.error_code = error.code
    if error is not None:
        yield _sse(error.body())
    else:
        yield _sse(llm_final_chunk(call, completion))
        if call.include_usage:
            yield _sse(llm_usage_chunk(call, completion))
    yield _DONE
