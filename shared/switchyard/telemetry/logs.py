"""Structured logs: one JSON object a line, with the current trace and span ids.

``{"ts": "2026-11-22T17:50:01.123Z", "level": "INFO", "logger": "switchyard.runtime",
"msg": "started", "service": "monitor", "instance": "host-42", "trace_id": "…",
"span_id": "…", …extra fields}``

:func:`configure_logging` sends them to stderr, a given stream, or a file. Lines written
once per HTTP call are not logged at INFO: at 1,000 calls a second that would be 1,000
lines a second (httpx's ``HTTP Request: …`` lines, uvicorn's access log) and they show
only when the level is DEBUG; the ingress counts calls in its metrics and spans instead.
An unreachable trace collector is reported once a minute per exporter, not on every
failed export and retry (:class:`ExportFailureFilter`).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from opentelemetry import trace

from switchyard.config import Settings

# Attributes every LogRecord has; anything else came from `extra=` and is logged as a field.
_STANDARD_ATTRIBUTES = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}

_NOISY_LOGGERS = ("aiokafka", "kafka", "urllib3", "opentelemetry", "httpcore")
# Loggers that write a line per HTTP call at INFO: let through at DEBUG only.
_PER_CALL_LOGGERS = ("httpx", "uvicorn.access")
# Loggers whose failure lines repeat for as long as a collector is unreachable.
_EXPORTER_LOGGERS = ("opentelemetry.exporter.",)


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


class ExportFailureFilter(logging.Filter):
    """Let one line a minute through from each OpenTelemetry exporter logger, and say
    how many were held back since.

    An OTLP exporter logs every failed export and every retry (three warnings and an
    error a batch, every few seconds in every process) while its collector is down or
    absent: one line a minute says as much. Other loggers pass untouched.
    """

    def __init__(
        self, interval_s: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.interval_s = interval_s
        self._clock = clock
        self._last_s: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(_EXPORTER_LOGGERS):
            return True
        now_s = self._clock()
        last_s = self._last_s.get(record.name)
        if last_s is not None and now_s - last_s < self.interval_s:
            self._held[record.name] = self._held.get(record.name, 0) + 1
            return False
        self._last_s[record.name] = now_s
        held = self._held.pop(record.name, 0)
        if held:
            record.msg = f"{record.getMessage()} ({held} more like it held back since)"
            record.args = None
        return True


def configure_logging(
    service_name: str,
    settings: Settings,
    *,
    stream: TextIO | None = None,
    path: str | os.PathLike[str] | None = None,
    keep_file: bool = False,
) -> None:
    """Send the root logger to ``stream`` (default stderr), or to the file ``path``, in
    ``settings.log_format``.

    Sets the root level to ``settings.log_level``; keeps chatty libraries (aiokafka,
    urllib3, OpenTelemetry's own) at WARNING or above, and per-call lines (httpx's
    requests, uvicorn's access log) below DEBUG out. Idempotent: calling it again
    replaces Switchyard's handler instead of adding a second one.

    Args:
        stream: where to write; default ``sys.stderr``.
        path: a file to append to instead (its folder is created); a file that cannot
            be opened raises ``OSError`` and leaves the current destination in place.
        keep_file: when an earlier call sent the logs to a file (``path``), keep writing
            to it and only set the format and level again: a program that chose a log
            file (``switchyard demo``) keeps it when the embedded stack configures its
            logs. A stream destination is replaced as usual.
    """
    if stream is not None and path is not None:
        raise ValueError("configure_logging: pass stream or path, not both")
    root = logging.getLogger()
    previous = [h for h in root.handlers if h.get_name() == _HANDLER_NAME]
    kept = next((h for h in previous if isinstance(h, logging.FileHandler)), None)
    handler: logging.Handler
    if keep_file and kept is not None and stream is None and path is None:
        handler = kept
    elif path is not None:
        target = Path(path).expanduser()
        target.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(target, encoding="utf-8")
    else:
        handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    for old in previous:
        if old is not handler:
            root.removeHandler(old)
            old.close()  # a file handler closes its file; a stream handler leaves it open
    handler.set_name(_HANDLER_NAME)
    if settings.log_format == "json":
        handler.setFormatter(JsonFormatter(service_name, settings.instance_id))
    else:
        handler.setFormatter(TextFormatter(service_name))
    if not any(isinstance(f, ExportFailureFilter) for f in handler.filters):
        handler.addFilter(ExportFailureFilter())
    if handler not in root.handlers:
        root.addHandler(handler)
    root.setLevel(settings.log_level)
    for name in _NOISY_LOGGERS:
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))
    for name in _PER_CALL_LOGGERS:
        per_call = logging.getLogger(name)
        per_call.setLevel(root.level if root.level <= logging.DEBUG else logging.WARNING)
