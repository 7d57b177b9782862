"""Stand-in for the OpenTelemetry collector where its image cannot be pulled.

Not the collector: an OTLP/HTTP receiver on 4318 that does for this stack what
deploy/otel/collector.yaml asks of the real one. Traces are queued and forwarded, in the
background, to Jaeger's OTLP/HTTP endpoint (the real collector sends them over gRPC);
metrics and logs are counted and a line per export is printed (the ``debug`` exporter at
basic verbosity). The configuration file is accepted and not read. Standard library and
opentelemetry-proto only.
"""

from __future__ import annotations

import argparse
import os
import queue
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

PROTOBUF = "application/x-protobuf"
QUEUE_LIMIT = 1000
"""Trace exports held while Jaeger is slow or away; beyond that new ones are dropped."""
RETRIES = 5


def log(message: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} otelcol-standin {message}", flush=True)


class Forwarder(threading.Thread):
    """Sends queued trace exports to ``endpoint``, retrying with backoff, in order."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(daemon=True)
        self.endpoint = endpoint
        self.queue: queue.Queue[tuple[bytes, str]] = queue.Queue(QUEUE_LIMIT)
        self.sent = 0
        self.dropped = 0

    def offer(self, body: bytes, content_type: str) -> None:
        try:
            self.queue.put_nowait((body, content_type))
        except queue.Full:
            self.dropped += 1

    def run(self) -> None:
        while True:
            body, content_type = self.queue.get()
            for attempt in range(RETRIES):
                request = urllib.request.Request(
                    self.endpoint, data=body, headers={"Content-Type": content_type}
                )
                try:
                    with urllib.request.urlopen(request, timeout=10) as answer:
                        answer.read()
                    self.sent += 1
                    break
                except (urllib.error.URLError, OSError) as error:
                    if attempt == RETRIES - 1:
                        self.dropped += 1
                        log(f"traces dropped after {RETRIES} tries: {error}")
                    time.sleep(0.5 * 2**attempt)


def counts(path: str, body: bytes, content_type: str) -> str:
    """What the debug exporter prints at basic verbosity, for a protobuf export."""
    if not content_type.startswith(PROTOBUF):
        return f"{len(body)} bytes of {content_type}"
    if path == "/v1/metrics":
        metrics = ExportMetricsServiceRequest.FromString(body)
        names = [
            m for rm in metrics.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
        ]
        return f"resource metrics: {len(metrics.resource_metrics)}, metrics: {len(names)}"
    logs = ExportLogsServiceRequest.FromString(body)
    records = sum(len(sl.log_records) for rl in logs.resource_logs for sl in rl.scope_logs)
    return f"resource logs: {len(logs.resource_logs)}, log records: {records}"


def make_handler(forwarder: Forwarder) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            content_type = self.headers.get("Content-Type", PROTOBUF)
            if self.path == "/v1/traces":
                forwarder.offer(body, content_type)
            elif self.path in ("/v1/metrics", "/v1/logs"):
                try:
                    log(f"{self.path[4:]} received: {counts(self.path, body, content_type)}")
                except Exception as error:
                    self.send_error(400, f"undecodable export: {error}")
                    return
            else:
                self.send_error(404)
                return
            # An empty export response: protobuf's empty message, or JSON's.
            empty = b"" if content_type.startswith(PROTOBUF) else b"{}"
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(empty)))
            self.end_headers()
            self.wfile.write(empty)

        def log_message(self, format: str, *args: object) -> None:
            """Quiet: a line per export request would drown the counts."""

    return Handler


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="accepted for the real collector's command; not read")
    parser.add_argument("--port", type=int, default=4318)
    parser.add_argument(
        "--traces-endpoint",
        default=os.environ.get("OTELCOL_STANDIN_TRACES", "http://jaeger:4318/v1/traces"),
    )
    args = parser.parse_args(argv)
    forwarder = Forwarder(args.traces_endpoint)
    forwarder.start()
    server = ThreadingHTTPServer(("0.0.0.0", args.port), make_handler(forwarder))
    unread = f"; {args.config} is not read" if args.config else ""
    log(f"OTLP/HTTP on :{args.port}, traces to {args.traces_endpoint} (a stand-in{unread})")
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
