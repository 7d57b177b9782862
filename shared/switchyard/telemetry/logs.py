"""Structured logs: one JSON object a line, with the current trace and span ids.

``{"ts": "2026-11-22T17:50:01.123Z", "level": "INFO", "logger": "switchyard.runtime",
"msg": "started", "service": "monitor", "instance": "host-42", "trace_id": "…",
"span_id": "…", …extra fields}``
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

from opentelemetry import trace

from switchyard.config import Settings

# Attributes every LogRecord has; anything else came from `extra=` and is logged as a field.
_STANDARD_ATTRIBUTES = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}

_NOISY_LOGGERS = ("aiokafka", "kafka", "urllib3", "opentelemetry")


def _trace_ids() -> tuple[str, str] | None:
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return format(context.trace_id, "032x"), format(context.span_id, "016x")


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object on one line.

    Fields: ``ts`` (ISO-8601 UTC, milliseconds), ``level``, ``logger``, ``msg``,
    ``service``, ``instance``; ``trace_id`` and ``span_id`` (hex) when a valid span is
    current; ``exc`` (the formatted traceback) when an exception is attached; and every
    ``extra={...}`` field of the call. Values JSON cannot hold are written with str().
    """

    def __init__(self, service: str, instance: str) -> None:
        super().__init__()
        self._service = service
        self._instance = instance

    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.fromtimestamp(record.created, tz=UTC)
        entry: dict[str, Any] = {
            "ts": stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{stamp.microsecond // 1000:03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            "service": self._service,
            "instance": self._instance,
        }
        ids = _trace_ids()
        if ids is not None:
            entry["trace_id"], entry["span_id"] = ids
        for key, value in record.__dict__.items():
            if key not in _STANDARD_ATTRIBUTES and key not in entry:
                entry[key] = value
        if record.exc_info and record.exc_info[0] is not None:
            entry["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exc"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    """A readable line: time, level, logger, message, and the trace id when there is one."""

    def __init__(self, service: str) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")
        self._service = service

    def format(self, record: logging.LogRecord) -> str:
        line = f"[{self._service}] " + super().format(record)
        ids = _trace_ids()
        return line if ids is None else f"{line} trace={ids[0]}"


_HANDLER_NAME = "switchyard"


def configure_logging(
    service_name: str, settings: Settings, *, stream: TextIO | None = None
) -> None:
    """Send the root logger to ``stream`` (default stderr) in ``settings.log_format``.

    Sets the root level to ``settings.log_level`` and keeps chatty libraries (aiokafka,
    urllib3, OpenTelemetry's own) at WARNING or above. Idempotent: calling it again
    replaces Switchyard's handler instead of adding a second one.
    """
    root = logging.getLogger()
    for handler in list(root.handlers):
        if handler.get_name() == _HANDLER_NAME:
            root.removeHandler(handler)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.set_name(_HANDLER_NAME)
    if settings.log_format == "json":
        handler.setFormatter(JsonFormatter(service_name, settings.instance_id))
    else:
        handler.setFormatter(TextFormatter(service_name))
    root.addHandler(handler)
    root.setLevel(settings.log_level)
    for name in _NOISY_LOGGERS:
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))
