"""The dead-letter record: a message given up on, kept whole with the reason."""

from __future__ import annotations

import base64

from pydantic import Field, NonNegativeInt

from switchyard.contracts.base import Message


class DeadLetter(Message):
    """A message that could not be handled, kept with its original bytes and the reason.

    ``reason_kind`` is one of ``bad_bytes`` (not JSON), ``schema_version``, ``validation``,
    ``message_type`` or ``handler`` (the handler failed and will not succeed on retry).
    """

    MESSAGE_TYPE = "dead-letter"

    source_topic: str
    source_partition: NonNegativeInt
    source_offset: NonNegativeInt
    consumer_group: str
    reason_kind: str
    reason: str = Field(max_length=4000)
    key_b64: str | None = None
    value_b64: str
    headers: list[tuple[str, str]] = Field(
        default_factory=list, description="Original headers, values base64-encoded."
    )
    dead_lettered_at_s: float

    def original_value(self) -> bytes:
        """The original message bytes, exactly as they were on the source topic."""
        return base64.b64decode(self.value_b64)

    def original_key(self) -> bytes | None:
        return None if self.key_b64 is None else base64.b64decode(self.key_b64)
