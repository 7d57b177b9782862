"""The demo over the real Kafka broker and Redis server: same guarantees as in memory."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_demo_on_kafka_and_redis_answers_every_request_once(
    kafka_bootstrap: str, redis_url: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "switchyard", "demo", "--requests", "300"],
        env={
            **os.environ,
            "SWITCHYARD_BUS": "kafka",
            "SWITCHYARD_KAFKA_BOOTSTRAP": kafka_bootstrap,
            "SWITCHYARD_STATE": "redis",
            "SWITCHYARD_REDIS_URL": redis_url,
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "completions (one per request)   300   missing 0, doubled 0" in done.stdout
    assert "dead letters                    1" in done.stdout
