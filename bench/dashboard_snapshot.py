"""A picture of the dashboard on a live stack: ``docs/img/dashboard.png``.

Starts the stack as processes on the local Kafka and Redis (``deploy/local/infra.sh
up``; ``make dashboard-snapshot`` brings them up): monitor, predictor, scheduler (GAPS,
as the compose file runs it), rebalancer, an emulated ``llama-2-7b`` and an emulated
``llama-2-13b`` worker at time scale ``--time-scale`` (a performance model, not a
measurement of GPUs), and the ingress; a Prometheus of its own
(:class:`~loadgen.harness.prometheus.LocalPrometheus`, Debian's server) scrapes every
replica each second. ``python -m loadgen replay`` then replays the bundled Azure mixed
sample (conversation calls to ``llama-2-7b``, code calls to ``llama-2-13b``) at
``--speedup``, and every panel of the provisioned dashboard is drawn from Prometheus
over the replay (:mod:`bench.dashboard_render`). With ``--prometheus URL`` it starts
nothing and draws the last ``--minutes`` of that Prometheus (the compose file's, say).

Run ``python -m bench.dashboard_snapshot [--out docs/img/dashboard.png]``. The picture is
a rendering of the dashboard's queries on real scraped data; Grafana itself is not run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from switchyard.config import load_settings

from bench.dashboard_render import PanelData, query_panels, render
from loadgen.harness.process_stack import ProcessStack
from loadgen.harness.prometheus import DASHBOARD, LocalPrometheus

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "docs" / "img" / "dashboard.png"
SERVICES = 7
"""Replicas scraped: monitor, predictor, scheduler, rebalancer, two workers, ingress."""


def draw(base_url: str, start_s: float, end_s: float, out: Path, *, note: str) -> list[PanelData]:
    """Every panel of the dashboard over ``[start_s, end_s]`` from ``base_url``, drawn
    into ``out``; the panels, for the caller's checks."""
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    step_s = max(1.0, (end_s - start_s) / 300)
    panels = query_panels(base_url, dashboard, start_s=start_s, end_s=end_s, step_s=step_s)
    out.parent.mkdir(parents=True, exist_ok=True)
    render(panels, out, span_s=end_s - start_s, title=dashboard["title"], note=note)
    return panels


async def _live(
    args: argparse.Namespace, folder: Path, prometheus: LocalPrometheus
) -> tuple[float, float, str]:
    """Run the stack and the replay, scraped by ``prometheus``: the range to draw and
    the picture's note."""
    settings = load_settings({})
    stack = ProcessStack(
        settings.kafka_bootstrap,
        settings.redis_url,
        f"dash-{uuid.uuid4().hex[:8]}",
        folder / "logs",
        time_scale=args.time_scale,
        llm_policy="gaps",
    )
    try:
        for service in ("monitor", "predictor", "scheduler", "rebalancer"):
            stack.start_service(service)
        stack.start_worker("worker-7b", profile="a100-80gb/llama-2-7b")
        stack.start_worker("worker-13b", profile="a100-80gb/llama-2-13b")
        stack.start_service("ingress")
        await stack.wait_ready(workers=2)
        await prometheus.scrape_replicas(stack.state, SERVICES)
        await prometheus.wait_scraping(SERVICES)
        await asyncio.sleep(10)  # a flat start before the load
        start_s = time.time() - 15
        replay = [
            sys.executable, "-m", "loadgen", "replay", "--trace", "azure-mix-sample",
            "--target", stack.url, "--speedup", str(args.speedup), "--limit", str(args.limit),
            "--no-progress",
        ]  # fmt: skip
        done = await asyncio.to_thread(
            subprocess.run, replay, cwd=ROOT, capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise SystemExit(f"dashboard_snapshot: the replay failed:\n{done.stderr[-2000:]}")
        print(done.stdout)
        await asyncio.sleep(15)  # the last answers scraped, and the rates' fall
        end_s = time.time()  # before the stack stops: its targets are still up
    finally:
        await stack.close()
    note = (
        f"Switchyard's dashboard ({DASHBOARD.name}) drawn from Prometheus by "
        f"bench.dashboard_snapshot, not Grafana: {args.limit} calls of the Azure mixed "
        f"sample at x{args.speedup:g} through the stack as processes on Kafka and Redis, "
        f"emulated LLM workers (a performance model) at time scale {args.time_scale:g}."
    )
    return start_s, end_s, note


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--prometheus", help="draw from this Prometheus; start nothing")
    parser.add_argument("--minutes", type=float, default=10.0, help="with --prometheus")
    parser.add_argument("--limit", type=int, default=1500, help="trace rows replayed")
    parser.add_argument("--speedup", type=float, default=6.0)
    parser.add_argument("--time-scale", type=float, default=20.0)
    args = parser.parse_args(argv)
    if args.prometheus:
        end_s = time.time()
        panels = draw(
            args.prometheus,
            end_s - 60 * args.minutes,
            end_s,
            args.out,
            note=f"drawn from {args.prometheus} by bench.dashboard_snapshot, not Grafana",
        )
    else:
        if shutil.which("prometheus") is None:
            raise SystemExit("dashboard_snapshot: no prometheus (make deps installs Debian's)")
        with (
            tempfile.TemporaryDirectory(prefix="switchyard-dashboard-") as folder,
            LocalPrometheus(Path(folder) / "prometheus") as prometheus,
        ):
            start_s, end_s, note = asyncio.run(_live(args, Path(folder), prometheus))
            panels = draw(prometheus.url, start_s, end_s, args.out, note=note)
    empty = [p.title for p in panels if not p.series]
    print(f"{args.out}: {len(panels)} panels, {len(panels) - len(empty)} with data")
    if empty:
        print("no data: " + "; ".join(empty))


if __name__ == "__main__":
    main()
