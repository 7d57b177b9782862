"""switchyard.runtime.group_commit: concurrent writes share a batch, with no added wait."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from switchyard.runtime.group_commit import GroupCommit


class Store:
    """A flush that records each batch and answers after the test releases it."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.release = asyncio.Event()
        self.fail_next: Exception | None = None

    async def flush(self, items: Sequence[int]) -> list[int]:
        self.batches.append(list(items))
        await self.release.wait()
        if self.fail_next is not None:
            error, self.fail_next = self.fail_next, None
            raise error
        return [item * 10 for item in items]


async def test_a_lone_item_goes_out_at_once() -> None:
    store = Store()
    store.release.set()
    group = GroupCommit(store.flush)

    assert await asyncio.wait_for(group.submit(1), 1) == 10
    assert store.batches == [[1]]


async def test_items_arriving_during_a_flush_share_the_next_one() -> None:
    store = Store()
    group = GroupCommit(store.flush)
    first = asyncio.create_task(group.submit(1))
    await asyncio.sleep(0.01)  # the first batch is in flight
    later = [asyncio.create_task(group.submit(n)) for n in (2, 3, 4)]
    await asyncio.sleep(0.01)
    assert store.batches == [[1]], "nothing else goes out while a batch is in flight"

    store.release.set()

    assert await asyncio.gather(first, *later) == [10, 20, 30, 40]
    assert store.batches == [[1], [2, 3, 4]]
    assert group.batches == 2


async def test_max_batch_splits_a_long_queue() -> None:
    store = Store()
    store.release.set()
    group = GroupCommit(store.flush, max_batch=2)

    results = await asyncio.gather(*(group.submit(n) for n in range(5)))

    assert results == [0, 10, 20, 30, 40]
    assert [len(batch) for batch in store.batches] == [2, 2, 1]


async def test_a_failed_batch_fails_its_callers_only() -> None:
    store = Store()
    group = GroupCommit(store.flush)
    store.fail_next = ConnectionError("store down")
    doomed = [asyncio.create_task(group.submit(n)) for n in (1, 2)]
    await asyncio.sleep(0.01)
    survivor = asyncio.create_task(group.submit(3))
    store.release.set()

    outcomes = await asyncio.gather(*doomed, survivor, return_exceptions=True)

    assert [type(o) for o in outcomes[:2]] == [ConnectionError, ConnectionError]
    assert outcomes[2] == 30, "the next batch goes out as usual"


async def test_a_caller_that_gives_up_does_not_disturb_the_batch() -> None:
    store = Store()
    group = GroupCommit(store.flush)
    gone = asyncio.create_task(group.submit(1))
    kept = asyncio.create_task(group.submit(2))
    await asyncio.sleep(0.01)
    gone.cancel()
    store.release.set()

    assert await kept == 20
    assert gone.cancelled()


async def test_a_flush_that_miscounts_is_an_error_for_its_callers() -> None:
    async def short(items: Sequence[int]) -> list[int]:
        return []

    group = GroupCommit(short)

    with pytest.raises(RuntimeError, match="returned 0 results"):
        await group.submit(1)


def test_max_batch_must_be_positive() -> None:
    async def flush(items: Sequence[int]) -> list[int]:
        return list(items)

    with pytest.raises(ValueError, match="max_batch"):
        GroupCommit(flush, max_batch=0)
