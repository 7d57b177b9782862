"""The dashboard and the alerting rules against a real Prometheus scraping a real stack.

Every service runs as its own process on Kafka and Redis; Prometheus (Debian's, started
here) scrapes each replica's ``/metrics``, found through the replicas' presence records,
as the compose file's and the chart's scrape configurations find them by DNS. After a
short replay, every query of every panel of ``deploy/helm/switchyard/files/dashboard.json``
must return data, and every rule of ``alerts.yml`` must load and evaluate without error.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.dashboard_snapshot import draw
from loadgen.harness.process_stack import ProcessStack, StackFactory
from loadgen.harness.prometheus import LocalPrometheus
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
def prometheus(tmp_path: Path) -> Iterator[LocalPrometheus]:
    """A Prometheus on a free port with the chart's rules, scraping what it is told."""
    with LocalPrometheus(tmp_path / "prometheus") as server:
        yield server


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


async def test_every_panel_shows_data_and_every_rule_evaluates(
    process_stack: StackFactory, prometheus: LocalPrometheus, tmp_path: Path
) -> None:
    base = prometheus.url
    # GAPS, as the compose file runs it: its requests carry predictions, so the
    # predictor's error is measured.
    stack = process_stack(llm_policy="gaps")
    await _start(stack)
    assert await prometheus.scrape_replicas(stack.state, services=7) >= 7
    started_s = time.time()
    async with httpx.AsyncClient(timeout=30.0) as http:
        # Every replica scraped before the calls, so rates see them start.
        await prometheus.wait_scraping(7)
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
    # The picture of the dashboard draws every panel from the same Prometheus.
    picture = tmp_path / "dashboard.png"
    panels = await asyncio.to_thread(
        draw, prometheus.url, started_s, time.time(), picture, note="the dashboard test"
    )
    assert [p.title for p in panels] == list(dict.fromkeys(title for title, _ in queries))
    assert all(p.series for p in panels), [p.title for p in panels if not p.series]
    assert picture.stat().st_size > 50_000
    print(f"\ndashboard: {len(queries)} queries returned data; rules: {sorted(loaded)}")
