"""The scheduler's placement counts (stages routed per model, stages held per model),
against the memory store and a real Redis: the Lua and the Python body agree."""

from __future__ import annotations

from switchyard.state import StateStore, keys

from services.scheduler.stages import STAGE_COUNTS

DEMAND = keys.PLACEMENT_DEMAND
WAITING = keys.placement_waiting("scheduler-0")


async def _counts(
    store: StateStore, demand: dict[str, int], waiting: dict[str, int] | None
) -> None:
    args = ["5000", str(len(demand)), "1" if waiting is not None else ""]
    for model, count in demand.items():
        args += [model, str(count)]
    for model, count in (waiting or {}).items():
        args += [model, str(count)]
    await store.run_script(STAGE_COUNTS, [DEMAND, WAITING], args)


async def test_demand_adds_up_and_waiting_is_rewritten_whole(store: StateStore) -> None:
    await _counts(store, {"sd15-base": 2, "upscaler": 1}, {"upscaler": 3, "sd15-base": 1})
    await _counts(store, {"sd15-base": 5}, {"upscaler": 2})
    assert await store.hgetall(DEMAND) == {"sd15-base": "7", "upscaler": "1"}
    # Rewritten whole: a model no longer held is gone from the hash.
    assert await store.hgetall(WAITING) == {"upscaler": "2"}
    ttl_s = await store.ttl_s(WAITING)
    assert ttl_s is not None
    assert 0 < ttl_s <= 5.0
    assert await store.ttl_s(DEMAND) is None  # the counters never expire


async def test_demand_alone_leaves_the_waiting_hash_as_it_was(store: StateStore) -> None:
    await _counts(store, {}, {"upscaler": 4})
    await _counts(store, {"prompt-encoder": 1}, None)
    assert await store.hgetall(WAITING) == {"upscaler": "4"}
    assert await store.hgetall(DEMAND) == {"prompt-encoder": "1"}


async def test_nothing_held_deletes_the_waiting_hash(store: StateStore) -> None:
    await _counts(store, {}, {"upscaler": 4})
    await _counts(store, {}, {})
    assert await store.hgetall(WAITING) == {}
