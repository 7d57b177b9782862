"""The ingress HTTP API: OpenAI-compatible completions, classification inference,
pipeline calls, request status, the catalogue, and its OpenAPI document.

:func:`build_app` makes the Starlette app from its collaborators only (the catalogue, a
publisher, the answer registry and the state store), so tests drive it in process with
``httpx.ASGITransport`` and the service runs it under uvicorn. The handlers here read and
validate a call (:mod:`services.ingress.body`, :mod:`services.ingress.openai_schema`),
hand its request to the :class:`~services.ingress.calls.RequestDesk` (admission, the
request ledger, publishing, waiting for the answer) and shape the answer
(:mod:`services.ingress.responses`, :mod:`services.ingress.streaming`). A call to
``/v1/apps/{app}/infer`` naming a pipeline goes to the
:class:`~services.ingress.pipelines.PipelineCoordinator`, which runs its stages through
the same desk.

Every call but the probes runs inside a SERVER span (:mod:`services.ingress.telemetry`),
so the request is published in the call's trace. Metrics are served on the health port
(``SWITCHYARD_HEALTH_PORT``), never on the API's: a client of the API does not see them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from opentelemetry import trace
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from switchyard.contracts.fields import PREFIX_BLOCK_TOKENS
from switchyard.contracts.messages import (
    ClassificationPayload,
    InferenceRequest,
    LLMPayload,
    WorkloadType,
)
from switchyard.lifecycle import RequestLedger
from switchyard.serving import ServingCatalogue, UnknownServedApplicationError
from switchyard.state.base import StateStore

from services.ingress.answers import AnswerRegistry
from services.ingress.auth import TenantMiddleware, tenant_of
from services.ingress.body import deadline_and_priority, json_body
from services.ingress.calls import (
    CallOptions,
    FirstDecisions,
    Publish,
    RequestDesk,
    status_error,
)
from services.ingress.drain import HEALTH_PATHS, Admission, AdmissionMiddleware
from services.ingress.errors import (
    INVALID_REQUEST,
    NOT_FOUND,
    SERVER_ERROR,
    ApiError,
    bad_request,
)
from services.ingress.load_shedding import AdmissionGate, Demand
from services.ingress.openai_schema import (
    MAX_TOKENS_DEFAULT,
    ChatBody,
    CompletionBody,
    InferBody,
    SwitchyardOptions,
    parse,
)
from services.ingress.pipeline_admission import PipelineGate
from services.ingress.pipelines import PipelineCoordinator, PipelineOptions
from services.ingress.quotas import Quotas
from services.ingress.read_api import ReadApi
from services.ingress.responses import (
    Flavour,
    LlmCall,
    answer_headers,
    classification_answer,
    judged,
    llm_answer,
    token_block,
)
from services.ingress.streaming import stream_answer
from services.ingress.telemetry import HttpTelemetryMiddleware, call_record
from services.ingress.tenants import KeyRing, public_request_id
from services.ingress.tokens import approximate_tokens, chat_prompt, prompt_blocks

if TYPE_CHECKING:
    from switchyard.telemetry import Telemetry

log = logging.getLogger("switchyard.ingress")


@dataclass(frozen=True, slots=True)
class ApiOptions:
    """Limits and timings of the API.

    Attributes:
        max_body_bytes: largest request body (413 beyond it).
        answer_timeout_s: longest a call waits for its answer (504 after, with the id).
        publish_timeout_s: longest publishing a request may take before the call is
            answered 503 ``outcome_unknown``.
        stream_grace_s: how long a stream whose answer overtook its last chunks waits
            for them before finishing from the answer's text.
        poll_interval_s: how often a retry of a request that another replica is serving
            polls the request's record for its answer.
        llm_time_scale: emulated workers run this many times faster than real
            (``SWITCHYARD_WORKER_TIME_SCALE``); an LLM application's SLO, and a
            pipeline's (model seconds), are divided by it, so that a default deadline
            means the same in compressed time.
    """

    max_body_bytes: int = 1_048_576
    answer_timeout_s: float = 300.0
    publish_timeout_s: float = 10.0
    stream_grace_s: float = 0.25
    poll_interval_s: float = 0.05
    llm_time_scale: float = 1.0

    def calls(self) -> CallOptions:
        return CallOptions(
            answer_timeout_s=self.answer_timeout_s,
            publish_timeout_s=self.publish_timeout_s,
            poll_interval_s=self.poll_interval_s,
        )


def build_app(
    catalogue: ServingCatalogue,
    publish: Publish,
    answers: AnswerRegistry,
    state: StateStore,
    *,
    options: ApiOptions | None = None,
    admission: Admission | None = None,
    gate: AdmissionGate | None = None,
    pipeline_gate: PipelineGate | None = None,
    clock: Callable[[], float] = time.time,
    telemetry: Telemetry | None = None,
    decisions: FirstDecisions | None = None,
    keys: KeyRing | None = None,
    quotas: Quotas | None = None,
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
        gate: deadline-aware admission control (:mod:`services.ingress.load_shedding`):
            a request no worker can finish before its deadline is refused with 429, one
            for a model no worker has served for a while with 503, both before anything
            is recorded or published. None: every valid request is accepted.
        pipeline_gate: the same for pipeline calls
            (:mod:`services.ingress.pipeline_admission`); None: every valid call accepted.
        clock: epoch seconds (arrival times).
        telemetry: the providers SERVER spans and request metrics go to; None: spans
            and metrics go to the process-wide providers.
        decisions: direct dispatch (:mod:`services.ingress.dispatch`): new LLM requests
            are placed here and recorded with their decision in one round trip.
        keys: the tenants' API keys (:mod:`services.ingress.tenants`); None: no keys,
            one anonymous tenant.
        quotas: where tenants' rate limits and concurrency quotas are kept; None: none.
    """
    options = options or ApiOptions()
    desk = RequestDesk(
        RequestLedger(state),
        publish,
        answers,
        options.calls(),
        clock=clock,
        gate=gate,
        decisions=decisions,
    )
    drain = admission if admission is not None else Admission()
    pipelines = PipelineCoordinator(
        desk,
        PipelineOptions(
            max_body_bytes=options.max_body_bytes,
            answer_timeout_s=options.answer_timeout_s,
            time_scale=options.llm_time_scale,
        ),
        clock=clock,
        tracer_provider=telemetry.tracer_provider if telemetry is not None else None,
        gate=pipeline_gate,
        llm_apps=catalogue.llm,
    )
    api = _Api(catalogue, desk, options, clock, pipelines)
    read = ReadApi(catalogue, desk.ledger, desk.answers, drain, time_scale=options.llm_time_scale)
    routes = [
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/v1/chat/completions", api.chat_completions, methods=["POST"]),
        Route("/v1/apps/{app}/infer", api.infer, methods=["POST"]),
        Route("/v1/requests/{request_id:path}", read.request_status, methods=["GET"]),
        Route("/v1/models", read.models, methods=["GET"]),
        Route("/v1/models/{model:path}", read.model, methods=["GET"]),
        Route("/v1/apps", read.apps, methods=["GET"]),
        Route("/openapi.json", read.openapi, methods=["GET"]),
        *(Route(path, read.healthz, methods=["GET"]) for path in HEALTH_PATHS),
    ]
    return Starlette(
        routes=routes,
        middleware=[
            # Outermost: a call refused while draining is still traced and counted.
            Middleware(
                HttpTelemetryMiddleware,
                routes=list(routes),
                tracer_provider=telemetry.tracer_provider if telemetry is not None else None,
                meter_provider=telemetry.meter_provider if telemetry is not None else None,
                pipelines=catalogue.pipelines,
            ),
            Middleware(AdmissionMiddleware, admission=drain),
            Middleware(TenantMiddleware, keys=keys, quotas=quotas, clock=clock),
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


def _trace_request_id(request_id: str) -> None:
    """Name the request on the call's SERVER span (spans only: never a metric label)."""
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attribute("switchyard.request_id", request_id)


class _Api:
    """The route handlers (see the module docstring)."""

    def __init__(
        self,
        catalogue: ServingCatalogue,
        desk: RequestDesk,
        options: ApiOptions,
        clock: Callable[[], float],
        pipelines: PipelineCoordinator,
    ) -> None:
        self.catalogue = catalogue
        self.pipelines = pipelines
        self.desk = desk
        self.answers = desk.answers
        self.ledger = desk.ledger
        self.options = options
        self.clock = clock
        self._classification_service_s: dict[str, float | None] = {}

    def _profiled_service_s(self, name: str) -> float | None:
        """The fastest profiled batch-of-one latency of application ``name``'s variants,
        seconds (what admission control takes as its service time); None: unprofiled."""
        if name not in self._classification_service_s:
            app = self.catalogue.classification_application(name)
            found = [
                by_batch[min(by_batch)]
                for variant in app.spec.variants.values()
                for by_batch in variant.latency_s.values()
                if by_batch
            ]
            self._classification_service_s[name] = min(found) if found else None
        return self._classification_service_s[name]

    # -- LLM endpoints -----------------------------------------------------------------

    async def completions(self, request: Request) -> Response:
        """``POST /v1/completions``."""
        arrival_s = self.clock()
        body = parse(CompletionBody, await json_body(request, self.options.max_body_bytes))
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
            include_usage=bool(body.stream_options and body.stream_options.include_usage),
            options=options,
        )

    async def chat_completions(self, request: Request) -> Response:
        """``POST /v1/chat/completions``."""
        arrival_s = self.clock()
        body = parse(ChatBody, await json_body(request, self.options.max_body_bytes))
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
            include_usage=bool(body.stream_options and body.stream_options.include_usage),
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
        include_usage: bool,
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
        blocks = _prefix_blocks(options, prompt, prompt_tokens)
        output_tokens = max_tokens if max_tokens is not None else MAX_TOKENS_DEFAULT
        if output_tokens > app.max_output_tokens:
            raise bad_request(
                f"'max_tokens' is {output_tokens}; model {app.name!r} generates at most "
                f"{app.max_output_tokens}",
                param="max_tokens",
            )
        deadline_ms, priority = deadline_and_priority(
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
            prefix_blocks=blocks,
            ttft_slo_s=app.objectives.ttft_s / self.options.llm_time_scale,
        )

        tenant = tenant_of(request.scope)

        def make_request(request_id: str) -> InferenceRequest:
            return self.desk.request(
                request_id, app.name, payload, arrival_s, deadline_s, priority, tenant
            )

        demand = Demand(
            kind="llm",
            model=app.model,
            arrival_s=arrival_s,
            deadline_s=deadline_s,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
        )
        accepted = await self.desk.accept(
            options.request_id,
            make_request,
            tenant=tenant,
            stream=stream,
            demand=demand,
            what=f"model {app.name!r}",
        )
        _trace_request_id(accepted.request_id)
        record = accepted.record
        call = LlmCall(
            request_id=public_request_id(accepted.request_id),
            model=app.name,
            created=int(record.arrival_s if record and record.arrival_s else arrival_s),
            prompt_tokens=(
                record.prompt_tokens if record and record.prompt_tokens else prompt_tokens
            ),
            flavour=flavour,
            deadline_s=record.deadline_s if record else deadline_s,
            include_usage=include_usage,
            token_slo=app.objectives,
        )
        if stream:
            return await stream_answer(
                self.desk,
                call,
                accepted,
                stream_grace_s=self.options.stream_grace_s,
                telemetry=telemetry,
                receive=request.receive,
            )
        try:
            completion = await self.desk.completion(
                accepted, self.options.answer_timeout_s, request.receive
            )
        finally:
            self.desk.release(accepted)
        if completion is None:
            raise self.desk.timeout(call.request_id)
        if telemetry is not None:
            telemetry.deadline_met = judged(completion, call.deadline_s)
            telemetry.judged_tokens(token_block(completion, call.token_slo))
        if (error := status_error(completion, call.deadline_s)) is not None:
            raise error
        return JSONResponse(
            llm_answer(call, completion),
            headers=answer_headers(call.request_id, emulated=completion.emulated),
        )

    # -- classification ------------------------------------------------------------------

    async def infer(self, request: Request) -> Response:
        """``POST /v1/apps/{app}/infer``: a classification application, or a pipeline."""
        arrival_s = self.clock()
        name = request.path_params["app"]
        if name not in self.catalogue.classification and name in self.catalogue.pipelines:
            return await self.pipelines.infer(request, self.catalogue.pipeline(name))
        try:
            app = self.catalogue.classification_application(name)
        except UnknownServedApplicationError as exc:
            pipelines = ", ".join(sorted(self.catalogue.pipelines)) or "none"
            raise ApiError(
                404,
                f"{exc}; pipelines: {pipelines}",
                type_=NOT_FOUND,
                param="app",
                code="app_not_found",
            ) from None
        if (telemetry := call_record(request.scope)) is not None:
            telemetry.app = app.name
        body = parse(InferBody, await json_body(request, self.options.max_body_bytes))
        if len(body.features) != app.feature_dim:
            raise bad_request(
                f"'features' has {len(body.features)} values; application {app.name!r} "
                f"takes exactly {app.feature_dim}",
                param="features",
            )
        deadline_ms, priority = deadline_and_priority(request, body.deadline_ms, body.priority)
        due_s = arrival_s + (deadline_ms / 1000.0 if deadline_ms is not None else app.deadline_s)
        deadline_s: float | None = due_s
        payload = ClassificationPayload(features=list(body.features))

        tenant = tenant_of(request.scope)

        def make_request(request_id: str) -> InferenceRequest:
            return self.desk.request(
                request_id, app.name, payload, arrival_s, deadline_s, priority, tenant
            )

        demand = Demand(
            kind="classification",
            model=app.name,
            arrival_s=arrival_s,
            deadline_s=due_s,
            service_s=self._profiled_service_s(app.name),
        )
        accepted = await self.desk.accept(
            body.request_id,
            make_request,
            tenant=tenant,
            stream=False,
            demand=demand,
            what=f"application {app.name!r}",
        )
        _trace_request_id(accepted.request_id)
        if accepted.record is not None:
            deadline_s = accepted.record.deadline_s
        try:
            completion = await self.desk.completion(
                accepted, self.options.answer_timeout_s, request.receive
            )
        finally:
            self.desk.release(accepted)
        if completion is None:
            raise self.desk.timeout(accepted.request_id)
        if (telemetry := call_record(request.scope)) is not None:
            telemetry.deadline_met = judged(completion, deadline_s)
        if (error := status_error(completion, deadline_s)) is not None:
            raise error
        return JSONResponse(
            classification_answer(completion, app.classes, deadline_s),
            headers=answer_headers(
                public_request_id(accepted.request_id), emulated=completion.emulated
            ),
        )


def _prefix_blocks(options: SwitchyardOptions, prompt: str | None, prompt_tokens: int) -> list[int]:
    """The prompt's KV-block ids: the client's (trace replay), else hashed from its text."""
    if options.prefix_blocks is None:
        return prompt_blocks(prompt or "")
    most = -(-prompt_tokens // PREFIX_BLOCK_TOKENS)
    if len(options.prefix_blocks) > most:
        raise bad_request(
            f"'switchyard.prefix_blocks' names {len(options.prefix_blocks)} blocks; a prompt "
            f"of {prompt_tokens} tokens has at most {most} of {PREFIX_BLOCK_TOKENS} tokens",
            param="switchyard.prefix_blocks",
        )
    return list(options.prefix_blocks)
