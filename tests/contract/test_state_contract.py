"""One contract suite for the state store, run against memory and a real Redis server.

Every test but the last few runs twice: ``[memory]`` and ``[redis]``. Stores made by one
test share one backing store (one dict, or the one Redis server), as separate service
processes share one Redis, so the multi-client tests are real races on Redis.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Sequence

import pytest
from switchyard.errors import StateError
from switchyard.state import StateStore
from switchyard.state.base import Script, ScriptView
from switchyard.state.redis_store import RedisStateStore

from tests.contract.conftest import StoreMaker

# -- plain keys ------------------------------------------------------------------------


async def test_plain_keys(store: StateStore) -> None:
    await store.ping()
    assert await store.get("k") is None
    assert not await store.exists("k")
    await store.set("k", "v1")
    assert await store.get("k") == "v1"
    await store.set("k", "v2")
    assert await store.get("k") == "v2"
    assert await store.exists("k")
    await store.set("other", "")
    assert await store.get("other") == "", "the empty string is a value, not a missing key"
    assert await store.delete("k", "other", "never-there") == 2
    assert not await store.exists("k")
    assert await store.get("k") is None
    assert await store.delete() == 0


async def test_set_replaces_a_value_of_another_type(store: StateStore) -> None:
    await store.hset("k", {"f": "1"})
    await store.set("k", "plain")
    assert await store.get("k") == "plain"


async def test_keys_expire_after_their_ttl(store: StateStore) -> None:
    await store.set("short", "x", ttl_s=0.2)
    await store.set("forever", "y")
    left = await store.ttl_s("short")
    assert left is not None
    assert 0.1 < left <= 0.2
    assert await store.ttl_s("forever") is None
    assert await store.ttl_s("missing") is None
    await asyncio.sleep(0.35)
    assert await store.get("short") is None
    assert not await store.exists("short")
    assert await store.ttl_s("short") is None
    assert await store.set_if_absent("short", "again"), "an expired key is absent"
    assert await store.get("forever") == "y"


async def test_expire_gives_an_existing_key_a_deadline(store: StateStore) -> None:
    await store.hset("h", {"f": "1"})
    assert await store.expire("h", 0.2)
    assert not await store.expire("missing", 60)
    assert not await store.exists("missing"), "expire does not create keys"
    left = await store.ttl_s("h")
    assert left is not None
    assert 0.1 < left <= 0.2
    await asyncio.sleep(0.35)
    assert await store.hgetall("h") == {}
    assert not await store.exists("h")


async def test_set_drops_an_earlier_ttl_and_counters_keep_it(store: StateStore) -> None:
    await store.set("k", "1", ttl_s=60)
    await store.set("k", "2")
    assert await store.ttl_s("k") is None, "set without ttl_s makes the key permanent"
    await store.set("n", "1", ttl_s=60)
    await store.incr("n")
    left = await store.ttl_s("n")
    assert left is not None
    assert 59 < left <= 60, "incr keeps the time to live"


@pytest.mark.parametrize("bad_ttl_s", [0, -1.0, math.nan, math.inf])
async def test_a_ttl_that_is_not_positive_and_finite_is_refused(
    store: StateStore, bad_ttl_s: float
) -> None:
    with pytest.raises(ValueError, match="ttl_s"):
        await store.set("k", "v", ttl_s=bad_ttl_s)
    with pytest.raises(ValueError, match="ttl_s"):
        await store.set_if_absent("k", "v", ttl_s=bad_ttl_s)
    with pytest.raises(ValueError, match="ttl_s"):
        await store.compare_and_set("k", None, "v", ttl_s=bad_ttl_s)
    await store.set("k", "v")
    with pytest.raises(ValueError, match="ttl_s"):
        await store.expire("k", bad_ttl_s)
    assert await store.get("k") == "v"
    assert await store.ttl_s("k") is None


async def test_set_if_absent_claims_once(store: StateStore) -> None:
    results = await asyncio.gather(
        *[store.set_if_absent("claim", f"w{i}", ttl_s=30) for i in range(10)]
    )
    assert results.count(True) == 1
    assert await store.get("claim") == f"w{results.index(True)}"
    assert (await store.ttl_s("claim") or 0) > 29
    await store.zadd("z", {"m": 1.0})
    assert not await store.set_if_absent("z", "v"), "a key of another type exists"


# -- compare-and-set -------------------------------------------------------------------


async def test_compare_and_set(store: StateStore) -> None:
    assert not await store.compare_and_set("epoch", "0", "1"), "missing is not '0'"
    assert await store.get("epoch") is None
    assert await store.compare_and_set("epoch", None, "1")
    assert not await store.compare_and_set("epoch", None, "9"), "exists already"
    assert not await store.compare_and_set("epoch", "0", "2"), "stale expectation"
    assert await store.get("epoch") == "1"
    assert await store.compare_and_set("epoch", "1", "2", ttl_s=30)
    assert await store.get("epoch") == "2"
    assert (await store.ttl_s("epoch") or 0) > 29
    assert await store.compare_and_set("epoch", "2", "3")
    assert await store.ttl_s("epoch") is None, "like set: no ttl_s, no expiry"
    await store.set("empty", "")
    assert not await store.compare_and_set("empty", None, "x"), "'' exists"
    assert await store.compare_and_set("empty", "", "x")
    assert await store.get("empty") == "x"


async def test_concurrent_compare_and_set_loses_no_update(
    make_store: StoreMaker, unique_prefix: str
) -> None:
    clients = [make_store(unique_prefix) for _ in range(5)]
    conflicts = 0

    async def increment(client: StateStore, times: int) -> None:
        nonlocal conflicts
        for _ in range(times):
            while True:
                current = await client.get("counter")
                await asyncio.sleep(0)  # let the other tasks read the same value
                if await client.compare_and_set("counter", current, str(int(current or "0") + 1)):
                    break
                conflicts += 1

    await asyncio.gather(*[increment(clients[i % 5], 10) for i in range(20)])
    assert await clients[0].get("counter") == "200"
    assert conflicts > 0, "the tasks never raced, so the test proved nothing"


async def test_concurrent_compare_and_set_from_one_value_has_one_winner(
    make_store: StoreMaker, unique_prefix: str
) -> None:
    clients = [make_store(unique_prefix) for _ in range(5)]
    await clients[0].set("owner", "nobody")
    for expected in ["nobody", "round-2"]:
        wins = await asyncio.gather(
            *[clients[i % 5].compare_and_set("owner", expected, f"c{i}") for i in range(20)]
        )
        assert wins.count(True) == 1
        assert await clients[0].get("owner") == f"c{wins.index(True)}"
        await clients[0].set("owner", "round-2")


async def test_concurrent_claims_of_a_missing_key_have_one_winner(
    make_store: StoreMaker, unique_prefix: str
) -> None:
    clients = [make_store(unique_prefix) for _ in range(5)]
    wins = await asyncio.gather(
        *[clients[i % 5].compare_and_set("leader", None, f"c{i}") for i in range(20)]
    )
    assert wins.count(True) == 1
    assert await clients[3].get("leader") == f"c{wins.index(True)}"


# -- counters --------------------------------------------------------------------------


async def test_counters(store: StateStore) -> None:
    assert await store.incr("n") == 1
    assert await store.incr("n", 5) == 6
    assert await store.incr("n", -10) == -4
    assert await store.get("n") == "-4"
    await store.set("preset", "41")
    assert await store.incr("preset") == 42
    assert await store.incr_float("work_s", 1.5) == pytest.approx(1.5)
    assert await store.incr_float("work_s", 1.5) == pytest.approx(3.0)
    assert await store.get("work_s") == "3", "floats are stored as plain decimal text"
    assert await store.incr_float("work_s", -0.25) == pytest.approx(2.75)
    assert float(await store.get("work_s") or "nan") == pytest.approx(2.75)
    assert await store.incr_float("n", 0.5) == pytest.approx(-3.5), "an integer is a number"


@pytest.mark.parametrize("stored", ["abc", "1.5", " 1", ""])
async def test_incr_of_a_non_integer_is_a_non_retriable_error(
    store: StateStore, stored: str
) -> None:
    await store.set("n", stored)
    with pytest.raises(StateError) as caught:
        await store.incr("n")
    assert not caught.value.retriable
    assert await store.get("n") == stored


async def test_float_counters_refuse_what_is_not_a_finite_number(store: StateStore) -> None:
    await store.set("x", "abc")
    with pytest.raises(StateError) as caught:
        await store.incr_float("x", 1.0)
    assert not caught.value.retriable
    await store.set("inf", "inf")
    with pytest.raises(StateError) as caught:
        await store.incr_float("inf", 1.0)
    assert not caught.value.retriable
    await store.set("one", "1")
    with pytest.raises(StateError) as caught:
        await store.incr_float("one", math.inf)
    assert not caught.value.retriable
    assert await store.get("one") == "1"


async def test_incr_overflow_is_a_non_retriable_error(store: StateStore) -> None:
    await store.set("n", str(2**63 - 1))
    with pytest.raises(StateError) as caught:
        await store.incr("n")
    assert not caught.value.retriable


# -- hashes ----------------------------------------------------------------------------


async def test_hashes(store: StateStore) -> None:
    await store.hset("worker:w1", {"queue": "3", "type": "a100"})
    await store.hset("worker:w1", {"queue": "4"})
    await store.hset("worker:w1", {})
    assert await store.hget("worker:w1", "queue") == "4"
    assert await store.hget("worker:w1", "missing") is None
    assert await store.hget("missing", "queue") is None
    assert await store.hgetall("worker:w1") == {"queue": "4", "type": "a100"}
    assert await store.hincr_float("worker:w1", "queued_work_s", 2.5) == pytest.approx(2.5)
    assert await store.hincr_float("worker:w1", "queued_work_s", 0.5) == pytest.approx(3.0)
    assert await store.hget("worker:w1", "queued_work_s") == "3"
    assert await store.hdel("worker:w1", "queue", "nope") == 1
    assert await store.hdel("worker:w1") == 0
    assert await store.hgetall("worker:w1") == {"type": "a100", "queued_work_s": "3"}
    assert await store.hgetall("missing") == {}
    assert not await store.exists("missing")


async def test_a_hash_emptied_by_hdel_is_gone(store: StateStore) -> None:
    await store.hset("h", {"a": "1", "b": "2"})
    assert await store.hdel("h", "a", "b") == 2
    assert not await store.exists("h")


async def test_hincr_float_creates_the_hash_and_refuses_non_numbers(store: StateStore) -> None:
    assert await store.hincr_float("load", "w1", -1.25) == pytest.approx(-1.25)
    assert await store.hgetall("load") == {"w1": "-1.25"}
    await store.hset("load", {"label": "busy"})
    with pytest.raises(StateError) as caught:
        await store.hincr_float("load", "label", 1.0)
    assert not caught.value.retriable
    assert await store.hget("load", "label") == "busy"


async def test_get_many_reads_strings_in_order_in_one_call(store: StateStore) -> None:
    await store.set("a", "1")
    await store.set("c", "3")
    await store.hset("h", {"f": "v"})
    assert await store.get_many(["a", "b", "c", "h", "a"]) == ["1", None, "3", None, "1"]
    assert await store.get_many([]) == []


async def test_hgetall_returns_a_copy(store: StateStore) -> None:
    await store.hset("h", {"a": "1"})
    fields = await store.hgetall("h")
    fields["b"] = "2"
    assert await store.hgetall("h") == {"a": "1"}


# -- sorted sets -----------------------------------------------------------------------


async def test_sorted_sets(store: StateStore) -> None:
    await store.zadd("workers", {"w3": 30.0, "w1": 10.0, "w2": 20.0, "w0": 20.0})
    await store.zadd("workers", {})
    assert await store.zcard("workers") == 4
    assert await store.zrange_by_score("workers", 0, 25) == [
        ("w1", 10.0),
        ("w0", 20.0),
        ("w2", 20.0),
    ]
    assert await store.zrange_by_score("workers", 10, 20) == [
        ("w1", 10.0),
        ("w0", 20.0),
        ("w2", 20.0),
    ], "both bounds are inclusive"
    assert await store.zrange_by_score("workers", 15, 100, limit=2) == [("w0", 20.0), ("w2", 20.0)]
    assert await store.zrange_by_score("workers", 15, 100, limit=0) == []
    assert await store.zrange_by_score("workers", 50, 10) == []
    await store.zadd("workers", {"w1": 40.0})
    assert await store.zscore("workers", "w1") == 40.0
    assert await store.zcard("workers") == 4, "updating a score adds no member"
    assert await store.zrem("workers", "w1", "ghost") == 1
    assert await store.zrem("workers") == 0
    assert await store.zscore("workers", "w1") is None
    assert await store.zscore("missing", "w1") is None
    assert await store.zcard("workers") == 3
    assert await store.zrange_by_score("empty", 0, 100) == []
    assert await store.zcard("empty") == 0


async def test_sorted_set_scores_may_be_negative_or_infinite_but_not_nan(
    store: StateStore,
) -> None:
    await store.zadd("z", {"low": -math.inf, "mid": -2.5, "high": math.inf})
    assert await store.zrange_by_score("z", -math.inf, math.inf) == [
        ("low", -math.inf),
        ("mid", -2.5),
        ("high", math.inf),
    ]
    with pytest.raises(StateError) as caught:
        await store.zadd("z", {"bad": math.nan})
    assert not caught.value.retriable
    assert await store.zcard("z") == 3
    with pytest.raises(ValueError, match="limit"):
        await store.zrange_by_score("z", 0, 1, limit=-1)


async def test_a_sorted_set_emptied_by_zrem_is_gone(store: StateStore) -> None:
    await store.zadd("z", {"only": 1.0})
    assert await store.zrem("z", "only") == 1
    assert not await store.exists("z")


# -- prefixes --------------------------------------------------------------------------


async def test_prefixes_isolate_stores(make_store: StoreMaker, unique_prefix: str) -> None:
    mine = make_store(unique_prefix + "a:")
    theirs = make_store(unique_prefix + "b:")
    await mine.set("k", "mine")
    await theirs.set("k", "theirs")
    await mine.zadd("z", {"m": 1.0})
    await theirs.hset("h", {"f": "v"})
    assert await mine.get("k") == "mine"
    assert not await mine.exists("h")
    assert await mine.delete("h") == 0
    assert await theirs.hgetall("h") == {"f": "v"}
    assert await mine.clear_prefix() == 2
    assert await mine.get("k") is None
    assert await mine.zcard("z") == 0
    assert await theirs.get("k") == "theirs"
    assert await theirs.hgetall("h") == {"f": "v"}
    assert await mine.clear_prefix() == 0


async def test_clear_prefix_takes_glob_characters_literally(
    make_store: StoreMaker, unique_prefix: str
) -> None:
    starred = make_store(unique_prefix + "*")
    other = make_store(unique_prefix + "x")
    await starred.set("k", "1")
    await other.set("k", "2")
    assert await starred.clear_prefix() == 1
    assert await other.get("k") == "2"


async def test_clear_prefix_deletes_many_keys(store: StateStore) -> None:
    for i in range(1200):  # more than one SCAN batch
        await store.set(f"k{i}", "v")
    assert await store.clear_prefix() == 1200
    assert not await store.exists("k0")
    assert not await store.exists("k1199")


# -- scripts ---------------------------------------------------------------------------

# Moves a counter between two hashes if the source holds at least the amount; the same
# step in Lua and in Python, as every script is written.
_MOVE_LUA = """
local have = tonumber(redis.call('HGET', KEYS[1], 'n') or '0')
local amount = tonumber(ARGV[1])
if have < amount then return {'short', tostring(have)} end
redis.call('HINCRBY', KEYS[1], 'n', -amount)
local now = redis.call('HINCRBY', KEYS[2], 'n', amount)
return {'moved', tostring(now)}
"""


def _move(view: ScriptView, keys: Sequence[str], args: Sequence[str]) -> list[str]:
    have = int(view.hget(keys[0], "n") or "0")
    amount = int(args[0])
    if have < amount:
        return ["short", str(have)]
    view.hincrby(keys[0], "n", -amount)
    return ["moved", str(view.hincrby(keys[1], "n", amount))]


MOVE = Script("test-move", _MOVE_LUA, _move)


async def test_a_script_runs_on_prefixed_keys_and_returns_strings(store: StateStore) -> None:
    await store.hset("a", {"n": "5"})

    assert await store.run_script(MOVE, ["a", "b"], ["3"]) == ["moved", "3"]
    assert await store.run_script(MOVE, ["a", "b"], ["3"]) == ["short", "2"]
    assert await store.hgetall("a") == {"n": "2"}
    assert await store.hgetall("b") == {"n": "3"}


async def test_many_runs_of_a_script_apply_in_order(store: StateStore) -> None:
    await store.hset("a", {"n": "4"})

    results = await store.run_script_many(MOVE, [(["a", "b"], ["2"])] * 3)

    assert results == [["moved", "2"], ["moved", "4"], ["short", "0"]]
    assert await store.run_script_many(MOVE, []) == []


async def test_concurrent_scripts_never_interleave(
    make_store: StoreMaker, unique_prefix: str
) -> None:
    # Ten clients race to take 1 from a pot of 6: exactly six win, whatever the timing.
    clients = [make_store(unique_prefix) for _ in range(10)]
    await clients[0].hset("pot", {"n": "6"})

    results = await asyncio.gather(
        *(client.run_script(MOVE, ["pot", f"won-{i}"], ["1"]) for i, client in enumerate(clients))
    )

    assert sum(1 for result in results if result[0] == "moved") == 6
    assert await clients[0].hget("pot", "n") == "0"


async def test_a_script_on_a_key_of_another_type_is_refused(store: StateStore) -> None:
    await store.set("a", "plain")

    with pytest.raises(StateError) as refused:
        await store.run_script(MOVE, ["a", "b"], ["1"])

    assert not refused.value.retriable


# -- errors ----------------------------------------------------------------------------


async def test_a_key_of_another_type_is_a_clear_non_retriable_error(store: StateStore) -> None:
    await store.set("plain", "v")
    await store.hset("fields", {"f": "1"})
    wrong_type_calls: list[Callable[[], Awaitable[object]]] = [
        lambda: store.hget("plain", "field"),
        lambda: store.hgetall("plain"),
        lambda: store.hset("plain", {"f": "1"}),
        lambda: store.hincr_float("plain", "f", 1.0),
        lambda: store.zadd("plain", {"m": 1.0}),
        lambda: store.zrange_by_score("plain", 0, 1),
        lambda: store.get("fields"),
        lambda: store.incr("fields"),
        lambda: store.compare_and_set("fields", "1", "2"),
        lambda: store.zscore("fields", "f"),
    ]
    for call in wrong_type_calls:
        with pytest.raises(StateError, match="wrong type") as caught:
            await call()
        assert not caught.value.retriable
        assert "plain" in str(caught.value) or "fields" in str(caught.value)
    assert await store.get("plain") == "v"
    assert await store.hgetall("fields") == {"f": "1"}


@pytest.mark.integration
async def test_unreachable_redis_is_a_retriable_error_naming_the_server() -> None:
    store = RedisStateStore("redis://app:s3cret@127.0.0.1:1/0", timeout_s=1.0)
    started = time.monotonic()
    with pytest.raises(StateError, match=r"127\.0\.0\.1:1") as caught:
        await store.ping()
    assert caught.value.retriable
    assert "s3cret" not in str(caught.value)
    with pytest.raises(StateError, match="compare_and_set") as caught:
        await store.compare_and_set("k", None, "v")
    assert caught.value.retriable
    with pytest.raises(StateError, match="clear_prefix") as caught:
        await store.clear_prefix()
    assert caught.value.retriable
    assert time.monotonic() - started < 5
    await store.close()


@pytest.mark.integration
async def test_a_redis_that_never_answers_is_a_retriable_timeout() -> None:
    async def mute(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # accept, read, never answer
        writer.close()

    server = await asyncio.start_server(mute, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    store = RedisStateStore(f"redis://127.0.0.1:{port}/0", timeout_s=0.2)
    try:
        with pytest.raises(StateError, match=f"127.0.0.1:{port}") as caught:
            await store.get("k")
        assert caught.value.retriable
    finally:
        await store.close()
        server.close()
        await server.wait_closed()


@pytest.mark.integration
async def test_scripts_survive_a_redis_that_lost_its_script_cache(
    redis_url: str, unique_prefix: str
) -> None:
    # A restarted Redis (or SCRIPT FLUSH) forgets loaded scripts: the store loads them
    # again, and a batch runs each call exactly once.
    import redis.asyncio as aioredis

    store = RedisStateStore(redis_url, prefix=unique_prefix)
    raw = aioredis.Redis.from_url(redis_url)
    try:
        await store.hset("a", {"n": "10"})
        assert (await store.run_script(MOVE, ["a", "b"], ["1"]))[0] == "moved"
        await raw.script_flush()
        assert (await store.run_script(MOVE, ["a", "b"], ["1"]))[0] == "moved"
        await raw.script_flush()
        results = await store.run_script_many(MOVE, [(["a", "b"], ["1"])] * 3)
        assert [r[0] for r in results] == ["moved"] * 3
        assert await store.hgetall("a") == {"n": "5"}
    finally:
        await store.clear_prefix()
        await store.close()
        await raw.aclose()
