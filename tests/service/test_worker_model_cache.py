"""The worker's model cache: budget, least-recently-used eviction, models in use."""

from __future__ import annotations

import time

import pytest

from services.worker.model_cache import ModelCache, ModelCacheFullError, ModelTooLargeError


def _loader(name: str, size_bytes: int, loads: list[str]) -> tuple[str, int]:
    loads.append(name)
    return f"model-{name}", size_bytes


async def test_loads_once_then_serves_from_memory() -> None:
    cache = ModelCache(100)
    loads: list[str] = []
    async with cache.use("a", lambda: _loader("a", 40, loads)) as model:
        assert model == "model-a"
    async with cache.use("a", lambda: _loader("a", 40, loads)) as model:
        assert model == "model-a"
    assert loads == ["a"]
    assert cache.resident() == ["a"]
    assert cache.used_bytes == 40
    assert cache.free_bytes == 60


async def test_swap_in_cost_is_the_measured_load_time() -> None:
    cache = ModelCache(100)

    def slow() -> tuple[str, int]:
        time.sleep(0.05)
        return "slow", 10

    async with cache.use("slow", slow):
        pass
    load_s = cache.load_s("slow")
    assert load_s is not None
    assert load_s >= 0.05
    assert cache.swap_ins[-1].key == "slow"
    assert cache.swap_ins[-1].load_s == load_s


async def test_evicts_least_recently_used_first() -> None:
    cache = ModelCache(100)
    loads: list[str] = []
    for name in ("a", "b"):
        async with cache.use(name, lambda name=name: _loader(name, 40, loads)):  # type: ignore[misc]
            pass
    async with cache.use("a", lambda: _loader("a", 40, loads)):  # a is now the most recent
        pass
    async with cache.use("c", lambda: _loader("c", 40, loads)):
        pass
    assert sorted(cache.resident()) == ["a", "c"]
    assert cache.swap_ins[-1].evicted == ("b",)
    assert loads == ["a", "b", "c"]


async def test_a_model_in_use_is_never_evicted() -> None:
    cache = ModelCache(100)
    loads: list[str] = []
    async with cache.use("a", lambda: _loader("a", 60, loads)):
        with pytest.raises(ModelCacheFullError, match="in use"):
            async with cache.use("b", lambda: _loader("b", 60, loads)):
                pass
        assert cache.resident() == ["a"]
    # Once a is released, b evicts it.
    async with cache.use("b", lambda: _loader("b", 60, loads)):
        pass
    assert cache.resident() == ["b"]


async def test_a_model_larger_than_the_budget_is_refused_clearly() -> None:
    cache = ModelCache(100)
    loads: list[str] = []
    with pytest.raises(ModelTooLargeError, match=r"needs 500 bytes.*budget of 100 bytes"):
        async with cache.use("huge", lambda: _loader("huge", 500, loads), size_hint_bytes=500):
            pass
    assert loads == []  # refused before loading, from the hint
    with pytest.raises(ModelTooLargeError, match="huge2"):
        async with cache.use("huge2", lambda: _loader("huge2", 500, loads)):
            pass
    assert cache.resident() == []


async def test_a_resident_model_stays_for_good() -> None:
    cache = ModelCache(100)
    cache.put_resident("weights", object(), 70)
    with pytest.raises(ModelCacheFullError):
        async with cache.use("b", lambda: ("b", 40)):
            pass
    assert cache.resident() == ["weights"]
