"""A worker's prefix cache (switchyard.perf.prefix_cache): only a leading run of a
prompt's blocks matches, and a full cache gives up its least recently used blocks,
a prompt's tail before its head."""

from __future__ import annotations

import pytest
from switchyard.perf.prefix_cache import PrefixCache


def test_only_a_leading_run_of_blocks_matches() -> None:
    cache = PrefixCache(capacity_blocks=100)
    assert cache.use([1, 2, 3]) == 0
    assert cache.matched_blocks([1, 2, 3, 4]) == 3
    assert cache.matched_blocks([1, 9, 3]) == 1  # 3 follows another prefix here
    assert cache.use([1, 2, 3, 4]) == 3
    assert cache.hit_rate == pytest.approx(3 / 7)


def test_looking_does_not_count_as_a_use() -> None:
    cache = PrefixCache(capacity_blocks=3)
    cache.use([1, 2, 3])
    cache.matched_blocks([1, 2, 3])
    assert (cache.lookups, cache.looked_up_blocks) == (1, 3)


def test_a_full_cache_gives_up_the_least_recently_used_prompt_first() -> None:
    cache = PrefixCache(capacity_blocks=4)
    cache.use([1, 2])
    cache.use([5, 6])
    cache.use([1, 2])  # used again: now the most recent
    cache.use([7, 8])
    assert cache.matched_blocks([1, 2]) == 2
    assert cache.matched_blocks([5, 6]) == 0
    assert len(cache) == 4


def test_of_one_prompt_the_tail_goes_before_the_head() -> None:
    cache = PrefixCache(capacity_blocks=5)
    cache.use([1, 2, 3, 4])
    cache.use([9, 10])  # one block too many: the old prompt loses its last block
    assert cache.matched_blocks([1, 2, 3, 4]) == 3


def test_a_cache_of_no_blocks_holds_nothing_and_a_negative_one_is_refused() -> None:
    cache = PrefixCache(capacity_blocks=0)
    cache.use([1, 2])
    assert cache.matched_blocks([1, 2]) == 0
    with pytest.raises(ValueError, match="capacity_blocks"):
        PrefixCache(capacity_blocks=-1)
