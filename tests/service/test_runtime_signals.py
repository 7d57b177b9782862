"""A real service process (tests/service/runtime_demo_service.py, built by the default
builder on the in-memory bus and state): SIGTERM drains it, a drain that overruns its
timeout exits 1, a second signal forces the stop, bad configuration exits 2.

Waits are generous and nothing asserts on durations: these run on loaded CI machines.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 30.0


class DemoProcess:
    """The demo service in a subprocess; a thread collects its stderr (JSON log lines)."""

    def __init__(self, tmp_path: Path, *, gated: bool = False, **env: str) -> None:
        self.work_log = tmp_path / "work.log"
        self.gate = tmp_path / "gate"
        if gated:
            env["DEMO_DRAIN_GATE"] = str(self.gate)
        base = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("SWITCHYARD_", "OTEL_", "DEMO_"))
        }
        pythonpath = os.pathsep.join(
            p for p in (str(ROOT / "shared"), str(ROOT), os.environ.get("PYTHONPATH")) if p
        )
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.service.runtime_demo_service"],
            cwd=ROOT,
            env={
                **base,
                "PYTHONPATH": pythonpath,
                "SWITCHYARD_BUS": "memory",
                "SWITCHYARD_STATE": "memory",
                "SWITCHYARD_HEALTH_PORT": "0",
                "SWITCHYARD_LOG_FORMAT": "json",
                "DEMO_WORK_LOG": str(self.work_log),
                **env,
            },
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.stderr_lines: list[str] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._reader.start()

    def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            with self._lock:
                self.stderr_lines.append(line.rstrip("\n"))

    def events(self) -> list[dict[str, Any]]:
        """The JSON log lines so far."""
        with self._lock:
            lines = list(self.stderr_lines)
        entries = []
        for line in lines:
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return entries

    def wait_for_event(self, event: str) -> dict[str, Any]:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            for entry in self.events():
                if entry.get("event") == event:
                    return entry
            if self.process.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.02)
        raise AssertionError(f"no {event!r} log line; stderr: {self.stderr()}")

    def wait_for_work_line(self, prefix: str) -> None:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            if any(line.startswith(prefix) for line in self.work_lines()):
                return
            time.sleep(0.02)
        raise AssertionError(f"no {prefix!r} in {self.work_lines()}; stderr: {self.stderr()}")

    def work_lines(self) -> list[str]:
        return self.work_log.read_text().splitlines() if self.work_log.exists() else []

    def stderr(self) -> str:
        with self._lock:
            return "\n".join(self.stderr_lines)

    def wait(self) -> int:
        code = self.process.wait(timeout=WAIT_S)
        self._reader.join(timeout=WAIT_S)
        return code

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self._reader.join(timeout=WAIT_S)
        assert self.process.stderr is not None
        self.process.stderr.close()


Spawn = Callable[..., DemoProcess]


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Spawn]:
    """Starts demo processes; kills what is left of them after the test."""
    started: list[DemoProcess] = []

    def _spawn(*, gated: bool = False, **env: str) -> DemoProcess:
        demo = DemoProcess(tmp_path, gated=gated, **env)
        started.append(demo)
        return demo

    yield _spawn
    for demo in started:
        demo.close()


def _get_status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_sigterm_finishes_the_item_in_hand_starts_no_other_and_exits_0(spawn: Spawn) -> None:
    demo = spawn(gated=True, DEMO_ITEM_S="0.5")
    port = int(demo.wait_for_event("started")["health_port"])
    assert _get_status(port, "/healthz") == 200
    assert _get_status(port, "/readyz") == 200
    demo.wait_for_work_line("started 1")

    demo.process.send_signal(signal.SIGTERM)
    demo.wait_for_event("draining")
    # The item in hand cannot finish before the gate opens: the drain is under way now.
    assert _get_status(port, "/readyz") == 503
    assert _get_status(port, "/healthz") == 200
    assert demo.process.poll() is None, "the drain waits for the item in hand"
    demo.gate.touch()
    assert demo.wait() == 0

    lines = demo.work_lines()
    drain_at = lines.index("drain")
    after = lines[drain_at + 1 :]
    assert not [line for line in after if line.startswith("started")], (
        f"no new item after the stop: {lines}"
    )
    in_hand = [line for line in lines[:drain_at] if line.startswith("started")][-1]
    assert in_hand.replace("started", "finished") in after, f"the item in hand finished: {lines}"


def test_a_drain_longer_than_the_timeout_exits_1_naming_the_routine(spawn: Spawn) -> None:
    demo = spawn(DEMO_ITEM_S="60", SWITCHYARD_DRAIN_TIMEOUT_S="0.5")
    demo.wait_for_event("started")
    demo.wait_for_work_line("started 1")
    demo.process.send_signal(signal.SIGTERM)
    assert demo.wait() == 1
    timeout_line = demo.wait_for_event("drain-timeout")
    assert timeout_line["routines"] == ["work_routine"]
    assert "work_routine" in timeout_line["msg"]
    assert "Traceback" not in demo.stderr()


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_second_signal_during_the_drain_forces_the_stop(
    spawn: Spawn, signum: signal.Signals, code: int
) -> None:
    demo = spawn(DEMO_ITEM_S="60", SWITCHYARD_DRAIN_TIMEOUT_S="60")
    demo.wait_for_event("started")
    demo.wait_for_work_line("started 1")
    demo.process.send_signal(signum)
    demo.wait_for_event("draining")
    demo.process.send_signal(signum)
    assert demo.wait() == code
    assert demo.wait_for_event("forced")["routines"] == ["work_routine"]
    assert "Traceback" not in demo.stderr()


def test_bad_configuration_exits_2_naming_each_variable(spawn: Spawn) -> None:
    demo = spawn(SWITCHYARD_HEALTH_PORT="http", SWITCHYARD_BUS="rabbitmq")
    assert demo.wait() == 2
    err = demo.stderr()
    assert err.startswith("switchyard demo: invalid configuration")
    assert "SWITCHYARD_HEALTH_PORT='http'" in err
    assert "SWITCHYARD_BUS='rabbitmq'" in err
    assert "Traceback" not in err
