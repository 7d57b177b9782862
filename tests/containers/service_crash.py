"""A Switchyard service crashing inside its container, and calls that go on meanwhile.

The crash is a SIGKILL of the container's main process sent from the host, as the
kernel's out-of-memory killer would send it: unlike ``docker kill``, which marks the
container stopped by hand, it leaves the compose file's ``restart: unless-stopped`` to
start the container again. The calls are a replay plan's LLM completions and
classification calls, each with its id, retried with the same id and body until it is
answered, as the README tells a client to.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import httpx
from docker.models.containers import Container

from loadgen.mixes import PlannedRequest
from tests.containers.stack import AUTH, INGRESS

RETRY_FOR_S = 120.0


def crash(container: Container) -> int:
    """SIGKILL the container's main process from the host; its restart count before."""
    container.reload()
    restarts = int(container.attrs["RestartCount"])
    os.kill(int(container.attrs["State"]["Pid"]), signal.SIGKILL)
    return restarts


def wait_restarted(container: Container, restarts_before: int, timeout_s: float = 120.0) -> float:
    """Seconds until the container was started again by its restart policy and its health
    check passes."""
    began = time.monotonic()
    deadline = began + timeout_s
    while time.monotonic() < deadline:
        container.reload()
        state = container.attrs["State"]
        health = (state.get("Health") or {}).get("Status", "healthy")
        if (
            int(container.attrs["RestartCount"]) > restarts_before
            and state["Running"]
            and health == "healthy"
        ):
            return time.monotonic() - began
        time.sleep(0.2)
    raise AssertionError(
        f"{container.name} not restarted and healthy within {timeout_s:g} s: "
        f"{container.attrs['State']}"
    )


def answered(request: PlannedRequest, run_id: str) -> tuple[str, int | str, int]:
    """POST ``request`` until it is answered 200 (retrying a failed connection, a 429 or a
    5xx with the same id and body); its id, the last status (or error) and the attempts."""
    body: dict[str, Any] = request.body(run_id)
    deadline = time.monotonic() + RETRY_FOR_S
    attempts = 0
    last: int | str = "not sent"
    while time.monotonic() < deadline:
        attempts += 1
        try:
            answer = httpx.post(f"{INGRESS}{request.path}", json=body, headers=AUTH, timeout=60)
        except httpx.HTTPError as error:
            last = f"{type(error).__name__}: {error}"
            time.sleep(0.5)
            continue
        last = code = answer.status_code
        if code == 200 or (400 <= code < 500 and code != 429):
            break  # answered, or refused for good
        time.sleep(float(answer.headers.get("retry-after", "0.5") or 0.5))
    return request.request_id(run_id), last, attempts
