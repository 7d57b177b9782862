"""Errors that carry behaviour flags.

Retry code checks ``retriable`` rather than matching exception types: a broker or
Redis outage is retriable (the work waits and is tried again), a message that can
never be handled is not (it goes to the dead-letter topic).
"""

from __future__ import annotations


class SwitchyardError(Exception):
    """Base of every error Switchyard raises on purpose.

    Attributes:
        retriable: True when trying the same operation again later may succeed.
    """

    retriable: bool = False

    def __init__(self, message: str, *, retriable: bool | None = None) -> None:
        super().__init__(message)
        if retriable is not None:
            self.retriable = retriable


class ConfigError(SwitchyardError):
    """The configuration (environment variables) is invalid; the message names each problem."""


class TransportError(SwitchyardError):
    """The broker could not be reached or refused an operation."""

    retriable = True


class StateError(SwitchyardError):
    """The state store could not be reached or refused an operation."""

    retriable = True


class DecodeError(SwitchyardError):
    """A message on the bus could not be decoded or validated.

    Attributes:
        kind: a short machine-readable reason (``bad_bytes``, ``schema_version``,
            ``validation``, ``message_type``) recorded in the dead letter.
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message, retriable=False)
        self.kind = kind


def is_retriable(exc: BaseException) -> bool:
    """Whether an exception raised while handling a message deserves another try.

    Connection-level failures of the libraries underneath (``ConnectionError``,
    ``TimeoutError``, ``OSError``) count as retriable even when they do not come
    wrapped in a :class:`SwitchyardError`.
    """
    if isinstance(exc, SwitchyardError):
        return exc.retriable
    return isinstance(exc, ConnectionError | TimeoutError | OSError)
