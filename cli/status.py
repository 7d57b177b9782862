"""``switchyard status``: the live stack at a glance, refreshed like ``top``.

Two ways to reach a stack, one document (:mod:`switchyard.runtime.status`):

- ``--url http://host:port``: any service's health port serves ``GET /status`` (an
  embedded stack's, a container's, a pod's through ``kubectl port-forward``);
- no ``--url``: read the state store the ``SWITCHYARD_*`` settings name (Redis), as the
  services do. An in-memory store lives inside its stack's process: use ``--url``.

``--once`` prints one screen and exits, ``--json`` prints the document (one per line
while refreshing); rates need two documents, so the first screen shows none.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from switchyard.config import Settings
from switchyard.errors import SwitchyardError
from switchyard.runtime import loop as event_loop

from cli.exit_codes import EXIT_CONFIG, EXIT_UNAVAILABLE

Fetch = Callable[[], Awaitable[dict[str, Any]]]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        default=None,
        help="a service's health URL (http://host:port) to read /status from; default: "
        "the configured state store",
    )
    parser.add_argument(
        "--interval-s", type=float, default=2.0, help="seconds between refreshes (default 2)"
    )
    parser.add_argument("--once", action="store_true", help="print once and exit")
    parser.add_argument("--json", action="store_true", help="print the JSON document")


def run(settings: Settings, args: argparse.Namespace) -> int:
    if args.interval_s <= 0:
        print("switchyard status: --interval-s must be positive", file=sys.stderr)
        return EXIT_CONFIG
    if args.url is None and settings.state == "memory":
        print(
            "switchyard status: the configured state store is in memory (SWITCHYARD_STATE="
            "memory), inside its stack's process: pass --url with one of its services' "
            "health URLs, or set SWITCHYARD_STATE=redis and SWITCHYARD_REDIS_URL",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    return event_loop.run(_watch(settings, args))


async def _watch(settings: Settings, args: argparse.Namespace) -> int:
    import httpx
    from rich.console import Console
    from rich.live import Live

    failures = (SwitchyardError, httpx.HTTPError, OSError, ValueError)
    # A pipe or a file gets lines wide enough for every column (a terminal its width).
    console = Console(width=None if sys.stdout.isatty() else 160)
    where = _where(settings, args.url)
    async with _source(settings, args.url) as fetch:
        try:
            document = await fetch()
            if args.once and not args.json:
                # Rates need a second document: a screen waits a moment for one.
                await asyncio.sleep(min(args.interval_s, 1.0))
                document = await fetch()
        except failures as exc:
            print(f"switchyard status: {where}: {exc}", file=sys.stderr)
            return EXIT_UNAVAILABLE
        if args.once:
            if args.json:
                print(json.dumps(document), flush=True)
            else:
                console.print(render(document, where))
            return 0
        live = None if args.json else Live(console=console, auto_refresh=False, screen=False)
        if live is not None:
            live.start()
        try:
            while True:
                if live is None:
                    print(json.dumps(document), flush=True)
                else:
                    live.update(render(document, where), refresh=True)
                await asyncio.sleep(args.interval_s)
                try:
                    document = await fetch()
                except failures as exc:  # shown on the screen; the next refresh tries again
                    document = {**document, "error": f"{where}: {exc}"}
        finally:
            if live is not None:
                live.stop()


def _where(settings: Settings, url: str | None) -> str:
    if url is not None:
        return url
    from switchyard.runtime.connections import redact_url

    return redact_url(settings.redis_url)


@contextlib.asynccontextmanager
async def _source(settings: Settings, url: str | None) -> AsyncIterator[Fetch]:
    """The fetch of the next document, from ``url`` or from the configured store."""
    if url is not None:
        import httpx

        status_url = url.rstrip("/") + "/status"
        async with httpx.AsyncClient(timeout=5.0) as client:

            async def fetch_http() -> dict[str, Any]:
                answer = await client.get(status_url)
                if answer.status_code != 200:
                    raise ValueError(
                        f"GET {status_url} answered {answer.status_code}: {answer.text}"
                    )
                document: dict[str, Any] = answer.json()
                return document

            yield fetch_http
        return
    from switchyard.runtime.status import StatusSource
    from switchyard.state import state_from_settings

    state = state_from_settings(settings)
    try:
        yield StatusSource(state, worker_timeout_s=settings.worker_timeout_s).document
    finally:
        await state.close()


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


_STATE_STYLE = {"alive": "green", "draining": "yellow", "silent": "red", "down": "red"}


def render(document: dict[str, Any], where: str) -> Any:
    """The screen for ``document`` (a rich renderable)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    totals = document["totals"]
    taken = time.strftime("%H:%M:%S", time.localtime(document["taken_s"]))
    head = Text(
        f"switchyard status  {where}  {taken}   workers {totals['workers_alive']}/"
        f"{totals['workers']} up   answers/s {_num(totals['answers_per_s'])}   answered "
        f"{totals['completed']}   SLO met {_pct(totals['slo_attainment'])} (last "
        f"{totals['recent_window']}: {_pct(totals['recent_slo_attainment'])})   dead letters "
        f"{totals['dead_letters']}   superseded runs {totals['superseded']}",
        style="bold",
    )
    parts: list[Any] = [head]
    if "error" in document:
        parts.append(Text(f"last refresh failed: {document['error']}", style="red"))
    workers = Table(title="workers", title_justify="left")
    for name in ("worker", "state", "profile", "waiting", "running", "util", "KV", "ans/s"):
        workers.add_column(name, justify="left" if name in ("worker", "profile") else "right")
    workers.add_column("answered (late)", justify="right")
    workers.add_column("heard", justify="right")
    for w in document["workers"]:
        running = "-" if w["running"] is None else f"{w['running']}/{w['max_slots'] or '-'}"
        profile = w["profile"] or w["worker_type"] or "-"
        if w.get("role") in ("prefill", "decode"):
            profile += f" [{w['role']}]"
        workers.add_row(
            w["worker_id"],
            Text(w["state"], style=_STATE_STYLE.get(w["state"], "")),
            profile + (" (emulated)" if w["emulated"] else ""),
            "-" if w["waiting"] is None else str(w["waiting"]),
            running,
            _pct(w["utilization"]),
            _pct(w["kv_used"]),
            _num(w["answers_per_s"]),
            f"{w['completed']} ({w['violated']})",
            _age(w["heartbeat_age_s"]) + " ago",
        )
    parts.append(workers)
    services = Table(title="services", title_justify="left", expand=False)
    for name in ("service", "instance", "state", "up", "health"):
        services.add_column(name)
    for s in document["services"]:
        services.add_row(s["name"], s["instance"], s["state"], _age(s["up_s"]), s["health_url"])
    parts.append(services)
    return Group(*parts)
