"""Encoding messages to bytes and headers, and decoding them back with a reason on failure.

Messages travel as UTF-8 JSON. Headers name the message type and schema version so that
tools can read a topic without knowing its contract, and so that a consumer can reject a
record meant for another type before it tries to validate it.
"""

from __future__ import annotations

from typing import TypeVar, overload

from pydantic import ValidationError

from switchyard.bus.records import Envelope
from switchyard.contracts.base import Message, SchemaVersionError
from switchyard.errors import DecodeError

M = TypeVar("M", bound=Message)

TYPE_HEADER = "sy-type"
SCHEMA_HEADER = "sy-schema"
CONTENT_TYPE_HEADER = "content-type"
CONTENT_TYPE_JSON = b"application/json"

_MAX_REASON_CHARS = 1500


def encode(message: Message) -> tuple[bytes, list[tuple[str, bytes]]]:
    """The JSON bytes of ``message`` and the headers that describe it."""
    headers = [
        (TYPE_HEADER, message.MESSAGE_TYPE.encode()),
        (SCHEMA_HEADER, str(message.SCHEMA_VERSION).encode()),
        (CONTENT_TYPE_HEADER, CONTENT_TYPE_JSON),
    ]
    return message.model_dump_json().encode(), headers


@overload
def decode(envelope: Envelope, message_types: type[M]) -> M: ...


@overload
def decode(envelope: Envelope, message_types: tuple[type[Message], ...]) -> Message: ...


def decode(envelope: Envelope, message_types: type[Message] | tuple[type[Message], ...]) -> Message:
    """Validate ``envelope`` as the message type given, or as the one of the types given
    that its ``sy-type`` header names (the first when it has no such header).

    Raises:
        DecodeError: ``kind`` is ``message_type`` when the ``sy-type`` header names a type
            the topic does not carry, ``bad_bytes`` when the value is not JSON,
            ``schema_version`` when the version is not the one this code reads,
            ``validation`` for any other problem.
    """
    if not isinstance(message_types, tuple):
        message_types = (message_types,)
    declared = envelope.header(TYPE_HEADER)
    message_type = message_types[0]
    if declared is not None:
        for candidate in message_types:
            if declared == candidate.MESSAGE_TYPE.encode():
                message_type = candidate
                break
        else:
            carried = " or ".join(repr(t.MESSAGE_TYPE) for t in message_types)
            raise DecodeError(
                "message_type",
                f"record of type {declared.decode(errors='replace')!r} on a topic of {carried}",
            )
    try:
        return message_type.model_validate_json(envelope.value)
    except ValidationError as exc:
        raise _classify(exc, message_type) from None


def _classify(exc: ValidationError, message_type: type[Message]) -> DecodeError:
    errors = exc.errors(include_url=False)
    for error in errors:
        if error["type"] in ("json_invalid", "json_type"):
            return DecodeError("bad_bytes", f"not a JSON object: {error['msg']}")
        cause = (error.get("ctx") or {}).get("error")
        if isinstance(cause, SchemaVersionError):
            return DecodeError("schema_version", str(cause))
    parts = []
    for error in errors[:10]:
        where = ".".join(str(p) for p in error["loc"]) or "<message>"
        parts.append(f"{where}: {error['msg']}")
    reason = f"invalid {message_type.MESSAGE_TYPE}: " + "; ".join(parts)
    if len(errors) > 10:
        reason += f"; and {len(errors) - 10} more"
    return DecodeError("validation", reason[:_MAX_REASON_CHARS])
