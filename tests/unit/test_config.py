"""Configuration from SWITCHYARD_* variables: defaults, overrides and clear refusals."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from switchyard.config import load_settings
from switchyard.errors import ConfigError

from cli.ops import cmd_config


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


def test_kafka_sasl_needs_its_credentials_and_never_shows_the_password() -> None:
    with pytest.raises(ConfigError) as missing:
        load_settings({"SWITCHYARD_KAFKA_SECURITY_PROTOCOL": "SASL_SSL"})
    text = str(missing.value)
    assert "SWITCHYARD_KAFKA_SASL_USERNAME='<unset>': needed with" in text
    assert "SWITCHYARD_KAFKA_SASL_PASSWORD='<hidden>': needed with" in text

    secret = "s3cret-" + "x" * 12
    with pytest.raises(ConfigError) as bad:
        load_settings(
            {
                "SWITCHYARD_KAFKA_SECURITY_PROTOCOL": "SASL_TLS",
                "SWITCHYARD_KAFKA_SASL_PASSWORD": secret,
            }
        )
    assert "SWITCHYARD_KAFKA_SECURITY_PROTOCOL='SASL_TLS'" in str(bad.value)
    assert secret not in str(bad.value)

    settings = load_settings(
        {
            "SWITCHYARD_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "SWITCHYARD_KAFKA_SASL_USERNAME": "switchyard",
            "SWITCHYARD_KAFKA_SASL_PASSWORD": secret,
        }
    )
    assert secret not in repr(settings)
    assert secret not in settings.model_dump_json()
    assert settings.kafka_sasl_password.get_secret_value() == secret


def test_kafka_tls_files_must_exist_and_a_client_certificate_needs_its_key(
    tmp_path: Path,
) -> None:
    with pytest.raises(ConfigError) as missing:
        load_settings({"SWITCHYARD_KAFKA_SSL_CAFILE": str(tmp_path / "nope.pem")})
    assert "SWITCHYARD_KAFKA_SSL_CAFILE" in str(missing.value)
    assert "no such file" in str(missing.value)
    cert = tmp_path / "client.pem"
    cert.write_text("-----BEGIN CERTIFICATE-----\n")
    with pytest.raises(ConfigError) as half:
        load_settings({"SWITCHYARD_KAFKA_SSL_CERTFILE": str(cert)})
    assert "needs both SWITCHYARD_KAFKA_SSL_CERTFILE and _KEYFILE" in str(half.value)


def test_switchyard_config_lists_the_kafka_password_masked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    secret = "p" * 20
    settings = load_settings(
        {
            "SWITCHYARD_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "SWITCHYARD_KAFKA_SASL_USERNAME": "switchyard",
            "SWITCHYARD_KAFKA_SASL_PASSWORD": secret,
        }
    )
    assert cmd_config(settings, argparse.Namespace()) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["kafka_security_protocol"] == "SASL_SSL"
    assert listed["kafka_sasl_username"] == "switchyard"
    assert listed["kafka_sasl_password"] == "**********"
