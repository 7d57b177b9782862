"""The prefix-aware baselines (llm-d's endpoint picker, Dynamo's KV router) over
hand-built snapshots: a prefix hit draws a request, until load outweighs it."""

from __future__ import annotations

from dataclasses import replace

import pytest
from switchyard.policies import make_llm_policy
from switchyard.policies.prefix_aware import EndpointPicker, KvRouter
from switchyard.policies.snapshot import WorkerView

from tests.unit.test_policies import cluster, ctx, request, worker


def test_the_endpoint_picker_follows_the_prefix_among_equally_loaded_workers() -> None:
    snapshot = cluster(worker("w1"), worker("w2"), worker("w3"))
    placed = EndpointPicker().assign(
        request(prompt_tokens=2000, cached_tokens={"w2": 1536}), snapshot, ctx()
    )
    assert placed.worker_id == "w2"


def test_the_endpoint_picker_leaves_a_prefix_behind_a_long_queue_and_a_full_cache() -> None:
    # w1 holds 3/4 of the prompt (3 x 0.75 = 2.25 points) but has the longest queue and a
    # full KV cache (0 + 0 points); w2 is idle and empty (2 + 2 points).
    snapshot = cluster(
        worker("w1", waiting=10, kv_used_tokens=100_000), worker("w2"), worker("w3", waiting=5)
    )
    placed = EndpointPicker().assign(
        request(prompt_tokens=2048, cached_tokens={"w1": 1536}), snapshot, ctx()
    )
    assert placed.worker_id == "w2"


def test_the_kv_router_weighs_blocks_to_prefill_against_blocks_held() -> None:
    # w1 would prefill 1 block of 8 but holds 20 blocks; w2 prefills all 8 and holds none:
    # cost 1 + 20 + 8 = 29 against 8 + 0 + 8 = 16.
    busy_but_cached = cluster(worker("w1", queued_tokens=20 * 512), worker("w2"))
    placed = KvRouter().assign(
        request(prompt_tokens=8 * 512, cached_tokens={"w1": 7 * 512}), busy_but_cached, ctx()
    )
    assert placed.worker_id == "w2"
    lightly_loaded = cluster(worker("w1", queued_tokens=2 * 512), worker("w2"))
    placed = KvRouter().assign(
        request(prompt_tokens=8 * 512, cached_tokens={"w1": 7 * 512}), lightly_loaded, ctx()
    )
    assert placed.worker_id == "w1"  # 1 + 2 + 8 = 11 against 16


@pytest.mark.parametrize("name", ["llm-d", "kv-router"])
def test_without_prefix_knowledge_they_balance_load(name: str) -> None:
    policy = make_llm_policy(name).assignment
    snapshot = cluster(
        worker("w1", waiting=4, queued_tokens=8000, kv_used_tokens=6000),
        worker("w2", waiting=1, queued_tokens=2000, kv_used_tokens=1500),
    )
    assert policy.assign(request(), snapshot, ctx()).worker_id == "w2"


_PREFILL = {"prefill_per_token_s": 0.0004, "prefill_per_token_sq_s": 0.0}
"""0.4 ms a prompt token: a 2,000-token prompt takes 0.8 s to prefill, 500 of it 0.2 s."""


def test_switchyard_follows_a_prefix_to_a_worker_busier_with_decodes() -> None:
    policy = make_llm_policy("switchyard").assignment
    hit = request(prompt_tokens=2000, cached_tokens={"w1": 1500})
    # w1: 0.2 s of prefill, paused for 8 of 64 slots (x 2.25) + 2 x 8/64 load = 0.7;
    # w2: 0.8 s of prefill, idle = 0.8.
    snapshot = cluster(worker("w1", running=8, **_PREFILL), worker("w2", **_PREFILL))
    assert policy.assign(hit, snapshot, ctx()).worker_id == "w1"


def test_switchyard_leaves_a_prefix_behind_a_backlog_of_prefills() -> None:
    policy = make_llm_policy("switchyard").assignment
    hit = request(prompt_tokens=2000, cached_tokens={"w1": 1500})
    # w1 has 3,000 prompt tokens waiting: 1.2 s before its own 0.2 s; w2 is idle: 0.8 s.
    backlog = worker("w1", waiting=3, queued_tokens=3000, **_PREFILL)
    snapshot = cluster(backlog, worker("w2", **_PREFILL))
    assert policy.assign(hit, snapshot, ctx()).worker_id == "w2"


def test_switchyard_counts_half_of_a_prefill_in_progress_as_ahead() -> None:
    policy = make_llm_policy("switchyard").assignment
    # Both run one request holding 4,000 KV tokens. On w1 it is a prompt still
    # prefilling: half of its 1.6 s is counted ahead of a newcomer (0.8 s), which w2,
    # decoding, does not have. Listed first, w1 would win the tie if it were not counted.
    held = {"running": 1, "kv_used_tokens": 4000, "queued_tokens": 4000, **_PREFILL}
    prefilling = worker("w1", prefilling_tokens=4000, **held)
    snapshot = cluster(prefilling, worker("w2", **held))
    assert policy.assign(request(prompt_tokens=100), snapshot, ctx()).worker_id == "w2"
    # Half, not all: w1's 0.8 s ahead beats w2's 2,500-token prompt waiting (1.0 s);
    # counted whole (1.6 s), w1 would lose.
    waiting = worker("w2", waiting=1, **{**held, "queued_tokens": 6500})
    snapshot = cluster(prefilling, waiting)
    assert policy.assign(request(prompt_tokens=100), snapshot, ctx()).worker_id == "w1"


def test_switchyard_joins_a_waiting_prompt_rather_than_pause_a_batch_again() -> None:
    policy = make_llm_policy("switchyard").assignment
    # Both decode 40 requests. On w2 a 100-token newcomer opens a prefill iteration of
    # its own, whose 20 ms base pauses all 40 (0.5 x 0.02 x 40 = 0.4 s); on w1 it joins
    # the 100-token prompt waiting there: 0.04 s behind it, 0.04 s more before that
    # one's first token, one more outstanding (2 / 64 s). Without the iteration's cost
    # w2 would win by 0.11 s.
    held = {"running": 40, "kv_used_tokens": 8000, "prefill_base_s": 0.02, **_PREFILL}
    joining = worker("w1", waiting=1, queued_tokens=8100, **held)
    opening = worker("w2", queued_tokens=8000, **held)
    newcomer = request(prompt_tokens=100)
    assert policy.assign(newcomer, cluster(joining, opening), ctx()).worker_id == "w1"
    # Nothing running: a new iteration pauses no one, and the shorter wait wins.
    idle = {**held, "running": 0, "kv_used_tokens": 0}
    snapshot = cluster(worker("w1", waiting=1, queued_tokens=100, **idle), worker("w2", **idle))
    assert policy.assign(newcomer, snapshot, ctx()).worker_id == "w2"
    # In chunks the prompt rides the decodes' own iterations: no iteration of its own.
    snapshot = cluster(
        replace(joining, chunk_budget_tokens=512), replace(opening, chunk_budget_tokens=512)
    )
    assert policy.assign(newcomer, snapshot, ctx()).worker_id == "w2"


def test_switchyard_keeps_a_long_prompt_from_holding_back_a_short_one_waiting() -> None:
    policy = make_llm_policy("switchyard").assignment
    long_prompt = request(prompt_tokens=2000)  # 0.8 s of prefill
    # Joining w1's 100-token prompt would hold that one's first token back 0.8 s; on w2
    # it waits for half the 1,000-token prefill in progress (0.2 s). Without counting
    # the first token it delays, w1 (0.04 s ahead) would win.
    waiting = worker("w1", waiting=1, queued_tokens=100, **_PREFILL)
    busy = {"running": 1, "kv_used_tokens": 1000, "queued_tokens": 1000}
    prefilling = worker("w2", prefilling_tokens=1000, **busy, **_PREFILL)
    assert policy.assign(long_prompt, cluster(waiting, prefilling), ctx()).worker_id == "w2"


def test_switchyard_keeps_a_long_prefill_away_from_a_full_batch() -> None:
    policy = make_llm_policy("switchyard").assignment
    # 5,000 tokens: 2 s of prefill. On w1 it would pause 48 running decodes (x 8.5); w2
    # has one short prompt waiting (0.2 s) and nothing running.
    decoding = worker("w1", running=48, kv_used_tokens=20_000, queued_tokens=20_000, **_PREFILL)
    queued = worker("w2", waiting=1, queued_tokens=500, **_PREFILL)
    long_prompt = request(prompt_tokens=5000)
    assert policy.assign(long_prompt, cluster(decoding, queued), ctx()).worker_id == "w2"


def test_switchyard_without_prefill_costs_joins_the_shorter_queue() -> None:
    policy = make_llm_policy("switchyard").assignment
    snapshot = cluster(worker("w1", waiting=3, running=2), worker("w2", running=4))
    assert policy.assign(request(), snapshot, ctx()).worker_id == "w2"


def _gpu(worker_id: str, slow: bool, running: int) -> WorkerView:
    """A worker of a mixed cluster: ``slow`` has twice the fixed step time, 2.4 times the
    cost of a KV token and half the cache (an L40S next to an A100)."""
    return worker(
        worker_id,
        running=running,
        kv_used_tokens=1000 * running,
        queued_tokens=1000 * running,
        kv_capacity_tokens=50_000 if slow else 100_000,
        prefill_base_s=0.02 if slow else 0.01,
        decode_step_per_kv_token_s=2.4e-7 if slow else 1e-7,
    )


def test_switchyard_weighs_the_load_of_a_slower_gpu_more() -> None:
    policy = make_llm_policy("switchyard").assignment
    # Per slot the slow worker is less loaded (12 of 64 against 20), but its decode step
    # with the request added is 1.85 times the fast one's: 1.14 s against 0.83 s.
    snapshot = cluster(_gpu("fast", slow=False, running=20), _gpu("slow", slow=True, running=12))
    assert policy.assign(request(), snapshot, ctx()).worker_id == "fast"
    # An idle slower worker still takes work from a busy faster one.
    snapshot = cluster(_gpu("fast", slow=False, running=20), _gpu("slow", slow=True, running=0))
    assert policy.assign(request(), snapshot, ctx()).worker_id == "slow"
