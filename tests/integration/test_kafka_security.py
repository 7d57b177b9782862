"""Kafka with TLS and SASL, as managed services run it (deploy/local/kafka-secure.sh: one
SASL_SSL listener, SCRAM-SHA-512 users, a CA of its own).

The bus contract suite runs against this broker too (``kafka-sasl-ssl`` in
tests/contract/test_bus_contract.py); here: a whole service reads and writes through it
configured by SWITCHYARD_* variables alone, and each way of getting the settings wrong
is refused with an error that names the setting to fix and never shows the password.
"""

from __future__ import annotations

import uuid

import pytest
from switchyard.bus import Bus, bus_from_settings
from switchyard.config import load_settings
from switchyard.contracts.topics import REQUESTS
from switchyard.errors import TransportError

from tests.support.bus import make_request


def _bus(env: dict[str, str], **changes: str) -> Bus:
    settings = load_settings(
        {
            **env,
            "SWITCHYARD_BUS": "kafka",
            "SWITCHYARD_TOPIC_PREFIX": f"t{uuid.uuid4().hex[:8]}.",
            **changes,
        }
    )
    return bus_from_settings(settings)


async def _refusal(bus: Bus) -> str:
    with pytest.raises(TransportError) as refused:
        await bus.start()
    await bus.stop()
    return str(refused.value)


async def test_a_service_reads_and_writes_over_sasl_ssl_from_its_settings(
    kafka_secure_env: dict[str, str],
) -> None:
    bus = _bus(kafka_secure_env)
    await bus.start()
    try:
        partitions = list(range(await bus.partitions_of(REQUESTS)))
        reader = bus.subscribe(REQUESTS, group="secure", partitions=partitions)
        async with reader:
            await bus.publish(REQUESTS, make_request("over-tls", seq=7))
            delivery = await reader.next_within(20.0)
            assert delivery is not None
            assert delivery.message.request_id == "over-tls"
    finally:
        await bus.stop()


async def test_a_wrong_password_is_named_and_not_shown(kafka_secure_env: dict[str, str]) -> None:
    wrong = "not-the-password-" + uuid.uuid4().hex
    message = await _refusal(_bus(kafka_secure_env, SWITCHYARD_KAFKA_SASL_PASSWORD=wrong))
    assert "refused the credentials of SASL user 'switchyard'" in message
    assert "SWITCHYARD_KAFKA_SASL_PASSWORD" in message
    assert wrong not in message
    assert kafka_secure_env["SWITCHYARD_KAFKA_SASL_PASSWORD"] not in message


async def test_a_plaintext_client_is_told_the_listener_wants_tls_or_sasl(
    kafka_secure_env: dict[str, str],
) -> None:
    plain = {"SWITCHYARD_KAFKA_BOOTSTRAP": kafka_secure_env["SWITCHYARD_KAFKA_BOOTSTRAP"]}
    message = await _refusal(_bus(plain))
    assert "SWITCHYARD_KAFKA_SECURITY_PROTOCOL is PLAINTEXT" in message


async def test_an_untrusted_certificate_names_the_ca_setting(
    kafka_secure_env: dict[str, str],
) -> None:
    without_ca = {k: v for k, v in kafka_secure_env.items() if k != "SWITCHYARD_KAFKA_SSL_CAFILE"}
    message = await _refusal(_bus(without_ca))
    assert "certificate is not trusted" in message
    assert "SWITCHYARD_KAFKA_SSL_CAFILE" in message
