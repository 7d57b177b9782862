"""Telemetry: OpenTelemetry providers from the environment, JSON logs, bus tracing."""

from switchyard.telemetry.bus_tracing import TracingMiddleware, extract_context
from switchyard.telemetry.logs import JsonFormatter, configure_logging
from switchyard.telemetry.setup import Telemetry, configure_telemetry

__all__ = [
    "JsonFormatter",
    "Telemetry",
    "TracingMiddleware",
    "configure_logging",
    "configure_telemetry",
    "extract_context",
]
