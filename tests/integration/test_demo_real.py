"""The demo over the real Kafka broker and Redis server: same guarantees as in memory."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

DEMO_TIMEOUT_S = 150
"""The demo normally takes about 5 s here; a stall past this fails the test with
everything the demo printed (its progress and its JSON logs) rather than a bare timeout."""


@pytest.mark.timeout(DEMO_TIMEOUT_S + 30)
def test_demo_on_kafka_and_redis_answers_every_request_once(
    kafka_bootstrap: str, redis_url: str
) -> None:
    demo = subprocess.Popen(
        [sys.executable, "-m", "cli", "demo-bus", "--requests", "300"],
        env={
            **os.environ,
            "SWITCHYARD_BUS": "kafka",
            "SWITCHYARD_KAFKA_BOOTSTRAP": kafka_bootstrap,
            "SWITCHYARD_STATE": "redis",
            "SWITCHYARD_REDIS_URL": redis_url,
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = demo.communicate(timeout=DEMO_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        demo.kill()
        stdout, stderr = demo.communicate()
        pytest.fail(f"the demo did not finish in {DEMO_TIMEOUT_S} s:\n{stdout}\n{stderr}")
    assert demo.returncode == 0, stdout + stderr
    assert "completions (one per request)   300   missing 0, doubled 0" in stdout
    assert "dead letters                    1" in stdout
