"""Stand-in for Jaeger all-in-one where its image cannot be pulled.

Not Jaeger: an in-memory store of the most recent traces, fed over OTLP/HTTP on 4318
(``/v1/traces``, protobuf; OTLP's JSON encoding is refused), and the part of Jaeger's query API that finds them on
16686: ``/api/services``, ``/api/traces?service=NAME[&operation=OP][&limit=N]`` and
``/api/traces/{trace id}``, in Jaeger's JSON shapes. The page at ``/`` lists the services
seen; there is no Jaeger UI. Standard library and opentelemetry-proto only.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

MAX_TRACES = 20_000
"""Traces kept; the oldest go first."""
PROTOBUF = "application/x-protobuf"


def _text(value: AnyValue) -> str:
    kind = value.WhichOneof("value")
    return "" if kind is None else str(getattr(value, kind))


class Store:
    """Spans by trace id, each with the service that reported it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.traces: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()
        self.spans = 0

    def add(self, export: ExportTraceServiceRequest) -> int:
        added = 0
        with self.lock:
            for resource_spans in export.resource_spans:
                attributes = {a.key: _text(a.value) for a in resource_spans.resource.attributes}
                service = attributes.get("service.name", "unknown_service")
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        trace_id = span.trace_id.hex()
                        self.traces.setdefault(trace_id, []).append(
                            {
                                "traceID": trace_id,
                                "spanID": span.span_id.hex(),
                                "parentSpanID": span.parent_span_id.hex(),
                                "operationName": span.name,
                                "startTime": span.start_time_unix_nano // 1000,
                                "duration": (span.end_time_unix_nano - span.start_time_unix_nano)
                                // 1000,
                                "tags": [
                                    {"key": a.key, "type": "string", "value": _text(a.value)}
                                    for a in span.attributes
                                ],
                                "service": service,
                            }
                        )
                        self.traces.move_to_end(trace_id)
                        added += 1
            while len(self.traces) > MAX_TRACES:
                self.traces.popitem(last=False)
            self.spans += added
        return added

    def services(self) -> list[str]:
        with self.lock:
            return sorted({s["service"] for spans in self.traces.values() for s in spans})

    def find(self, service: str, operation: str | None, limit: int) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        with self.lock:
            for trace_id in reversed(self.traces):
                spans = self.traces[trace_id]
                if any(
                    s["service"] == service and operation in (None, s["operationName"])
                    for s in spans
                ):
                    found.append(jaeger_trace(trace_id, spans))
                    if len(found) >= limit:
                        break
        return found

    def get(self, trace_id: str) -> dict[str, Any] | None:
        with self.lock:
            spans = self.traces.get(trace_id)
            return None if spans is None else jaeger_trace(trace_id, spans)


def jaeger_trace(trace_id: str, spans: list[dict[str, Any]]) -> dict[str, Any]:
    """One trace in the JSON shape of Jaeger's query API."""
    processes: dict[str, str] = {}
    out = []
    for span in spans:
        process = processes.setdefault(span["service"], f"p{len(processes) + 1}")
        references = (
            [{"refType": "CHILD_OF", "traceID": trace_id, "spanID": span["parentSpanID"]}]
            if span["parentSpanID"]
            else []
        )
        fields = {k: v for k, v in span.items() if k not in ("service", "parentSpanID")}
        out.append({**fields, "references": references, "processID": process})
    return {
        "traceID": trace_id,
        "spans": out,
        "processes": {p: {"serviceName": s, "tags": []} for s, p in processes.items()},
        "warnings": None,
    }


def make_handler(store: Store) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def reply(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def reply_json(self, status: int, document: object) -> None:
            self.reply(status, json.dumps(document).encode(), "application/json")

        def do_POST(self) -> None:
            if self.path != "/v1/traces":
                self.send_error(404)
                return
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            content_type = self.headers.get("Content-Type", PROTOBUF)
            if not content_type.startswith(PROTOBUF):
                self.send_error(415, "only OTLP protobuf is read here")
                return
            try:
                export = ExportTraceServiceRequest.FromString(body)
            except Exception as error:
                self.send_error(400, f"undecodable export: {error}")
                return
            store.add(export)
            self.reply(200, b"", PROTOBUF)

        def do_GET(self) -> None:
            url = urlparse(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            if url.path == "/api/services":
                services = store.services()
                self.reply_json(200, {"data": services, "total": len(services), "errors": None})
            elif url.path == "/api/traces":
                if "service" not in query:
                    self.reply_json(400, {"data": None, "errors": [{"msg": "service is needed"}]})
                    return
                traces = store.find(
                    query["service"], query.get("operation"), int(query.get("limit", "20"))
                )
                self.reply_json(200, {"data": traces, "total": len(traces), "errors": None})
            elif url.path.startswith("/api/traces/"):
                trace = store.get(url.path.rsplit("/", 1)[1])
                if trace is None:
                    self.reply_json(404, {"data": None, "errors": [{"msg": "trace not found"}]})
                else:
                    self.reply_json(200, {"data": [trace], "total": 1, "errors": None})
            elif url.path == "/":
                rows = "".join(f"<li>{s}</li>" for s in store.services())
                page = (
                    "<html><body><h1>Jaeger stand-in</h1><p>Not Jaeger: an in-memory trace"
                    f" store ({store.spans} spans). Services:</p><ul>{rows}</ul></body></html>"
                )
                self.reply(200, page.encode(), "text/html")
            else:
                self.send_error(404)

        def log_message(self, format: str, *args: object) -> None:
            """Quiet: the services export every few seconds."""

    return Handler


def main() -> None:
    store = Store()
    handler = make_handler(store)
    servers = [ThreadingHTTPServer(("0.0.0.0", port), handler) for port in (4318, 16686)]
    for server in servers[1:]:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    print(
        f"{time.strftime('%Y-%m-%dT%H:%M:%S')} jaeger-standin: OTLP/HTTP on :4318,"
        " query API on :16686 (a stand-in, not Jaeger)",
        flush=True,
    )
    servers[0].serve_forever()


if __name__ == "__main__":
    main()
