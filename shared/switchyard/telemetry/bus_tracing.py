"""Tracing as bus middleware: W3C trace context rides in message headers.

Publishing starts a PRODUCER span and writes its ``traceparent`` (and ``tracestate``)
into the record's headers; handling a message starts a CONSUMER span whose parent is the
context read back from those headers. One request is therefore one trace across every
service it passes through, whatever the transport.

When the tracer provider's sampler drops everything (no exporter is configured), no span
is made per message: the received context is current while a message is handled, and a
publish hands the current context on as it is. Trace ids flow the same; the unsampled
spans nobody could read are not paid for.

Metrics (one set per meter provider, shared by every middleware built on it):

* ``switchyard.bus.published`` — messages published; attributes ``topic``, ``message_type``.
* ``switchyard.bus.consumed`` — messages handled; attributes ``topic``, ``group``,
  ``outcome`` (``ok`` | ``error``).
* ``switchyard.bus.handler.duration`` — seconds from a message's hand-over to the handler
  until the handler finished; same attributes as ``consumed``.
* ``switchyard.bus.dead_lettered`` — messages sent to the dead-letter topic; attributes
  ``topic``, ``group``, ``reason``.

The two per-message counters are observable counters fed from plain dictionaries: a
synchronous ``Counter.add`` costs about as much as creating an unsampled span, a dict
increment a fortieth of that.

This module never imports aiokafka: the middleware works the same over every transport.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from contextvars import Token
from types import TracebackType
from typing import TYPE_CHECKING, cast

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.metrics import CallbackOptions, Meter, MeterProvider, Observation
from opentelemetry.propagators.textmap import Getter, Setter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import (
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    Tracer,
    TracerProvider,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from switchyard import __version__
from switchyard.bus.records import Envelope, Headers
from switchyard.telemetry.observables import instruments_once, observe

if TYPE_CHECKING:
    from switchyard.bus import Bus

_INSTRUMENTATION_NAME = "switchyard.bus"
_PROPAGATOR = TraceContextTextMapPropagator()


class _HeaderListSetter(Setter[list[tuple[str, bytes]]]):
    """Writes a header into a publish's header list, replacing an earlier value of it."""

    def set(self, carrier: list[tuple[str, bytes]], key: str, value: str) -> None:
        carrier[:] = [(k, v) for k, v in carrier if k != key]
        carrier.append((key, value.encode("utf-8")))


class _HeaderTupleGetter(Getter[Headers]):
    """Reads headers from a delivered record's ``((name, bytes), ...)``."""

    def get(self, carrier: Headers, key: str) -> list[str] | None:
        found = [v.decode("utf-8", errors="replace") for k, v in carrier if k == key]
        return found or None

    def keys(self, carrier: Headers) -> list[str]:
        return [k for k, _ in carrier]


_SETTER = _HeaderListSetter()
_GETTER = _HeaderTupleGetter()


def extract_context(headers: Headers) -> Context:
    """The trace context carried by a record's headers (an empty context when none)."""
    return _PROPAGATOR.extract(headers, getter=_GETTER)


def trace_carrier(context: Context) -> dict[str, str]:
    """``context``'s span as W3C ``traceparent`` (and ``tracestate``) fields, for keeping
    a request's trace where messages do not carry it (a state-store record); empty when
    the context has no valid span."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=context)
    return carrier


def context_from_carrier(carrier: Mapping[str, str]) -> Context:
    """The trace context :func:`trace_carrier` wrote (an empty context when none)."""
    return _PROPAGATOR.extract(dict(carrier))


_PROPAGATED: Token[Context] = cast("Token[Context]", object())
"""The token of a publishing scope that handed the current context on without a span."""


def _set_traceparent(headers: list[tuple[str, bytes]], context: SpanContext) -> None:
    """Write ``context`` as W3C ``traceparent`` (and ``tracestate``) into ``headers``."""
    headers[:] = [(k, v) for k, v in headers if k not in ("traceparent", "tracestate")]
    headers.append(
        (
            "traceparent",
            f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}".encode(),
        )
    )
    if context.trace_state:
        headers.append(("tracestate", context.trace_state.to_header().encode()))


class _BusInstruments:
    """The bus instruments of one meter provider, and the counts its observers report."""

    def __init__(self, meter: Meter) -> None:
        self.published: Counter[tuple[str, str]] = Counter()
        self.consumed: Counter[tuple[str, str, str]] = Counter()
        meter.create_observable_counter(
            "switchyard.bus.published",
            callbacks=[self._observe_published],
            unit="{message}",
            description="Messages published.",
        )
        meter.create_observable_counter(
            "switchyard.bus.consumed",
            callbacks=[self._observe_consumed],
            unit="{message}",
            description="Messages handled, by outcome.",
        )
        self.dead_lettered = meter.create_counter(
            "switchyard.bus.dead_lettered",
            unit="{message}",
            description="Messages sent to the dead-letter topic.",
        )
        self.handler_duration_s = meter.create_histogram(
            "switchyard.bus.handler.duration",
            unit="s",
            description="Time from a message's hand-over to its handler until it finished.",
        )

    def _observe_published(self, options: CallbackOptions) -> Iterable[Observation]:
        for (topic, message_type), count in list(self.published.items()):
            yield Observation(count, {"topic": topic, "message_type": message_type})

    def _observe_consumed(self, options: CallbackOptions) -> Iterable[Observation]:
        for (topic, group, outcome), count in list(self.consumed.items()):
            yield Observation(count, {"topic": topic, "group": group, "outcome": outcome})


def _mark_failed(span: Span, exc: BaseException) -> None:
    if span.is_recording():
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))


class _PublishScope(AbstractContextManager[None]):
    """One publish: a current PRODUCER span whose context is injected into the headers."""

    __slots__ = ("_headers", "_message_type", "_middleware", "_span", "_token", "_topic")

    def __init__(
        self,
        middleware: TracingMiddleware,
        topic: str,
        message_type: str,
        headers: list[tuple[str, bytes]],
    ) -> None:
        self._middleware = middleware
        self._topic = topic
        self._message_type = message_type
        self._headers = headers
        self._span: Span = trace.INVALID_SPAN
        self._token: Token[Context] | None = None

    def __enter__(self) -> None:
        if self._token is not None:
            raise RuntimeError("a publishing scope is entered once")
        middleware = self._middleware
        if middleware._propagate_only:
            current = trace.get_current_span().get_span_context()
            if current.is_valid:
                # Nothing records spans here: hand the current context on as it is (the
                # trace id is what logs and later hops need), without a span of our own.
                _set_traceparent(self._headers, current)
                self._token = _PROPAGATED
                return
        span = middleware._tracer.start_span(f"{self._topic} publish", kind=SpanKind.PRODUCER)
        if span.is_recording():
            span.set_attributes(
                {
                    "messaging.system": middleware._messaging_system,
                    "messaging.destination.name": self._topic,
                    "messaging.operation.type": "send",
                    "messaging.operation.name": "publish",
                    "switchyard.message_type": self._message_type,
                }
            )
        span_context = trace.set_span_in_context(span)
        self._span = span
        self._token = otel_context.attach(span_context)
        _PROPAGATOR.inject(self._headers, context=span_context, setter=_SETTER)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        token, self._token = self._token, None
        if token is None:
            raise RuntimeError("a publishing scope is left only after it was entered")
        if token is not _PROPAGATED:
            if exc is not None:
                _mark_failed(self._span, exc)
            otel_context.detach(token)
            self._span.end()
        if exc is None:
            self._middleware._instruments.published[self._topic, self._message_type] += 1


class _ConsumeScope(AbstractContextManager[None]):
    """The handling of one message: a current CONSUMER span, child of the producer's.

    ``__enter__`` and ``__exit__`` may run in separate calls (the bus enters it in one
    ``__anext__`` of a subscription and leaves it in the next), as long as both run in the
    same asyncio task, so that the context attached on entry is the one detached on exit.
    """

    __slots__ = (
        "_envelope",
        "_group",
        "_message_type",
        "_middleware",
        "_span",
        "_started_s",
        "_token",
    )

    def __init__(
        self, middleware: TracingMiddleware, envelope: Envelope, group: str, message_type: str
    ) -> None:
        self._middleware = middleware
        self._envelope = envelope
        self._group = group
        self._message_type = message_type
        self._span: Span = trace.INVALID_SPAN
        self._token: Token[Context] | None = None
        self._started_s = 0.0

    def __enter__(self) -> None:
        if self._token is not None:
            raise RuntimeError("a consuming scope is entered once")
        middleware, envelope = self._middleware, self._envelope
        parent = extract_context(envelope.headers)
        if middleware._propagate_only:
            # Nothing records spans here: the producer's context is current while the
            # message is handled (its trace id in logs and in what is published), and no
            # unsampled span of our own is made.
            self._token = otel_context.attach(parent)
            self._started_s = time.perf_counter()
            return
        span = middleware._tracer.start_span(
            f"{envelope.topic} process", context=parent, kind=SpanKind.CONSUMER
        )
        if span.is_recording():
            span.set_attributes(
                {
                    "messaging.system": middleware._messaging_system,
                    "messaging.destination.name": envelope.topic,
                    "messaging.consumer.group.name": self._group,
                    "messaging.destination.partition.id": str(envelope.partition),
                    "messaging.kafka.offset": envelope.offset,
                    "messaging.operation.type": "process",
                    "switchyard.message_type": self._message_type,
                }
            )
        self._span = span
        self._token = otel_context.attach(trace.set_span_in_context(span))
        self._started_s = time.perf_counter()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        elapsed_s = time.perf_counter() - self._started_s
        token, self._token = self._token, None
        if token is None:
            raise RuntimeError("a consuming scope is left only after it was entered")
        outcome = "ok"
        if exc is not None:
            outcome = "error"
            _mark_failed(self._span, exc)
        otel_context.detach(token)
        self._span.end()
        instruments, topic = self._middleware._instruments, self._envelope.topic
        instruments.consumed[topic, self._group, outcome] += 1
        instruments.handler_duration_s.record(
            elapsed_s, {"topic": topic, "group": self._group, "outcome": outcome}
        )
        # Returning None lets the handler's exception propagate unchanged.


class TracingMiddleware:
    """:class:`~switchyard.bus.middleware.BusMiddleware` that traces and counts messages.

    Args:
        tracer_provider: where spans go; None means the process-wide provider.
        meter_provider: where bus metrics go; None means the process-wide provider.
        messaging_system: the ``messaging.system`` span attribute.
    """

    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        *,
        messaging_system: str = "kafka",
    ) -> None:
        self._tracer: Tracer = trace.get_tracer(_INSTRUMENTATION_NAME, __version__, tracer_provider)
        provider = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
        # A provider whose sampler drops everything (no exporter: configure_telemetry)
        # never records a span: then only the context is handed on, which costs a
        # fraction of making an unsampled span per message.
        self._propagate_only = getattr(provider, "sampler", None) is ALWAYS_OFF
        self._instruments = instruments_once(meter_provider, _INSTRUMENTATION_NAME, _BusInstruments)
        self._messaging_system = messaging_system

    def publishing(
        self, topic: str, message_type: str, headers: list[tuple[str, bytes]]
    ) -> AbstractContextManager[None]:
        """Wrap one publish in a PRODUCER span and add its ``traceparent`` to ``headers``.

        The span is current inside the block and ended on exit; an exception marks it as
        an error (and propagates). The message counts as published when the block exits
        without an exception.
        """
        return _PublishScope(self, topic, message_type, headers)

    def consuming(
        self, envelope: Envelope, group: str, message_type: str
    ) -> AbstractContextManager[None]:
        """Wrap the handling of ``envelope`` in a CONSUMER span, child of its producer's.

        The span is current from ``__enter__`` to ``__exit__`` (which may run in separate
        calls of one task); an exception passed to ``__exit__`` marks the span as an
        error, counts the message with ``outcome=error`` and is not swallowed.
        """
        return _ConsumeScope(self, envelope, group, message_type)

    def dead_lettered(self, envelope: Envelope, group: str, reason_kind: str) -> None:
        """Count a dead-lettered message and note it on the current span, if one records."""
        self._instruments.dead_lettered.add(
            1, {"topic": envelope.topic, "group": group, "reason": reason_kind}
        )
        span = trace.get_current_span()
        if span.is_recording():
            span.add_event(
                "dead-lettered",
                {
                    "messaging.destination.name": envelope.topic,
                    "messaging.consumer.group.name": group,
                    "switchyard.dead_letter.reason": reason_kind,
                },
            )


def observe_bus_records(meter_provider: MeterProvider, bus: Bus) -> None:
    """Export ``bus.record_counts`` as the counter ``switchyard.bus.records`` (``topic``,
    ``group``, ``outcome``: ``decoded``, ``skipped``, ``dead_lettered``): what each
    consumer read, decoded or passed over; and ``bus.lags()`` as the gauge
    ``switchyard.bus.lag`` (``topic``, ``group``). Several buses of one process (the
    embedded stack) feed the one instrument."""
    counts = bus.record_counts

    def observations() -> Iterable[Observation]:
        return [
            Observation(count, {"topic": topic, "group": group, "outcome": outcome})
            for (topic, group, outcome), count in list(counts.items())
        ]

    observe(
        meter_provider,
        "switchyard.bus",
        "switchyard.bus.records",
        observations,
        kind="counter",
        unit="{record}",
        description="Records read by consumers, by outcome (decoded, skipped, dead_lettered).",
    )

    def lags() -> Iterable[Observation]:
        return [
            Observation(lag, {"topic": topic, "group": group})
            for (topic, group), lag in bus.lags().items()
        ]

    observe(
        meter_provider,
        "switchyard.bus",
        "switchyard.bus.lag",
        lags,
        kind="gauge",
        unit="{record}",
        description="Records the broker holds for a consumer beyond what it fetched.",
    )
