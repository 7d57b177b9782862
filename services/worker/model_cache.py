"""The worker's model cache: resident models within a memory budget.

A model is loaded on first use (its *swap-in*, measured: the real load time) and stays
resident until room is needed for another; then the least recently used models that no
batch is using are evicted. A model in use is never evicted, so a batch never loses its
model halfway. A model that alone exceeds the budget is refused with
:class:`ModelTooLargeError` before anything is evicted for it.

Loading runs in a worker thread (``asyncio.to_thread``) so heartbeats and intake go on
while a model loads. Loads of the same model are serialised by a per-model lock: two
batches of one model never load it twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TypeVar, cast

from switchyard.errors import SwitchyardError

T = TypeVar("T")


class ModelCacheError(SwitchyardError):
    """A model cannot be made resident."""


class ModelTooLargeError(ModelCacheError):
    """The model alone needs more memory than the cache's whole budget."""


class ModelCacheFullError(ModelCacheError):
    """The models in use leave too little room for this one (none of them can be evicted)."""


@dataclass(slots=True)
class _Entry:
    model: object
    size_bytes: int
    load_s: float
    in_use: int = 0
    pinned: bool = False


@dataclass(frozen=True, slots=True)
class SwapIn:
    """One model load: which model, how long it took (measured), and what it evicted."""

    key: str
    load_s: float
    size_bytes: int
    evicted: tuple[str, ...]


class ModelCache:
    """Resident models by key, within ``budget_bytes``; least recently used evicted first.

    Args:
        budget_bytes: the memory the resident models may occupy together.
    """

    def __init__(self, budget_bytes: int) -> None:
        if budget_bytes < 1:
            raise ValueError(f"budget_bytes must be positive, got {budget_bytes}")
        self.budget_bytes = budget_bytes
        self._entries: OrderedDict[str, _Entry] = OrderedDict()  # least recently used first
        self._locks: dict[str, asyncio.Lock] = {}
        self.swap_ins: list[SwapIn] = []
        """Every load so far, oldest first (bounded: the last 1,000)."""
        self.swap_in_count = 0
        """How many loads there were in all (``swap_ins`` keeps only the last ones)."""

    # -- figures ---------------------------------------------------------------------------

    @property
    def used_bytes(self) -> int:
        return sum(entry.size_bytes for entry in self._entries.values())

    @property
    def free_bytes(self) -> int:
        return max(0, self.budget_bytes - self.used_bytes)

    def resident(self) -> list[str]:
        """Keys of the resident models, least recently used first."""
        return list(self._entries)

    def is_resident(self, key: str) -> bool:
        return key in self._entries

    def load_s(self, key: str) -> float | None:
        """The measured load time of a resident model; None when it is not resident."""
        entry = self._entries.get(key)
        return None if entry is None else entry.load_s

    # -- use ---------------------------------------------------------------------------------

    def put_resident(self, key: str, model: object, size_bytes: int) -> None:
        """Make ``model`` resident for good (never evicted): a model present from the start.

        Raises:
            ModelTooLargeError: it does not fit the budget.
        """
        self._check_fits(key, size_bytes)
        self._make_room(key, size_bytes)
        self._entries[key] = _Entry(model, size_bytes, 0.0, pinned=True)

    @contextlib.asynccontextmanager
    async def use(
        self,
        key: str,
        load: Callable[[], tuple[T, int]],
        *,
        size_hint_bytes: int | None = None,
    ) -> AsyncIterator[T]:
        """The model ``key``, loaded with ``load`` when not resident, held while in the block.

        ``load`` returns the model and its size in bytes; it runs in a thread and its
        duration is the swap-in cost. ``size_hint_bytes`` (e.g. the profiled size) lets a
        model too large for the budget be refused before loading it.

        Raises:
            ModelTooLargeError: the model alone exceeds the budget.
            ModelCacheFullError: the models in use leave no room for it.
        """
        if size_hint_bytes is not None:
            self._check_fits(key, size_hint_bytes)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            entry = self._entries.get(key)
            if entry is None:
                if size_hint_bytes is not None:
                    # Room first, so peak memory stays within the budget while loading.
                    self._make_room(key, size_hint_bytes)
                started_s = time.perf_counter()
                model, size_bytes = await asyncio.to_thread(load)
                load_s = time.perf_counter() - started_s
                self._check_fits(key, size_bytes)
                evicted = self._make_room(key, size_bytes)
                entry = _Entry(model, size_bytes, load_s)
                self._entries[key] = entry
                self.swap_ins.append(SwapIn(key, load_s, size_bytes, tuple(evicted)))
                self.swap_in_count += 1
                del self.swap_ins[:-1000]
            self._entries.move_to_end(key)
            entry.in_use += 1
        try:
            yield cast(T, entry.model)
        finally:
            entry.in_use -= 1

    # -- inside ------------------------------------------------------------------------------

    def _check_fits(self, key: str, size_bytes: int) -> None:
        if size_bytes > self.budget_bytes:
            raise ModelTooLargeError(
                f"model {key!r} needs {size_bytes} bytes, more than the worker's whole model "
                f"memory budget of {self.budget_bytes} bytes (SWITCHYARD_WORKER_MEMORY_BYTES)"
            )

    def _make_room(self, key: str, size_bytes: int) -> list[str]:
        """Evict least recently used models not in use until ``size_bytes`` fit."""
        evicted: list[str] = []
        free = self.budget_bytes - self.used_bytes
        for other, entry in list(self._entries.items()):
            if free >= size_bytes:
                break
            if other == key or entry.in_use or entry.pinned:
                continue
            del self._entries[other]
            free += entry.size_bytes
            evicted.append(other)
        if free < size_bytes:
            busy = [k for k, e in self._entries.items() if e.in_use or e.pinned]
            raise ModelCacheFullError(
                f"no room for model {key!r} ({size_bytes} bytes): {free} bytes free of "
                f"{self.budget_bytes}, the rest held by models in use ({', '.join(busy)})"
            )
        return evicted
