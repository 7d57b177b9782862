"""switchyard.heap: the collector settled after start, and paused around a decision."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
from switchyard.heap import YOUNG_COLLECTION_ALLOCATIONS, collector_paused, settle_heap


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def _cycle() -> _Node:
    """Two objects that refer to each other: only the cyclic collector frees them."""
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return a


@pytest.fixture
def collections() -> Iterator[list[int]]:
    """The generation of every collection from here on, with a low young threshold (so
    one would fall inside a block that allocates thousands) and the collector's state
    restored."""
    seen: list[int] = []

    def note(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            seen.append(info["generation"])

    threshold = gc.get_threshold()
    enabled = gc.isenabled()
    gc.enable()
    gc.set_threshold(500, threshold[1], threshold[2])
    gc.collect()  # the count starts at 0: the few allocations before a block trigger none
    gc.callbacks.append(note)
    try:
        yield seen
    finally:
        gc.callbacks.remove(note)
        gc.set_threshold(*threshold)
        if not enabled:
            gc.disable()


def test_no_collection_falls_inside_the_block_and_the_young_generation_follows_it(
    collections: list[int],
) -> None:
    with collector_paused():
        assert not gc.isenabled()
        garbage = weakref.ref(_cycle())
        kept = [_cycle() for _ in range(1_000)]  # 4 times the young threshold
        assert collections == []
        assert garbage() is not None  # nothing collected it yet
    assert gc.isenabled()
    assert collections[0] == 0  # the youngest generation, right after the block
    assert garbage() is None  # the cycle made inside is freed by it
    assert all(node.other is not None for node in kept)


def test_the_collector_is_back_after_an_error_in_the_block(collections: list[int]) -> None:
    with pytest.raises(RuntimeError, match="plan failed"), collector_paused():
        raise RuntimeError("plan failed")
    assert gc.isenabled()
    assert collections[:1] == [0]


def test_inside_a_caller_that_disabled_the_collector_it_changes_nothing(
    collections: list[int],
) -> None:
    gc.disable()
    with collector_paused():
        [_cycle() for _ in range(1_000)]
    assert not gc.isenabled()
    assert collections == []


def test_settle_heap_freezes_what_start_up_built_and_collects_less_often() -> None:
    threshold = gc.get_threshold()
    built = _cycle()
    try:
        settle_heap()
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold()[0] == YOUNG_COLLECTION_ALLOCATIONS
        assert all(obj is not built for obj in gc.get_objects(0))  # moved out of reach
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
