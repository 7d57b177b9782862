"""No message stops a service: every topic the embedded stack reads gets bytes that are
not a message and messages that pass the schema but make no sense (in-memory bus and
state; ``tests/integration/test_poison_messages_kafka.py`` does the same through Kafka
and Redis), and afterwards every service is still healthy and serves the next good
request."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from switchyard.config import load_settings

from services.embedded import EmbeddedPlan, EmbeddedStack
from tests.support.poison import assert_every_service_serves, poison_every_topic


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack() -> AsyncIterator[EmbeddedStack]:
    settings = load_settings(
        {}, worker_time_scale=50.0, log_level="ERROR", heartbeat_interval_s=0.2
    )
    plan = EmbeddedPlan(
        llm_workers=("a100-80gb/llama-2-7b",), torch_workers=1, model_workers=1, http_port=0
    )
    embedded = EmbeddedStack(settings, plan)
    await embedded.start()
    yield embedded
    assert await embedded.stop() == 0


pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_no_message_stops_a_service_and_the_next_request_is_served(
    stack: EmbeddedStack,
) -> None:
    await poison_every_topic(stack)
    await assert_every_service_serves(stack, settle_s=1.5)
