"""The base of every message that crosses the bus.

Every message carries a schema version, a message id and the wall-clock time it was
created. A consumer accepts only the schema version its code was written for; any other
version goes to the dead-letter topic with the reason, so a producer upgraded ahead of
its consumers cannot make them misread a message. Adding an optional field keeps the
version; removing a field or changing a meaning bumps it.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator


def new_message_id() -> str:
    """A random 128-bit id in hex (32 characters)."""
    return uuid.uuid4().hex


class Message(BaseModel):
    """Base class of bus messages: frozen, versioned, and identified.

    Subclasses set ``MESSAGE_TYPE`` (the name carried in the ``sy-type`` header) and, when
    their shape changes incompatibly, ``SCHEMA_VERSION``.
    """

    # NaN and infinities are refused in every float field: JSON has no such numbers, and a
    # consumer that took one in (a learnt model, a deadline) would misbehave quietly.
    model_config = ConfigDict(
        frozen=True, extra="ignore", populate_by_name=True, allow_inf_nan=False
    )

    MESSAGE_TYPE: ClassVar[str] = "message"
    SCHEMA_VERSION: ClassVar[int] = 1

    schema_version: int = Field(default=-1, description="Version of this message's shape.")
    message_id: str = Field(default_factory=new_message_id, min_length=1, max_length=128)
    created_at_s: float = Field(
        default_factory=time.time, description="Wall-clock creation time, epoch seconds."
    )

    @model_validator(mode="before")
    @classmethod
    def _fill_and_check_version(cls, data: Any) -> Any:
        # A message built in code gets the class's version; one decoded from the bus
        # must carry exactly that version.
        if isinstance(data, dict):
            version = data.get("schema_version")
            if version is None:
                return {**data, "schema_version": cls.SCHEMA_VERSION}
            if version != cls.SCHEMA_VERSION:
                raise SchemaVersionError(cls.MESSAGE_TYPE, version, cls.SCHEMA_VERSION)
        return data


class SchemaVersionError(ValueError):
    """A message's schema version is not the one this code understands."""

    def __init__(self, message_type: str, got: object, expected: int) -> None:
        super().__init__(
            f"{message_type} schema version {got!r} is not supported (this consumer reads "
            f"version {expected})"
        )
        self.got = got
        self.expected = expected
