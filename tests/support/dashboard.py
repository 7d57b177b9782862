"""The dashboard's queries, as Prometheus is asked them by the dashboard tests."""

from __future__ import annotations

import json
from typing import Any

import yaml

from loadgen.harness.prometheus import ALERTS, DASHBOARD

__all__ = ["ALERTS", "DASHBOARD", "alert_names", "panel_queries"]


def panel_queries(rate_interval: str) -> list[tuple[str, str]]:
    """Every (panel title, PromQL) of the dashboard, Grafana's ``$__rate_interval``
    written as ``rate_interval``."""
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return [
        (panel["title"], target["expr"].replace("$__rate_interval", rate_interval))
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
    ]


def alert_names() -> set[str]:
    """The name of every alerting rule ``alerts.yml`` declares."""
    declared: dict[str, Any] = yaml.safe_load(ALERTS.read_text())
    return {rule["alert"] for group in declared["groups"] for rule in group["rules"]}
