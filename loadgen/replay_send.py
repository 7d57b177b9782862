"""Sending one request of a replay and recording what became of it.

:class:`ReplayRun` is the mutable state of one replay (the client, the clock, the
records so far); :meth:`ReplayRun.send` sends one request at once, however many are in
flight, notes when it went out against when it was due (``send_lag_s``), reads the
answer with :func:`loadgen.replay_answers.parse_answer`, and records a client timeout as
``timeout`` and a connection failure as ``transport_error``. :func:`open_client` picks
the client: the lean keep-alive one (:mod:`loadgen.http_client`) for a plain ``http://``
target, httpx for ``https://`` or an in-process transport.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import httpx
from switchyard.progress import Progress

from loadgen.http_client import (
    HttpClient,
    HttpxClient,
    KeepAliveClient,
    ProtocolError,
    RequestTimeoutError,
)
from loadgen.mixes import PlannedRequest
from loadgen.replay_answers import parse_answer
from loadgen.replay_records import OK, TIMEOUT, TRANSPORT_ERROR, RequestRecord

__all__ = [
    "ReplayRun",
    "open_client",
]


class ReplayRun:
    """The mutable state of one replay: the client, the clock, the records so far;
    :meth:`send` sends one request and records what became of it."""

    _POSTFIX_EVERY_S = 0.1

    def __init__(
        self,
        client: HttpClient,
        run_id: str,
        clock: Callable[[], float],
        bar: Progress,
    ) -> None:
        self.client = client
        self.run_id = run_id
        self.clock = clock
        self.bar = bar
        self.start = clock()
        self.records: dict[int, RequestRecord] = {}
        self.sent: dict[int, tuple[float, float]] = {}  # index -> (scheduled_s, sent_s)
        self.last_answer_s = 0.0
        self.ok = 0
        self.failed = 0
        self.max_lag_s = 0.0
        self._postfix_at_s = 0.0

    def base_record(self, request: PlannedRequest, scheduled_s: float) -> dict[str, Any]:
        return {
            "index": request.index,
            "request_id": request.request_id(self.run_id),
            "kind": request.kind,
            "app": request.app,
            "workload": request.workload,
            "arrival_s": request.arrival_s,
            "scheduled_s": scheduled_s,
            "prompt_tokens": request.prompt_tokens,
            "max_tokens": request.max_tokens,
            "true_label": request.true_label,
            "exec_scale": request.exec_scale,
        }

    async def send(self, request: PlannedRequest, payload: bytes, scheduled_s: float) -> None:
        sent_s = self.clock() - self.start
        self.sent[request.index] = (scheduled_s, sent_s)
        self.max_lag_s = max(self.max_lag_s, sent_s - scheduled_s)
        record = self.base_record(request, scheduled_s)
        record["sent_s"] = sent_s
        record["send_lag_s"] = sent_s - scheduled_s
        try:
            response = await self.client.post(request.path, payload)
        except RequestTimeoutError as exc:
            record["outcome"] = TIMEOUT
            record["error_type"] = type(exc).__name__
            record["error_message"] = str(exc) or "no answer within the timeout"
        except ProtocolError as exc:  # refused, reset, protocol errors
            record["outcome"] = TRANSPORT_ERROR
            record["error_type"] = type(exc).__name__
            record["error_message"] = str(exc) or type(exc).__name__
        else:
            record["latency_s"] = self.clock() - self.start - sent_s
            record["status_code"] = response.status
            record.update(
                parse_answer(request.kind, response.status, response.content, response.headers)
            )
        done_s = self.clock() - self.start
        self.last_answer_s = max(self.last_answer_s, done_s)
        self.records[request.index] = RequestRecord(**record)
        if record["outcome"] == OK:
            self.ok += 1
        else:
            self.failed += 1
        postfix = None
        if done_s - self._postfix_at_s >= self._POSTFIX_EVERY_S:
            # Formatted a few times a second, not per answer: at 1,000 answers a second
            # the text would cost more than the bar shows.
            self._postfix_at_s = done_s
            postfix = (
                f"ok {self.ok} failed {self.failed} in flight "
                f"{len(self.sent) - len(self.records)} max lag {self.max_lag_s:.3f}s"
            )
        self.bar.advance(postfix=postfix)


def open_client(
    base_url: str,
    timeout_s: float,
    max_connections: int,
    transport: httpx.AsyncBaseTransport | None,
    api_key: str | None = None,
) -> contextlib.AbstractAsyncContextManager[HttpClient]:
    """The lean keep-alive client for a plain ``http://`` target; httpx for ``https://``
    or an in-process transport."""
    url = httpx.URL(base_url)
    client: HttpClient
    if transport is None and url.scheme == "http":
        client = KeepAliveClient(
            url.host,
            url.port or 80,
            timeout_s=timeout_s,
            max_connections=max_connections,
            api_key=api_key,
        )
    else:
        client = HttpxClient(
            base_url,
            timeout_s=timeout_s,
            max_connections=max_connections,
            transport=transport,
            api_key=api_key,
        )
    return contextlib.aclosing(client)
