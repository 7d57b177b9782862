"""A Prometheus of its own for a process stack: Debian's server on a free loopback port,
scraping every replica of the stack through a file of targets, with the chart's alerting
rules loaded. The dashboard test and the dashboard snapshot use it.

Every replica's health port (where ``/metrics`` is served) is found through its presence
record, as the compose file's and the chart's scrape configurations find them by DNS,
and labelled with its service and replica.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from pathlib import Path
from types import TracebackType

import httpx
import yaml
from switchyard.runtime.presence import read_replicas
from switchyard.state import StateStore

from loadgen.harness.process_stack import StackError, free_port

__all__ = ["ALERTS", "DASHBOARD", "LocalPrometheus"]

CHART_FILES = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "switchyard" / "files"
DASHBOARD = CHART_FILES / "dashboard.json"
ALERTS = CHART_FILES / "alerts.yml"


class LocalPrometheus:
    """Prometheus scraping every second, its data and log under ``folder``; a context
    manager that stops it (SIGTERM, then SIGKILL).

    Raises:
        StackError: no ``prometheus`` on the PATH (``make deps`` installs Debian's).
    """

    def __init__(self, folder: Path, *, rules: Path = ALERTS) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            raise StackError("prometheus is missing: make deps installs Debian's package")
        folder.mkdir(parents=True, exist_ok=True)
        self.targets = folder / "targets.json"
        self.targets.write_text("[]")
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [
                {
                    "job_name": "switchyard",
                    "file_sd_configs": [{"files": [str(self.targets)], "refresh_interval": "1s"}],
                }
            ],
        }
        config_path = folder / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(config))
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self._log = (folder / "prometheus.log").open("wb")
        self._process = subprocess.Popen(
            [
                binary,
                f"--config.file={config_path}",
                f"--storage.tsdb.path={folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    async def scrape_replicas(self, state: StateStore, services: int, timeout_s: float = 30) -> int:
        """Write every live replica's health port as a target once ``services`` replicas
        are present (or ``timeout_s`` passed); returns how many were written."""
        deadline_s = time.monotonic() + timeout_s
        while True:
            replicas = await read_replicas(state, time.time())
            if len(replicas) >= services or time.monotonic() > deadline_s:
                break
            await asyncio.sleep(0.5)
        groups = [
            {
                "targets": [replica.health_url.removeprefix("http://")],
                "labels": {"service": replica.name, "replica": replica.instance},
            }
            for replica in replicas
        ]
        await asyncio.to_thread(self.targets.write_text, json.dumps(groups))
        return len(groups)

    async def wait_scraping(self, replicas: int, timeout_s: float = 60.0) -> None:
        """Return once ``replicas`` targets are up (scraped successfully).

        Raises:
            StackError: fewer after ``timeout_s``, naming what is up.
        """
        deadline_s = time.monotonic() + timeout_s
        async with httpx.AsyncClient(base_url=self.url, timeout=10.0) as http:
            while True:
                answer = await http.get(
                    "/api/v1/query", params={"query": 'up{job="switchyard"} == 1'}
                )
                up = answer.json()["data"]["result"] if answer.status_code == 200 else []
                if len(up) >= replicas:
                    return
                if time.monotonic() > deadline_s:
                    raise StackError(f"Prometheus scrapes {len(up)} of {replicas} replicas: {up}")
                await asyncio.sleep(0.5)

    def stop(self) -> None:
        self._process.terminate()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._log.close()

    def __enter__(self) -> LocalPrometheus:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()
