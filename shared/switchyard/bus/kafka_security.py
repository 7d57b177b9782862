"""How Switchyard's Kafka clients authenticate and encrypt: TLS and SASL.

Every client a :class:`~switchyard.bus.kafka.KafkaTransport` makes (its producer, admin
client and consumers) takes the same options, built once from the settings
(``SWITCHYARD_KAFKA_SECURITY_PROTOCOL``, ``_SASL_*``, ``_SSL_*``):

- ``SSL``: TLS to the brokers, verified against ``kafka_ssl_cafile`` (else the system's
  trusted CAs), with a client certificate when the brokers ask for one;
- ``SASL_SSL``: the same, and a user and password (``PLAIN`` or ``SCRAM-SHA-256/512``);
- ``SASL_PLAINTEXT``: a user and password without TLS (a private network only).

The password lives in a ``SecretStr`` until it is handed to the client: no error, log
line or ``switchyard config`` listing shows it.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass, field
from typing import Any

from aiokafka.conn import create_conn
from aiokafka.errors import SaslAuthenticationFailed, UnsupportedSaslMechanismError
from aiokafka.helpers import create_ssl_context

from switchyard.config import Settings


@dataclass(frozen=True)
class KafkaSecurity:
    """The security options of one deployment's Kafka clients."""

    protocol: str = "PLAINTEXT"
    sasl_mechanism: str = "SCRAM-SHA-512"
    username: str = ""
    password: str = field(default="", repr=False)
    cafile: str = ""
    certfile: str = ""
    keyfile: str = ""

    @property
    def uses_tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context (certificates read now), or None without TLS."""
        if not self.uses_tls:
            return None
        context: ssl.SSLContext = create_ssl_context(
            cafile=self.cafile or None,
            certfile=self.certfile or None,
            keyfile=self.keyfile or None,
        )
        return context

    def client_options(self) -> dict[str, Any]:
        """Keyword arguments for every aiokafka client (producer, consumer, admin)."""
        options: dict[str, Any] = {"security_protocol": self.protocol}
        context = self.ssl_context()
        if context is not None:
            options["ssl_context"] = context
        if self.uses_sasl:
            options["sasl_mechanism"] = self.sasl_mechanism
            options["sasl_plain_username"] = self.username
            options["sasl_plain_password"] = self.password
        return options


def kafka_security(settings: Settings) -> KafkaSecurity:
    """The settings' Kafka security (already validated: SASL has its credentials, the
    PEM files exist)."""
    return KafkaSecurity(
        protocol=settings.kafka_security_protocol,
        sasl_mechanism=settings.kafka_sasl_mechanism,
        username=settings.kafka_sasl_username,
        password=settings.kafka_sasl_password.get_secret_value(),
        cafile=settings.kafka_ssl_cafile,
        certfile=settings.kafka_ssl_certfile,
        keyfile=settings.kafka_ssl_keyfile,
    )


async def why_not_connected(
    bootstrap: str, security: KafkaSecurity, timeout_s: float = 10.0
) -> str | None:
    """After clients failed to bootstrap: one connection to the first broker with the
    same options, and what went wrong, in words that name the setting to look at; None
    when that connection works or fails for no security reason (refused, unreachable:
    the original error says so)."""
    host, _, port = bootstrap.split(",")[0].strip().rpartition(":")
    options = security.client_options()
    try:
        conn = await asyncio.wait_for(
            create_conn(host, int(port), request_timeout_ms=int(timeout_s * 1000), **options),
            timeout_s,
        )
    except SaslAuthenticationFailed:
        return (
            f"the broker refused the credentials of SASL user {security.username!r} "
            f"({security.sasl_mechanism}): check SWITCHYARD_KAFKA_SASL_USERNAME and "
            "SWITCHYARD_KAFKA_SASL_PASSWORD"
        )
    except UnsupportedSaslMechanismError as exc:
        return (
            f"the broker does not offer SASL mechanism {security.sasl_mechanism} "
            f"(SWITCHYARD_KAFKA_SASL_MECHANISM): {exc}"
        )
    except ssl.SSLCertVerificationError as exc:
        return (
            f"the broker's TLS certificate is not trusted ({exc.verify_message}): set "
            "SWITCHYARD_KAFKA_SSL_CAFILE to the CA that signed it"
        )
    except ssl.SSLError as exc:
        return (
            f"TLS with the broker failed ({exc.reason or exc}): does this listener take "
            f"SWITCHYARD_KAFKA_SECURITY_PROTOCOL={security.protocol}?"
        )
    except (OSError, TimeoutError):
        return None
    except Exception as exc:  # aiokafka's own connection errors
        if security.protocol == "PLAINTEXT" and "closed" in str(exc):
            return (
                "the broker closed the connection: its listener may want TLS or SASL "
                "(SWITCHYARD_KAFKA_SECURITY_PROTOCOL is PLAINTEXT)"
            )
        return None
    conn.close()
    return None
