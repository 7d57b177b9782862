"""The dashboard and the alerting rules against a real Prometheus scraping a real stack.

Every service runs as its own process on Kafka and Redis; Prometheus (Debian's, started
here) scrapes each replica's ``/metrics``, found through the replicas' presence records,
as the compose file's and the chart's scrape configurations find them by DNS. After a
short replay, every query of every panel of ``deploy/helm/switchyard/files/dashboard.json``
must return data, and every rule of ``alerts.yml`` must load and evaluate without error.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from switchyard.runtime.presence import read_replicas

from loadgen.harness.process_stack import ProcessStack, StackFactory, free_port
from tests.support.dashboard import ALERTS, alert_names, panel_queries

RATE_INTERVAL = "1m"
"""What Grafana's ``$__rate_interval`` stands for in the queries sent here (scrapes
every second, so a minute holds plenty of samples)."""


def test_the_rules_file_is_valid_for_promtool() -> None:
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool is missing: make deps installs Debian's prometheus"
    checked = subprocess.run(
        [promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A Prometheus on a free port, reading its scrape targets from ``targets.json``
    (rewritten by the test) and the rules file; its base URL and that file."""
    binary = shutil.which("prometheus")
    assert binary is not None, "prometheus is missing: make deps installs Debian's package"
    targets = tmp_path / "targets.json"
    targets.write_text("[]")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(ALERTS)],
        "scrape_configs": [
            {
                "job_name": "switchyard",
                "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "1s"}],
            }
        ],
    }
    config_path = tmp_path / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config))
    port = free_port()
    log = (tmp_path / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config_path}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield f"http://127.0.0.1:{port}", targets
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


async def _query(http: httpx.AsyncClient, base: str, expr: str) -> list[Any]:
    answer = await http.get(f"{base}/api/v1/query", params={"query": expr})
    body = answer.json()
    assert answer.status_code == 200, (expr, body)
    assert body["status"] == "success", (expr, body)
    result: list[Any] = body["data"]["result"]
    return result


async def _start(stack: ProcessStack) -> None:
    for service in ("monitor", "predictor", "scheduler", "rebalancer"):
        stack.start_service(service)
    for worker in ("worker-a", "worker-b"):
        stack.start_worker(worker)
    stack.start_service("ingress")
    await stack.wait_ready(workers=2)


async def _write_targets(stack: ProcessStack, targets: Path, services: int) -> None:
    """Every replica's health port as a scrape target, labelled with its service."""
    deadline_s = time.monotonic() + 30
    while True:
        replicas = await read_replicas(stack.state, time.time())
        if len(replicas) >= services or time.monotonic() > deadline_s:
            break
        await asyncio.sleep(0.5)
    assert len(replicas) >= services, replicas
    groups = [
        {
            "targets": [replica.health_url.removeprefix("http://")],
            "labels": {"service": replica.name, "replica": replica.instance},
        }
        for replica in replicas
    ]
    await asyncio.to_thread(targets.write_text, json.dumps(groups))


async def test_every_panel_shows_data_and_every_rule_evaluates(
    process_stack: StackFactory, prometheus: tuple[str, Path]
) -> None:
    base, targets = prometheus
    # GAPS, as the compose file runs it: its requests carry predictions, so the
    # predictor's error is measured.
    stack = process_stack(llm_policy="gaps")
    await _start(stack)
    await _write_targets(stack, targets, services=7)
    async with httpx.AsyncClient(timeout=30.0) as http:
        # Every replica scraped before the calls, so rates see them start.
        deadline_s = time.monotonic() + 60
        while len(await _query(http, base, 'up{job="switchyard"} == 1')) < 7:
            assert time.monotonic() < deadline_s, await _query(http, base, "up")
            await asyncio.sleep(0.5)
        # Calls for a while: a few every tenth of a second, one with a deadline it misses.
        async with httpx.AsyncClient(base_url=stack.url, timeout=60.0) as client:
            for round_number in range(60):
                calls = [
                    client.post(
                        "/v1/completions",
                        json={"model": "llama-2-7b", "prompt": "watch me", "max_tokens": 8},
                    )
                    for _ in range(3)
                ]
                answers = await asyncio.gather(*calls)
                assert all(a.status_code == 200 for a in answers), answers[0].text
                if round_number == 0:
                    await client.post(
                        "/v1/completions",
                        json={
                            "model": "llama-2-7b",
                            "prompt": "too late",
                            "max_tokens": 64,
                            "switchyard": {"deadline_ms": 1},
                        },
                    )
                await asyncio.sleep(0.1)
        await asyncio.sleep(3)  # the last answers scraped
        queries = await asyncio.to_thread(panel_queries, RATE_INTERVAL)
        empty = [(title, expr) for title, expr in queries if not await _query(http, base, expr)]
        assert empty == [], empty
        rules = (await http.get(f"{base}/api/v1/rules")).json()["data"]["groups"]
        loaded = {rule["name"]: rule for group in rules for rule in group["rules"]}
        assert set(loaded) == await asyncio.to_thread(alert_names)
        assert all(rule["health"] == "ok" for rule in loaded.values()), loaded
    print(f"\ndashboard: {len(queries)} queries returned data; rules: {sorted(loaded)}")
