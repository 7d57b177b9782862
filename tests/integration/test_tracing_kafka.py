"""One request is one trace across services: the parent link survives a real Kafka hop."""

from __future__ import annotations

import asyncio

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from switchyard.bus import Delivery
from switchyard.contracts.messages import (
    Completion,
    CompletionStatus,
    InferenceRequest,
    RequestTimeline,
)
from switchyard.contracts.topics import ANSWERS, REQUESTS
from switchyard.telemetry import TracingMiddleware

from tests.support.bus import bus_factory, collect, make_request


async def test_consumer_spans_are_children_of_the_producer_spans_across_two_hops(
    kafka_bootstrap: str, unique_prefix: str
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = TracingMiddleware(provider)
    client_tracer = provider.get_tracer("test-client")

    async with bus_factory("kafka", prefix=unique_prefix, kafka_bootstrap=kafka_bootstrap) as make:
        ingress, worker, reporter = (make(middlewares=(tracing,)) for _ in range(3))
        for bus in (ingress, worker, reporter):
            await bus.start()
        with client_tracer.start_as_current_span("client request") as root:
            await ingress.publish(REQUESTS, make_request("r-traced"))
        # Outside any span now: only the headers can carry the trace onward.
        assert not trace.get_current_span().get_span_context().is_valid

        stopping = asyncio.Event()
        # The answer's partition is read from its end: open the reader before it comes.
        answers = reporter.subscribe(ANSWERS, group="ingress", partitions=[1])
        await answers.open()

        async def work(delivery: Delivery[InferenceRequest]) -> None:
            request = delivery.message
            await worker.publish(
                ANSWERS,
                Completion(
                    request_id=request.request_id,
                    app=request.app,
                    worker_id="w-1",
                    worker_type="cpu",
                    variant="logreg",
                    status=CompletionStatus.OK,
                    timeline=RequestTimeline(arrival_s=request.arrival_s),
                ),
                partition=1,
            )
            stopping.set()

        await asyncio.wait_for(
            worker.consume(REQUESTS, group="worker", handler=work, stopping=stopping), 60
        )
        async with answers as sub:
            await collect(sub, 1)

    spans = {span.name: span for span in exporter.get_finished_spans()}
    requests_topic = f"{unique_prefix}switchyard.requests"
    completions_topic = f"{unique_prefix}switchyard.answers"
    publish_request = spans[f"{requests_topic} publish"]
    process_request = spans[f"{requests_topic} process"]
    publish_completion = spans[f"{completions_topic} publish"]
    process_completion = spans[f"{completions_topic} process"]

    root_context = root.get_span_context()
    chain = [publish_request, process_request, publish_completion, process_completion]
    assert {s.context.trace_id for s in chain if s.context} == {root_context.trace_id}
    assert publish_request.parent is not None
    assert publish_request.parent.span_id == root_context.span_id
    assert process_request.parent is not None
    assert publish_request.context is not None
    assert process_request.parent.span_id == publish_request.context.span_id
    assert process_request.parent.is_remote  # it came through Kafka headers, not memory
    assert publish_completion.parent is not None
    assert process_request.context is not None
    assert publish_completion.parent.span_id == process_request.context.span_id
    assert process_completion.parent is not None
    assert publish_completion.context is not None
    assert process_completion.parent.span_id == publish_completion.context.span_id
    assert publish_request.kind is SpanKind.PRODUCER
    assert process_request.kind is SpanKind.CONSUMER
    assert process_request.attributes is not None
    assert process_request.attributes["messaging.consumer.group.name"] == "worker"
