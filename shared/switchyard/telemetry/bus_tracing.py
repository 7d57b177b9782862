"""Tracing as bus middleware: W3C trace context rides in message headers.

Publishing starts a PRODUCER span and writes its ``traceparent`` (and ``tracestate``)
into the record's headers; handling a message starts a CONSUMER span whose parent is the
context read back from those headers. One request is therefore one trace across every
service it passes through, whatever the transport.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager

from opentelemetry import metrics, trace
from opentelemetry.context import Context
from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation
from opentelemetry.propagators.textmap import Getter, Setter
from opentelemetry.trace import SpanKind, Status, StatusCode, TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from switchyard import __version__
from switchyard.bus.records import Envelope, Headers

_PROPAGATOR = TraceContextTextMapPropagator()


class _HeaderListSetter(Setter[list[tuple[str, bytes]]]):
    def set(self, carrier: list[tuple[str, bytes]], key: str, value: str) -> None:
        carrier[:] = [(k, v) for k, v in carrier if k != key]
        carrier.append((key, value.encode()))


class _HeaderTupleGetter(Getter[Headers]):
    def get(self, carrier: Headers, key: str) -> list[str] | None:
        found = [v.decode("utf-8", errors="replace") for k, v in carrier if k == key]
        return found or None

    def keys(self, carrier: Headers) -> list[str]:
        return [k for k, _ in carrier]


_SETTER = _HeaderListSetter()
_GETTER = _HeaderTupleGetter()


def extract_context(headers: Headers) -> Context:
    """The trace context carried by a record's headers (empty when there is none)."""
    return _PROPAGATOR.extract(headers, getter=_GETTER)


class TracingMiddleware:
    """:class:`~switchyard.bus.middleware.BusMiddleware` that traces and counts messages.

    Args:
        tracer_provider / meter_provider: where spans and metrics go; None means the
            process-wide providers.
        messaging_system: the ``messaging.system`` attribute.
    """

    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        *,
        messaging_system: str = "kafka",
    ) -> None:
        self._tracer = trace.get_tracer("switchyard.bus", __version__, tracer_provider)
        meter = metrics.get_meter("switchyard.bus", __version__, meter_provider)
        self._system = messaging_system
        # Publish counts are kept in a plain dict and read by the meter when it collects:
        # a counter call per message costs more than the rest of the publish path.
        self._published_counts: Counter[tuple[str, str]] = Counter()
        meter.create_observable_counter(
            "switchyard.bus.published",
            callbacks=[self._observe_published],
            unit="{message}",
            description="Messages published.",
        )
        self._dead_lettered = meter.create_counter(
            "switchyard.bus.dead_lettered",
            unit="{message}",
            description="Messages sent to the dead-letter topic.",
        )
        # Its count per outcome is also the number of messages handled.
        self._handler_duration = meter.create_histogram(
            "switchyard.bus.handler.duration",
            unit="s",
            description="Time from a message's delivery to its handler's return.",
        )

    def _observe_published(self, options: CallbackOptions) -> Iterable[Observation]:
        for (topic, message_type), count in list(self._published_counts.items()):
            yield Observation(count, {"topic": topic, "message_type": message_type})

    def publishing(
        self, topic: str, message_type: str, headers: list[tuple[str, bytes]]
    ) -> AbstractContextManager[None]:
        return self._publishing(topic, message_type, headers)

    @contextmanager
    def _publishing(
        self, topic: str, message_type: str, headers: list[tuple[str, bytes]]
    ) -> Iterator[None]:
        span = self._tracer.start_span(f"{topic} publish", kind=SpanKind.PRODUCER)
        if span.is_recording():
            span.set_attributes(
                {
                    "messaging.system": self._system,
                    "messaging.destination.name": topic,
                    "messaging.operation.type": "send",
                    "switchyard.message_type": message_type,
                }
            )
        with trace.use_span(span, end_on_exit=True):
            _PROPAGATOR.inject(headers, setter=_SETTER)
            yield
        self._published_counts[topic, message_type] += 1

    def consuming(
        self, envelope: Envelope, group: str, message_type: str
    ) -> AbstractContextManager[None]:
        return self._consuming(envelope, group, message_type)

    @contextmanager
    def _consuming(self, envelope: Envelope, group: str, message_type: str) -> Iterator[None]:
        started_s = time.perf_counter()
        outcome = "ok"
        # The span is ended by hand (not by `with`) so that an exception can mark it as an
        # error while still propagating to the caller unchanged.
        span = self._tracer.start_span(
            f"{envelope.topic} process",
            context=extract_context(envelope.headers),
            kind=SpanKind.CONSUMER,
        )
        if span.is_recording():
            span.set_attributes(
                {
                    "messaging.system": self._system,
                    "messaging.destination.name": envelope.topic,
                    "messaging.consumer.group.name": group,
                    "messaging.destination.partition.id": str(envelope.partition),
                    "messaging.kafka.offset": envelope.offset,
                    "messaging.operation.type": "process",
                    "switchyard.message_type": message_type,
                }
            )
        try:
            with trace.use_span(
                span, end_on_exit=False, record_exception=False, set_status_on_exception=False
            ):
                yield
        except BaseException as exc:
            outcome = "error"
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            raise
        finally:
            span.end()
            self._handler_duration.record(
                time.perf_counter() - started_s,
                {"topic": envelope.topic, "group": group, "outcome": outcome},
            )

    def dead_lettered(self, envelope: Envelope, group: str, reason_kind: str) -> None:
        self._dead_lettered.add(1, {"topic": envelope.topic, "group": group, "reason": reason_kind})
        span = trace.get_current_span()
        if span.is_recording():
            span.add_event(
                "dead-lettered",
                {"messaging.destination.name": envelope.topic, "switchyard.reason": reason_kind},
            )
