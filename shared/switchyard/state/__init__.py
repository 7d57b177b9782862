"""The state store: one Protocol, a Redis and an in-memory implementation."""

from __future__ import annotations

from switchyard.config import Settings
from switchyard.state.base import StateStore
from switchyard.state.memory import MemoryStateStore

__all__ = ["MemoryStateStore", "StateStore", "state_from_settings"]


def state_from_settings(settings: Settings) -> StateStore:
    """The store ``settings`` ask for: Redis at ``redis_url``, or in-memory."""
    if settings.state == "redis":
        from switchyard.state.redis_store import RedisStateStore  # redis only where used

        return RedisStateStore(settings.redis_url, prefix=settings.state_prefix)
    return MemoryStateStore(settings.state_prefix)
