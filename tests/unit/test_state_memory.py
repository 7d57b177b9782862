"""The in-memory state store's expiry on an injected clock, and choosing a store from
settings. The behaviour both stores share is in tests/contract/test_state_contract.py."""

from __future__ import annotations

import subprocess
import sys

import pytest
from switchyard.config import Settings
from switchyard.state import MemoryStateStore, state_from_settings
from switchyard.state.base import format_float


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(clock: FakeClock) -> MemoryStateStore:
    return MemoryStateStore("p:", clock=clock)


async def test_a_key_lives_until_its_deadline_and_not_a_moment_longer(
    store: MemoryStateStore, clock: FakeClock
) -> None:
    await store.set("k", "v", ttl_s=10)
    clock.now_s += 9.5
    assert await store.get("k") == "v"
    assert await store.ttl_s("k") == pytest.approx(0.5)
    clock.now_s += 0.5
    assert await store.get("k") is None
    assert not await store.exists("k")
    assert await store.ttl_s("k") is None


async def test_every_type_of_key_expires(store: MemoryStateStore, clock: FakeClock) -> None:
    await store.hset("h", {"f": "1"})
    await store.zadd("z", {"m": 1.0})
    await store.incr("n")
    for key in ["h", "z", "n"]:
        assert await store.expire(key, 5)
    clock.now_s += 5
    assert await store.hgetall("h") == {}
    assert await store.zcard("z") == 0
    assert await store.incr("n") == 1, "an expired counter starts again from 0"
    assert await store.ttl_s("n") is None


async def test_writes_that_keep_the_ttl_and_writes_that_drop_it(
    store: MemoryStateStore, clock: FakeClock
) -> None:
    await store.set("n", "1", ttl_s=10)
    await store.incr("n")
    await store.incr_float("n", 0.5)
    assert await store.ttl_s("n") == pytest.approx(10)
    await store.hset("h", {"a": "1"})
    await store.expire("h", 10)
    await store.hset("h", {"b": "2"})
    await store.hincr_float("h", "c", 1.0)
    assert await store.ttl_s("h") == pytest.approx(10)
    assert await store.compare_and_set("n", "2.5", "3")
    assert await store.ttl_s("n") is None
    clock.now_s += 10
    assert await store.get("n") == "3"
    assert await store.hgetall("h") == {}


async def test_a_key_that_expired_is_absent_for_claims_and_compare_and_set(
    store: MemoryStateStore, clock: FakeClock
) -> None:
    assert await store.set_if_absent("claim", "a", ttl_s=1)
    assert not await store.set_if_absent("claim", "b", ttl_s=1)
    clock.now_s += 1
    assert await store.compare_and_set("claim", None, "c")
    assert await store.get("claim") == "c"


async def test_clear_prefix_counts_only_live_keys_and_drops_expired_ones(
    store: MemoryStateStore, clock: FakeClock
) -> None:
    other = store.sharing("q:")
    await store.set("live", "1")
    await store.set("old1", "1", ttl_s=1)
    await store.set("old2", "1", ttl_s=1)
    await other.set("theirs", "1", ttl_s=1)
    clock.now_s += 1
    assert await store.clear_prefix() == 1
    assert await store.delete("old1", "old2", "live") == 0
    assert await other.clear_prefix() == 0


async def test_stores_sharing_data_see_each_other_under_the_same_prefix(
    store: MemoryStateStore,
) -> None:
    twin = store.sharing("p:")
    stranger = store.sharing("other:")
    await store.set("k", "v")
    assert await twin.get("k") == "v"
    assert await stranger.get("k") is None
    await stranger.set("k", "x")
    await twin.set("k", "w")
    assert await store.get("k") == "w"
    assert await stranger.get("k") == "x"


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (3.0, "3"),
        (-1.25, "-1.25"),
        (1e-05, "0.00001"),
        (1e20, "100000000000000000000"),
        (-0.0, "0"),
    ],
)
def test_float_counters_are_written_as_plain_decimal_text(value: float, text: str) -> None:
    assert format_float(value) == text
    assert float(text) == value


async def test_state_from_settings_builds_the_configured_store() -> None:
    memory = state_from_settings(Settings(state="memory", state_prefix="sy:"))
    assert isinstance(memory, MemoryStateStore)
    assert memory.prefix == "sy:"
    redis = state_from_settings(
        Settings(state="redis", redis_url="redis://cache:6380/2", state_prefix="sy2:")
    )
    from switchyard.state.redis_store import RedisStateStore

    assert isinstance(redis, RedisStateStore)
    assert redis.prefix == "sy2:"
    assert redis.url == "redis://cache:6380/2"
    await redis.close()


def test_the_memory_path_does_not_import_redis() -> None:
    code = (
        "import sys\n"
        "from switchyard.config import Settings\n"
        "from switchyard.state import state_from_settings\n"
        "state_from_settings(Settings(state='memory'))\n"
        "assert 'redis' not in sys.modules, sorted(m for m in sys.modules if 'redis' in m)\n"
        "from switchyard.state import RedisStateStore\n"
        "assert 'redis' in sys.modules\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr


async def test_expired_keys_are_dropped_even_if_never_read_again(clock: FakeClock) -> None:
    store = MemoryStateStore("p:", clock=clock)
    for i in range(1_000):
        await store.set(f"old-{i}", "v", ttl_s=10)
    clock.now_s += 11
    # The next write that sets a deadline reaps them: memory does not grow with keys
    # no one reads again.
    await store.set("new", "v", ttl_s=10)
    assert len(store._data) == 1
    # Renewed deadlines leave old heap entries behind; the heap is rebuilt, not grown.
    for _ in range(10_000):
        await store.expire("new", 10)
    assert len(store._expiry.heap) <= 4 * 1 + 1024 + 1


async def test_past_max_keys_the_keys_nearest_their_expiry_go_first(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    store = MemoryStateStore("p:", clock=clock, max_keys=1_000)
    await store.set("workers", "kept: no deadline")
    for i in range(1_500):
        await store.hset(f"request:{i}", {"status": "ok"})
        await store.expire(f"request:{i}", 3600)
        clock.now_s += 0.001
    assert len(store._data) == 1_000
    assert store.evicted == 501
    assert await store.get("workers") == "kept: no deadline"
    assert await store.hgetall("request:0") == {}
    assert await store.hgetall("request:1499") == {"status": "ok"}
    assert "SWITCHYARD_MEMORY_MAX_KEYS" in caplog.text
    # Clients sharing the data share the bound.
    other = store.sharing("p:")
    await other.set("one-more", "v", ttl_s=7200)
    assert len(store._data) == 1_000
