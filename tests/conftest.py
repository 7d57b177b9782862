"""Fixtures shared by every tier.

The real Kafka broker and Redis server are found through SWITCHYARD_KAFKA_BOOTSTRAP and
SWITCHYARD_REDIS_URL (defaults: 127.0.0.1:9092 and redis://127.0.0.1:6379/0, which
``deploy/local/infra.sh up`` serves). When either cannot be reached, the tests that need
it fail with a message saying how to start it: they never skip.
"""

from __future__ import annotations

import os
import socket
import uuid
from urllib.parse import urlparse

import pytest

DEFAULT_KAFKA_BOOTSTRAP = "127.0.0.1:9092"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
HOW_TO_START = "start it with `deploy/local/infra.sh up` (or `make infra-up`)"


def _reachable(host: str, port: int, timeout_s: float = 3.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    """Bootstrap servers of the real Kafka broker; fails the test when none answers."""
    bootstrap = os.environ.get("SWITCHYARD_KAFKA_BOOTSTRAP", DEFAULT_KAFKA_BOOTSTRAP)
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    if not _reachable(host, int(port)):
        pytest.fail(f"Kafka broker not reachable at {bootstrap}: {HOW_TO_START}", pytrace=False)
    return bootstrap


@pytest.fixture(scope="session")
def redis_url() -> str:
    """URL of the real Redis server; fails the test when none answers."""
    url = os.environ.get("SWITCHYARD_REDIS_URL", DEFAULT_REDIS_URL)
    parsed = urlparse(url)
    if not _reachable(parsed.hostname or "127.0.0.1", parsed.port or 6379):
        pytest.fail(f"Redis server not reachable at {url}: {HOW_TO_START}", pytrace=False)
    return url


@pytest.fixture
def unique_prefix() -> str:
    """A prefix no other test uses, for topics, consumer groups and keys."""
    return f"t{uuid.uuid4().hex[:12]}."
