"""An unreachable trace collector is one log line a minute per exporter, not a line for
every failed export and retry; everything else is logged as before."""

from __future__ import annotations

import io
import logging

from switchyard.config import load_settings
from switchyard.telemetry.logs import ExportFailureFilter, configure_logging

EXPORTER = "opentelemetry.exporter.otlp.proto.http.trace_exporter"


def _record(name: str, msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord(name, logging.WARNING, __file__, 1, msg, args, None)


def test_one_line_a_minute_per_exporter_then_how_many_were_held() -> None:
    now = [0.0]
    keep = ExportFailureFilter(interval_s=60.0, clock=lambda: now[0])
    passed = []
    for t in (0.0, 5.0, 10.0, 30.0, 59.0):
        now[0] = t
        passed.append(keep.filter(_record(EXPORTER, "Transient error %s", "refused")))
    assert passed == [True, False, False, False, False]
    now[0] = 61.0
    late = _record(EXPORTER, "Failed to export %s", "spans")
    assert keep.filter(late)
    assert late.getMessage() == "Failed to export spans (4 more like it held back since)"
    # Each exporter has its own minute; other loggers are never held back.
    assert keep.filter(_record("opentelemetry.exporter.otlp.proto.http.metric_exporter", "x"))
    assert all(keep.filter(_record("switchyard.worker", "busy")) for _ in range(5))


def test_configured_logging_holds_back_repeated_export_failures() -> None:
    out = io.StringIO()
    configure_logging("probe", load_settings({"SWITCHYARD_LOG_FORMAT": "text"}), stream=out)
    exporter = logging.getLogger(EXPORTER)
    for _ in range(10):
        exporter.warning("Transient error connecting to the collector")
    logging.getLogger("switchyard.probe").warning("still here")
    lines = out.getvalue().splitlines()
    assert sum("Transient error" in line for line in lines) == 1
    assert any("still here" in line for line in lines)
