"""The ingress HTTP API: OpenAI-compatible completions, classification inference, request
status, the catalogue, and its OpenAPI document.

:func:`build_app` makes the Starlette app from its collaborators only (the catalogue, a
publisher, the answer registry and the state store), so tests drive it in process with
``httpx.ASGITransport`` and the service runs it under uvicorn.

How one call goes: validate (every refusal is an OpenAI-shaped error naming the field),
claim its id, pass the admission gate when there is one (a request no worker can finish
before its deadline gets 429, one for a model no worker serves 503, both with
``Retry-After`` and before anything is recorded or published: see
:mod:`services.ingress.admission_policy`), register a waiter for the request id, record
the request as ``queued`` in the state store, publish it to ``switchyard.requests`` (returns once the bus stored it: accepted
work is never lost; a failure is a 503 with ``Retry-After``), then wait up to
``answer_timeout_s`` for the completion routed back to this replica (see
:mod:`services.ingress.answers`).

Every call but the probes runs inside a SERVER span (:mod:`services.ingress.telemetry`),
so the request is published in the call's trace; ``GET /metrics`` serves the process's
metrics in the Prometheus text format, so one scrape target per ingress replica suffices.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send
from switchyard.contracts.messages import (
    ClassificationPayload,
    Completion,
    CompletionStatus,
    InferenceRequest,
    LLMPayload,
    OutputChunk,
    WorkloadType,
)
from switchyard.serving import ServingCatalogue, UnknownServedApplicationError
from switchyard.state.base import StateStore
from switchyard.telemetry.prometheus import CONTENT_TYPE as METRICS_CONTENT_TYPE

from services.cluster_state import REQUEST_TTL_S
from services.ingress import records
from services.ingress.admission import Admission, AdmissionMiddleware, unavailable
from services.ingress.admission_policy import AdmissionGate, Decision, Demand, Verdict
from services.ingress.answers import AnswerRegistry, Waiter
from services.ingress.errors import (
    INVALID_REQUEST,
    NOT_FOUND,
    SERVER_ERROR,
    ApiError,
    bad_request,
)
from services.ingress.openai_schema import (
    MAX_TOKENS_DEFAULT,
    ChatBody,
    CompletionBody,
    InferBody,
    SwitchyardOptions,
    parse,
)
from services.ingress.openapi import openapi_document
from services.ingress.responses import (
    Flavour,
    LlmCall,
    answer_headers,
    classification_answer,
    llm_answer,
    llm_chunk,
    llm_final_chunk,
    output_of,
    switchyard_block,
    timeline,
)
from services.ingress.telemetry import CallRecord, HttpTelemetryMiddleware, call_record
from services.ingress.tokens import approximate_tokens, chat_prompt

if TYPE_CHECKING:
    from switchyard.telemetry import Telemetry

log = logging.getLogger("switchyard.ingress")

Publish = Callable[[InferenceRequest], Awaitable[object]]
"""Publishes a request to ``switchyard.requests``; returns once the bus stored it."""

DEADLINE_HEADER = "X-Switchyard-Deadline-Ms"
PRIORITY_HEADER = "X-Switchyard-Priority"


@dataclass(frozen=True, slots=True)
class ApiOptions:
    """Limits and timings of the API.

    Attributes:
        max_body_bytes: largest request body (413 beyond it).
        answer_timeout_s: longest a call waits for its answer (504 after, with the id).
        publish_timeout_s: longest publishing a request may take before the call is
            answered 503.
        stream_grace_s: how long a stream whose completion overtook its last chunks (they
            travel on different topics) waits for them before finishing from the
            completion's text.
        poll_interval_s: how often a retry of a request that another replica is serving
            polls the state store for its answer.
        orphaned_claim_s: how long a retry waits for the record of a claimed request id
            before it takes the claim over (its claimant failed without releasing it).
        llm_time_scale: emulated LLM workers run this many times faster than real
            (``SWITCHYARD_WORKER_TIME_SCALE``); an LLM application's SLO is divided by it,
            so that a default deadline means the same in compressed time.
    """

    max_body_bytes: int = 1_048_576
    answer_timeout_s: float = 300.0
    publish_timeout_s: float = 10.0
    stream_grace_s: float = 0.25
    poll_interval_s: float = 0.05
    orphaned_claim_s: float = 1.0
    llm_time_scale: float = 1.0


@dataclass(slots=True)
class _Accepted:
    """A call's request: fresh (a waiter), or a retry (a stored answer, another call's
    request on this replica, or one being served elsewhere: polled)."""

    request_id: str
    waiter: Waiter | None = None
    stored: Completion | None = None
    record: records.RequestRecord | None = None


def build_app(
    catalogue: ServingCatalogue,
    publish: Publish,
    answers: AnswerRegistry,
    state: StateStore,
    *,
    options: ApiOptions | None = None,
    admission: Admission | None = None,
    gate: AdmissionGate | None = None,
    clock: Callable[[], float] = time.time,
    telemetry: Telemetry | None = None,
) -> Starlette:
    """The ingress ASGI app.

    Args:
        catalogue: what is served (``model`` names, classification applications).
        publish: stores a request on ``switchyard.requests``.
        answers: the registry the answer routines deliver completions and chunks to;
            its ``instance_id`` is every request's ``reply_to``.
        state: where request records live (``request:{id}``).
        options: limits and timings.
        admission: drain control shared with the service; a fresh one when None.
        gate: deadline-aware admission control (:mod:`services.ingress.admission_policy`):
            a request no worker can finish before its deadline is refused with 429, one
            for a model no worker has served for a while with 503, both before anything
            is recorded or published. None: every valid request is accepted.
        clock: epoch seconds (arrival times).
        telemetry: the providers SERVER spans and request metrics go to, and the
            Prometheus reader ``GET /metrics`` renders (404 without one); None: spans and
            metrics go to the process-wide providers, and there is no ``/metrics``.
    """
    api = _Api(catalogue, publish, answers, state, options or ApiOptions(), clock, gate)
    routes = [
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/v1/chat/completions", api.chat_completions, methods=["POST"]),
        Route("/v1/apps/{app}/infer", api.infer, methods=["POST"]),
        Route("/v1/requests/{request_id:path}", api.request_status, methods=["GET"]),
        Route("/v1/models", api.models, methods=["GET"]),
        Route("/v1/apps", api.apps, methods=["GET"]),
        Route("/openapi.json", api.openapi, methods=["GET"]),
        Route("/healthz", api.healthz, methods=["GET"]),
    ]
    prometheus = telemetry.prometheus if telemetry is not None else None
    if prometheus is not None:
        render = prometheus.render

        async def metrics(request: Request) -> Response:
            """``GET /metrics``: this process's metrics, Prometheus text format 0.0.4."""
            return Response(render(), media_type=METRICS_CONTENT_TYPE)

        routes.append(Route("/metrics", metrics, methods=["GET"]))
    drain = admission if admission is not None else Admission()
    api.admission = drain
    return Starlette(
        routes=routes,
        middleware=[
            # Outermost: a call refused while draining is still traced and counted.
            Middleware(
                HttpTelemetryMiddleware,
                routes=list(routes),
                tracer_provider=telemetry.tracer_provider if telemetry is not None else None,
                meter_provider=telemetry.meter_provider if telemetry is not None else None,
            ),
            Middleware(AdmissionMiddleware, admission=drain),
        ],
        exception_handlers={
            ApiError: _api_error,
            HTTPException: _http_error,
            Exception: _unexpected_error,
        },
    )


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    if (record := call_record(request.scope)) is not None:
        record.error_code = exc.code
    return exc.response()


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow", "")
        message = f"method {request.method} is not allowed on {request.url.path}; use {allowed}"
        code = "method_not_allowed"
    elif exc.status_code == 404:
        message = f"no such endpoint: {request.method} {request.url.path}"
        code = "not_found"
    else:
        message, code = str(exc.detail), None
    type_ = NOT_FOUND if exc.status_code == 404 else INVALID_REQUEST
    return ApiError(
        exc.status_code, message, type_=type_, code=code, headers=exc.headers
    ).response()


async def _unexpected_error(request: Request, exc: Exception) -> Response:
    # A bug: log it with its traceback, answer without one.
    log.exception("unexpected error on %s %s", request.method, request.url.path)
    return ApiError(500, "internal error in the ingress", type_=SERVER_ERROR).response()


def _refusal(decision: Decision, what: str) -> ApiError:
    """The answer to a request the admission gate refused: 429 (overloaded) or 503 (no
    live worker), both with ``Retry-After``."""
    retry = str(decision.retry_after_s)
    if decision.verdict is Verdict.NO_WORKER:
        return ApiError(
            503,
            f"no live worker serves {what} ({decision.reason}); nothing was started, "
            f"retry after {retry} s",
            type_=SERVER_ERROR,
            code="no_worker",
            headers={"Retry-After": retry},
        )
    return ApiError(
        429,
        f"{what} is overloaded: the estimated wait is {decision.wait_s:.2f} s plus "
        f"{decision.service_s:.2f} s of service on the least-loaded worker, more than the "
        f"{max(0.0, decision.time_left_s):.2f} s left to the request's deadline; nothing "
        f"was started, retry after {retry} s",
        type_=SERVER_ERROR,
        code="overloaded",
        headers={"Retry-After": retry},
        extra={
            "switchyard": {
                "estimated_wait_s": round(decision.wait_s, 4),
                "estimated_service_s": round(decision.service_s, 4),
                "time_left_s": round(decision.time_left_s, 4),
                "retry_after_s": decision.retry_after_s,
            }
        },
    )


def _trace_request_id(request_id: str) -> None:
    """Name the request on the call's SERVER span (spans only: never a metric label)."""
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attribute("switchyard.request_id", request_id)


def _sse(data: Any) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


_DONE = b"data: [DONE]\n\n"


class _SseResponse(StreamingResponse):
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


class _Api:
    def __init__(
        self,
        catalogue: ServingCatalogue,
        publish: Publish,
        answers: AnswerRegistry,
        state: StateStore,
        options: ApiOptions,
        clock: Callable[[], float],
        gate: AdmissionGate | None = None,
    ) -> None:
        self.catalogue = catalogue
        self.gate = gate
        self._classification_service_s: dict[str, float | None] = {}
        self.publish = publish
        self.answers = answers
        self.state = state
        self.options = options
        self.clock = clock
        self.admission = Admission()
        self._openapi: dict[str, Any] | None = None

    # -- reading a call -----------------------------------------------------------------

    async def _json_body(self, request: Request) -> Any:
        """The body parsed as JSON: 415 for another content type, 413 beyond the limit
        (checked against Content-Length and while reading), 400 when it is not JSON."""
        content_type = request.headers.get("content-type")
        if content_type is not None:
            media = content_type.split(";", 1)[0].strip().lower()
            if media != "application/json" and not media.endswith("+json"):
                raise ApiError(
                    415,
                    f"Content-Type must be application/json, got {content_type!r}",
                    param="Content-Type",
                    code="unsupported_media_type",
                )
        limit = self.options.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None:
            if not declared.strip().isdigit():
                raise bad_request(
                    f"Content-Length must be a byte count, got {declared!r}", param="Content-Length"
                )
            if int(declared) > limit:
                raise self._too_large(int(declared))
        body = bytearray()
        async for piece in request.stream():
            body += piece
            if len(body) > limit:  # a lying or missing Content-Length: never read unbounded
                raise self._too_large(None)
        if not body.strip():
            raise bad_request("the request body is empty; send a JSON object", param=None)
        try:
            return json.loads(body)
        except (ValueError, RecursionError) as exc:
            raise ApiError(
                400, f"the request body is not valid JSON: {exc}", code="invalid_json"
            ) from None

    def _too_large(self, size: int | None) -> ApiError:
        what = f"{size} bytes" if size is not None else "more than that"
        return ApiError(
            413,
            f"request body too large: at most {self.options.max_body_bytes} bytes, got {what}",
            code="body_too_large",
        )

    @staticmethod
    def _header_deadline_ms(request: Request) -> float | None:
        raw = request.headers.get(DEADLINE_HEADER)
        if raw is None:
            return None
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            raise bad_request(
                f"header {DEADLINE_HEADER} must be a positive number of milliseconds, got {raw!r}",
                param=DEADLINE_HEADER,
            )
        return value

    @staticmethod
    def _header_priority(request: Request) -> int | None:
        raw = request.headers.get(PRIORITY_HEADER)
        if raw is None:
            return None
        text = raw.strip()
        if not (text.isdigit() and 0 <= int(text) <= 1000):
            raise bad_request(
                f"header {PRIORITY_HEADER} must be an integer from 0 to 1000, got {raw!r}",
                param=PRIORITY_HEADER,
            )
        return int(text)

    def _deadline_and_priority(
        self, request: Request, deadline_ms: float | None, priority: int | None
    ) -> tuple[float | None, int]:
        # Headers are read (and checked) always; the body's values win.
        header_deadline = self._header_deadline_ms(request)
        header_priority = self._header_priority(request)
        deadline = deadline_ms if deadline_ms is not None else header_deadline
        chosen = priority if priority is not None else header_priority
        return deadline, chosen if chosen is not None else 0

    # -- accepting and answering -----------------------------------------------------------

    def _request_maker(
        self,
        app: str,
        payload: LLMPayload | ClassificationPayload,
        arrival_s: float,
        deadline_s: float | None,
        priority: int,
    ) -> Callable[[str], InferenceRequest]:
        """How to build the request once its id is known (the client's, or a new one)."""

        def make_request(request_id: str) -> InferenceRequest:
            return InferenceRequest(
                request_id=request_id,
                app=app,
                payload=payload,
                arrival_s=arrival_s,
                deadline_s=deadline_s,
                priority=priority,
                reply_to=self.answers.instance_id,
            )

        return make_request

    async def _accept(
        self,
        client_id: str | None,
        make_request: Callable[[str], InferenceRequest],
        *,
        stream: bool,
        demand: Demand | None = None,
        what: str = "",
    ) -> _Accepted:
        """Register, record and publish a request, or find the earlier one a retry names.

        A fresh request (not a retry of an accepted one) passes the admission gate first
        with ``demand``; ``what`` names its model or application in a refusal."""
        try:
            if client_id is None:
                request_id = f"req-{uuid.uuid4().hex}"
            else:
                owner = f"{self.answers.instance_id}/{uuid.uuid4().hex}"
                if not await records.claim(self.state, client_id, owner):
                    existing = await self._existing(client_id, owner, stream=stream)
                    if existing is not None:
                        return existing
                request_id = client_id
        except ApiError:
            raise
        except Exception as exc:
            raise unavailable(f"the state store is unavailable: {exc}") from None
        if self.gate is not None and demand is not None:
            decision = self.gate.decide(demand, self.clock())
            if not decision.admitted:
                if client_id is not None:  # let a later retry of this id in
                    with contextlib.suppress(Exception):
                        await records.forget(self.state, request_id)
                log.debug(
                    "refused request %s for %s: %s",
                    request_id,
                    what,
                    decision.reason,
                    extra={"event": "admission_refused", "verdict": str(decision.verdict)},
                )
                raise _refusal(decision, what)
        request = make_request(request_id)
        waiter = self.answers.register(request_id, stream=stream)
        try:
            await records.write_accepted(self.state, request)
            await asyncio.wait_for(self.publish(request), self.options.publish_timeout_s)
        except Exception as exc:
            self.answers.release(waiter)
            with contextlib.suppress(Exception):
                await records.forget(self.state, request_id)
            reason = str(exc) or type(exc).__name__
            log.warning("could not accept request %s: %s", request_id, reason)
            raise unavailable(
                f"could not queue request {request_id}: {reason}; nothing was started"
            ) from None
        return _Accepted(request_id, waiter=waiter)

    def _profiled_service_s(self, name: str) -> float | None:
        """The fastest profiled batch-of-one latency of application ``name``'s variants,
        seconds (what admission control takes as its service time); None: unprofiled."""
        if name not in self._classification_service_s:
            app = self.catalogue.classification_application(name)
            found = [
                by_batch[min(by_batch)] / 1000.0
                for variant in app.spec.variants.values()
                for by_batch in variant.latency_ms.values()
                if by_batch
            ]
            self._classification_service_s[name] = min(found) if found else None
        return self._classification_service_s[name]

    async def _existing(self, request_id: str, owner: str, *, stream: bool) -> _Accepted | None:
        """A retry of a request id already claimed; None when its claim was orphaned and
        this call (``owner``) took it over: the caller then runs the request."""
        record = await records.read(self.state, request_id)
        if record is not None and record.completion is not None:
            return _Accepted(request_id, stored=record.completion, record=record)
        if self.answers.is_waited_for(request_id):
            # The first call still waits on this replica: wait with it.
            waiter = self.answers.register(request_id, stream=stream)
            # The answer may have come between the read above and registering.
            again = await records.read(self.state, request_id)
            if again is not None and again.completion is not None:
                self.answers.release(waiter)
                return _Accepted(request_id, stored=again.completion, record=again)
            return _Accepted(request_id, waiter=waiter, record=record)
        if record is None:
            # Claimed but not recorded: the claimant is between its claim and its record
            # (a moment), or it failed and could not release its claim (a state store
            # outage). Give it the moment, then take the claim over.
            deadline = time.monotonic() + self.options.orphaned_claim_s
            while record is None and time.monotonic() < deadline:
                await asyncio.sleep(self.options.poll_interval_s)
                record = await records.read(self.state, request_id)
            if record is None and await records.take_over(self.state, request_id, owner):
                return None
        return _Accepted(request_id, record=record)  # served elsewhere: poll the record

    async def _completion(self, accepted: _Accepted, timeout_s: float) -> Completion | None:
        """The completion, or None when it did not come within ``timeout_s``."""
        if accepted.stored is not None:
            return accepted.stored
        if accepted.waiter is not None:
            return await accepted.waiter.completion(timeout_s)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                record = await records.read(self.state, accepted.request_id)
            except Exception as exc:
                log.warning("polling request %s failed: %s", accepted.request_id, exc)
                record = None
            if record is not None and record.completion is not None:
                return record.completion
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            await asyncio.sleep(min(self.options.poll_interval_s, left))

    def _timeout(self, request_id: str) -> ApiError:
        return ApiError(
            504,
            f"no answer for request {request_id} within {self.options.answer_timeout_s:g} s; "
            f"it was accepted and may still finish: poll GET /v1/requests/{request_id}",
            type_=SERVER_ERROR,
            code="answer_timeout",
            headers=answer_headers(request_id, emulated=False),
            extra={"switchyard": {"request_id": request_id, "status": "pending"}},
        )

    @staticmethod
    def _status_error(completion: Completion, deadline_s: float | None) -> ApiError | None:
        """The error answer of a completion that is not ``ok``; None when it is."""
        rid = completion.request_id
        extra = {"switchyard": switchyard_block(completion, deadline_s)}
        headers = answer_headers(rid, emulated=completion.emulated)
        if completion.status is CompletionStatus.OK:
            return None
        if completion.status is CompletionStatus.EXPIRED:
            return ApiError(
                504,
                f"request {rid} expired: its deadline passed before it was served"
                + (f" ({completion.error})" if completion.error else ""),
                type_=SERVER_ERROR,
                code="deadline_expired",
                headers=headers,
                extra=extra,
            )
        what = "failed" if completion.status is CompletionStatus.FAILED else "was cancelled"
        return ApiError(
            502,
            f"request {rid} {what} on worker {completion.worker_id}: "
            f"{completion.error or 'no reason given'}",
            type_=SERVER_ERROR,
            code="worker_failed" if completion.status is CompletionStatus.FAILED else "cancelled",
            headers=headers,
            extra=extra,
        )

    # -- LLM endpoints -----------------------------------------------------------------

    async def completions(self, request: Request) -> Response:
        """``POST /v1/completions``."""
        arrival_s = self.clock()
        body = parse(CompletionBody, await self._json_body(request))
        options = body.switchyard or SwitchyardOptions()
        if body.prompt is None and options.prompt_tokens is None:
            raise bad_request(
                "missing required field 'prompt' (or give switchyard.prompt_tokens)",
                param="prompt",
                code="missing_field",
            )
        return await self._llm(
            request,
            arrival_s=arrival_s,
            flavour=Flavour.TEXT,
            model=body.model,
            prompt=body.prompt,
            prompt_param="prompt",
            max_tokens=body.max_tokens,
            stream=bool(body.stream),
            options=options,
        )

    async def chat_completions(self, request: Request) -> Response:
        """``POST /v1/chat/completions``."""
        arrival_s = self.clock()
        body = parse(ChatBody, await self._json_body(request))
        prompt = chat_prompt((m.role, m.text()) for m in body.messages)
        return await self._llm(
            request,
            arrival_s=arrival_s,
            flavour=Flavour.CHAT,
            model=body.model,
            prompt=prompt,
            prompt_param="messages",
            max_tokens=body.max_completion_tokens or body.max_tokens,
            stream=bool(body.stream),
            options=body.switchyard or SwitchyardOptions(),
        )

    async def _llm(
        self,
        request: Request,
        *,
        arrival_s: float,
        flavour: Flavour,
        model: str,
        prompt: str | None,
        prompt_param: str,
        max_tokens: int | None,
        stream: bool,
        options: SwitchyardOptions,
    ) -> Response:
        try:
            app = self.catalogue.llm_application(model)
        except UnknownServedApplicationError as exc:
            raise ApiError(
                404, str(exc), type_=NOT_FOUND, param="model", code="model_not_found"
            ) from None
        if (telemetry := call_record(request.scope)) is not None:
            telemetry.app = app.name
        if options.prompt_tokens is not None:
            prompt_tokens, how, param = (
                options.prompt_tokens,
                "switchyard.prompt_tokens",
                "switchyard.prompt_tokens",
            )
        else:
            prompt_tokens, how, param = (
                approximate_tokens(prompt or ""),
                "approximated as ceil(UTF-8 bytes / 4)",
                prompt_param,
            )
        if prompt_tokens > app.max_prompt_tokens:
            raise bad_request(
                f"'{param}' is too long: {prompt_tokens} prompt tokens ({how}); model "
                f"{app.name!r} accepts at most {app.max_prompt_tokens}",
                param=param,
                code="context_length_exceeded",
            )
        output_tokens = max_tokens if max_tokens is not None else MAX_TOKENS_DEFAULT
        if output_tokens > app.max_output_tokens:
            raise bad_request(
                f"'max_tokens' is {output_tokens}; model {app.name!r} generates at most "
                f"{app.max_output_tokens}",
                param="max_tokens",
            )
        deadline_ms, priority = self._deadline_and_priority(
            request, options.deadline_ms, options.priority
        )
        deadline_s = arrival_s + (
            deadline_ms / 1000.0
            if deadline_ms is not None
            else app.slo_s / self.options.llm_time_scale
        )
        hint = options.output_tokens_hint
        payload = LLMPayload(
            model=app.model,
            prompt_tokens=prompt_tokens,
            max_output_tokens=output_tokens,
            # The model never generates more than max_tokens, whatever the client expects.
            output_tokens_hint=None if hint is None else min(hint, output_tokens),
            workload=WorkloadType(options.workload) if options.workload else app.workload,
            prompt=prompt,
            stream=stream,
        )

        make_request = self._request_maker(app.name, payload, arrival_s, deadline_s, priority)

        demand = Demand(
            kind="llm",
            model=app.model,
            arrival_s=arrival_s,
            deadline_s=deadline_s,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
        )
        accepted = await self._accept(
            options.request_id,
            make_request,
            stream=stream,
            demand=demand,
            what=f"model {app.name!r}",
        )
        _trace_request_id(accepted.request_id)
        record = accepted.record
        call = LlmCall(
            request_id=accepted.request_id,
            model=app.name,
            created=int(record.arrival_s if record and record.arrival_s else arrival_s),
            prompt_tokens=(
                record.prompt_tokens if record and record.prompt_tokens else prompt_tokens
            ),
            flavour=flavour,
            deadline_s=record.deadline_s if record else deadline_s,
        )
        if stream:
            return await self._stream(call, accepted, telemetry)
        try:
            completion = await self._completion(accepted, self.options.answer_timeout_s)
        finally:
            if accepted.waiter is not None:
                self.answers.release(accepted.waiter)
        if completion is None:
            raise self._timeout(call.request_id)
        if (error := self._status_error(completion, call.deadline_s)) is not None:
            raise error
        return JSONResponse(
            llm_answer(call, completion),
            headers=answer_headers(call.request_id, emulated=completion.emulated),
        )

    async def _stream(
        self, call: LlmCall, accepted: _Accepted, telemetry: CallRecord | None = None
    ) -> Response:
        """A streamed answer. Waits for the first chunk (or the completion) before
        answering, so a request that fails or times out before any output gets a proper
        HTTP error and the ``X-Switchyard-Emulated`` header is known."""
        waiter = accepted.waiter
        deadline = time.monotonic() + self.options.answer_timeout_s

        def close() -> None:
            if waiter is not None:
                self.answers.release(waiter)

        try:
            first: OutputChunk | Completion | None
            if waiter is not None and waiter.stream:
                first = await waiter.next_event(deadline - time.monotonic())
            else:  # a retry: the whole answer comes as one piece
                first = await self._completion(accepted, deadline - time.monotonic())
            if first is None:
                raise self._timeout(call.request_id)
            error = (
                self._status_error(first, call.deadline_s)
                if isinstance(first, Completion)
                else None
            )
            if error is not None:
                raise error
        except BaseException:
            close()
            raise
        events = self._events(call, first, waiter, deadline, telemetry)
        headers = answer_headers(call.request_id, emulated=first.emulated)
        return _SseResponse(events, headers=headers, on_close=close)

    async def _events(
        self,
        call: LlmCall,
        first: OutputChunk | Completion,
        waiter: Waiter | None,
        deadline: float,
        telemetry: CallRecord | None = None,
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
            yield _sse(self._timeout(call.request_id).body())
            yield _DONE
            return
        completion = event
        text, output_tokens = output_of(completion)
        covered = bool(text) and text.startswith("".join(streamed))
        if waiter is not None and tokens < output_tokens and not covered:
            # The completion travels on another topic than the chunks and may overtake
            # the last of them. Its text, when it has one, finishes the stream; without
            # one, the missing chunks get a moment to arrive.
            grace_end = time.monotonic() + self.options.stream_grace_s
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
        error = self._status_error(completion, call.deadline_s)
        if error is not None and telemetry is not None:
            telemetry.error_code = error.code
        yield _sse(error.body() if error is not None else llm_final_chunk(call, completion))
        yield _DONE

    # -- classification ------------------------------------------------------------------

    async def infer(self, request: Request) -> Response:
        """``POST /v1/apps/{app}/infer``."""
        arrival_s = self.clock()
        name = request.path_params["app"]
        try:
            app = self.catalogue.classification_application(name)
        except UnknownServedApplicationError as exc:
            raise ApiError(
                404, str(exc), type_=NOT_FOUND, param="app", code="app_not_found"
            ) from None
        if (telemetry := call_record(request.scope)) is not None:
            telemetry.app = app.name
        body = parse(InferBody, await self._json_body(request))
        if len(body.features) != app.feature_dim:
            raise bad_request(
                f"'features' has {len(body.features)} values; application {app.name!r} "
                f"takes exactly {app.feature_dim}",
                param="features",
            )
        deadline_ms, priority = self._deadline_and_priority(
            request, body.deadline_ms, body.priority
        )
        due_s = arrival_s + (deadline_ms / 1000.0 if deadline_ms is not None else app.deadline_s)
        deadline_s: float | None = due_s
        payload = ClassificationPayload(features=list(body.features))

        make_request = self._request_maker(app.name, payload, arrival_s, deadline_s, priority)

        demand = Demand(
            kind="classification",
            model=app.name,
            arrival_s=arrival_s,
            deadline_s=due_s,
            service_s=self._profiled_service_s(app.name),
        )
        accepted = await self._accept(
            body.request_id,
            make_request,
            stream=False,
            demand=demand,
            what=f"application {app.name!r}",
        )
        _trace_request_id(accepted.request_id)
        if accepted.record is not None:
            deadline_s = accepted.record.deadline_s
        try:
            completion = await self._completion(accepted, self.options.answer_timeout_s)
        finally:
            if accepted.waiter is not None:
                self.answers.release(accepted.waiter)
        if completion is None:
            raise self._timeout(accepted.request_id)
        if (error := self._status_error(completion, deadline_s)) is not None:
            raise error
        return JSONResponse(
            classification_answer(completion, app.classes, deadline_s),
            headers=answer_headers(accepted.request_id, emulated=completion.emulated),
        )

    # -- status and catalogue ----------------------------------------------------------------

    async def request_status(self, request: Request) -> Response:
        """``GET /v1/requests/{request_id}``."""
        request_id = request.path_params["request_id"]
        try:
            record = await records.read(self.state, request_id)
        except Exception as exc:
            raise unavailable(f"the state store is unavailable: {exc}") from None
        if record is None:
            raise ApiError(
                404,
                f"unknown request {request_id!r} (never accepted, or its record expired "
                f"after {REQUEST_TTL_S:g} s)",
                type_=NOT_FOUND,
                param="request_id",
                code="request_not_found",
            )
        body: dict[str, Any] = {
            "request_id": record.request_id,
            "app": record.app,
            "kind": record.kind or None,
            "status": record.status,
            "deadline_s": record.deadline_s,
            "worker_id": record.worker_id,
        }
        completion = record.completion
        if completion is None:
            body["timeline"] = {
                "arrival_s": record.arrival_s,
                "assigned_s": None,
                "started_s": None,
                "first_token_s": None,
                "finished_s": None,
            }
            return JSONResponse(body)
        block = switchyard_block(completion, record.deadline_s)
        body.update(
            status=str(completion.status),
            worker_id=completion.worker_id,
            worker_type=completion.worker_type,
            variant=completion.variant,
            emulated=completion.emulated,
            deadline_s=block["deadline_s"],
            deadline_met=block["deadline_met"],
            result=None if completion.result is None else completion.result.model_dump(mode="json"),
            error=completion.error,
            timeline=timeline(completion),
        )
        return JSONResponse(
            body, headers=answer_headers(record.request_id, emulated=completion.emulated)
        )

    async def models(self, request: Request) -> Response:
        """``GET /v1/models``: the LLM applications, as OpenAI lists models."""
        data = [
            {
                "id": app.name,
                "object": "model",
                "created": 0,
                "owned_by": "switchyard",
                "switchyard": {
                    "served_model": app.model,
                    "slo_s": app.slo_s,
                    "max_prompt_tokens": app.max_prompt_tokens,
                    "max_output_tokens": app.max_output_tokens,
                    "workload": str(app.workload),
                },
            }
            for app in sorted(self.catalogue.llm.values(), key=lambda a: a.name)
        ]
        return JSONResponse({"object": "list", "data": data})

    async def apps(self, request: Request) -> Response:
        """``GET /v1/apps``: the classification applications."""
        data = [
            {
                "name": app.name,
                "feature_dim": app.feature_dim,
                "classes": list(app.classes),
                "deadline_ms": app.deadline_s * 1000.0,
                "variants": list(app.variants),
            }
            for app in sorted(self.catalogue.classification.values(), key=lambda a: a.name)
        ]
        return JSONResponse({"object": "list", "data": data})

    async def openapi(self, request: Request) -> Response:
        """``GET /openapi.json``."""
        if self._openapi is None:
            self._openapi = openapi_document(self.catalogue)
        return JSONResponse(self._openapi)

    async def healthz(self, request: Request) -> Response:
        """``GET /healthz``: 200 while serving, 503 once draining."""
        if not self.admission.accepting:
            return JSONResponse(
                {"status": "draining", "in_flight": self.admission.in_flight},
                status_code=503,
                headers={"Retry-After": "1"},
            )
        return JSONResponse({"status": "ok", "waiting": len(self.answers)})
