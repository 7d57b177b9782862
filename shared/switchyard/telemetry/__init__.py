"""Telemetry: OpenTelemetry providers from the environment, JSON logs, bus tracing."""

from switchyard.telemetry.bus_tracing import (
    TracingMiddleware,
    context_from_carrier,
    extract_context,
    observe_bus_records,
    trace_carrier,
)
from switchyard.telemetry.logs import JsonFormatter, configure_logging
from switchyard.telemetry.setup import Telemetry, configure_telemetry

__all__ = [
    "JsonFormatter",
    "Telemetry",
    "TracingMiddleware",
    "configure_logging",
    "configure_telemetry",
    "context_from_carrier",
    "extract_context",
    "observe_bus_records",
    "trace_carrier",
]
