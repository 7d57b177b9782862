"""The state store: one Protocol, a Redis and an in-memory implementation.

``RedisStateStore`` is importable from here too, but lazily: the embedded (memory) path
never imports redis.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from switchyard.config import Settings
from switchyard.state import keys
from switchyard.state.base import StateStore
from switchyard.state.memory import MemoryStateStore

if TYPE_CHECKING:
    from switchyard.state.redis_store import RedisStateStore

__all__ = [
    "MemoryStateStore",
    "RedisStateStore",
    "StateStore",
    "keys",
    "state_from_settings",
]


def __getattr__(name: str) -> object:
    if name == "RedisStateStore":
        from switchyard.state.redis_store import RedisStateStore

        return RedisStateStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def state_from_settings(settings: Settings) -> StateStore:
    """The store ``settings`` ask for: Redis at ``redis_url`` (``state="redis"``), or an
    in-process memory store (``state="memory"``), both under ``state_prefix``."""
    if settings.state == "redis":
        from switchyard.state.redis_store import RedisStateStore  # redis only where used

        return RedisStateStore(settings.redis_url, prefix=settings.state_prefix)
    return MemoryStateStore(settings.state_prefix, max_keys=settings.memory_max_keys)
