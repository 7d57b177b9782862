"""A Kafka broker and a Redis server of one harness's own, to kill and restart.

The fault matrix (:mod:`loadgen.harness.faults`) kills and restarts the broker and the
state store under a running stack; it must never do that to the servers other tests
and stacks share. :class:`PrivateInfra` starts both with the project's own scripts
(``deploy/local/kafka.sh`` and ``redis.sh``, the same Kafka version and Redis settings
as ``make test``) on free ports, with run directories of their own, and stops them and
removes their data at the end. Redis runs with the scripts' default persistence (the
append-only file, fsynced every second).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from loadgen.harness.process_stack import REPO_ROOT, StackError, free_port

_SCRIPTS = REPO_ROOT / "deploy" / "local"


def _cache_dir() -> Path:
    # The scripts' own default (deploy/local/lib.sh), so the broker's jars are reused.
    configured = os.environ.get("SWITCHYARD_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "switchyard"


@dataclass
class PrivateInfra:
    """A broker and a Redis on ports of their own (chosen free at construction)."""

    kafka_port: int = 0
    redis_port: int = 0

    def __post_init__(self) -> None:
        self.kafka_port = self.kafka_port or free_port()
        self.controller_port = free_port()
        self.redis_port = self.redis_port or free_port()

    @property
    def kafka_bootstrap(self) -> str:
        return f"127.0.0.1:{self.kafka_port}"

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    def _run_dir(self, server: str) -> Path:
        port = self.kafka_port if server == "kafka" else self.redis_port
        return _cache_dir() / "run" / f"{server}-{port}"

    def _script(self, server: str, action: str) -> None:
        env = {
            **os.environ,
            "SWITCHYARD_KAFKA_BOOTSTRAP": self.kafka_bootstrap,
            "KAFKA_CONTROLLER_PORT": str(self.controller_port),
            "SWITCHYARD_REDIS_URL": self.redis_url,
        }
        env.pop("SWITCHYARD_INFRA_RECORD", None)
        done = subprocess.run(
            ["bash", str(_SCRIPTS / f"{server}.sh"), action],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        if done.returncode != 0:
            raise StackError(
                f"{server}.sh {action} failed ({done.returncode}):\n{done.stderr[-3000:]}"
            )

    # -- the whole pair ------------------------------------------------------------------

    def start(self) -> None:
        """Both servers, fresh: any data a previous run left on these ports is removed."""
        for server in ("kafka", "redis"):
            shutil.rmtree(self._run_dir(server), ignore_errors=True)
        self.start_kafka()
        self.start_redis()

    def stop(self) -> None:
        """Stop both (best effort) and remove their data."""
        for server in ("redis", "kafka"):
            try:
                self._script(server, "down")
            except (StackError, subprocess.TimeoutExpired):
                self._kill(server)
            shutil.rmtree(self._run_dir(server), ignore_errors=True)

    # -- one server ----------------------------------------------------------------------

    def start_kafka(self) -> float:
        """Start (or restart, on its data) the broker; returns when it answers, the
        seconds it took."""
        began = time.monotonic()
        self._script("kafka", "up")
        return time.monotonic() - began

    def stop_kafka(self) -> None:
        """A graceful stop: SIGTERM, the broker closes its logs and leaves."""
        self._script("kafka", "down")

    def kill_kafka(self) -> float:
        """SIGKILL the broker; the wall time of the kill."""
        return self._kill("kafka")

    def start_redis(self) -> float:
        began = time.monotonic()
        self._script("redis", "up")
        return time.monotonic() - began

    def kill_redis(self) -> float:
        """SIGKILL Redis: what its append-only file had fsynced survives."""
        return self._kill("redis")

    def wipe_redis(self) -> None:
        """Remove Redis's append-only file (with Redis stopped): it comes back empty, as
        one run without persistence does."""
        shutil.rmtree(self._run_dir("redis") / "appendonlydir", ignore_errors=True)

    def _kill(self, server: str) -> float:
        pidfile = self._run_dir(server) / f"{server}.pid"
        try:
            pid = int(pidfile.read_text().strip())
        except (OSError, ValueError) as exc:
            raise StackError(f"no {server} process to kill ({pidfile}: {exc})") from exc
        os.kill(pid, signal.SIGKILL)
        killed_at_s = time.time()
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
            time.sleep(0.05)
        return killed_at_s
