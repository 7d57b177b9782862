"""No message stops a service, through the real Kafka broker and Redis: every topic the
stack reads gets bytes that are not a message and messages that pass the schema but make
no sense, and afterwards every service is still healthy and serves the next request."""

from __future__ import annotations

from switchyard.config import load_settings

from services.embedded import EmbeddedPlan, EmbeddedStack
from tests.support.poison import assert_every_service_serves, poison_every_topic


async def test_no_message_through_kafka_stops_a_service(
    kafka_bootstrap: str, redis_url: str, unique_prefix: str
) -> None:
    settings = load_settings(
        {},
        bus="kafka",
        state="redis",
        kafka_bootstrap=kafka_bootstrap,
        redis_url=redis_url,
        topic_prefix=f"{unique_prefix}.",
        state_prefix=f"{unique_prefix}:",
        worker_time_scale=50.0,
        heartbeat_interval_s=0.2,
        log_level="ERROR",
    )
    stack = EmbeddedStack(
        settings,
        EmbeddedPlan(
            llm_workers=("a100-80gb/llama-2-7b",), torch_workers=1, model_workers=1, http_port=0
        ),
        over_settings_transports=True,
    )
    await stack.start()
    try:
        await poison_every_topic(stack)
        await assert_every_service_serves(stack, settle_s=5.0)
    finally:
        assert await stack.stop() == 0
