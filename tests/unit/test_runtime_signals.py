"""A real service process: SIGTERM drains it, bad configuration stops it with exit code 2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def _spawn(tmp_path: Path, **env: str) -> tuple[subprocess.Popen[str], Path]:
    log = tmp_path / "work.log"
    full_env = {
        **os.environ,
        "SWITCHYARD_BUS": "memory",
        "SWITCHYARD_STATE": "memory",
        "SWITCHYARD_HEALTH_PORT": "0",
        "WORK_LOG": str(log),
        **env,
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.support.work_service"],
        cwd=ROOT,
        env=full_env,
        stderr=subprocess.PIPE,
        text=True,
    )
    return process, log


def _health_port(process: subprocess.Popen[str]) -> int:
    assert process.stderr is not None
    for line in process.stderr:
        entry = json.loads(line)
        if entry.get("event") == "started":
            return int(entry["health_port"])
    raise AssertionError(f"service exited ({process.wait()}) without logging 'started'")


def _readyz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _wait_for_line(log: Path, line: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if log.exists() and line in log.read_text().splitlines():
            return
        time.sleep(0.02)
    raise AssertionError(f"{line!r} never appeared in {log}")


def test_sigterm_finishes_the_item_in_hand_and_exits_0(tmp_path: Path) -> None:
    process, log = _spawn(tmp_path, WORK_ITEM_S="1.0")
    try:
        port = _health_port(process)
        assert _readyz(port) == 200
        _wait_for_line(log, "started 2")
        process.send_signal(signal.SIGTERM)
        # Readiness turns off at once, while the item in hand is still being finished.
        deadline = time.monotonic() + 5
        while _readyz(port) != 503 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _readyz(port) == 503
        assert process.wait(timeout=30) == 0
    finally:
        process.kill()
        process.wait()
        assert process.stderr is not None
        process.stderr.close()
    lines = log.read_text().splitlines()
    assert lines[-2:] == ["started 2", "finished 2"], (
        "the in-flight item finished, no new one began"
    )


def test_a_drain_longer_than_the_timeout_exits_1_naming_the_routine(tmp_path: Path) -> None:
    process, log = _spawn(tmp_path, WORK_ITEM_S="60", SWITCHYARD_DRAIN_TIMEOUT_S="0.5")
    try:
        _health_port(process)
        _wait_for_line(log, "started 1")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 1
        assert process.stderr is not None
        rest = process.stderr.read()
    finally:
        process.kill()
        process.wait()
        assert process.stderr is not None
        process.stderr.close()
    timeout_lines = [json.loads(x) for x in rest.splitlines() if "drain-timeout" in x]
    assert timeout_lines
    assert timeout_lines[0]["routines"] == ["work_routine"]


def test_bad_configuration_exits_2_naming_the_variable(tmp_path: Path) -> None:
    process, _ = _spawn(tmp_path, SWITCHYARD_HEALTH_PORT="http", SWITCHYARD_BUS="rabbitmq")
    assert process.wait(timeout=30) == 2
    assert process.stderr is not None
    err = process.stderr.read()
    process.stderr.close()
    assert "SWITCHYARD_HEALTH_PORT='http'" in err
    assert "SWITCHYARD_BUS='rabbitmq'" in err
    assert "Traceback" not in err
