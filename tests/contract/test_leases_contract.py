"""Partition leases of addressed topics, against the memory store and a real Redis."""

from __future__ import annotations

import asyncio

from switchyard.state import StateStore, keys
from switchyard.state.leases import PartitionLease

from tests.contract.conftest import StoreMaker


async def test_destinations_get_partitions_of_their_own(store: StateStore) -> None:
    leases = [PartitionLease(store, "inbox", 4, f"worker-{i}") for i in range(4)]

    held = [await lease.acquire() for lease in leases]

    assert sorted(h.partition for h in held) == [0, 1, 2, 3]
    assert all(h.exclusive for h in held)


async def test_a_restarted_owner_gets_its_partition_back(store: StateStore) -> None:
    first = await PartitionLease(store, "inbox", 8, "worker-a").acquire()
    await PartitionLease(store, "inbox", 8, "worker-b").acquire()

    again = await PartitionLease(store, "inbox", 8, "worker-a").acquire()

    assert again == first


async def test_when_every_partition_is_leased_a_destination_shares_one(store: StateStore) -> None:
    for i in range(2):
        await PartitionLease(store, "inbox", 2, f"worker-{i}").acquire()

    extra = await PartitionLease(store, "inbox", 2, "worker-late").acquire()

    assert not extra.exclusive
    assert extra.partition in (0, 1)


async def test_a_released_partition_is_free_at_once_and_a_lost_one_is_noticed(
    store: StateStore,
) -> None:
    first = PartitionLease(store, "inbox", 1, "worker-a")
    await first.acquire()
    assert await first.renew()
    await first.release()
    second = PartitionLease(store, "inbox", 1, "worker-b")
    assert (await second.acquire()).exclusive

    # worker-a comes back (it thinks it still holds partition 0): it is told it lost it.
    await first.acquire()
    assert first.held is not None
    assert not first.held.exclusive
    stale = PartitionLease(store, "inbox", 1, "worker-a")
    stale.held = second.held
    assert not await stale.renew()
    assert await store.get(keys.lease("inbox", 0)) == "worker-b"


async def test_racing_destinations_never_share_a_free_partition(
    make_store: StoreMaker, unique_prefix: str
) -> None:
    leases = [PartitionLease(make_store(unique_prefix), "inbox", 8, f"w{i}") for i in range(8)]

    held = await asyncio.gather(*(lease.acquire() for lease in leases))

    assert sorted(h.partition for h in held) == list(range(8))
