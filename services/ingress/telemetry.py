"""The ingress's HTTP telemetry: a SERVER span per call, and the request metrics.

:class:`HttpTelemetryMiddleware` wraps the whole ASGI app (outside admission control, so
refusals while draining are counted too). For every HTTP call but the health probe it
starts a SERVER span named ``{METHOD} {route}`` (``POST
/v1/completions``), whose parent is the caller's W3C ``traceparent`` header when it sent
one, and keeps it current while the app handles the call: the request is published
inside it, so the bus's PRODUCER span, and everything downstream (scheduler, worker, the
answer coming back), belong to the call's trace.

For the inference endpoints it also records (attributes low-cardinality: an ``app`` is a
catalogue name or ``unknown``, never a request id):

* ``switchyard.ingress.requests`` (counter): calls by ``app``, ``kind`` (``llm`` |
  ``classification`` | ``pipeline``: ``/v1/apps/{app}/infer`` naming a pipeline),
  ``outcome``, ``status_class`` (``2xx`` …) and ``deadline``
  (``met``, ``missed``: answered after its deadline or expired, ``none``: no deadline
  judged, a refusal included), so SLO attainment and goodput per application are one
  query each;
* ``switchyard.ingress.latency`` (histogram, seconds): from the call's arrival until its
  answer was fully sent (a stream's last event included), by ``app`` and ``outcome``;
* ``switchyard.ingress.ttft`` and ``switchyard.ingress.tpot`` (histograms, seconds): an
  LLM answer's time to first token and per output token after it, by ``app``;
* ``switchyard.ingress.token_slo`` (counter): LLM answers judged by their application's
  TTFT and TPOT objectives, by ``app`` and ``verdict`` (``met``, ``missed``);
* ``switchyard.ingress.in_flight`` (up-down counter): inference calls being answered,
  by ``kind``.

Outcomes: ``ok``, ``failed`` (the worker failed or cancelled it, or the ingress hit a
bug), ``expired`` (its deadline passed before it was served), ``timeout`` (no answer
within ``answer_timeout_s``), ``client_gone`` (the client closed its connection
first; a request not yet started was cancelled), ``rejected`` (429: admission control found the cluster
overloaded; 503: draining, no live worker for the model, or the bus or state store is
unavailable) and ``bad_request`` (any other 4xx). A streamed answer that ends with an
error event counts with that error's outcome although its status was 200.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.metrics import CallbackOptions, Meter, MeterProvider, Observation
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from switchyard import __version__
from switchyard.telemetry.buckets import SECONDS_BUCKETS
from switchyard.telemetry.observables import instruments_once

from services.ingress.drain import HEALTH_PATHS

INSTRUMENTATION_NAME = "switchyard.ingress"

"""Bucket bounds of ``switchyard.ingress.latency``, seconds."""

UNKNOWN_APP = "unknown"

_KIND_OF_ROUTE = {
    "/v1/completions": "llm",
    "/v1/chat/completions": "llm",
    "/v1/apps/{app}/infer": "classification",
}
_OUTCOME_OF_CODE = {
    "deadline_expired": "expired",
    "answer_timeout": "timeout",
    "worker_failed": "failed",
    "cancelled": "failed",
    "client_closed": "client_gone",
}
_STATE_KEY = "switchyard.call"
_PROPAGATOR = TraceContextTextMapPropagator()


@dataclass(slots=True)
class CallRecord:
    """What the handlers tell the middleware about one call.

    Attributes:
        kind: ``llm``, ``classification`` or ``pipeline`` (from the route, and for
            ``/v1/apps/{app}/infer`` whether ``app`` names a pipeline).
        app: the served application's catalogue name once validated, else ``unknown``.
        error_code: the ``code`` of the :class:`~services.ingress.errors.ApiError`
            answered, if one was.
        outcome: set by a handler that knows better than the status (a stream ending
            with an error event).
    """

    kind: str
    app: str = UNKNOWN_APP
    error_code: str | None = None
    outcome: str | None = None
    deadline_met: bool | None = None
    """Whether the answer met its deadline (None: no answer, or no deadline)."""
    ttft_s: float | None = None
    """An LLM answer's time to first token (None: no answer, or not known)."""
    tpot_s: float | None = None
    """An LLM answer's time per output token after the first (None: not known)."""
    token_slo_met: bool | None = None
    """Whether both met the application's objectives (None: not judged)."""

    def judged_tokens(self, block: dict[str, Any]) -> None:
        """Take an LLM answer's ``ttft_s``, ``tpot_s`` and ``token_slo_met``
        (:func:`services.ingress.responses.token_block`)."""
        self.ttft_s, self.tpot_s = block["ttft_s"], block["tpot_s"]
        self.token_slo_met = block["token_slo_met"]


def deadline_label(outcome: str, record: CallRecord) -> str:
    """The ``deadline`` attribute of a call: ``met``, ``missed`` or ``none``."""
    if outcome == "expired":
        return "missed"
    if record.deadline_met is None:
        return "none"
    return "met" if record.deadline_met else "missed"


def call_record(scope: Scope) -> CallRecord | None:
    """The record of the inference call being answered in ``scope``; None for others."""
    state = scope.get("state")
    if not isinstance(state, dict):
        return None
    found = state.get(_STATE_KEY)
    return found if isinstance(found, CallRecord) else None


def outcome_of(status: int, record: CallRecord) -> str:
    """The outcome of a call answered with ``status`` (see the module docstring)."""
    if record.outcome is not None:
        return record.outcome
    code = record.error_code
    if code in _OUTCOME_OF_CODE:
        return _OUTCOME_OF_CODE[code]
    if status < 400:
        return "ok"
    if status in (429, 503):
        return "rejected"
    if status < 500:
        return "bad_request"
    return "failed"


class _Instruments:
    """The ingress's instruments on one meter provider. The two per-call counts are
    plain dictionaries read by observable instruments on collection: a synchronous
    ``Counter.add`` hashes its attributes under a lock on every call, a dictionary
    increment costs a fraction of that."""

    def __init__(self, meter: Meter) -> None:
        self.requests: Counter[tuple[str, str, str, str, str]] = Counter()
        """(app, kind, outcome, status class, deadline) -> calls answered."""
        self.in_flight: Counter[str] = Counter()
        """kind -> calls being answered."""
        self.token_slo: Counter[tuple[str, str]] = Counter()
        """(app, verdict: met | missed) -> LLM answers judged by their token objectives."""
        meter.create_observable_counter(
            "switchyard.ingress.token_slo",
            callbacks=[self._observe_token_slo],
            unit="{request}",
            description="LLM answers judged by their application's TTFT and TPOT objectives, "
            "by app and verdict (met, missed).",
        )
        meter.create_observable_counter(
            "switchyard.ingress.requests",
            callbacks=[self._observe_requests],
            unit="{request}",
            description="Inference calls answered, by app, kind, outcome, status class and "
            "whether the deadline was met.",
        )
        meter.create_observable_up_down_counter(
            "switchyard.ingress.in_flight",
            callbacks=[self._observe_in_flight],
            unit="{request}",
            description="Inference calls being answered.",
        )
        self.latency_s = meter.create_histogram(
            "switchyard.ingress.latency",
            unit="s",
            description="Seconds from an inference call's arrival until its answer was sent.",
            explicit_bucket_boundaries_advisory=SECONDS_BUCKETS,
        )
        self.ttft_s = meter.create_histogram(
            "switchyard.ingress.ttft",
            unit="s",
            description="Seconds from an LLM call's arrival to its first token.",
            explicit_bucket_boundaries_advisory=SECONDS_BUCKETS,
        )
        self.tpot_s = meter.create_histogram(
            "switchyard.ingress.tpot",
            unit="s",
            description="Seconds per output token after the first, of an LLM answer.",
            explicit_bucket_boundaries_advisory=SECONDS_BUCKETS,
        )

    def _observe_requests(self, options: CallbackOptions) -> Iterable[Observation]:
        for (app, kind, outcome, status_class, deadline), count in list(self.requests.items()):
            attributes = {"app": app, "kind": kind, "outcome": outcome}
            yield Observation(
                count, attributes | {"status_class": status_class, "deadline": deadline}
            )

    def _observe_token_slo(self, options: CallbackOptions) -> Iterable[Observation]:
        for (app, verdict), count in list(self.token_slo.items()):
            yield Observation(count, {"app": app, "verdict": verdict})

    def _observe_in_flight(self, options: CallbackOptions) -> Iterable[Observation]:
        for kind, count in list(self.in_flight.items()):
            yield Observation(count, {"kind": kind})


class HttpTelemetryMiddleware:
    """SERVER spans and request metrics around the ingress app (module docstring).

    Args:
        app: the app to wrap.
        routes: the app's routes, to name spans by route template.
        pipelines: the pipeline applications' names: a call to one is of kind
            ``pipeline``.
        tracer_provider: where spans go; None: the process-wide provider.
        meter_provider: where metrics go; None: the process-wide provider.
    """

    def __init__(
        self,
        app: ASGIApp,
        routes: list[BaseRoute],
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        pipelines: Iterable[str] = (),
    ) -> None:
        self.app = app
        self.routes = routes
        self.pipelines = frozenset(pipelines)
        self.tracer = trace.get_tracer(INSTRUMENTATION_NAME, __version__, tracer_provider)
        self.instruments = instruments_once(meter_provider, INSTRUMENTATION_NAME, _Instruments)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in HEALTH_PATHS:
            await self.app(scope, receive, send)
            return
        started_s = time.perf_counter()
        method = str(scope.get("method", "GET"))
        route, params = self._route(scope)
        headers = _headers(scope)
        span = self.tracer.start_span(
            f"{method} {route}" if route else method,
            context=_PROPAGATOR.extract(headers),
            kind=SpanKind.SERVER,
        )
        if span.is_recording():
            span.set_attributes(_request_attributes(scope, method, route, headers))
        kind = _KIND_OF_ROUTE.get(route or "") if method == "POST" else None
        if kind == "classification" and params.get("app") in self.pipelines:
            kind = "pipeline"
        record: CallRecord | None = None
        if kind is not None:
            record = CallRecord(kind)
            scope.setdefault("state", {})[_STATE_KEY] = record
            self.instruments.in_flight[kind] += 1
        status = 500
        token = otel_context.attach(trace.set_span_in_context(span))

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except BaseException as exc:
            if span.is_recording():
                span.record_exception(exc)
            raise
        finally:
            otel_context.detach(token)
            self._finish(span, status, record, time.perf_counter() - started_s)

    def _finish(self, span: Span, status: int, record: CallRecord | None, elapsed_s: float) -> None:
        outcome = outcome_of(status, record) if record is not None else None
        if span.is_recording():
            span.set_attribute("http.response.status_code", status)
            if record is not None:
                span.set_attributes({"switchyard.app": record.app, "switchyard.outcome": outcome})
            if status >= 500:
                span.set_status(Status(StatusCode.ERROR, f"HTTP {status}"))
            elif outcome not in (None, "ok", "bad_request"):
                span.set_status(Status(StatusCode.ERROR, str(outcome)))
        span.end()
        if record is None or outcome is None:
            return
        instruments = self.instruments
        instruments.in_flight[record.kind] -= 1
        key = (record.app, record.kind, outcome, f"{status // 100}xx")
        instruments.requests[(*key, deadline_label(outcome, record))] += 1
        instruments.latency_s.record(elapsed_s, {"app": record.app, "outcome": outcome})
        if record.ttft_s is not None:
            instruments.ttft_s.record(record.ttft_s, {"app": record.app})
        if record.tpot_s is not None:
            instruments.tpot_s.record(record.tpot_s, {"app": record.app})
        if record.token_slo_met is not None:
            instruments.token_slo[record.app, "met" if record.token_slo_met else "missed"] += 1

    def _route(self, scope: Scope) -> tuple[str | None, dict[str, Any]]:
        """The template of the route ``scope`` matches, and its path parameters."""
        for route in self.routes:
            match, child = route.matches(scope)
            if match is not Match.NONE:
                path = getattr(route, "path", None)
                params = child.get("path_params")
                return (
                    path if isinstance(path, str) else None,
                    params if isinstance(params, dict) else {},
                )
        return None, {}


def _headers(scope: Scope) -> dict[str, str]:
    return {
        key.decode("latin-1").lower(): value.decode("latin-1")
        for key, value in scope.get("headers", ())
    }


def _request_attributes(
    scope: Scope, method: str, route: str | None, headers: dict[str, str]
) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "http.request.method": method,
        "url.path": str(scope.get("path", "")),
        "url.scheme": str(scope.get("scheme", "http")),
        "network.protocol.version": str(scope.get("http_version", "1.1")),
    }
    if route:
        attributes["http.route"] = route
    server = scope.get("server")
    if server:
        attributes["server.address"] = str(server[0])
        if server[1] is not None:
            attributes["server.port"] = int(server[1])
    client = scope.get("client")
    if client:
        attributes["client.address"] = str(client[0])
    if agent := headers.get("user-agent"):
        attributes["user_agent.original"] = agent
    return attributes


__all__ = [
    "CallRecord",
    "HttpTelemetryMiddleware",
    "call_record",
    "outcome_of",
]
