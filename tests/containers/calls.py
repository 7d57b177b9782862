"""Calls the container tests make through the published API port, and what they read
back when one goes wrong (the services' logs, the recorded state of a call)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import docker
import httpx

from tests.containers.stack import AUTH, INGRESS, compose

T = TypeVar("T")
LONG_DEADLINE = {"deadline_ms": 120_000}
"""Calls the tests need answered: a deadline admission control can always meet."""


def why() -> str:
    """The last lines of every service's log, for a failure message."""
    return compose("logs", "--no-color", "--tail", "25", check=False).stdout[-15000:]


def complete(model: str, max_tokens: int = 16, **extra: Any) -> dict[str, Any]:
    body = {
        "model": model,
        "prompt": "Say hello to the containers",
        "max_tokens": max_tokens,
        "switchyard": LONG_DEADLINE,
        **extra,
    }
    answer = httpx.post(f"{INGRESS}/v1/completions", json=body, headers=AUTH, timeout=180)
    assert answer.status_code == 200, (model, answer.status_code, answer.text)
    document: dict[str, Any] = answer.json()
    return document


def exits_since(client: docker.DockerClient, container: str, since: int) -> list[dict[str, Any]]:
    """The engine's ``die`` events of ``container`` since ``since`` (epoch seconds)."""
    return list(
        client.events(
            since=since,
            until=int(time.time()) + 1,
            decode=True,
            filters={"type": "container", "event": "die", "container": container},
        )
    )


def post_completion(model: str) -> int:
    """A short completion through the published port; its HTTP status."""
    body = {"model": model, "prompt": "Hello", "max_tokens": 4, "switchyard": LONG_DEADLINE}
    return httpx.post(f"{INGRESS}/v1/completions", json=body, headers=AUTH, timeout=180).status_code


def completion_status(request_id: str) -> tuple[str, int | str]:
    """A short completion with a client-chosen id; its HTTP status, or what went wrong."""
    body = {
        "model": "llama-2-7b",
        "prompt": "Hello",
        "max_tokens": 4,
        "switchyard": {**LONG_DEADLINE, "request_id": request_id},
    }
    try:
        answer = httpx.post(f"{INGRESS}/v1/completions", json=body, headers=AUTH, timeout=120)
    except httpx.HTTPError as error:
        return request_id, f"{type(error).__name__}: {error}"
    return request_id, answer.status_code


def request_states(request_ids: list[str]) -> dict[str, Any]:
    """``GET /v1/requests/{id}`` of each: the recorded state of calls that went wrong."""
    states: dict[str, Any] = {}
    for request_id in request_ids[:10]:
        found = httpx.get(f"{INGRESS}/v1/requests/{request_id}", headers=AUTH, timeout=30)
        states[request_id] = found.json() if found.status_code == 200 else found.status_code
    return states


def call_every(
    pool: ThreadPoolExecutor, every_s: float, stop: threading.Event, call: Callable[[], T]
) -> list[Future[T]]:
    """Submit ``call`` to the pool every ``every_s`` until ``stop``; the calls' futures."""
    calls: list[Future[T]] = []
    while not stop.is_set():
        calls.append(pool.submit(call))
        time.sleep(every_s)
    return calls
