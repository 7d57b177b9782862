"""One contract suite for the state store, run against memory and a real Redis server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest
from switchyard.errors import StateError
from switchyard.state import MemoryStateStore, StateStore
from switchyard.state.redis_store import RedisStateStore

pytestmark = pytest.mark.contract

StoreMaker = Callable[[str], StateStore]


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.integration)])
async def make_store(request: pytest.FixtureRequest) -> AsyncIterator[StoreMaker]:
    """Makes stores that share one backing store, as separate processes share one Redis."""
    made: list[StateStore] = []
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")

        def make(prefix: str) -> StateStore:
            store = RedisStateStore(url, prefix=prefix)
            made.append(store)
            return store

    else:
        shared = MemoryStateStore("")

        def make(prefix: str) -> StateStore:
            store = shared.sharing(prefix)
            made.append(store)
            return store

    yield make
    for store in made:
        await store.clear_prefix()
        await store.close()


@pytest.fixture
def store(make_store: StoreMaker, unique_prefix: str) -> StateStore:
    return make_store(unique_prefix)


async def test_plain_keys(store: StateStore) -> None:
    assert await store.get("k") is None
    await store.set("k", "v1")
    assert await store.get("k") == "v1"
    assert await store.exists("k")
    assert await store.delete("k", "never-there") == 1
    assert not await store.exists("k")


async def test_keys_expire_after_their_ttl(store: StateStore) -> None:
    await store.set("short", "x", ttl_s=0.2)
    await store.set("forever", "y")
    left = await store.ttl_s("short")
    assert left is not None
    assert 0 < left <= 0.2
    assert await store.ttl_s("forever") is None
    assert await store.ttl_s("missing") is None
    await asyncio.sleep(0.35)
    assert await store.get("short") is None
    assert await store.get("forever") == "y"
    assert await store.expire("forever", 60)
    assert not await store.expire("missing", 60)


async def test_set_if_absent_claims_once(store: StateStore) -> None:
    results = await asyncio.gather(*[store.set_if_absent("claim", f"w{i}") for i in range(10)])
    assert results.count(True) == 1
    winner = f"w{results.index(True)}"
    assert await store.get("claim") == winner


async def test_compare_and_set(store: StateStore) -> None:
    assert await store.compare_and_set("epoch", None, "1")
    assert not await store.compare_and_set("epoch", None, "9"), "exists already"
    assert not await store.compare_and_set("epoch", "0", "2"), "stale expectation"
    assert await store.compare_and_set("epoch", "1", "2", ttl_s=30)
    assert await store.get("epoch") == "2"
    assert (await store.ttl_s("epoch") or 0) > 0


async def test_concurrent_compare_and_set_loses_no_update(
    make_store: StoreMaker, unique_prefix: str
) -> None:
    clients = [make_store(unique_prefix) for _ in range(5)]

    async def increment(client: StateStore, times: int) -> None:
        for _ in range(times):
            while True:
                current = await client.get("counter")
                new = str(int(current or "0") + 1)
                if await client.compare_and_set("counter", current, new):
                    break

    await asyncio.gather(*[increment(clients[i % 5], 10) for i in range(20)])
    assert await clients[0].get("counter") == "200"


async def test_concurrent_compare_and_set_from_one_value_has_one_winner(
    make_store: StoreMaker, unique_prefix: str
) -> None:
    clients = [make_store(unique_prefix) for _ in range(8)]
    await clients[0].set("owner", "nobody")
    wins = await asyncio.gather(
        *[c.compare_and_set("owner", "nobody", f"c{i}") for i, c in enumerate(clients)]
    )
    assert wins.count(True) == 1
    assert await clients[0].get("owner") == f"c{wins.index(True)}"


async def test_counters(store: StateStore) -> None:
    assert await store.incr("n") == 1
    assert await store.incr("n", 5) == 6
    assert await store.incr_float("work_s", 1.5) == pytest.approx(1.5)
    assert await store.incr_float("work_s", -0.25) == pytest.approx(1.25)


async def test_hashes(store: StateStore) -> None:
    await store.hset("worker:w1", {"queue": "3", "type": "a100"})
    await store.hset("worker:w1", {"queue": "4"})
    assert await store.hget("worker:w1", "queue") == "4"
    assert await store.hget("worker:w1", "missing") is None
    assert await store.hgetall("worker:w1") == {"queue": "4", "type": "a100"}
    assert await store.hincr_float("worker:w1", "queued_work_s", 2.5) == pytest.approx(2.5)
    assert await store.hincr_float("worker:w1", "queued_work_s", 0.5) == pytest.approx(3.0)
    assert await store.hdel("worker:w1", "queue", "nope") == 1
    assert await store.hgetall("missing") == {}


async def test_sorted_sets(store: StateStore) -> None:
    await store.zadd("workers", {"w3": 30.0, "w1": 10.0, "w2": 20.0, "w0": 20.0})
    assert await store.zcard("workers") == 4
    assert await store.zrange_by_score("workers", 0, 25) == [
        ("w1", 10.0),
        ("w0", 20.0),
        ("w2", 20.0),
    ]
    assert await store.zrange_by_score("workers", 15, 100, limit=2) == [("w0", 20.0), ("w2", 20.0)]
    await store.zadd("workers", {"w1": 40.0})
    assert await store.zscore("workers", "w1") == 40.0
    assert await store.zrem("workers", "w1", "ghost") == 1
    assert await store.zscore("workers", "w1") is None
    assert await store.zrange_by_score("empty", 0, 100) == []


async def test_prefixes_isolate_stores(make_store: StoreMaker, unique_prefix: str) -> None:
    mine = make_store(unique_prefix + "a:")
    theirs = make_store(unique_prefix + "b:")
    await mine.set("k", "mine")
    await theirs.set("k", "theirs")
    await mine.zadd("z", {"m": 1.0})
    assert await mine.get("k") == "mine"
    assert await mine.clear_prefix() == 2
    assert await mine.get("k") is None
    assert await theirs.get("k") == "theirs"


async def test_a_key_of_another_type_is_a_clear_non_retriable_error(store: StateStore) -> None:
    await store.set("plain", "v")
    with pytest.raises(StateError) as caught:
        await store.hget("plain", "field")
    assert not caught.value.retriable
    with pytest.raises(StateError):
        await store.zadd("plain", {"m": 1.0})


@pytest.mark.integration
async def test_unreachable_redis_is_a_retriable_error_naming_the_server() -> None:
    store = RedisStateStore("redis://127.0.0.1:1/0", timeout_s=1.0)
    with pytest.raises(StateError, match=r"127\.0\.0\.1:1") as caught:
        await store.ping()
    assert caught.value.retriable
    await store.close()
