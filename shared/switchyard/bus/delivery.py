"""What a subscription hands its reader: a decoded :class:`Delivery`, and the
:data:`RecordFilter` that passes over records before they are decoded."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from switchyard.bus.records import Envelope
from switchyard.contracts.base import Message

M = TypeVar("M", bound=Message)

RecordFilter = Callable[[Envelope], bool]
"""Decides from a record's key and headers, before decoding it, whether a subscription
wants it (for example a reader of a shared partition keeps the records keyed with its
own id)."""


@dataclass(frozen=True, slots=True)
class Delivery(Generic[M]):
    """A decoded message and where it came from."""

    message: M
    envelope: Envelope
    group: str
