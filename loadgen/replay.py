"""The open-loop replay engine: send a request plan to a live Switchyard ingress.

Request ``i`` of a plan is sent ``(arrival_i - arrival_0) / speedup`` seconds after the
start, whatever happened to the requests before it: one asyncio task per request on a
shared keep-alive client (:mod:`loadgen.http_client`) that opens a connection whenever
every open one is busy, so no request waits for a connection. The client is lean on
purpose: the generator's own CPU per request is part of what a benchmark reports
(``ReplayResult.cpu_s``), and at 1,000 requests/s a heavy client would measure itself. The dispatcher records, for each request, when it was due
(``scheduled_s``) and when it actually went out (``sent_s``); the difference,
``send_lag_s``, says when the generator itself fell behind (a busy event loop, a
saturated client), so that such a run is not mistaken for a slow server.

Answers are parsed tolerantly: any field of the ingress's contract may be missing or
null, and a request whose answer lacks a timeline is simply left out of the latency
breakdown. A 429 or 503 is recorded as ``rejected`` (never retried); another non-2xx as
``http_error``; a client timeout as ``timeout``; a connection failure as
``transport_error``.

Library use (what ``make demo`` calls in-process)::

    from loadgen.mixes import build_plan
    from loadgen.replay import replay
    from switchyard.traces import resolve_trace

    plan = build_plan(resolve_trace("azure-conv-sample"), "llm", limit=100)
    result = await replay(plan, "http://127.0.0.1:8000", speedup=10.0, timeout_s=60.0,
                          progress=False)
    # result.records: one RequestRecord per planned request;
    # loadgen.replay_report.summarize(result) turns them into the figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
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

__all__ = [
    "CANCELLED",
    "HTTP_ERROR",
    "NOT_SENT",
    "OK",
    "OUTCOMES",
    "REJECTED",
    "REJECTED_STATUS_CODES",
    "TIMEOUT",
    "TRANSPORT_ERROR",
    "ReplayResult",
    "RequestRecord",
    "TargetError",
    "check_reachable",
    "new_run_id",
    "normalise_target",
    "parse_answer",
    "replay",
]

OK = "ok"
"""A 2xx answer."""
REJECTED = "rejected"
"""A 429 or 503 answer: the stack shed the request (not retried)."""
HTTP_ERROR = "http_error"
"""Any other non-2xx answer (400, 404, 500, ...)."""
TIMEOUT = "timeout"
"""No answer within the client timeout."""
TRANSPORT_ERROR = "transport_error"
"""The connection failed (refused, reset, protocol error)."""
CANCELLED = "cancelled"
"""Sent, but still unanswered when a stopped replay's grace period ended."""
NOT_SENT = "not_sent"
"""Never sent: the replay was stopped before it was due."""
OUTCOMES = (OK, REJECTED, HTTP_ERROR, TIMEOUT, TRANSPORT_ERROR, CANCELLED, NOT_SENT)

REJECTED_STATUS_CODES = frozenset({429, 503})
EMULATED_HEADER = "x-switchyard-emulated"
"""The ingress's header naming an emulated answer; read when the body does not say."""

DEFAULT_MAX_CONNECTIONS = 4096
DEFAULT_GRACE_S = 5.0


class TargetError(ValueError):
    """The target URL is malformed or cannot be reached; the one-line message says why."""


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """What happened to one planned request.

    Times ending in ``_s`` without another reference are seconds after the start of the
    replay on the client's monotonic clock; ``timeline`` is the server's, as sent.

    Attributes:
        index: the request's position in the plan.
        request_id: ``<run id>-<index>``.
        kind: ``llm`` or ``classification``.
        app: the OpenAI model or classification application.
        workload: the trace row's workload, or ``classification``.
        arrival_s: the trace arrival (seconds after the trace's first row).
        scheduled_s: when it was due: ``(arrival_s - first arrival) / speedup``.
        sent_s: when it actually went out (None: never sent).
        send_lag_s: ``sent_s - scheduled_s``, how far the generator was behind.
        latency_s: client end-to-end latency, from sending to the whole answer read
            (None without an answer).
        status_code: the HTTP status (None without an answer).
        outcome: one of :data:`OUTCOMES`.
        error_type, error_message: from the error body, or the client exception.
        error_code: the error body's ``code`` (``answer_timeout``, ``model_not_found``).
        retry_after_s: the Retry-After header of a rejection, when numeric.
        prompt_tokens, max_tokens: what an LLM request asked for.
        completion_tokens: ``usage.completion_tokens`` of an LLM answer.
        server_status: ``switchyard.status`` of an LLM answer.
        worker_id, worker_type, variant: who served it.
        emulated: whether the worker was a performance model (None: not said).
        deadline_s: the request's deadline as the server states it.
        deadline_met: whether the server met it (None: not said).
        timeline: the server's ``arrival_s``, ``assigned_s``, ``started_s``,
            ``first_token_s``, ``finished_s`` (numbers only; None when absent).
        label, class_name: a classification answer's prediction.
        true_label: the dataset label of a classification request's features.
    """

    index: int
    request_id: str
    kind: str
    app: str
    workload: str
    arrival_s: float
    scheduled_s: float
    sent_s: float | None = None
    send_lag_s: float | None = None
    latency_s: float | None = None
    status_code: int | None = None
    outcome: str = NOT_SENT
    error_type: str | None = None
    error_message: str | None = None
    error_code: str | None = None
    retry_after_s: float | None = None
    prompt_tokens: int | None = None
    max_tokens: int | None = None
    completion_tokens: int | None = None
    server_status: str | None = None
    worker_id: str | None = None
    worker_type: str | None = None
    variant: str | None = None
    emulated: bool | None = None
    deadline_s: float | None = None
    deadline_met: bool | None = None
    timeline: Mapping[str, float] | None = None
    label: int | None = None
    class_name: str | None = None
    true_label: int | None = None

    @property
    def answered_ok(self) -> bool:
        """A 2xx answer arrived."""
        return self.outcome == OK

    @property
    def was_sent(self) -> bool:
        """The request went out (whatever became of it)."""
        return self.sent_s is not None

    def to_json(self) -> dict[str, Any]:
        """The record as a JSON-ready dict (NaN and infinity become None)."""
        data = asdict(self)
        data["timeline"] = dict(self.timeline) if self.timeline is not None else None
        return {key: _json_number(value) for key, value in data.items()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RequestRecord:
        """A record from :meth:`to_json`'s dict (unknown keys are ignored).

        Raises:
            KeyError: a required key (``index``, ``request_id``, ...) is missing.
        """
        names = cls.__dataclass_fields__
        kwargs = {key: value for key, value in data.items() if key in names}
        timeline = kwargs.get("timeline")
        kwargs["timeline"] = _timeline(timeline) if timeline is not None else None
        return cls(**kwargs)


def _json_number(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _json_number(inner) for key, inner in value.items()}
    return value


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """The outcome of :func:`replay`.

    Attributes:
        run_id: the prefix of every request id.
        target: the base URL requests were sent to.
        speedup: the factor inter-arrival times were divided by.
        timeout_s: the client timeout per request.
        started_at: the wall-clock start, ISO 8601 in UTC.
        duration_s: seconds from the start to the last answer (or to the stop).
        stopped: whether the replay was stopped early (Ctrl-C, the ``stop`` event).
        records: one record per planned request, in plan order.
        cpu_s: CPU seconds this process spent during the replay (the generator's own
            cost; with other work in the process, an upper bound).
    """

    run_id: str
    target: str
    speedup: float
    timeout_s: float
    started_at: str
    duration_s: float
    stopped: bool
    records: list[RequestRecord] = field(default_factory=list)
    cpu_s: float | None = None

    @property
    def cpu_ms_per_request(self) -> float | None:
        """The generator's CPU milliseconds per request it sent (None: none sent)."""
        sent = sum(1 for record in self.records if record.was_sent)
        if self.cpu_s is None or not sent:
            return None
        return self.cpu_s * 1000.0 / sent

    def config(self) -> dict[str, Any]:
        """The settings of the run, for a report's ``config`` section."""
        return {
            "run_id": self.run_id,
            "target": self.target,
            "speedup": self.speedup,
            "timeout_s": self.timeout_s,
            "started_at": self.started_at,
            "duration_s": self.duration_s,
            "stopped": self.stopped,
            "planned": len(self.records),
            "generator_cpu_s": self.cpu_s,
            "generator_cpu_ms_per_request": self.cpu_ms_per_request,
        }


def new_run_id() -> str:
    """A fresh run id: ``replay-<UTC time>-<6 hex digits>``."""
    return f"replay-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(3)}"


def normalise_target(target: str) -> str:
    """The target as a base URL without a trailing slash.

    Raises:
        TargetError: not an ``http://`` or ``https://`` URL with a host.
    """
    text = target.strip().rstrip("/")
    try:
        url = httpx.URL(text)
    except (httpx.InvalidURL, TypeError) as exc:
        raise TargetError(f"--target: not a URL: {target!r} ({exc})") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise TargetError(
            f"--target: expected an http:// or https:// URL with a host, got {target!r}"
        )
    return text


async def check_reachable(target: str, timeout_s: float = 3.0) -> None:
    """Open (and close) one TCP connection to the target's host and port.

    Raises:
        TargetError: the URL is malformed, or nothing accepts a connection there within
            ``timeout_s``.
    """
    url = httpx.URL(normalise_target(target))
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(url.host, port), timeout_s)
    except TimeoutError:
        raise TargetError(
            f"cannot reach the target {target}: no connection within {timeout_s:g} s"
        ) from None
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise TargetError(f"cannot reach the target {target}: {reason}") from None
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()


# --------------------------------------------------------------------------- parsing


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _integer(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def _flag(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, dict | list):
        return None
    return str(value)


def _timeline(value: Any) -> dict[str, float] | None:
    if not isinstance(value, Mapping):
        return None
    numbers = {str(key): _number(inner) for key, inner in value.items()}
    kept = {key: number for key, number in numbers.items() if number is not None}
    return kept or None


def _retry_after_s(headers: Mapping[str, str]) -> float | None:
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None  # an HTTP date: rare, and the replay does not retry anyway
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def parse_answer(
    kind: str, status_code: int, content: bytes, headers: Mapping[str, str]
) -> dict[str, Any]:
    """The :class:`RequestRecord` fields an HTTP answer gives, tolerant of anything.

    A body that is not JSON, or a field that is missing, null or of the wrong type,
    leaves the field out; only ``outcome`` is always present. An error body's
    ``switchyard`` block, when the ingress adds one, is read like an answer's (its
    timeline is kept but never enters the breakdown, which takes 2xx answers only).

    Args:
        kind: ``llm`` (OpenAI completion with a ``switchyard`` object) or
            ``classification`` (the fields at the top level).
        status_code: the HTTP status.
        content: the raw body.
        headers: the response headers (``httpx.Headers``, or a dict with lower-case keys).
    """
    fields: dict[str, Any] = {}
    if 200 <= status_code < 300:
        fields["outcome"] = OK
    elif status_code in REJECTED_STATUS_CODES:
        fields["outcome"] = REJECTED
        retry = _retry_after_s(headers)
        if retry is not None:
            fields["retry_after_s"] = retry
    else:
        fields["outcome"] = HTTP_ERROR
    try:
        body = json.loads(content) if content else None
    except (ValueError, UnicodeDecodeError):
        body = None
    if not isinstance(body, dict):
        if fields["outcome"] != OK:
            snippet = content[:200].decode("utf-8", "replace").strip()
            fields["error_message"] = snippet or None
        return {key: value for key, value in fields.items() if value is not None}
    meta: Mapping[str, Any]
    if fields["outcome"] != OK:
        error = body.get("error")
        if isinstance(error, Mapping):
            fields["error_type"] = _text(error.get("type"))
            fields["error_message"] = _text(error.get("message"))
            fields["error_code"] = _text(error.get("code"))
        # The ingress may add its ``switchyard`` block to an error (a missed deadline,
        # an answer timeout): who served it and whether it was emulated still count.
        raw_meta = body.get("switchyard")
        meta = raw_meta if isinstance(raw_meta, Mapping) else {}
        fields["server_status"] = _text(meta.get("status"))
    elif kind == "llm":
        raw_meta = body.get("switchyard")
        meta = raw_meta if isinstance(raw_meta, Mapping) else {}
        usage = body.get("usage")
        if isinstance(usage, Mapping):
            fields["completion_tokens"] = _integer(usage.get("completion_tokens"))
        fields["server_status"] = _text(meta.get("status"))
    else:
        meta = body
        fields["label"] = _integer(body.get("label"))
        fields["class_name"] = _text(body.get("class_name"))
    fields["worker_id"] = _text(meta.get("worker_id"))
    fields["worker_type"] = _text(meta.get("worker_type"))
    fields["variant"] = _text(meta.get("variant"))
    emulated = _flag(meta.get("emulated"))
    if emulated is None and EMULATED_HEADER in headers:
        emulated = str(headers[EMULATED_HEADER]).strip().lower() == "true"
    fields["emulated"] = emulated
    fields["deadline_s"] = _number(meta.get("deadline_s"))
    fields["deadline_met"] = _flag(meta.get("deadline_met"))
    fields["timeline"] = _timeline(meta.get("timeline"))
    return {key: value for key, value in fields.items() if value is not None}


# --------------------------------------------------------------------------- engine


class _Run:
    """The mutable state of one replay: the client, the clock, the records so far."""

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


async def _sleep_or_stop(delay_s: float, stop: asyncio.Event | None) -> None:
    """Sleep ``delay_s`` (yielding to the loop even when it is 0) or until ``stop`` is set."""
    if stop is None or delay_s <= 0:
        await asyncio.sleep(max(delay_s, 0.0))
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), delay_s)


async def _first_done(waiters: set[asyncio.Future[Any]], timeout_s: float | None) -> None:
    await asyncio.wait(waiters, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)


async def _wait_all(tasks: set[asyncio.Task[None]], stop: asyncio.Event | None) -> bool:
    """Wait for every task, or until ``stop`` is set; True when all finished.

    Each task counts itself off as it ends, so the wait costs nothing per answer (a
    replay of 100,000 requests must not rescan its tasks at every answer)."""
    pending = {task for task in tasks if not task.done()}
    if not pending:
        return True
    all_done = asyncio.Event()

    def finished(task: asyncio.Task[None]) -> None:
        pending.discard(task)
        if not pending:
            all_done.set()

    for task in pending:
        task.add_done_callback(finished)
    waits: set[asyncio.Future[Any]] = {asyncio.ensure_future(all_done.wait())}
    if stop is not None:
        waits.add(asyncio.ensure_future(stop.wait()))
    try:
        await _first_done(waits, None)
    finally:
        for wait in waits:
            wait.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
    return all(task.done() for task in tasks)


async def _grace(
    tasks: set[asyncio.Task[None]], grace_s: float, abort: asyncio.Event | None
) -> None:
    """Wait up to ``grace_s`` for the unfinished tasks; ``abort`` ends the wait early."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace_s
    aborter: asyncio.Future[Any] | None = (
        asyncio.ensure_future(abort.wait()) if abort is not None else None
    )
    try:
        while not (abort is not None and abort.is_set()):
            waiters: set[asyncio.Future[Any]] = {t for t in tasks if not t.done()}
            remaining_s = deadline - loop.time()
            if not waiters or remaining_s <= 0:
                break
            if aborter is not None:
                waiters.add(aborter)
            await _first_done(waiters, remaining_s)
    finally:
        if aborter is not None:
            aborter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await aborter


def _client(
    base_url: str,
    timeout_s: float,
    max_connections: int,
    transport: httpx.AsyncBaseTransport | None,
) -> contextlib.AbstractAsyncContextManager[HttpClient]:
    """The lean keep-alive client for a plain ``http://`` target; httpx for ``https://``
    or an in-process transport."""
    url = httpx.URL(base_url)
    client: HttpClient
    if transport is None and url.scheme == "http":
        client = KeepAliveClient(
            url.host, url.port or 80, timeout_s=timeout_s, max_connections=max_connections
        )
    else:
        client = HttpxClient(
            base_url, timeout_s=timeout_s, max_connections=max_connections, transport=transport
        )
    return contextlib.aclosing(client)


async def replay(
    plan: Sequence[PlannedRequest],
    target: str,
    *,
    speedup: float = 1.0,
    timeout_s: float = 120.0,
    progress: bool = True,
    run_id: str | None = None,
    stop: asyncio.Event | None = None,
    abort: asyncio.Event | None = None,
    grace_s: float = DEFAULT_GRACE_S,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    transport: httpx.AsyncBaseTransport | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> ReplayResult:
    """Send ``plan`` to ``target`` open-loop and record what became of every request.

    Request ``i`` goes out ``(plan[i].arrival_s - first arrival) / speedup`` seconds
    after the start, in its own task, however the earlier ones are doing.

    Args:
        plan: the requests (:func:`loadgen.mixes.build_plan`); sent in arrival order.
        target: the ingress base URL, e.g. ``http://127.0.0.1:8000``.
        speedup: divide the trace's inter-arrival times by this (> 0).
        timeout_s: client timeout of each request (> 0); past it the request is a
            ``timeout``.
        progress: show a progress bar on stderr.
        run_id: the prefix of request ids; default :func:`new_run_id`.
        stop: when set, no further request is sent; in-flight ones get ``grace_s``
            seconds to answer, then are cancelled and recorded as ``cancelled``.
            The CLI sets it on Ctrl-C.
        abort: when set during the grace period, ends it at once (a second Ctrl-C).
        grace_s: how long a stopped replay waits for in-flight answers.
        max_connections: the connection pool's size.
        transport: an httpx transport to use instead of the network (tests pass an
            ``httpx.ASGITransport``); the requests then go through httpx, as they do to
            an ``https://`` target. Otherwise the lean keep-alive client sends them.
        clock: a monotonic clock in seconds.

    Returns:
        A :class:`ReplayResult` with one record per planned request, in plan order.

    Raises:
        TargetError: a malformed target URL.
        ValueError: ``speedup``, ``timeout_s`` or ``max_connections`` out of range.
    """
    base_url = normalise_target(target)
    if not (math.isfinite(speedup) and speedup > 0):
        raise ValueError(f"--speedup must be a finite number > 0, got {speedup:g}")
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"--timeout-s must be a finite number > 0, got {timeout_s:g}")
    if max_connections < 1:
        raise ValueError(f"max_connections must be at least 1, got {max_connections}")
    run_id = run_id or new_run_id()
    ordered = sorted(plan, key=lambda request: (request.arrival_s, request.index))
    first_s = ordered[0].arrival_s if ordered else 0.0
    # Bodies are encoded before the clock starts, so that encoding never delays a send.
    payloads = [
        json.dumps(request.body(run_id), separators=(",", ":")).encode() for request in ordered
    ]
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    stopped = False
    cpu_start_s = time.process_time()
    async with _client(base_url, timeout_s, max_connections, transport) as client:
        with Progress(len(ordered), "replay", enabled=None if progress else False) as bar:
            run = _Run(client, run_id, clock, bar)
            tasks: set[asyncio.Task[None]] = set()
            for request, payload in zip(ordered, payloads, strict=True):
                scheduled_s = (request.arrival_s - first_s) / speedup
                await _sleep_or_stop(run.start + scheduled_s - clock(), stop)
                if stop is not None and stop.is_set():
                    stopped = True
                    break
                tasks.add(asyncio.create_task(run.send(request, payload, scheduled_s)))
            finished = await _wait_all(tasks, stop)
            if not finished:
                stopped = True
                await _grace(tasks, grace_s, abort)
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            end_s = clock() - run.start
    cpu_s = time.process_time() - cpu_start_s
    records: list[RequestRecord] = []
    for request in sorted(plan, key=lambda r: r.index):
        record = run.records.get(request.index)
        if record is None:
            scheduled_s = (request.arrival_s - first_s) / speedup
            fields = run.base_record(request, scheduled_s)
            if request.index in run.sent:
                _, sent_s = run.sent[request.index]
                fields.update(sent_s=sent_s, send_lag_s=sent_s - scheduled_s, outcome=CANCELLED)
            record = RequestRecord(**fields)
        records.append(record)
    duration_s = end_s if stopped else max(run.last_answer_s, 0.0)
    return ReplayResult(
        run_id=run_id,
        target=base_url,
        speedup=speedup,
        timeout_s=timeout_s,
        started_at=started_at,
        duration_s=duration_s,
        stopped=stopped,
        records=records,
        cpu_s=cpu_s,
    )
