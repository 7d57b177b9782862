"""`switchyard demo` writes the services' logs to a file it names; the terminal keeps the
progress and the reports. Per-call HTTP lines are not logged at INFO anywhere."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from switchyard.config import Settings, load_settings
from switchyard.telemetry import configure_logging

from cli import stack_demo as demo

_TOUCHED_LOGGERS = ("httpx", "httpcore", "uvicorn.access", "aiokafka", "kafka")


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """The demo reconfigures process-wide logging: put it back and close its file."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    levels = {name: logging.getLogger(name).level for name in _TOUCHED_LOGGERS}
    yield
    for handler in root.handlers:
        if handler not in handlers:
            handler.close()
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, saved in levels.items():
        logging.getLogger(name).setLevel(saved)


def _settings(tmp_path: Path, **env: str) -> Settings:
    # A registry file that does not exist: the embedded stack fails at once when it
    # loads it, after configuring its logs, so the demo's wiring runs without a replay.
    return load_settings(
        {
            "SWITCHYARD_REGISTRY": str(tmp_path / "missing-registry.yaml"),
            "SWITCHYARD_CACHE_DIR": str(tmp_path / "cache"),
            **env,
        }
    )


def _records(path: Path) -> list[dict[str, object]]:
    for handler in logging.getLogger().handlers:
        handler.flush()
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_demo_logs_to_its_file_and_the_terminal_names_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log_file = tmp_path / "logs" / "demo.log"

    code = demo.run(_settings(tmp_path), ["jsq"], 5, 10.0, log_file=log_file)
    # What the services log from now on (the stack's own set-up has run).
    logging.getLogger("switchyard.ingress").info("ingress listening", extra={"port": 1})
    logging.getLogger("switchyard.scheduler").debug("below the configured level")
    logging.getLogger("httpx").info('HTTP Request: POST http://127.0.0.1/ "HTTP/1.1 200 OK"')

    terminal = capsys.readouterr()
    assert code == 1
    assert terminal.out.splitlines()[0] == f"service logs: {log_file}"
    # The failure reaches the terminal, naming the file to read more in.
    (error,) = terminal.err.splitlines()
    assert "missing-registry.yaml" in error
    assert error.endswith(f"(service logs: {log_file})")
    assert "ingress listening" not in terminal.out + terminal.err

    records = _records(log_file)
    assert [(r["logger"], r["msg"], r["service"]) for r in records] == [
        ("switchyard.ingress", "ingress listening", "embedded")
    ]


def test_the_default_log_file_is_in_the_cache_dir_and_stamped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = demo.run(_settings(tmp_path), ["jsq"], 5, 10.0)

    first = capsys.readouterr().out.splitlines()[0]
    assert code == 1
    path = Path(first.removeprefix("service logs: "))
    assert path.parent == tmp_path / "cache" / "demo"
    assert re.fullmatch(r"demo-\d{8}T\d{6}Z\.log", path.name)
    assert path.is_file()


def test_a_log_file_that_cannot_be_created_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a-file").write_text("")

    code = demo.run(_settings(tmp_path), ["jsq"], 5, 10.0, log_file=tmp_path / "a-file" / "x.log")

    terminal = capsys.readouterr()
    assert code == 2
    assert terminal.out == ""
    (error,) = terminal.err.splitlines()
    assert error.startswith("switchyard demo: cannot write the service logs:")
    assert "a-file" in error


def test_switchyard_demo_takes_log_file_and_keeps_json_off_the_terminal(tmp_path: Path) -> None:
    log_file = tmp_path / "demo.log"
    done = subprocess.run(
        [sys.executable, "-m", "cli", "demo", "--limit", "5", "--log-file", str(log_file)],
        env={
            **os.environ,
            "SWITCHYARD_REGISTRY": str(tmp_path / "missing-registry.yaml"),
            "SWITCHYARD_CACHE_DIR": str(tmp_path / "cache"),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert done.stdout.splitlines()[0] == f"service logs: {log_file}"
    assert f"(service logs: {log_file})" in done.stderr
    assert not [line for line in done.stderr.splitlines() if line.startswith("{")]
    assert log_file.is_file()
    assert not (tmp_path / "cache" / "demo").exists()


# -- configure_logging: files, and no line per HTTP call at INFO -----------------------


def test_per_call_http_lines_show_only_at_debug() -> None:
    line = 'HTTP Request: POST http://127.0.0.1:8080/v1/completions "HTTP/1.1 200 OK"'
    at_info, at_debug = io.StringIO(), io.StringIO()

    configure_logging("ingress", load_settings({}), stream=at_info)
    logging.getLogger("httpx").info(line)
    logging.getLogger("uvicorn.access").info("127.0.0.1 - POST /v1/completions 200")
    configure_logging("ingress", load_settings({"SWITCHYARD_LOG_LEVEL": "debug"}), stream=at_debug)
    logging.getLogger("httpx").info(line)

    assert at_info.getvalue() == ""
    assert [json.loads(entry)["msg"] for entry in at_debug.getvalue().splitlines()] == [line]


def test_keep_file_keeps_a_chosen_file_but_not_a_stream(tmp_path: Path) -> None:
    chosen = tmp_path / "chosen.log"
    configure_logging("embedded", load_settings({}), path=chosen)
    configure_logging("embedded", load_settings({"SWITCHYARD_LOG_FORMAT": "text"}), keep_file=True)
    logging.getLogger("switchyard.test").warning("kept")
    (line,) = chosen.read_text().splitlines()
    assert line.startswith("[embedded] ")
    assert line.endswith("switchyard.test: kept")

    stream, replaced_by = io.StringIO(), io.StringIO()
    configure_logging("embedded", load_settings({}), stream=stream)
    # keep_file with no file to keep: the default destination replaces the stream.
    configure_logging("embedded", load_settings({}), keep_file=True)
    ours = [h for h in logging.getLogger().handlers if h.get_name() == "switchyard"]
    assert len(ours) == 1
    assert isinstance(ours[0], logging.StreamHandler)
    assert ours[0].stream is sys.stderr
    configure_logging("embedded", load_settings({}), stream=replaced_by)
    logging.getLogger("switchyard.test").warning("to the stream")
    assert stream.getvalue() == ""
    assert "to the stream" in replaced_by.getvalue()
