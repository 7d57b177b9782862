"""Fixtures shared by every tier, and the tiers themselves.

A test's tier is the folder it lives in, set here for every test collected (so no file
can be left out of a ``-m`` selection): ``unit`` (pure, no I/O, no sleeping), ``service``
(service shells and the embedded stack over the in-memory bus and state, real event
loops and timers), ``contract`` (one suite per interface, every implementation; the
parameters that use the real servers are also marked ``integration``) and
``integration`` (the real Kafka broker and Redis server, processes killed for real). A
tier marker that disagrees with the folder fails the collection.

The real Kafka broker and Redis server are found through SWITCHYARD_KAFKA_BOOTSTRAP and
SWITCHYARD_REDIS_URL (defaults: 127.0.0.1:9092 and redis://127.0.0.1:6379/0, which
``deploy/local/infra.sh up`` serves). When either cannot be reached, the tests that need
it fail with a message saying how to start it: they never skip.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest

from loadgen.harness.process_stack import free_ports

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


@contextlib.contextmanager
def _tls_server(name: str, folder: Path, port: int, timeout_s: float) -> Iterator[str]:
    """``deploy/local/NAME up FOLDER PORT`` (its standard output), then ``down``."""
    script = Path(__file__).resolve().parents[1] / "deploy" / "local" / name
    started = subprocess.run(
        [str(script), "up", str(folder), str(port)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if started.returncode != 0:
        pytest.fail(f"deploy/local/{name} up failed: {started.stderr}", pytrace=False)
    try:
        yield started.stdout
    finally:
        subprocess.run(
            [str(script), "down", str(folder)], capture_output=True, timeout=60, check=False
        )


@pytest.fixture(scope="session")
def kafka_secure_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A Kafka broker of this session's own with one SASL_SSL listener (SCRAM-SHA-512,
    deploy/local/kafka-secure.sh); the SWITCHYARD_KAFKA_* settings a client is given."""
    folder = tmp_path_factory.mktemp("kafka-secure")
    # The broker's port and, next to it, its controller's.
    with _tls_server("kafka-secure.sh", folder, free_ports(2), 240) as printed:
        yield dict(line.split("=", 1) for line in printed.splitlines() if "=" in line)


@pytest.fixture(scope="session")
def redis_tls_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Redis server of this session's own that takes TLS only and an ACL user with a
    password (deploy/local/redis-tls.sh); the URL a Switchyard service would be given."""
    folder = tmp_path_factory.mktemp("redis-tls")
    with _tls_server("redis-tls.sh", folder, free_ports(1), 60) as printed:
        yield printed.strip()


_PREFIXES_USED: list[str] = []


@pytest.fixture
def unique_prefix() -> str:
    """A prefix no other test uses, for topics, consumer groups and keys; the topics made
    under it on the shared broker are deleted when the session ends."""
    prefix = f"t{uuid.uuid4().hex[:12]}."
    _PREFIXES_USED.append(prefix)
    return prefix


@pytest.fixture(scope="session", autouse=True)
def _delete_topics_of_unique_prefixes() -> Iterator[None]:
    """Every topic the session made under a ``unique_prefix``, deleted at its end: each
    test's topics would otherwise stay on the shared broker for good, and a broker that
    holds thousands of idle partitions spends a tenth of a core on them."""
    yield
    bootstrap = os.environ.get("SWITCHYARD_KAFKA_BOOTSTRAP", DEFAULT_KAFKA_BOOTSTRAP)
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    if not _PREFIXES_USED or not _reachable(host, int(port), timeout_s=1.0):
        return
    asyncio.run(_delete_topics_under(bootstrap, tuple(_PREFIXES_USED)))


async def _delete_topics_under(bootstrap: str, prefixes: tuple[str, ...]) -> None:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        await admin.start()
        made = [t for t in await admin.list_topics() if t.startswith(prefixes)]
        for first in range(0, len(made), 100):
            await admin.delete_topics(made[first : first + 100], timeout_ms=60_000)
    except Exception as exc:  # clean-up must not fail a session that passed
        warnings.warn(f"could not delete the session's test topics: {exc!r}", stacklevel=1)
    finally:
        await admin.close()


TIERS = ("unit", "service", "contract", "integration", "containers")
_TESTS = Path(__file__).parent


def _tier_of(path: Path) -> str | None:
    try:
        folder = path.relative_to(_TESTS).parts[0]
    except (ValueError, IndexError):
        return None
    return folder if folder in TIERS else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test with its folder's tier; refuse a test outside a tier folder or one
    marked with another tier (``integration`` on a contract parameter excepted)."""
    for item in items:
        tier = _tier_of(item.path)
        if tier is None:
            raise pytest.UsageError(
                f"{item.nodeid}: a test must live in one of tests/{{{','.join(TIERS)}}}/"
            )
        allowed = {tier, "integration"} if tier == "contract" else {tier}
        others = sorted({m.name for m in item.iter_markers() if m.name in TIERS} - allowed)
        if others:
            raise pytest.UsageError(
                f"{item.nodeid} is in tests/{tier}/ but marked {', '.join(others)}: "
                "its folder is its tier"
            )
        item.add_marker(getattr(pytest.mark, tier))
