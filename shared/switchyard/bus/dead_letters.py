"""Dead letters: the record kept of a message that could not be decoded or handled.

A :class:`~switchyard.contracts.dead_letter.DeadLetter` carries the original record whole
(key, value and headers, base64) with where it was read, by which group and why, so that
it can be inspected and published again as it was (``switchyard dead-letters``).
"""

from __future__ import annotations

import base64
import time

from switchyard.bus.records import Envelope
from switchyard.contracts.dead_letter import DeadLetter

_MAX_REASON_CHARS = 4000


def dead_letter_of(envelope: Envelope, group: str, kind: str, reason: str) -> DeadLetter:
    """The dead letter of ``envelope``, read by ``group`` and given up on for ``reason``
    (``kind`` classifies it: a decode error's kind, or ``handler``)."""
    return DeadLetter(
        source_topic=envelope.topic,
        source_partition=envelope.partition,
        source_offset=envelope.offset,
        consumer_group=group,
        reason_kind=kind,
        reason=reason[:_MAX_REASON_CHARS],
        key_b64=None if envelope.key is None else base64.b64encode(envelope.key).decode(),
        value_b64=base64.b64encode(envelope.value).decode(),
        headers=[(k, base64.b64encode(v).decode()) for k, v in envelope.headers],
        dead_lettered_at_s=time.time(),
    )
