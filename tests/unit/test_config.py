"""Configuration from SWITCHYARD_* variables: defaults, overrides and clear refusals."""

from __future__ import annotations

import pytest
from switchyard.config import load_settings
from switchyard.errors import ConfigError


def test_defaults_run_the_embedded_mode() -> None:
    settings = load_settings({})
    assert (settings.bus, settings.state) == ("memory", "memory")
    assert settings.kafka_bootstrap == "127.0.0.1:9092"


def test_variables_override_defaults_case_insensitively() -> None:
    settings = load_settings(
        {
            "SWITCHYARD_BUS": "kafka",
            "SWITCHYARD_KAFKA_BOOTSTRAP": "kafka-1:9092,kafka-2:9092",
            "SWITCHYARD_LOG_LEVEL": "debug",
            "SWITCHYARD_TOPIC_PARTITIONS": "12",
        }
    )
    assert settings.bus == "kafka"
    assert settings.kafka_bootstrap == "kafka-1:9092,kafka-2:9092"
    assert settings.log_level == "DEBUG"
    assert settings.topic_partitions == 12


def test_every_bad_variable_is_named_in_one_message() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(
            {
                "SWITCHYARD_BUS": "rabbitmq",
                "SWITCHYARD_HEALTH_PORT": "http",
                "SWITCHYARD_REDIS_URL": "localhost:6379",
                "SWITCHYARD_KAFKA_BOOTSTRAP": "kafka",
            }
        )
    message = str(caught.value)
    for variable in ("BUS='rabbitmq'", "HEALTH_PORT='http'", "REDIS_URL=", "KAFKA_BOOTSTRAP="):
        assert f"SWITCHYARD_{variable}" in message
    assert "redis://" in message


def test_otel_standard_endpoint_is_honoured_when_ours_is_unset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    assert load_settings({}).effective_otlp_endpoint() == "http://collector:4318"
    ours = load_settings({"SWITCHYARD_OTLP_ENDPOINT": "http://mine:4318"})
    assert ours.effective_otlp_endpoint() == "http://mine:4318"
